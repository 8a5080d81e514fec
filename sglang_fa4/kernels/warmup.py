"""The warmup registry: every kernel family that compiles per model shape, asked by startup.

Each sub-package names its families (:class:`~sglang_fa4.kernels.compile_events.KernelFamily`: how
to warm one of its variants, and the compile-event source it is counted under) in its face's
``FAMILIES``: FA4's configurations (``fa4``), the SM90 FP8 forward's variants (``fp8_forward``),
the paged FP8 KV cache's split-KV decode and page gather (``fp8_paged_decode``,
``fp8_paged_gather``), and the ViT kernels (``vit_rotary``, ``vit_short_window``, ``fp8_vit``).
Which variants a model needs is :mod:`sglang_fa4.startup.variants`'s answer; startup hands each
(family, variant) pair to :func:`warm`, which counts what it resolved in the one compile counter
(:mod:`sglang_fa4.kernels.compile_events`).
"""

from __future__ import annotations

from typing import Any

from sglang_fa4.kernels import compile_events
from sglang_fa4.kernels.compile_events import KernelFamily

_families: dict[str, KernelFamily] = {}


def families() -> dict[str, KernelFamily]:
    """Every family, by name (the sub-packages are imported on the first call: no FA4 or CUTLASS)."""
    if not _families:
        from sglang_fa4.kernels import fa4, fp8_paged_kv, fp8_sm90, vit

        for family in (*fa4.FAMILIES, *fp8_sm90.FAMILIES, *fp8_paged_kv.FAMILIES, *vit.FAMILIES):
            if family.name in _families:
                raise ValueError(f"two kernel families are named {family.name!r}")
            _families[family.name] = family
    return dict(_families)


def family(name: str) -> KernelFamily:
    known = families()
    if name not in known:
        raise KeyError(f"no kernel family {name!r}; known: {', '.join(sorted(known))}")
    return known[name]


def warm(name: str, variant: Any, device) -> tuple[str, int]:
    """Warm one variant of family ``name`` on ``device``: (how it went, how many kernels it newly
    resolved, counted under the family's compile-event source)."""
    fam = family(name)
    before = compile_events.count(fam.source)
    how = fam.warm(variant, device)
    return how, compile_events.count(fam.source) - before
