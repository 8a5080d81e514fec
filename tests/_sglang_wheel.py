"""Test helper: the upstream sglang wheel (cached under .cache/wheels, fetched with pip if absent)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WHEELS = ROOT / ".cache" / "wheels"


def sglang_wheel(version: str) -> Path:
    found = sorted(WHEELS.glob(f"sglang-{version}-*.whl"))
    if not found:
        WHEELS.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
             f"sglang=={version}", "-d", str(WHEELS)],
            check=True, capture_output=True, text=True,
        )
        found = sorted(WHEELS.glob(f"sglang-{version}-*.whl"))
    assert found, f"no sglang {version} wheel in {WHEELS}"
    return found[0]


def unpack(wheel: Path, dest: Path, prefixes: tuple[str, ...] = ()) -> Path:
    """Unpack the wheel (only members under `prefixes`, if given) into dest; return dest."""
    with zipfile.ZipFile(wheel) as zf:
        members = [n for n in zf.namelist() if not prefixes or n.startswith(prefixes)]
        zf.extractall(dest, members)
    return dest
