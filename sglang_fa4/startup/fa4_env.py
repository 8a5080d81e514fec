"""FA4's process environment, set before ``flash_attn.cute`` is imported: its persistent on-disk
compile cache (``SGLANG_FA4_KERNEL_CACHE`` / ``SGLANG_FA4_KERNEL_CACHE_DIR``).

Imports neither flash_attn nor torch.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

from sglang_fa4.environ import envs
from sglang_fa4.kernels import fa4

logger = logging.getLogger("sglang_fa4")


def configure_fa4_disk_cache() -> Optional[str]:
    """Point FA4's own persistent compile cache at ``SGLANG_FA4_KERNEL_CACHE_DIR`` (when
    ``SGLANG_FA4_KERNEL_CACHE`` is on). Returns the directory in use, or None when off.

    flash-attn-4 b36 reads ``FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED`` (exactly "1" enables it)
    and ``FLASH_ATTENTION_CUTE_DSL_CACHE_DIR`` once, when its cache module is imported, so this
    must run before that; the plugin calls it at registration. A user's own
    ``FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED`` is read as FA4 reads it: any value but "1" is off
    and wins (one line says so). A user's own directory wins; an empty one, which FA4 would take
    as the working directory, is replaced like an unset one.
    """
    if not envs.SGLANG_FA4_KERNEL_CACHE.get():
        return None
    enabled = envs.FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED
    directory = envs.FLASH_ATTENTION_CUTE_DSL_CACHE_DIR
    if enabled.is_set() and not enabled.get():
        if enabled.raw() == "0":
            logger.info("sglang-fa4: %s=0 set: FA4 kernels are not cached on disk", enabled.name)
        else:  # FA4 reads any value but "1" as off
            logger.warning("sglang-fa4: %s=%r: FA4 turns its persistent cache on only for '1'; FA4 kernels are "
                           "not cached on disk", enabled.name, enabled.raw())
        return None
    loaded = fa4.loaded_disk_cache()
    if loaded is not None:
        was_enabled, path = loaded
        if was_enabled:
            return path or directory.get() or None
        logger.warning(
            "sglang-fa4: flash_attn.cute was imported before the persistent kernel cache was "
            "configured; FA4 kernels of this process are not cached on disk"
        )
        return None
    enabled.set(True)  # "1", the only value FA4 accepts
    if not directory.get():
        directory.set(str(Path(envs.SGLANG_FA4_KERNEL_CACHE_DIR.get()).expanduser()))
    return directory.get()
