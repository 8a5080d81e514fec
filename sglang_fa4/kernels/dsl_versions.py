"""Which of sglang-fa4's CuTe kernels each nvidia-cutlass-dsl version builds: the one version gate.

SGLang pins the CUTLASS DSL (0.5.20 / 0.5.21: 4.6.2, 0.5.22 / 0.5.23: 4.8.0); our gpu extra only
asks for >= 4.6.2 so that it never fights that pin. Every kernel family below was cross-compiled on
the CPU under 4.6.2, 4.8.0 and 4.8.1 (tests/test_xcompile_dsl_versions.py, tests/test_fp8_xcompile.py).
A version outside a family's range is refused here, with a message naming the installed version and
the one needed, before the DSL is asked to build anything. doctor reports the same table.
"""

from __future__ import annotations

import functools
from importlib import metadata
from typing import Optional

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

#: kernel family -> (what it is, the DSL versions it builds with)
KERNELS: dict[str, tuple[str, SpecifierSet]] = {
    "fp8_sm90": ("sglang-fa4's SM90 FP8 attention forward (ViT and LLM FP8 KV)", SpecifierSet(">=4.6.2")),
    "fa4": ("FlashAttention-4's forward (flash-attn-4 4.0.0b36), the ViT fa4 backend and its warmup",
            SpecifierSet(">=4.6.2")),
}


class DslVersionError(RuntimeError):
    """The installed CUTLASS DSL cannot build a kernel family."""


@functools.cache  # read once per process: require() runs before every compile
def installed_version() -> Optional[str]:
    try:
        return metadata.version("nvidia-cutlass-dsl")
    except metadata.PackageNotFoundError:
        return None


@functools.cache
def builds(version: str) -> frozenset[str]:
    """The kernel families CUTLASS DSL `version` builds."""
    try:
        v = Version(version)
    except InvalidVersion:
        return frozenset()
    return frozenset(name for name, (_, spec) in KERNELS.items() if spec.contains(v, prereleases=True))


def require(family: str, version: Optional[str] = None) -> None:
    """Raise DslVersionError when the installed (or given) DSL cannot build `family`. Without a
    distribution to read (the DSL on PYTHONPATH without its dist-info) nothing is refused: the
    import itself says whether it is there."""
    what, spec = KERNELS[family]
    version = version if version is not None else installed_version()
    if version is not None and family not in builds(version):
        raise DslVersionError(f"{what} needs nvidia-cutlass-dsl{spec} (the versions it is built and tested "
                              f"with); the installed {version} is not one of them")


def report(version: Optional[str] = None) -> dict[str, str]:
    """family -> whether the installed (or given) DSL builds it, and what it needs (doctor)."""
    version = version if version is not None else installed_version()
    out = {}
    for family, (_, spec) in KERNELS.items():
        if version is None:
            out[family] = "nvidia-cutlass-dsl not installed"
        else:
            out[family] = (f"builds (needs nvidia-cutlass-dsl{spec})" if family in builds(version)
                           else f"cannot build: needs nvidia-cutlass-dsl{spec}, not {version}")
    return out
