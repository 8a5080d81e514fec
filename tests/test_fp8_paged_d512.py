"""Head dim 512 on the paged FP8 KV route (issue #44 item 1): Gemma-4's full-attention layers (31B:
32 q / 4 kv heads, 26B-A4B: 16 / 2; GQA 8, causal, bf16 q as SGLang hands it, or E4M3 q) run the
split-KV kernel at every call size -- decode, short extends, prefills of a few hundred tokens with a
cached prefix -- reading SGLang's pool in place; its sliding layers (d256, GQA 2, window (1023, 0),
E4M3 q) as a regression.

The kernel runs in Triton's CPU interpreter (one child process: tests/fp8_decode_child.py) against
the fp64 reference on the dequantized pool (NaN-poisoned free memory, shuffled pages); the prefill
cases go through the route's own plan (``paged_kv_attention``) and must take the split-KV kernel.
Host side: the plan's one routing rule (never the gather at d512, whatever the call size, the
routing setting or q's dtype), refusals of head dims no kernel runs, the d512 block sizes and their
registers for sm_90a, the warmup list."""

from __future__ import annotations

import subprocess

import pytest
import torch

from sglang_fa4.kernels import fp8_paged_kv
from sglang_fa4.kernels.fp8_paged_kv import GATHER, SPLIT_KV, PagedKVError
from sglang_fa4.kernels.fp8_paged_kv import batch_plan as B
from sglang_fa4.kernels.fp8_paged_kv import decode_plan as S

FP8 = torch.float8_e4m3fn
BF16 = torch.bfloat16

G31 = dict(hq=32, hkv=4, d=512)  # gemma-4-31B's full-attention layers
G26 = dict(hq=16, hkv=2, d=512)  # gemma-4-26B-A4B's

#: small enough for the interpreter (its cost is programs x key steps): the prefills are the 26B
#: shape or few tokens; page sizes 1 / 16 / 64, descales None / scalar / per (batch, kv head),
#: split counts 1 and several rotate over the cases
CASES = {
    # decode: one token per sequence, lengths at page edges
    "decode-31b-P16-bf16-none": dict(lens=[1, 16, 17, 300], page=16, **G31, q="bf16", descale="none"),
    "decode-26b-P1-bf16-scalar-splits3": dict(lens=[1, 2, 200], page=1, **G26, q="bf16", descale="one", splits=3),
    "decode-31b-P64-fp8-per-splits4": dict(lens=[64, 65, 250], page=64, **G31, q="fp8", descale="per", splits=4),
    # short extends (rows = 16 tokens x 8 heads: four 32-row blocks), several splits
    "extend-31b-P16-bf16-per-splits2": dict(lens=[70, 300], new=[5, 16], page=16, **G31, q="bf16", descale="per",
                                             splits=2),
    # prefills with a cached prefix through the route's own plan: the split-KV kernel (no gather)
    "prefill-26b-P64-bf16-prefix60": dict(lens=[260], new=[200], page=64, **G26, q="bf16", descale="none",
                                          auto=True),
    "prefill-26b-P16-fp8-per": dict(lens=[90, 3], new=[40, 3], page=16, **G26, q="fp8", descale="per", auto=True),
    # row-block edges: 32 new tokens x 8 heads = exactly eight 32-row blocks, 33 one token over
    "prefill-31b-P1-rows-block-multiple-and-one-over": dict(lens=[82, 40], new=[32, 33], page=1, **G31, q="bf16",
                                                           descale="scalar", auto=True),
    # ... and one row over (MHA-like: a row per token): 32 rows, 33 rows
    "prefill-mha-d512-P16-rows-32-33": dict(lens=[40, 33], new=[32, 33], page=16, hq=2, hkv=2, d=512, q="bf16",
                                           descale="none", auto=True),
    # decode == extend at d512 (SGLang #25790: the two paths must not diverge)
    "decode-vs-extend-26b": dict(L=100, n=6, page=16, **G26, q="bf16"),
    # Gemma-4's sliding layers: d256, GQA 2, window (1023, 0), E4M3 q, contexts past the window
    "sliding-d256-decode-window1023": dict(lens=[1100, 5], page=16, hq=4, hkv=2, d=256, window=(1023, 0),
                                           descale="one"),
    "sliding-d256-extend-window1023": dict(lens=[1100], new=[16], page=64, hq=4, hkv=2, d=256, window=(1023, 0),
                                           descale="per", auto=True),
    # Gemma-4 image prefill (SGLang 0.5.22+: image rows see their whole image, [sequence, begin, end]
    # in absolute key positions): behind a cached prefix, two images, one at a sequence's end
    "image-prefill-31b-P16-bf16": dict(lens=[104], new=[64], page=16, **G31, q="bf16", descale="none", auto=True,
                                       images=[[0, 50, 70], [0, 80, 95]]),
    "image-prefill-26b-two-seqs-P1": dict(lens=[120, 60], new=[100, 60], page=1, **G26, q="bf16", descale="one",
                                          auto=True, images=[[0, 30, 61], [1, 0, 9], [1, 40, 59]]),
    # forced split count (several splits, the LSE): an image whose far end lies in a later split
    "image-extend-26b-P64-splits3": dict(lens=[300], new=[48], page=64, **G26, q="bf16", descale="per", splits=3,
                                         images=[[0, 258, 290]]),
    # a sliding layer's window (narrowed to 20 here) still bounds an image row's keys on the left
    "image-sliding-d256-window20": dict(lens=[100], new=[100], page=16, hq=4, hkv=2, d=256, window=(20, 0),
                                        descale="one", auto=True, images=[[0, 10, 59]]),
}


@pytest.fixture(scope="module")
def interpreted():
    pytest.importorskip("triton")
    import fp8_decode_child

    return fp8_decode_child.run_interpreted(CASES)


@pytest.mark.parametrize("name", list(CASES))
def test_interpreted_kernel_matches_fp64_on_the_dequantized_pool(interpreted, name):
    r, c = interpreted[name], CASES[name]
    assert "error" not in r, r
    assert r["finite"], r  # nothing of the NaN-poisoned free memory was read
    assert r["rel_err"] < 5e-3 and r["max_excess"] <= 0, r
    if "L" in c:
        assert r["decode_rel_err"] < 5e-3, r
        return
    assert r["into_out"], r
    if c.get("auto"):
        assert r["backend"] == SPLIT_KV, r  # the route's own plan: no gather (d512 has no FP8 forward)
    else:
        assert r["lse_err"] < 1e-4, r


def test_the_cases_cover_what_they_claim():
    flat = [c for c in CASES.values() if "L" not in c]
    d512 = [c for c in flat if c["d"] == 512]
    assert {(c["hq"], c["hkv"]) for c in d512} >= {(32, 4), (16, 2)}
    assert {c["page"] for c in d512} == {1, 16, 64}
    assert {c["q"] for c in d512} == {"bf16", "fp8"}
    assert {c["descale"] for c in d512} >= {"none", "one", "per"}
    assert {c.get("splits") for c in d512 if not c.get("auto")} >= {None, 2, 3, 4}
    # prefills past the route's split-KV limit (16 new tokens), a few hundred rows with a prefix
    assert any(c.get("auto") and max(c["new"]) > 16 and c["lens"][0] > c["new"][0] for c in d512)
    assert max(max(c.get("new", [1])) for c in d512) >= 200
    # the row-block edges of the prefill block (32 rows): a multiple and one token / one row over
    bm = S.max_block_m(512)
    rows = {n * c["hq"] // c["hkv"] for c in d512 if c.get("auto") for n in c["new"]}
    assert {bm * 8, bm * 8 + 8, bm, bm + 1} <= rows
    assert any(c["d"] == 256 and c.get("window") == (1023, 0) and c["hq"] // c["hkv"] == 2 for c in flat)
    # image rows: the window's left bound cuts into an image, an image's far end in a later split
    assert any(c.get("images") and c.get("window") and any(e - b > c["window"][0] for _, b, e in c["images"])
               for c in flat)
    assert any(c.get("images") and (c.get("splits") or 1) > 1 for c in flat)


# ---- host side (no interpreter) ------------------------------------------------------------------


def _args(batch=2, width=40, P=16, hq=32, hkv=4, d=512, q_dtype=BF16, new=1):
    k = torch.zeros(batch * width + 1, P, hkv, d).to(FP8)
    q = torch.zeros(1, hq, d).to(q_dtype).expand(batch * new, hq, d)  # a plan reads shapes, not data
    return dict(q=q, k_cache=k, v_cache=k.clone(),
                page_table=torch.zeros(batch, width, dtype=torch.int32),
                cache_seqlens=torch.full((batch,), 300, dtype=torch.int32),
                cu_seqlens_q=torch.arange(0, batch * new + 1, new, dtype=torch.int32))


@pytest.mark.parametrize("limit", ["0", "16", "256"])
def test_the_plan_never_picks_the_gather_at_d512(limit, monkeypatch, reload_settings):
    """Every call size (decode, short and long extends, prefills, no host max_seqlen_q), both q
    dtypes, with and without the LSE, whatever SGLANG_FA4_FP8_KV_SPLIT_KV_MAX_Q says: the split-KV
    kernel. The same calls at d128 with E4M3 q take the gather past the limit (the rule's control)."""
    monkeypatch.setenv("SGLANG_FA4_FP8_KV_SPLIT_KV_MAX_Q", limit)
    reload_settings()
    for q_dtype in (BF16, FP8):
        for new, max_q in ((1, 1), (16, 16), (17, 17), (300, 300), (300, None), (8192, 8192)):
            for lse in (False, True):
                kw = _args(q_dtype=q_dtype, new=new)
                p = fp8_paged_kv.plan(**kw, max_seqlen_q=max_q, causal=True, return_lse=lse)
                assert p.backend == SPLIT_KV, (q_dtype, new, max_q, lse)
                assert p.decode.block_m <= S.max_block_m(512) and p.decode.block_n == (32 if new == 1 else 16)
    assert fp8_paged_kv.plan(**_args(d=128, q_dtype=FP8, new=300), max_seqlen_q=300, causal=True).backend == GATHER
    # bf16 q has no FP8 forward behind the gather at any head dim
    assert fp8_paged_kv.plan(**_args(d=128, q_dtype=BF16, new=300), max_seqlen_q=300, causal=True).backend == SPLIT_KV


def test_the_routing_rule():
    limit = 16  # the default setting (conftest leaves the environment's defaults)
    assert B.route(512, BF16, 8192, False) == B.route(512, FP8, None, False) == SPLIT_KV
    assert B.route(128, BF16, 8192, False) == SPLIT_KV
    assert [B.route(256, FP8, m, False) for m in (1, limit, limit + 1, None, 0)] == [SPLIT_KV, SPLIT_KV, GATHER,
                                                                                    GATHER, GATHER]
    assert B.route(256, FP8, 4096, True) == SPLIT_KV  # the LSE
    assert B.gather_runs(256, FP8) and not B.gather_runs(512, FP8) and not B.gather_runs(128, BF16)


def _on(device, args):
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in args.items()}


def test_forcing_the_gather_at_d512_is_refused_naming_the_head_dim(device):
    with pytest.raises(PagedKVError, match="head_dim 512: the gather route's SM90 FP8 forward runs"):
        fp8_paged_kv.plan(**_on(device, _args(q_dtype=FP8, new=300)), max_seqlen_q=300, causal=True, backend=GATHER)


@pytest.mark.parametrize("d", [320, 1024, 80])
@pytest.mark.parametrize("q_dtype", [BF16, FP8])
@pytest.mark.parametrize("new", [1, 300])
def test_a_head_dim_no_kernel_runs_is_refused_naming_it(d, q_dtype, new, device):
    with pytest.raises(PagedKVError, match=rf"head_dim {d} is not one the FP8 KV kernels run \(64, 96, 128, 192, "
                                           r"256, 512\)"):
        fp8_paged_kv.paged_kv_attention(**_on(device, _args(d=d, hq=8, hkv=4, q_dtype=q_dtype, new=new, width=4)),
                                        max_seqlen_q=new, causal=True)


def test_d512_block_sizes():
    """Decode of GQA 8 (8 rows): 16 rows x 32 keys, 4 warps (measured fastest on an H100), capped at
    168 registers in two head-dim pieces while the batch leaves the GPU unfilled (the split regime),
    uncapped and whole once it fills it; prefills: 32-row blocks, 16 keys, 8 warps, no register cap
    (decode_plan.block_n's docstring)."""
    dec = S.plan(8, 4, 8, 512, 1, 8192, 132)
    assert (dec.block_m, dec.row_blocks, dec.block_n, dec.num_warps, dec.maxnreg, dec.d_pieces) == (16, 1, 32, 4, 168, 2)
    dec = S.plan(64, 4, 8, 512, 1, 8192, 132)
    assert (dec.block_m, dec.row_blocks, dec.block_n, dec.num_warps, dec.maxnreg, dec.d_pieces) == (16, 1, 32, 4, None, 1)
    pre = S.plan(1, 4, 8, 512, 300, 8192, 132)
    assert (pre.block_m, pre.row_blocks, pre.block_n, pre.num_warps, pre.maxnreg) == (32, 75, 16, 8, None)
    assert S.plan(1, 4, 8, 512, 4, 8192, 132).row_blocks == 1 and S.plan(1, 4, 8, 512, 5, 8192, 132).row_blocks == 2
    assert S.plan(1, 4, 8, 256, 300, 8192, 132).block_m == 64  # d <= 256 keeps its 64-row blocks
    assert S.plan(1, 4, 8, 512, 300, 8192, 132, launch={"block_m": 16}).row_blocks == 150
    with pytest.raises(PagedKVError, match="launch block_m must be a power of two >= 16"):
        S.plan(1, 4, 8, 512, 300, 8192, 132, launch={"block_m": 24})


@pytest.mark.parametrize("q", ["bf16", "fp8"])
def test_d512_programs_fit_sm90_registers_without_spills(q):
    """The plan's decode and prefill programs at d512, compiled for sm_90a (Triton's ptxas, no
    GPU): the prefill program without a spill; the decode program (16 x 32 keys, 4 warps, one
    split) with at most 104 bytes of stack, none with several splits."""
    pytest.importorskip("triton")
    from benchmark.lab.decode_regs import resources

    for rows, single, stack in ((1, True, 104), (1, False, 0), (300, True, 0)):
        p = S.plan(1, 4, 8, 512, rows, 8192, 132)
        try:
            r = resources(512, p.block_m, p.block_n, p.num_warps, p.num_stages, q=q, single=single, g=8)
        except (ImportError, OSError, subprocess.CalledProcessError) as exc:
            pytest.skip(f"no sm_90a compile here: {exc}")
        assert r["stack"] <= stack and r["reg"] <= 255 and r["mma"] > 0, (rows, single, r)


def test_the_warmup_lists_the_d512_split_kv_variants_only(monkeypatch):
    """A d512 layer (bf16 q): the split-KV kernel's decode and prefill row blocks, with bf16 q; no
    FP8 forward (it has no d512) and no page gather -- also with the route's limit 0."""
    from sglang_fa4.kernels.fp8_paged_kv import warmup as W
    from sglang_fa4.kernels.settings import RoutingSettings
    from sglang_fa4.startup.variants import LlmAttentionShape, WarmItem, llm_fp8_kv_warmup_list

    for limit in (16, 0):
        items = llm_fp8_kv_warmup_list(LlmAttentionShape(512, 32, 4, 16, q_dtype="bfloat16"),
                                       RoutingSettings(split_kv_max_q=limit))
        assert items == [WarmItem("fp8_paged_decode", W.SplitKvShape(512, 32, 4, 16, limit, "bfloat16"))]
        assert items[0].describe() == ("fp8_paged_decode fp8 split-KV decode d=512 heads=32/4 page=16 q=bfloat16 "
                                       "every call")
    assert llm_fp8_kv_warmup_list(LlmAttentionShape(320, 32, 4, 16, q_dtype="bfloat16"), RoutingSettings()) == []
    # the sliding layers keep their list (split-KV decode, FP8 forward causal + local, the gather)
    swa = [i.family for i in llm_fp8_kv_warmup_list(LlmAttentionShape(256, 32, 16, 16, 1023), RoutingSettings())]
    assert swa == ["fp8_paged_decode", "fp8_forward", "fp8_forward", "fp8_paged_gather"]
    seen = []
    monkeypatch.setattr(W, "paged_decode_attention", lambda q, k, v, t, s, cu, max_q, **kw: seen.append(
        (max_q, kw["num_splits"], kw["return_lse"], kw["launch"], q.dtype, tuple(q.shape))))
    decode = [(1, splits, lse) for splits in (1, 2) for lse in (False, True)]
    for limit in (16, 0):
        seen.clear()
        W.warm_split_kv(W.SplitKvShape(512, 32, 4, 16, limit, "bfloat16"), "cpu")
        # GQA 8: one new token -> 16-row blocks, in the split regime's launch and the filled GPU's;
        # 3 -> 32 (the largest at d512), its one launch; bf16 q
        assert [c[:4] for c in seen] == ([(*c, S.SPLIT_REGIME_LAUNCH) for c in decode]
                                         + [(*c, S.FILLED_LAUNCH) for c in decode]
                                         + [(3, 1, False, None), (3, 2, False, None)]), limit
        assert {c[4] for c in seen} == {BF16} and seen[-1][5] == (3, 32, 512)
    # a multimodal model: the image prefill variants too (every row block, one split and several, no
    # LSE), also where decode would take the gather (d256, the route's limit 0: image calls only)
    monkeypatch.setattr(W, "paged_decode_attention", lambda q, k, v, t, s, cu, max_q, **kw: seen.append(
        (max_q, kw["num_splits"], kw.get("return_lse", False), kw.get("image_ranges") is not None)))
    seen.clear()
    W.warm_split_kv(W.SplitKvShape(512, 32, 4, 16, 16, "bfloat16", True), "cpu")
    # (the 16-row block in both launches)
    assert [c for c in seen if c[3]] == [(1, 1, False, True), (1, 2, False, True)] * 2 + [
        (3, 1, False, True), (3, 2, False, True)]
    assert len([c for c in seen if not c[3]]) == 10
    seen.clear()
    W.warm_split_kv(W.SplitKvShape(256, 32, 16, 16, 0, "float8_e4m3fn", True), "cpu")
    # GQA 2: 1-8 new tokens -> 16-row blocks (both launches), 9-16 -> 32, 17-32 -> 64; image variants only
    assert seen == [(m, s, False, True) for m in (1, 1, 9, 17) for s in (1, 2)]
    items = llm_fp8_kv_warmup_list(LlmAttentionShape(256, 32, 16, 16, 1023, images=True),
                                   RoutingSettings(split_kv_max_q=0))
    assert items[0] == WarmItem("fp8_paged_decode", W.SplitKvShape(256, 32, 16, 16, 0, "float8_e4m3fn", True))
    assert items[0].describe().endswith("new tokens <= 0, image rows")


def test_the_backend_layer_shape_says_bf16_q_at_d512(monkeypatch):
    import types

    from sglang_fa4.integration import llm_fp8_kv
    from sglang_fa4.startup import warmup

    warmed = []
    monkeypatch.setattr(warmup, "warm_llm_fp8_kv", lambda shape, device: warmed.append(shape))
    monkeypatch.setattr(llm_fp8_kv, "is_sm90", lambda device: True)
    backend = types.SimpleNamespace(fa_impl_ver=4, kv_cache_dtype_str="fp8_e4m3", kv_cache_dtype=FP8, use_mla=False,
                                    device="cuda", head_dim=512, has_swa=False, num_attention_heads=32,
                                    num_kv_heads=4, page_size=16)
    for multimodal in (True, False):  # FlashAttentionBackend.__init__(model_runner, ...)
        runner = types.SimpleNamespace(model_config=types.SimpleNamespace(is_multimodal=multimodal))
        llm_fp8_kv.warm_fp8_after_backend_init(None, backend, runner)
    assert [(s.head_dim, s.q_dtype, s.images) for s in warmed] == [(512, "bfloat16", True), (512, "bfloat16", False)]

    backend = types.SimpleNamespace(head_dim=512, has_swa=False, num_attention_heads=32, num_kv_heads=4, page_size=16)
    assert llm_fp8_kv.layer_shape(backend).q_dtype == "bfloat16"
    assert llm_fp8_kv.layer_shape(types.SimpleNamespace(**{**vars(backend), "head_dim": 256})).q_dtype == \
        "float8_e4m3fn"


def test_gemma4s_sliding_layers_are_warmed_with_their_own_shape(monkeypatch):
    """A hybrid model whose sliding layers have another head dim / kv head count than the backend's
    (Gemma-4 31B: full d512 x 4 kv heads, sliding d256 x 16, window 1023) warms both layer types;
    a model whose sliding layers share the backend's shape, or has none, warms one."""
    import types

    from sglang_fa4.integration import llm_fp8_kv
    from sglang_fa4.startup import warmup

    warmed = []
    monkeypatch.setattr(warmup, "warm_llm_fp8_kv", lambda shape, device: warmed.append(shape))
    monkeypatch.setattr(llm_fp8_kv, "is_sm90", lambda device: True)

    def config(swa_dim, swa_kv, multimodal=False):
        return types.SimpleNamespace(is_multimodal=multimodal, swa_head_dim=swa_dim,
                                     get_swa_num_kv_heads=lambda tp: swa_kv // tp)

    backend = types.SimpleNamespace(fa_impl_ver=4, kv_cache_dtype_str="fp8_e4m3", kv_cache_dtype=FP8, use_mla=False,
                                    device="cuda", head_dim=512, has_swa=True, sliding_window_size=1023,
                                    num_attention_heads=32, num_kv_heads=4, page_size=16)
    llm_fp8_kv.warm_fp8_after_backend_init(None, backend, types.SimpleNamespace(model_config=config(256, 16), tp_size=1))
    assert [(s.head_dim, s.kv_heads, s.sliding_window, s.q_dtype) for s in warmed] == [
        (512, 4, 1023, "bfloat16"), (256, 16, 1023, "float8_e4m3fn")]
    warmed.clear()  # tensor parallel 2: each rank's kv heads
    llm_fp8_kv.warm_fp8_after_backend_init(None, backend, types.SimpleNamespace(model_config=config(256, 16), tp_size=2))
    assert [(s.head_dim, s.kv_heads) for s in warmed][1] == (256, 8)
    shared = types.SimpleNamespace(**{**vars(backend), "head_dim": 128, "num_kv_heads": 8})
    assert llm_fp8_kv.sliding_layer_shape(shared, types.SimpleNamespace(model_config=config(128, 8))) is None
    no_swa = types.SimpleNamespace(**{**vars(backend), "has_swa": False})
    assert llm_fp8_kv.sliding_layer_shape(no_swa, types.SimpleNamespace(model_config=config(256, 16))) is None
    assert llm_fp8_kv.sliding_layer_shape(backend, None) is None


def test_the_decode_bench_measures_gemma4s_full_layers_with_bf16_q(monkeypatch):
    """``sglang-fa4 bench decode --models gemma4-31b-full`` (not in the default matrix): our kernel
    gets the bf16 q SGLang hands at d512 (q8's values), and matches the fp32 contract."""
    from sglang_fa4.bench import decode
    from sglang_fa4.kernels.fp8_paged_kv import attention

    assert "gemma4-31b-full" not in decode.MODELS and decode.OPTIONAL_MODELS["gemma4-31b-full"] == (32, 4, 512)
    seen = []
    real = attention.run
    monkeypatch.setattr(attention, "run", lambda plan, q, *a, **k: seen.append(q.dtype) or real(plan, q, *a, **k))
    case = decode.Case("gemma4-31b-full", 2, 40, 16, 512, 32, 4)
    x = decode.make_inputs(case, "cpu", 0)
    calls, outs, errors, _ = decode.runners(case, x, ["fa4_fp8_split_kv"])
    assert not errors
    calls["fa4_fp8_split_kv"]()
    rows, ref = decode.reference_rows(case, x)
    got = outs["fa4_fp8_split_kv"][rows].float()
    assert seen == [BF16] and float((got - ref).norm() / ref.norm()) < 1e-2
