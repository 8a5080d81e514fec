"""flash-attn-4 as installed here: whether it is, which version, which kernel class, its disk cache.

What the release-specific module (:mod:`sglang_fa4.kernels.fa4.b36`: FA4's private names, its
kernel-call layout, its constants) knows stays behind this module and the package's face; startup
and the doctor ask here, so an FA4 upgrade is a diff of ``kernels/fa4/`` only.

The functions call through at call time (not bound at import), so a test that replaces one of
``b36``'s functions is seen here too. Imports neither flash_attn nor torch.
"""

from __future__ import annotations

from typing import Optional

from sglang_fa4.kernels.fa4 import b36

#: the flash-attn-4 release sglang-fa4 is written against
WRITTEN_AGAINST: str = b36.FA4_VERSION
#: other releases whose forward-kernel call was checked to match, and on which kernel classes
CALL_LAYOUT_CHECKED: dict = b36.CALL_LAYOUT_CHECKED
#: above this many segments FA4's varlen forward adds scheduler kernels (a kernel-config class)
MANY_SEGMENTS: int = b36.MANY_SEGMENTS


def available() -> bool:
    """Whether flash-attn-4 (``flash_attn.cute``) is installed, without importing it."""
    return b36.fa4_available()


def installed_version() -> Optional[str]:
    """The installed flash-attn-4 distribution's version, None when it is not installed."""
    return b36.installed_version()


def device_arch() -> int:
    """FA4's kernel class for this process (FLASH_ATTENTION_ARCH, else the current GPU), e.g. 90."""
    return b36.device_arch()


def loaded_disk_cache() -> Optional[tuple[bool, Optional[str]]]:
    """None when FA4 has not read its persistent-cache settings yet; else (enabled, directory)."""
    return b36.loaded_disk_cache()
