"""The SM90 FP8 kernel's config table (sglang_fa4.kernels.fp8_sm90.kernel_config): one row per
compiled variant, each row's K/V^T stages what fits shared memory, each field checked on its own.
The rows' PTX is pinned by tests/test_fp8_xcompile.py (tests/fp8_default_ptx.json)."""

from __future__ import annotations

import dataclasses

import pytest

from sglang_fa4.kernels.fp8_sm90 import layout
from sglang_fa4.kernels.fp8_sm90.kernel_config import DEFAULT_CONFIGS, Fp8KernelConfig, default_config
from sglang_fa4.kernels.fp8_sm90.layout import Fp8Variant


def test_one_row_per_compiled_variant():
    assert sorted(DEFAULT_CONFIGS) == sorted(layout.all_variants())
    for v in layout.all_variants():
        assert default_config(v) is DEFAULT_CONFIGS[v]
    with pytest.raises(ValueError, match="no FP8 kernel"):
        default_config(Fp8Variant(80, False, False))


@pytest.mark.parametrize("variant", layout.all_variants(), ids=lambda v: v.describe())
def test_every_row_fits_and_builds_its_variant(variant):
    """Each row: valid for its variant, two-level exactly up to d=128 outside the persistent kernel,
    the persistent kernel only at d=128 non-causal, and its stages within shared memory -- for key
    tiles other than 128 as many as fit, at most 4 (layout.tile_stages / persistent_stages)."""
    c = DEFAULT_CONFIGS[variant]
    c.check_variant(variant)
    d = variant.head_dim
    assert c.two_level == (d <= layout.TWO_LEVEL_MAX_HEAD_DIM and not c.persistent)
    assert c.persistent == (d == 128 and not variant.causal and not variant.local)
    if c.persistent:
        assert c.stages == layout.persistent_stages(d, c.tile_n)
        # two Q buffers, two bf16 O staging buffers, 2 KiB of barriers + the schedule table
        used = 2 * layout.TILE_M * d + 2 * layout.TILE_M * d + 2048
    elif c.tile_n == layout.TILE_N:
        assert c.stages == layout.head_dim_stages(d)
        used = layout.TILE_M * d + 4096
    else:
        assert c.stages == layout.tile_stages(d, c.tile_n)
        used = layout.TILE_M * d + 4096
    assert used + c.stages * 2 * c.tile_n * d <= layout.SM90_SMEM_BYTES
    if c.tile_n != layout.TILE_N:
        assert c.stages == 4 or used + (c.stages + 1) * 2 * c.tile_n * d > layout.SM90_SMEM_BYTES


def test_derived_switches_follow_the_fields():
    for c in set(DEFAULT_CONFIGS.values()):
        assert c.rowsum_mma == c.two_level
        assert c.narrow == c.kv_split == c.persistent
        assert c.pass_after_issue == (c.pingpong and not c.pingpong_late)
    assert any(c.pass_after_issue for c in DEFAULT_CONFIGS.values())
    assert any(c.pingpong_late for c in DEFAULT_CONFIGS.values())


def test_config_is_frozen_and_replace_checks():
    c = DEFAULT_CONFIGS[Fp8Variant(128, False, False)]
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.tile_n = 128
    assert c.replace(persistent=False, pingpong=False).persistent is False and c.persistent
    with pytest.raises(ValueError, match="tile_n"):
        c.replace(tile_n=100)


BASE = Fp8KernelConfig(tile_n=128, stages=4, two_level=True)


@pytest.mark.parametrize("changes, match", [
    ({"tile_n": 112}, "multiple of 32"),
    ({"tile_n": 0}, "multiple of 32"),
    ({"tile_n": 288}, "up to 256"),
    ({"stages": 1}, "at least 2"),
    ({"pingpong_late": True}, "pingpong_late"),
    ({"pingpong_late": True, "pingpong": True, "two_level": False}, "pingpong_late"),
    ({"emu": -1}, "emu"),
    ({"persistent": True}, "one-level loop"),
    ({"two_level": False, "pingpong": True}, "persistent kernel's"),
    ({"two_level": False, "persistent": True, "tile_n": 64}, "64 or 96 divide"),
])
def test_each_field_check(changes, match):
    with pytest.raises(ValueError, match=match):
        BASE.replace(**changes)


def test_check_variant_refuses_what_the_kernel_cannot_build():
    with pytest.raises(ValueError, match="two_level at head dim 192"):
        BASE.check_variant(Fp8Variant(192, False, False))
    BASE.check_variant(Fp8Variant(128, False, False))  # d=128: fits
    persistent = DEFAULT_CONFIGS[Fp8Variant(128, False, False)]
    for v in (Fp8Variant(64, False, False), Fp8Variant(128, True, False), Fp8Variant(128, False, True)):
        with pytest.raises(ValueError, match="persistent: the d=128 non-causal kernel only"):
            persistent.check_variant(v)


def test_parse_changes_and_config_for():
    from benchmark.lab.fp8_kernel_configs import config_for, parse_changes

    assert parse_changes("") == {}
    assert parse_changes("tile_n=128, persistent=0,pingpong=true") == {"tile_n": 128, "persistent": False,
                                                                       "pingpong": True}
    for bad, match in (("tile_n", "FIELD=VALUE"), ("nope=1", "FIELD=VALUE"), ("persistent=yes", "0/1"),
                       ("tile_n=abc", "invalid literal")):
        with pytest.raises(ValueError, match=match):
            parse_changes(bad)
    d128 = Fp8Variant(128, False, False)
    assert config_for(d128, "") is None
    c = config_for(d128, "persistent=0,pingpong=0,stages=4")
    assert (c.persistent, c.pingpong, c.stages, c.tile_n) == (False, False, 4, 192)
    with pytest.raises(ValueError, match="persistent: the d=128 non-causal kernel only"):
        config_for(Fp8Variant(64, False, False), "two_level=0,persistent=1,tile_n=192,pingpong=1")
