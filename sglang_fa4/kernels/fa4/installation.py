"""flash-attn-4 as the rest of sglang-fa4 sees it: the one door to FA4 facts for modules outside
``kernels/``.

What the release-specific module (:mod:`sglang_fa4.kernels.fa4_b36`: FA4's private names, its
kernel-call layout, its constants) knows stays behind this door; startup, the doctor and the
integration ask here, so an FA4 upgrade is a diff of ``kernels/`` only.
tests/test_architecture.py holds the boundary: no module outside ``kernels/`` imports ``fa4_b36``.

The functions call through at call time (not bound at import), so a test that replaces one of
``fa4_b36``'s functions is seen here too. Imports neither flash_attn nor torch.
"""

from __future__ import annotations

from typing import Optional

from sglang_fa4.kernels import fa4_b36

#: the flash-attn-4 release sglang-fa4 is written against
WRITTEN_AGAINST: str = fa4_b36.FA4_VERSION
#: other releases whose forward-kernel call was checked to match, and on which kernel classes
CALL_LAYOUT_CHECKED: dict = fa4_b36.CALL_LAYOUT_CHECKED
#: above this many segments FA4's varlen forward adds scheduler kernels (a kernel-config class)
MANY_SEGMENTS: int = fa4_b36.MANY_SEGMENTS


def available() -> bool:
    """Whether flash-attn-4 (``flash_attn.cute``) is installed, without importing it."""
    return fa4_b36.fa4_available()


def installed_version() -> Optional[str]:
    """The installed flash-attn-4 distribution's version, None when it is not installed."""
    return fa4_b36.installed_version()


def device_arch() -> int:
    """FA4's kernel class for this process (FLASH_ATTENTION_ARCH, else the current GPU), e.g. 90."""
    return fa4_b36.device_arch()


def loaded_disk_cache() -> Optional[tuple[bool, Optional[str]]]:
    """None when FA4 has not read its persistent-cache settings yet; else (enabled, directory)."""
    return fa4_b36.loaded_disk_cache()
