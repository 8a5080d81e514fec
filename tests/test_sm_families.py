"""Every GPU family the project decides on, one row each, through every per-architecture decision:
the ViT backend default (environ.yaml's table, exact "major.minor" then "major" then "default"),
FA4's kernel-call layout and max_seqlen key (SM100/SM110 vs the rest), the SM90-only short-window
route and FP8 ViT attention, and the SM90-only FP8-KV LLM upgrade. A one-line slip in any of
these (a family dropped from a tuple, ``>=`` for ``==``) changes some row here."""

from __future__ import annotations

import pytest

from sglang_fa4.kernels.vit import short_windows as short_segments
from sglang_fa4.kernels.vit import attn_dtype as vit_attn_dtype
from sglang_fa4.kernels.fa4.b36 import LAYOUT_SM90, LAYOUT_SM100, layout_for_arch
from sglang_fa4.kernels.fa4.config import seqlen_class
from sglang_fa4.llm_selection import LlmModelFacts, fp8_kv_upgrade
from sglang_fa4.selection import select_mm_attention_backend

# (capability, ViT default backend, FA4 SM100-class kernel, SM90-only routes)
FAMILIES = [
    ((8, 0), "triton_attn", False, False),   # A100
    ((8, 6), "triton_attn", False, False),   # consumer Ampere
    ((8, 9), "triton_attn", False, False),   # Ada
    ((9, 0), "fa3", False, True),            # H100 / H200
    ((10, 0), "fa4", True, False),           # B200
    ((10, 3), "fa4", True, False),           # B300
    ((11, 0), "triton_attn", True, False),   # Thor: FA4's SM100 kernel class, no table row
    ((12, 0), "triton_attn", False, False),  # RTX Blackwell: "12" row
    ((12, 1), "triton_attn", False, False),  # DGX Spark: "12" row, any minor
]


@pytest.mark.parametrize("cap,vit_default,sm100,sm90_only", FAMILIES, ids=lambda x: str(x))
def test_each_family_through_every_decision(monkeypatch, cap, vit_default, sm100, sm90_only):
    monkeypatch.delenv("SGLANG_FA4_MM_ATTENTION_BACKEND_DEFAULT", raising=False)
    monkeypatch.setenv("SGLANG_FA4_FP8_KV_UPGRADE", "1")
    arch = cap[0] * 10 + cap[1]
    choice = select_mm_attention_backend(None, None, cap)
    assert (choice.backend, choice.source) == (vit_default, "table")

    assert layout_for_arch(arch) is (LAYOUT_SM100 if sm100 else LAYOUT_SM90)
    # max_seqlen reaches only the SM100-class kernel (its q_stage / static-scheduler key)
    classes = {seqlen_class(arch, n, n) for n in (1, 128, 129, 256, 257)}
    assert (classes == {"any"}) is (not sm100)
    if sm100:
        assert classes == {"q_stage1-static", "q_stage2-static", "q_stage2"}

    assert (arch in short_segments.ROUTED_ARCHS) is sm90_only
    assert (arch in vit_attn_dtype.FP8_ARCHS) is sm90_only
    llm = fp8_kv_upgrade("fa3", capability=cap, kv_cache_dtype="fp8_e4m3", explicit_backend=False,
                         deterministic=False, model=LlmModelFacts(head_dim=128, v_head_dim=128))
    assert (llm.backend, llm.upgraded) == (("fa4", True) if sm90_only else ("fa3", False))


def test_every_table_row_is_a_family_above():
    """A row added to environ.yaml's table without a family here fails (the table is covered)."""
    from sglang_fa4.environ import envs

    caps = {f"{c[0]}.{c[1]}" for c, *_ in FAMILIES} | {str(c[0]) for c, *_ in FAMILIES} | {"default"}
    assert set(envs.mm_attention_backend_defaults) <= caps


def test_table_lookup_order_exact_then_major_then_default():
    """The order itself, on a table whose rows all differ (in environ.yaml's the "12" row equals
    the default, so there it cannot show)."""
    from sglang_fa4.selection import default_for_capability

    table = {"9.0": "exact", "12": "major", "default": "fallback"}
    assert default_for_capability((9, 0), table) == ("exact", "table entry '9.0'")
    assert default_for_capability((9, 1), table) == ("fallback", "table entry 'default'")
    assert default_for_capability((12, 1), table) == ("major", "table entry '12'")
    assert default_for_capability((12, 0), {**table, "12.0": "exact"})[0] == "exact"
