"""Kernel configs other than the product's table, from a command line's text: what the lab's
variant experiments (``ncu_fp8_attention.py``, ``exp_fp8_tile_cost.py``) and the cross-compile
test of two non-default configs (tests/fp8_xcompile.py) compile.  The product compiles only
``kernel_config.DEFAULT_CONFIGS``; the variants measured and left off are at the git tag
``lab/fp8-variants-2026-12-04`` (NOTES-fp8-variants.md).
"""

from __future__ import annotations

import dataclasses

from sglang_fa4.kernels.fp8_sm90.kernel_config import Fp8KernelConfig, default_config
from sglang_fa4.kernels.fp8_sm90.layout import Fp8Variant

_BOOL_FIELDS = frozenset(f.name for f in dataclasses.fields(Fp8KernelConfig) if f.type in (bool, "bool"))


def parse_changes(text: str) -> dict:
    """``"tile_n=128,persistent=0"`` -> ``{"tile_n": 128, "persistent": False}``: fields of
    :class:`Fp8KernelConfig` as a benchmark's command line gives them (booleans as 0/1/true/false)."""
    names = {f.name for f in dataclasses.fields(Fp8KernelConfig)}
    out = {}
    for item in (x.strip() for x in text.split(",") if x.strip()):
        name, sep, value = item.partition("=")
        if not sep or name not in names:
            raise ValueError(f"kernel config change {item!r}: expected FIELD=VALUE with FIELD one of {sorted(names)}")
        if name in _BOOL_FIELDS:
            if value.lower() not in ("0", "1", "true", "false"):
                raise ValueError(f"kernel config change {item!r}: {name} takes 0/1/true/false")
            out[name] = value.lower() in ("1", "true")
        else:
            out[name] = int(value)
    return out


def config_for(variant: Fp8Variant, changes: str = "") -> Fp8KernelConfig | None:
    """The table's config for ``variant`` with ``changes`` (parse_changes), checked against the
    variant; None without changes (the launch then uses the table's)."""
    fields = parse_changes(changes)
    if not fields:
        return None
    config = default_config(variant).replace(**fields)
    config.check_variant(variant)
    return config
