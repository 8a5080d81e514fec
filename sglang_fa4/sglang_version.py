"""The installed SGLang's version, found without importing SGLang."""

from __future__ import annotations

from importlib import metadata
from typing import Optional

from packaging.version import InvalidVersion, Version


def installed_sglang_version() -> Optional[str]:
    """Public version of the installed ``sglang`` distribution ("0.5.20" for "0.5.20+fa4.1"), or
    None when there is none (a bare ``sglang`` directory without dist-info counts as none)."""
    try:
        raw = metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return None
    try:
        return Version(raw).public
    except InvalidVersion:
        return raw
