"""The paged FP8 decode kernel (kernels/fp8_paged_kv/decode.py) in Triton's CPU interpreter, against an
fp64 reference on the dequantized pool (pools NaN-poisoned first: tests/fp8_decode_child.py), plus
its host side on the CPU: the split heuristic, the launch plan, the route's plan (input checks, the
routing setting), and no host sync with a grid that depends on host facts only (what SGLang's
decode CUDA graphs need).

The interpreted matrix runs in ONE child process (Triton must see TRITON_INTERPRET before it is
imported); its cost is programs x loop steps, so the cross product is cut: every head dim meets
every GQA ratio once, page sizes / windows / split counts / descale kinds rotate over those 20
cases, and only three cases have contexts in the thousands (one kv head)."""

from __future__ import annotations


import pytest
import torch

from sglang_fa4.kernels import fp8_paged_kv
from sglang_fa4.kernels.fp8_paged_kv import PagedKVError
from sglang_fa4.kernels.fp8_paged_kv import decode as D
from sglang_fa4.kernels.fp8_paged_kv import decode_plan as S
from sglang_fa4.kernels.fp8_paged_kv import warmup as W
from sglang_fa4.kernels.fp8_paged_kv.decode_plan import MAX_SPLITS, choose_splits

FP8 = torch.float8_e4m3fn


def _matrix_cases() -> dict:
    cases = {}
    pages = (1, 16, 64, 32, 4)
    for i, (d, g) in enumerate((d, g) for d in D.HEAD_DIMS for g in (1, 4, 7, 8)):
        P = pages[i % len(pages)]
        hkv = 2 if i % 4 == 1 else 1
        # exactly one page, one token past it, a few pages and a bit; every other case a single token
        lens = ([1] if i % 2 else []) + [P, P + 1, 2 * P + 37]
        c = dict(lens=lens, page=P, hq=g * hkv, hkv=hkv, d=d, seed=i,
                 window=(37, 0) if i % 3 == 0 else None, splits=(None, 2, 3)[i % 3],
                 descale=("per", "wide", "scalar", "none")[i % 4], q="bf16" if i % 5 == 4 else "fp8")
        if i % 7 == 3:  # non-causal (SGLang's cascade / decode calls), a window open on both sides
            c.update(causal=False, window=(20, 5) if i % 2 else None)
        cases[f"d{d}-g{g}-P{P}-hkv{hkv}"] = c
    # batch 64 (ragged lengths 1..300): the heuristic keeps one split (short contexts)
    cases["batch64"] = dict(lens=[1 + (37 * b) % 300 for b in range(64)], page=16, hq=4, hkv=1, d=128)
    # contexts in the thousands: the heuristic's own split counts (16; 19 over a window's range; 64)
    cases["long-4097-P64"] = dict(lens=[4097], page=64, hq=8, hkv=1, d=128)
    cases["long-5000-window-P1"] = dict(lens=[5000], page=1, hq=7, hkv=1, d=256, window=(700, 0), sms=8)
    cases["long-2500-mha-noncausal"] = dict(lens=[2500], page=16, hq=1, hkv=1, d=64, causal=False, splits=MAX_SPLITS)
    # more splits than keys (empty splits), one token, exactly one page split in two
    cases["ctx3-splits8"] = dict(lens=[3, 1], page=16, hq=4, hkv=1, d=64, splits=8)
    cases["ctx1-splits64"] = dict(lens=[1], page=1, hq=8, hkv=1, d=96, splits=64)
    cases["one-page-P64-splits2"] = dict(lens=[64], page=64, hq=7, hkv=1, d=192, splits=2)
    # a page table 8192 tokens wide over short contexts (SGLang's decode graphs): the plan's 32
    # splits meet MIN_KEYS_PER_SPLIT on the device, so all but the first two stay empty
    cases["wide-table-empty-splits"] = dict(lens=[300, 40, 257], page=16, hq=4, hkv=1, d=128, width=512)
    # the kernel's edges (issue #44, item 5), where Gemma-4's sliding layers live:
    # a sliding-window extend at d256 whose window (20) is narrower than the spread of the rows (64
    # tokens x 2 heads: two row blocks): a row block's first key block and whole splits hold none
    # of some rows' keys
    cases["edge-window-narrower-than-rows-d256"] = dict(lens=[600, 90], new=[64, 2], page=16, hq=4, hkv=2, d=256,
                                                        window=(20, 0), splits=4)
    # a causal extend whose last split has fewer keys (10) than new rows (48): rows that end before
    # it see nothing there (-inf LSE partials in the combine)
    cases["edge-last-split-shorter-than-rows"] = dict(lens=[714], new=[48], page=16, hq=2, hkv=1, d=256, splits=3)
    # k and v descales in different layouts
    cases["edge-descales-per-k-scalar-v"] = dict(lens=[77, 300], page=16, hq=8, hkv=2, d=128, descale="per",
                                                 descale_v="scalar")
    cases["edge-descales-none-k-one-v"] = dict(lens=[33], page=1, hq=4, hkv=1, d=64, descale="none", descale_v="one")
    cases["edge-descales-wide-k-none-v"] = dict(lens=[129, 5], page=64, hq=7, hkv=1, d=192, descale="wide",
                                                descale_v="none")
    # non-causal (left, 0) windows over several rows, and a window of 0 (each row its own key)
    cases["edge-noncausal-left-window-rows"] = dict(lens=[200], new=[12], page=16, hq=4, hkv=1, d=128,
                                                    causal=False, window=(30, 0))
    cases["edge-window-zero"] = dict(lens=[64, 9], new=[5, 1], page=4, hq=2, hkv=1, d=64, causal=False, window=(0, 0))
    # a column-sliced page table (row stride wider than its columns) and a zero-length sequence
    cases["edge-column-sliced-table"] = dict(lens=[100, 250], page=16, hq=4, hkv=1, d=128, slice_table=True)
    cases["edge-zero-length-sequence"] = dict(lens=[0, 130, 0], new=[0, 3, 0], page=16, hq=4, hkv=1, d=128)
    # extend with a few new rows per sequence through the same kernel (bottom-right causal)
    cases["extend-few-rows"] = dict(lens=[70, 300, 17], new=[5, 16, 17], page=16, hq=4, hkv=1, d=128, splits=3)
    # decode == extend for one cache: its last rows (window off / on, different split structures)
    cases["decode-vs-extend"] = dict(L=200, n=24, page=16, hq=7, hkv=1, d=128, decode_splits=2)
    cases["decode-vs-extend-window"] = dict(L=160, n=16, page=1, hq=4, hkv=1, d=64, window=(50, 0), extend_splits=2)
    # the launch candidate (decode_plan.CANDIDATE: page indices loaded a key block ahead) on every
    # head dim at GQA 7 and every page size, the kernel's edges (windows narrower than the rows,
    # empty splits, a column-sliced table, a zero-length sequence), an extend and decode == extend
    for name in [n for n in cases if "-g7-" in n or "-g1-" in n] + [
            "edge-window-narrower-than-rows-d256", "edge-last-split-shorter-than-rows", "ctx3-splits8",
            "wide-table-empty-splits", "edge-column-sliced-table", "edge-zero-length-sequence", "extend-few-rows",
            "decode-vs-extend", "decode-vs-extend-window"]:
        cases[f"candidate-{name}"] = {**cases[name], "launch": dict(S.CANDIDATE)}
    # the head dim in two column pieces (launch d_pieces=2, the split regime's): every head dim at
    # GQA 7 (96 and 192 with a padded, masked second piece), the edges, decode == extend
    for name in [n for n in cases if "-g7-" in n] + [
            "edge-window-narrower-than-rows-d256", "edge-last-split-shorter-than-rows", "ctx3-splits8",
            "edge-descales-wide-k-none-v", "edge-zero-length-sequence", "decode-vs-extend", "decode-vs-extend-window"]:
        cases[f"pieces-{name}"] = {**cases[name], "launch": {"d_pieces": 2}}
    # (above head dim 128 the plan's own launch is two pieces only in the split regime, which these
    # short contexts stay out of but for long-5000-window-P1: the default cases run the whole head dim)
    return cases


CASES = _matrix_cases()


@pytest.fixture(scope="module")
def interpreted():
    pytest.importorskip("triton")
    import fp8_decode_child

    return fp8_decode_child.run_interpreted(CASES)


@pytest.mark.parametrize("name", list(CASES))
def test_interpreted_kernel_matches_fp64_on_the_dequantized_pool(interpreted, name):
    r = interpreted[name]
    assert "error" not in r, r
    assert r["finite"], r  # nothing of the NaN-poisoned free memory was read
    assert r["rel_err"] < 5e-3, r
    assert r["max_excess"] <= 0, r  # every element within bf16 rounding (+ fp16 P)
    assert r["lse_err"] < 1e-4, r
    if "L" in CASES[name]:
        assert r["decode_rel_err"] < 5e-3, r
    else:
        assert r["into_out"], r  # a bf16 out of the right shape is written in place


def test_the_matrix_covers_what_it_claims():
    flat = [c for c in CASES.values() if "L" not in c]
    assert {c["d"] for c in flat} == set(D.HEAD_DIMS)
    assert {(c["d"], c["hq"] // c["hkv"]) for c in flat} >= {(d, g) for d in D.HEAD_DIMS for g in (1, 4, 7, 8)}
    assert {c["page"] for c in flat} >= {1, 4, 16, 32, 64}
    assert max(len(c["lens"]) for c in flat) == 64 and max(max(c["lens"]) for c in flat) > 4096
    assert any(c.get("window") for c in flat) and any(not c.get("window") for c in flat)
    for P in (1, 4, 16, 32, 64):  # a length of exactly one page and one off it, per page size
        assert any(c["page"] == P and P in c["lens"] and P + 1 in c["lens"] for c in flat), P
    # splits > 1 forced, more splits than keys, and the heuristic's own choice on the long contexts
    assert any((c.get("splits") or 0) > max(c["lens"]) for c in flat)
    long = CASES["long-4097-P64"]
    width = -(-4097 // 64) + 1
    assert S.plan(1, 1, 8, 128, 1, width * 64, 132).num_splits == 16 and long.get("splits") is None


def test_decode_equals_extend_row_for_row(interpreted):
    for name in ("decode-vs-extend", "decode-vs-extend-window"):
        r = interpreted[name]
        assert "error" not in r and r["finite"] and r["max_excess"] <= 0, (name, r)


# ---- host side (no interpreter) ------------------------------------------------------------------


def test_choose_splits_fills_one_wave_from_host_facts():
    # batch 1, 4 kv heads, 128k context, 132 SMs: 4 * 132 / 4 = 132 fit a wave, capped at MAX_SPLITS
    assert choose_splits(1, 4, 1, 131072, 132) == MAX_SPLITS
    # batch 64 x 4 kv heads = 256 CTAs: 2 splits fill 512 of the wave's 528, 3 would start a second
    assert choose_splits(64, 4, 1, 4096, 132) == 2
    # batch 8 x 8 kv heads = 64 CTAs: 8 splits exactly (512), not 9 (576: the H100's 1.20x case)
    assert choose_splits(8, 8, 1, 8192, 132) == 8
    # exact capacity: 66 x 8 = 528 CTAs in one wave; with 131 SMs (524) 66 no longer fit, 65 do
    assert choose_splits(1, 8, 1, 10**6, 132, max_splits=66) == 66
    assert choose_splits(1, 8, 1, 10**6, 131, max_splits=66) == 65  # 524 // 8
    # the batch alone fills a wave (exactly, one under, one past): no split
    assert choose_splits(132, 4, 1, 4096, 132) == choose_splits(131, 4, 1, 4096, 132) == 1
    assert choose_splits(133, 4, 1, 4096, 132) == 1 and choose_splits(66, 4, 1, 4096, 132) == 2
    # d > 128 holds 2 CTAs an SM: the wave is half as wide (3 in the split regime's launch)
    assert S.programs_per_sm(128) == 4 and S.programs_per_sm(256) == S.programs_per_sm(512) == 2
    assert S.plan(1, 8, 4, 128, 1, 32768, 132).num_splits == 64
    assert S.plan(1, 8, 2, 256, 1, 32768, 132).num_splits == 396 // 8 == 49
    assert S.plan(1, 8, 2, 256, 1, 32768, 132, launch={"programs_per_sm": 2}).num_splits == 33
    # short contexts: no split below MIN_KEYS_PER_SPLIT keys (511 keys: 1; 512: 2)
    assert choose_splits(1, 1, 1, 511, 132) == 1 and choose_splits(1, 1, 1, 512, 132) == 2
    assert choose_splits(0, 4, 1, 4096, 132) == 1 and choose_splits(2, 4, 1, 0, 132) == 1
    assert choose_splits(1, 1, 1, 10**6, 132, max_splits=7) == 7
    assert choose_splits(1, 1, 2, 10**6, 8, programs_per_sm=1) == 4  # row blocks count as CTAs
    for bad in (dict(batch=-1), dict(sm_count=0), dict(max_context=1.5), dict(max_splits=0)):
        args = {**dict(batch=1, kv_heads=1, row_blocks=1, max_context=1, sm_count=1), **bad}
        with pytest.raises(ValueError, match=next(iter(bad))):
            choose_splits(**args)


def test_split_regime_launch_above_head_dim_128_while_the_batch_leaves_the_gpu_unfilled():
    """Above head dim 128 a decode program (16 rows) takes SPLIT_REGIME_LAUNCH (two head-dim pieces,
    168 registers, 3 CTAs an SM) exactly while the one-wave rule at 3 CTAs an SM splits the keys:
    the batch's CTAs at most half of 3 x SMs and the context at least two splits long. Elsewhere the
    whole head dim, no cap, 2 CTAs an SM; at d <= 128 the page indices a block ahead, 4 CTAs."""
    def facts(p):
        return p.d_pieces, p.maxnreg, p.prefetch_pages

    regime, filled = (2, 168, False), (1, None, False)
    # 132 SMs: 396 CTAs a wave at 3 an SM; 198 CTAs split in two, 199 do not (exact boundary)
    assert facts(S.plan(99, 2, 2, 256, 1, 8192, 132)) == regime and S.plan(99, 2, 2, 256, 1, 8192, 132).num_splits == 2
    assert facts(S.plan(199, 1, 2, 256, 1, 8192, 132)) == filled
    assert S.plan(199, 1, 2, 256, 1, 8192, 132).num_splits == 1  # 264 // 199 at 2 CTAs an SM
    assert facts(S.plan(198, 1, 2, 256, 1, 8192, 132)) == regime
    # the SM count is a host fact of its own: 133 SMs fit 199 CTAs twice over (399 // 199)
    assert facts(S.plan(199, 1, 2, 256, 1, 8192, 133)) == regime
    # a context too short for two splits (min_chunk 256: 511 keys one split, 512 two)
    assert facts(S.plan(1, 1, 2, 256, 1, 511, 132)) == filled and facts(S.plan(1, 1, 2, 256, 1, 512, 132)) == regime
    assert facts(S.plan(1, 1, 2, 256, 1, 512, 132, launch={"min_chunk": 512})) == filled
    # d512 (32 keys a step) and d192 as d256; d128 never (and its page indices go a block ahead)
    assert facts(S.plan(8, 4, 8, 512, 1, 8192, 132)) == regime and facts(S.plan(64, 4, 8, 512, 1, 8192, 132)) == filled
    assert facts(S.plan(1, 1, 7, 192, 1, 8192, 132)) == regime
    assert facts(S.plan(1, 1, 7, 128, 1, 8192, 132)) == (1, 128, True)
    # wider row blocks (extends of several tokens, d512 prefill) keep their launch
    assert facts(S.plan(1, 1, 8, 256, 4, 8192, 132)) == filled and S.plan(1, 1, 8, 256, 4, 8192, 132).block_m == 32
    # an explicit launch overrides the regime's key by key
    p = S.plan(1, 1, 2, 256, 1, 8192, 132, launch={"d_pieces": 1})
    assert facts(p) == (1, 168, False) and p.num_splits == 32  # 8192 // 256 keys a split: context-bound
    assert facts(S.plan(1, 1, 2, 256, 1, 8192, 132, launch=S.FILLED_LAUNCH)) == filled
    # what the warmup resolves: both launches where the plan may choose either, one elsewhere
    assert S.launch_variants(256, 16) == (S.SPLIT_REGIME_LAUNCH, S.FILLED_LAUNCH)
    assert S.launch_variants(512, 16) == (S.SPLIT_REGIME_LAUNCH, S.FILLED_LAUNCH)
    assert S.launch_variants(256, 32) == S.launch_variants(128, 16) == ({},)
    assert [S.in_split_regime(1, 1, 1, 8192, 132, d, 16) for d in (128, 129)] == [False, True]
    # the interpreter matrix's long-5000-window-P1 (d256, 8 SMs) runs the split regime's launch by its
    # own plan; its short-context cases run the whole head dim
    assert CASES["long-5000-window-P1"]["d"] == 256 and S.plan(1, 1, 7, 256, 1, 5001, 8).d_pieces == 2
    assert S.plan(1, 1, 7, 256, 1, 400, 132).d_pieces == 1


def test_splits_filling_waves_past_one_wave():
    """The candidate's split rule (launch fill_waves): the one-wave rule's count while two splits fit
    one wave; past that, the fewest splits whose CTAs use their waves within FILL_SLACK of the best
    count, where the one-wave rule keeps 1 however little of its last wave the batch fills."""
    fill = S.choose_splits_filling_waves
    wave = 3 * 132
    # d256 batch 64 x 8 kv heads: 512 CTAs use 65% of two waves; 3 splits: 1536 of four waves' 1584
    assert S.wave_use(512, wave) == 512 / 792 and S.wave_use(1536, wave) == 1536 / 1584
    assert choose_splits(64, 8, 1, 8192, 132, programs_per_sm=3) == 1
    assert fill(64, 8, 1, 8192, 132, programs_per_sm=3) == 3
    assert fill(32, 8, 1, 8192, 132, programs_per_sm=3) == 3  # 256 CTAs: 768 of two waves' 792
    # room for two splits in one wave (198 CTAs, exact boundary): the one-wave rule's count, not fewer
    for batch, hkv, ctx in ((99, 2, 8192), (1, 8, 8192), (16, 8, 8192), (1, 1, 10**6)):
        assert fill(batch, hkv, 1, ctx, 132, programs_per_sm=3) == choose_splits(batch, hkv, 1, ctx, 132,
                                                                                programs_per_sm=3)
    assert fill(99, 2, 1, 8192, 132, programs_per_sm=3) == 2
    # 199 CTAs: past it; the count is the fewest within the slack of the best use (checked by definition)
    got = fill(199, 1, 1, 8192, 132, programs_per_sm=3)
    uses = {n: S.wave_use(199 * n, wave) for n in range(1, 33)}
    assert uses[got] >= max(uses.values()) - S.FILL_SLACK
    assert all(uses[n] < max(uses.values()) - S.FILL_SLACK for n in range(1, got)) and got > 1
    # the context and max_splits bound it as they bound the one-wave rule
    assert fill(64, 8, 1, 511, 132, programs_per_sm=3) == 1 and fill(64, 8, 1, 512, 132, programs_per_sm=3) == 2
    assert fill(64, 8, 1, 8192, 132, programs_per_sm=3, max_splits=2) == 2
    assert fill(0, 8, 1, 8192, 132, programs_per_sm=3) == 1 == fill(64, 8, 1, 0, 132, programs_per_sm=3)
    # through the plan: the candidate launch at d256 batch 64 (not the split regime: one wave is full)
    p = S.plan(64, 8, 2, 256, 1, 8192, 132, launch=S.CANDIDATE)
    assert (p.num_splits, p.d_pieces, p.maxnreg) == (3, 2, 168) and S.CANDIDATE["fill_waves"] is True
    assert S.plan(64, 8, 2, 256, 1, 8192, 132).num_splits == 1  # the default: 512 CTAs at 2 an SM
    with pytest.raises(PagedKVError, match="fill_waves must be true or false, got 1"):
        S.plan(64, 8, 2, 256, 1, 8192, 132, launch={"fill_waves": 1})


def test_plan_blocks_and_bounds():
    p = S.plan(8, 4, 7, 128, 1, 8192, 132)
    assert (p.block_m, p.row_blocks, p.block_n) == (16, 1, 64)  # 7 rows padded to 16
    p = S.plan(8, 4, 8, 256, 16, 8192, 132)
    assert (p.block_m, p.row_blocks, p.block_n) == (64, 2, 64)  # 128 rows in 2 blocks
    assert S.plan(1, 1, 1, 64, 1, 100, 132, num_splits=5).num_splits == 5
    with pytest.raises(PagedKVError, match="num_splits"):
        S.plan(1, 1, 1, 64, 1, 100, 132, num_splits=MAX_SPLITS + 1)
    assert D.window_bounds(True, (-1, -1)) == (D.UNBOUNDED, 0)
    assert D.window_bounds(False, (127, 3)) == (127, 3) and D.window_bounds(True, (127, 0)) == (127, 0)
    with pytest.raises(PagedKVError, match="right window"):
        D.window_bounds(True, (127, 4))


def _call_args(batch=3, width=8, P=16, hq=8, hkv=2, d=128):
    k = torch.zeros(batch * width + 1, P, hkv, d).to(FP8)
    return dict(q=torch.zeros(batch, hq, d).to(FP8), k_cache=k, v_cache=k.clone(),
                page_table=torch.zeros(batch, width, dtype=torch.int32),
                cache_seqlens=torch.full((batch,), 5, dtype=torch.int32),
                cu_seqlens_q=torch.arange(batch + 1, dtype=torch.int32), max_seqlen_q=1)


@pytest.mark.parametrize("change,match", [
    (dict(q=torch.zeros(3, 8, 128)), "float8_e4m3fn or bfloat16"),
    (dict(q=torch.zeros(3, 8, 64).to(FP8)), "q's head_dim 64 differs"),
    (dict(q=torch.zeros(3, 7, 128).to(FP8)), "multiple of kv heads"),
    (dict(k_cache=torch.zeros(9, 16, 2, 80).to(FP8), v_cache=torch.zeros(9, 16, 2, 80).to(FP8),
          q=torch.zeros(3, 8, 80).to(FP8)), "head_dim 80"),
    (dict(k_cache=torch.zeros(25, 24, 2, 128).to(FP8), v_cache=torch.zeros(25, 24, 2, 128).to(FP8)), "power of two"),
    (dict(cu_seqlens_q=torch.arange(4)), "cu_seqlens_q must be int32"),
    (dict(cu_seqlens_q=torch.arange(3, dtype=torch.int32)), r"cu_seqlens_q must be int32 \(4,\)"),
    (dict(k_descale=torch.ones(3, 3)), r"k_descale must be a scalar or \(batch, kv_heads\)"),
    (dict(v_descale=[1.0]), "v_descale must be a tensor"),
    (dict(window_size=(10, 2)), "right window"),
    (dict(max_seqlen_q=torch.tensor(1)), "max_seqlen_q must be a host int"),
    (dict(out=torch.zeros(2, 8, 128, dtype=torch.bfloat16)), "out must hold"),
    (dict(page_table=torch.zeros(3, 8, dtype=torch.int64)), "page_table must be int32"),
])
def test_bad_input_is_refused_naming_it(change, match, device):
    kw = {**_call_args(), "causal": True, **change}
    kw = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    with pytest.raises(PagedKVError, match=match):
        fp8_paged_kv.paged_decode_attention(kw.pop("q"), kw.pop("k_cache"), kw.pop("v_cache"), kw.pop("page_table"),
                                            kw.pop("cache_seqlens"), kw.pop("cu_seqlens_q"), kw.pop("max_seqlen_q"), **kw)


class _NoSync:
    """Every way a device tensor reaches the host raises (as a CUDA-graph capture would fail)."""

    NAMES = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")

    def __enter__(self):
        self.saved = {n: getattr(torch.Tensor, n) for n in self.NAMES}

        def refuse(name):
            def f(*a, **k):
                raise AssertionError(f"host sync: Tensor.{name}")
            return f

        for n in self.NAMES:
            setattr(torch.Tensor, n, refuse(n))
        return self

    def __exit__(self, *exc):
        for n, f in self.saved.items():
            setattr(torch.Tensor, n, f)
        return False


def test_no_host_sync_and_a_grid_from_host_facts_only(monkeypatch, request):
    """SGLang's decode graphs capture with the page table at its full width (max context / P) and
    replay with new lengths in the same buffers: the launches must not read a device value and
    their grid and scalar arguments must not depend on the lengths."""
    previous = fp8_paged_kv.install_kernels(None)  # the launch path a GPU call takes (launches recorded)
    request.addfinalizer(lambda: fp8_paged_kv.install_kernels(previous))
    launches = []
    for h in (D.SPLIT, D.COMBINE):
        monkeypatch.setattr(h, "launch", lambda grid, args, index, _n=h.name, **o: launches.append(
            (_n, grid, tuple(a for a in args if not isinstance(a, torch.Tensor)))))
    kw = _call_args(batch=4, width=2048, P=16, hq=28, hkv=4)  # 32k tokens of page table per sequence
    for lens in ([1, 1, 1, 1], [30000, 17, 4096, 2]):
        kw["cache_seqlens"].copy_(torch.tensor(lens, dtype=torch.int32))
        with _NoSync():
            fp8_paged_kv.paged_decode_attention(
                **{k: kw[k] for k in ("q", "k_cache", "v_cache", "page_table", "cache_seqlens", "cu_seqlens_q",
                                      "max_seqlen_q")},
                k_descale=torch.tensor([0.5]).expand(4, 4), v_descale=torch.ones(4, 4), causal=True, return_lse=True,
                sms=132)
    assert len(launches) == 4 and launches[:2] == launches[2:]
    (n1, grid1, _), (n2, grid2, _) = launches[:2]
    splits = choose_splits(4, 4, 1, 2048 * 16, 132)
    assert (n1, grid1) == ("fp8_paged_decode_split", (1, 16, splits)) and splits == 33
    assert (n2, grid2) == ("fp8_paged_decode_combine", (4, 28))  # per (token, q head)


def test_kv_bytes_read():
    # b64 x 4k, 4 kv heads, d128, page 16: K and V once, E4M3, plus the page-table entries
    assert D.kv_bytes_read([4096] * 64, 4, 128, 16) == 2 * 64 * 4096 * 4 * 128 + 4 * 64 * 256
    assert D.kv_bytes_read([1, 17], 1, 64, 16) == 2 * 18 * 64 + 4 * 3


@pytest.mark.parametrize("name", ["d96-g4-P1-hkv2", "long-5000-window-P1", "ctx3-splits8", "extend-few-rows",
                                  "decode-vs-extend-window"])
def test_cpu_tensors_take_the_torch_path_with_the_same_contract(name):
    """Outside the interpreter a CPU call runs the contract in torch: the kernels the CPU harnesses
    install (sglang_fa4.testing.paged_kv_torch; conftest.py installs them for the tests)."""
    import fp8_decode_child as child

    c = CASES[name]
    r = (child.run_decode_vs_extend if "L" in c else child.run_case)(c, "cpu")
    assert r["finite"] and r["rel_err"] < 5e-3 and r["max_excess"] <= 0 and r["lse_err"] < 1e-4, r


def test_route_threshold_variable_is_bounded_and_read_once(monkeypatch, reload_settings):
    """SGLANG_FA4_FP8_KV_SPLIT_KV_MAX_Q, read into the routing settings (not per call): the route's
    plan sends a call to the split-KV kernel up to that many new tokens per sequence."""
    from sglang_fa4.environ import EnvValueError, envs

    def backend(max_q):
        kw = _call_args(batch=1)
        q = torch.zeros(max(max_q or 1, 1), 8, 128).to(FP8)
        cu = torch.tensor([0, q.shape[0]], dtype=torch.int32)
        return fp8_paged_kv.plan(q, kw["k_cache"], kw["v_cache"], kw["page_table"], kw["cache_seqlens"], cu,
                                 max_q, causal=True).backend

    var = envs.SGLANG_FA4_FP8_KV_SPLIT_KV_MAX_Q
    reload_settings()
    split, gather = fp8_paged_kv.SPLIT_KV, fp8_paged_kv.GATHER
    assert var.get() == 16 and [backend(m) for m in (16, 17, None)] == [split, gather, gather]
    monkeypatch.setenv(var.name, "256")
    assert backend(256) == gather  # the settings were read before: the variable is not read per call
    reload_settings()
    assert var.get() == 256 and backend(256) == split
    monkeypatch.setenv(var.name, "0")
    reload_settings()
    assert backend(1) == gather
    for bad in ("257", "-1"):
        monkeypatch.setenv(var.name, bad)
        with pytest.raises(EnvValueError, match=r">= 0 and <= 256"):
            var.get()


@pytest.mark.parametrize("d,single", [(128, False), (192, True), (512, False)])
def test_split_kernel_compiles_for_sm90_with_16_byte_kv_loads_and_tensor_cores(d, single):
    """Cross-compiled for sm_90 (no GPU needed) with the specialization a real launch gets (16-byte
    aligned pointers and strides): the E4M3 K/V tiles are read as 16-byte vectors (no byte-wise
    global access), both products run on the tensor cores (mma), and the page arithmetic of the
    key loop is shifts (no integer division: page sizes are powers of two)."""
    import re

    pytest.importorskip("triton")
    from benchmark.lab import decode_regs

    ptx = decode_regs.compile_split(d, 16, S.block_n(d), 4, q="fp8", single=single, g=7).asm["ptx"]
    ops = re.findall(r"\b(ld|st)\.global(\.v\d)?\.[bu](\d+)", ptx)
    assert not [o for o in ops if o[2] == "8"], "byte-wise global loads/stores"
    # the K and V tiles: 16-byte vectors, straight to registers or through cp.async into shared memory
    # (Triton's software pipeline of the key loop)
    vec = sum(1 for o in ops if o == ("ld", ".v4", "32"))
    vec += len(re.findall(r"cp\.async\.cg\.shared\.global \[[^\]]+\], \[[^\]]+\], (?:0x10|16)", ptx))
    assert vec >= 2, sorted(set(re.findall(r"\b(?:ld|cp\.async)[\w.]*", ptx)))
    assert re.search(r"\bmma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.f16\.f16\.f32", ptx)
    # the key loop: the basic blocks after the prologue (the split's key range takes divisions, once)
    blocks = re.split(r"\n\$L__BB0_\d+:", ptx)
    loop = [b for b in blocks[1:] if "mma.sync" in b]
    assert loop and not any(re.search(r"\b(div|rem)\.[su]\d+", b) for b in loop), "a division per key"


@pytest.mark.parametrize("d,rows", [(128, 4), (256, 2), (256, 64), (512, 8)])
def test_page_indices_a_block_ahead_let_triton_keep_kv_loads_in_flight(d, rows):
    """Compiled for sm_90a: with the page-table load inside each key block, Triton's pipeliner keeps
    one K/V buffer and waits for every copy before a tile is used (no load in flight under the
    products); with the indices loaded a block ahead it double-buffers K and V and leaves the next
    tiles' copies outstanding. What the prefetch is for, as the compiler sees it; timed on an H100 it
    is the default at head dims <= 128 only (decode_plan.PREFETCH_PAGES_MAX_HEAD_DIM)."""
    pytest.importorskip("triton")
    from benchmark.lab import decode_pipeline, decode_regs

    g = rows if rows <= 8 else 2
    p = S.plan(1, 1, g, d, max(1, rows // g), 8192, 132, launch=S.FILLED_LAUNCH if d > 128 else None)
    facts = {}
    for prefetch in (False, True):
        k = decode_regs.compile_split(d, p.block_m, p.block_n, p.num_warps, p.num_stages, "bf16" if d == 512 else "fp8",
                                      True, g, p.maxnreg, False, prefetch_pages=prefetch)
        facts[prefetch] = decode_pipeline.pipeline_facts(k.asm["ttgir"])
    assert not decode_pipeline.in_flight(facts[False]) and f"1x{p.block_n}x{d}" in facts[False]["kv_buffers"], facts
    assert decode_pipeline.in_flight(facts[True]) and f"2x{p.block_n}x{d}" in facts[True]["kv_buffers"], facts
    assert S.plan(1, 1, g, d, max(1, rows // g), 8192, 132).prefetch_pages is (d <= S.PREFETCH_PAGES_MAX_HEAD_DIM)
    assert S.prefetch_pages(128) and not S.prefetch_pages(129)


def test_two_head_dim_pieces_spill_less_under_a_register_cap():
    """Compiled for sm_90a at the d256 decode plan (64 keys a step) capped at 168 registers (3 CTAs an
    SM instead of 2): with the head dim as two column pieces (launch d_pieces=2) half a K/V tile is
    live at once, and ptxas spills at most a third of what the one-piece kernel spills. What the
    pieces are for, as the compiler sees it (benchmark/lab/decode_pieces.py); timed on an H100 they
    are the split regime's launch (decode_plan.SPLIT_REGIME_LAUNCH)."""
    pytest.importorskip("triton")
    from benchmark.lab import decode_regs

    p = S.plan(1, 1, 2, 256, 1, 8192, 132)
    stack = {pieces: decode_regs.resources(256, p.block_m, p.block_n, p.num_warps, p.num_stages, "fp8", True, 2, 168,
                                           d_pieces=pieces) for pieces in (1, 2)}
    assert stack[1]["reg"] <= 168 and stack[2]["reg"] <= 168, stack
    assert stack[1]["stack"] >= 64 and 3 * stack[2]["stack"] <= stack[1]["stack"], stack
    with pytest.raises(PagedKVError, match="d_pieces must be 1 or 2, got 3"):
        S.plan(1, 1, 2, 256, 1, 8192, 132, launch={"d_pieces": 3})
    with pytest.raises(PagedKVError, match="d_pieces must be 1 or 2, got True"):
        S.plan(1, 1, 2, 256, 1, 8192, 132, launch={"d_pieces": True})
    assert S.plan(1, 1, 2, 256, 1, 8192, 132, launch={"d_pieces": 2}).d_pieces == 2
    assert S.plan(1, 1, 2, 256, 1, 8192, 132).d_pieces == S.SPLIT_REGIME_LAUNCH["d_pieces"] == 2
    assert S.SPLIT_REGIME_LAUNCH["maxnreg"] == 168 and S.plan(200, 1, 2, 256, 1, 8192, 132).d_pieces == 1


def test_warm_calls_every_variant_the_route_launches(monkeypatch):
    """One small call per (row block size up to the threshold) x (one split, several) x (LSE at
    decode): the constexprs and specializations a server's decode and short extends meet."""
    seen = []
    monkeypatch.setattr(W, "paged_decode_attention", lambda q, k, v, t, s, cu, max_q, **kw: seen.append(
        (max_q, kw["num_splits"], kw["return_lse"], tuple(q.shape), tuple(k.shape), int(s[0]), cu.tolist())))
    assert W.warm_split_kv(W.SplitKvShape(128, 28, 4, 16, 16), "cpu") == 0  # nothing compiles off a GPU
    # g = 7: 1-2 new tokens -> 16-row blocks, 3-4 -> 32, 5-16 -> 64
    assert [c[:3] for c in seen] == [(1, 1, False), (1, 1, True), (1, 2, False), (1, 2, True),
                                     (3, 1, False), (3, 2, False), (5, 1, False), (5, 2, False)]
    assert seen[-1][3:] == ((5, 28, 128), (4, 16, 4, 128), 6, [0, 5])
    # MHA (q heads == kv heads): up to 16 new tokens fit one 16-row block, so one row-block size
    seen.clear()
    W.warm_split_kv(W.SplitKvShape(128, 8, 8, 16, 16), "cpu")
    assert [c[:3] for c in seen] == [(1, 1, False), (1, 1, True), (1, 2, False), (1, 2, True)]
    assert seen[0][3:5] == ((1, 8, 128), (4, 16, 8, 128))
    seen.clear()
    W.warm_split_kv(W.SplitKvShape(64, 8, 8, 1, 1), "cpu")  # the route's limit 1 (the variable's value)
    assert [c[:3] for c in seen] == [(1, 1, False), (1, 1, True), (1, 2, False), (1, 2, True)]
