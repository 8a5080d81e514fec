"""Issue #17 item 2 on the CPU: the paged E4M3 KV gather (against a loop reference, SGLang's page
layout, page sizes 1/16/64), the routed call with the FP8 kernel replaced by a torch model of its
contract (so the gather, cu_seqlens_k, descales and the bottom-right causal diagonal are checked
against an fp32 reference on the dequantized cache), the route's refusals, and the hooks on SGLang
0.5.20 / 0.5.23's real FlashAttentionBackend methods and fp8_e4m3 MHATokenToKVPool, including SGLang's
own decode CUDA-graph metadata path (init_cuda_graph_state, init_forward_metadata_out_graph at capture
and at replay) with a capture faked in progress."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest
import torch

from sglang_fa4.integration import llm_fp8_kv
from sglang_fa4.kernels import fp8_paged_kv
from sglang_fa4.kernels.fp8_paged_kv import PagedKVError, gather_paged_kv
from sglang_fa4.kernels.fp8_paged_kv import paged_kv_attention as paged_fp8_attention
from sglang_fa4.kernels.fp8_paged_kv import extend as paged_extend
from sglang_fa4.kernels.fp8_paged_kv import batch_plan as paged_plan
from sglang_fa4.testing import cu_seqlens, offsets, page_table, paged_attention_fp32, rel_err
from sglang_fa4.testing.paged_kv_torch import fp8_forward_model, gather_paged_kv_reference
from sglang_harness import run_file
from test_fp8_paged_decode import _NoSync

FP8 = torch.float8_e4m3fn
ROOT = Path(__file__).resolve().parents[1]


def make_pool(lens, page_size, hkv=4, d=128, seed=0, spare_pages=3):
    """A paged fp8 cache holding ``lens`` tokens per sequence in shuffled pages, SGLang's layout
    (k_cache[page, offset, head, :]); page_table rows as SGLang builds them (page ids, int32)."""
    g = torch.Generator().manual_seed(seed)
    pages_needed = [-(-n // page_size) for n in lens]
    total_pages = sum(pages_needed) + spare_pages
    k = (torch.randn(total_pages, page_size, hkv, d, generator=g) * 2).to(FP8)
    v = (torch.randn(total_pages, page_size, hkv, d, generator=g) * 2).to(FP8)
    table = page_table(pages_needed, torch.randperm(total_pages, generator=g))
    return k, v, table, torch.tensor(lens, dtype=torch.int32)


@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("lens", [[37], [5, 300, 1, 64], [128, 128, 128]])
def test_gather_matches_the_loop_reference(page_size, lens):
    k_cache, v_cache, table, seqlens = make_pool(lens, page_size)
    k, v, cu_k, bound = gather_paged_kv(k_cache, v_cache, table, seqlens, fp8_paged_kv.exact_sizes(seqlens))
    assert cu_k.dtype == torch.int32 and cu_k.tolist() == offsets(lens)
    assert bound == max(lens) and k.shape[0] == sum(lens) and k.dtype == torch.uint8
    k_ref, v_ref = gather_paged_kv_reference(k_cache, v_cache, table, seqlens)
    assert torch.equal(k[: sum(lens)], k_ref) and torch.equal(v[: sum(lens)], v_ref)
    # independent of the reference: token t of sequence b is at page table[b, t // P], offset t % P
    b, t = len(lens) - 1, lens[-1] - 1
    row = int(cu_k[b]) + t
    assert torch.equal(k[row], k_cache[int(table[b, t // page_size]), t % page_size].view(torch.uint8))


def test_gather_rejects_bad_metadata():
    k_cache, v_cache, table, seqlens = make_pool([10], 16)
    with pytest.raises(PagedKVError, match="page_table must be int32"):
        gather_paged_kv(k_cache, v_cache, table.long(), seqlens)
    with pytest.raises(PagedKVError, match="one shape"):
        gather_paged_kv(k_cache, v_cache[..., :64].contiguous(), table, seqlens)
    with pytest.raises(PagedKVError, match="float8_e4m3fn"):
        gather_paged_kv(k_cache.float(), v_cache, table, seqlens)
    with pytest.raises(PagedKVError, match="entries"):
        gather_paged_kv(k_cache, v_cache, table, torch.tensor([10, 3], dtype=torch.int32))


@pytest.fixture()
def fake_kernel(monkeypatch):
    from sglang_fa4.kernels import fp8_sm90

    calls = []
    monkeypatch.setattr(fp8_sm90, "fp8_varlen_attention", fp8_forward_model(calls))
    return calls


@pytest.fixture()
def gather_only(monkeypatch, reload_settings):
    """SGLANG_FA4_FP8_KV_SPLIT_KV_MAX_Q=0: every call takes the page gather + WGMMA kernel."""
    monkeypatch.setenv("SGLANG_FA4_FP8_KV_SPLIT_KV_MAX_Q", "0")
    reload_settings()


@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("mode", ["prefill", "extend_with_prefix", "decode"])
def test_routed_call_matches_fp32_on_the_dequantized_cache(fake_kernel, gather_only, page_size, mode):
    torch.manual_seed(1)
    hq, hkv, d = 28, 4, 128
    lens = {"prefill": [200], "extend_with_prefix": [70, 300, 17], "decode": [33, 129, 64, 1]}[mode]
    new = {"prefill": [200], "extend_with_prefix": [20, 45, 17], "decode": [1, 1, 1, 1]}[mode]
    k_cache, v_cache, table, seqlens = make_pool(lens, page_size, hkv, d)
    cu_q = cu_seqlens(new)
    q = torch.randn(sum(new), hq, d).to(FP8)  # SGLang: q.to(fp8), no q scale
    k_scale, v_scale = torch.tensor([0.7]), torch.tensor([1.3])  # layer.k_scale / v_scale
    kd, vd = k_scale.expand(len(lens), hkv), v_scale.expand(len(lens), hkv)  # as SGLang passes them
    out = torch.full((sum(new), hq, d), float("nan"), dtype=torch.bfloat16)  # poisoned
    got = paged_fp8_attention(q, k_cache, v_cache, table, seqlens, cu_q, max(new), k_descale=kd, v_descale=vd,
                              softmax_scale=0.09, causal=True, window_size=(-1, -1), out=out)
    assert got is out and torch.isfinite(out.float()).all()
    ref = paged_attention_fp32(q, k_cache, v_cache, table, seqlens, cu_q, k_descale=k_scale, v_descale=v_scale,
                                    softmax_scale=0.09, causal=True)
    err = rel_err(out, ref)
    assert err < 1e-2, err
    assert fake_kernel[-1]["max_k"] == max(lens) and fake_kernel[-1]["vt"]  # the fused gather's V^T
    if mode == "decode":  # the GQA group (7 q heads per kv head) packed into the tile, non-causal
        assert fake_kernel[-1]["max_q"] == hq // hkv and fake_kernel[-1]["causal"] is False
    else:
        assert fake_kernel[-1]["max_q"] == max(new) and fake_kernel[-1]["causal"] is True


def test_decode_gqa_pack_roundtrip_and_when_it_applies(fake_kernel, gather_only, monkeypatch):
    q = torch.randn(5, 28, 16)
    packed, cu, g = paged_extend.decode_gqa_pack(q, 4)
    assert g == 7 and packed.shape == (35, 4, 16) and cu.tolist() == list(range(0, 36, 7))
    assert torch.equal(packed[2 * 7 + 3, 1], q[2, 1 * 7 + 3])  # row b*g+j of kv head h = q head h*g+j
    assert torch.equal(paged_extend.decode_gqa_unpack(packed, 5, 4, 7), q)

    def packable(q, batch, hkv, max_q, window, causal):
        return paged_plan.decode_gqa_packable(q, batch, hkv, max_q, *paged_plan.window_bounds(causal, window))

    assert packable(q, 5, 4, 1, (-1, -1), True) and packable(q, 5, 4, 1, (-1, -1), False)
    assert not packable(q, 5, 4, 2, (-1, -1), True)  # not one token per sequence
    assert not packable(q, 4, 4, 1, (-1, -1), True)  # rows != batch
    assert not packable(q, 5, 4, None, (-1, -1), True)  # no host max_seqlen_q
    assert not packable(q, 5, 28, 1, (-1, -1), True)  # MHA: nothing to pack
    assert not packable(q, 5, 4, 1, (127, 0), True)  # a sliding window moves with the position
    assert not packable(q, 5, 4, 1, (-1, 8), False)
    # unpacked (no host max_seqlen_q) and packed decode agree (the same torch model of the kernel)
    k_cache, v_cache, table, seqlens = make_pool([33, 129, 64, 1], 16, 4, 128)
    cu_q = torch.arange(5, dtype=torch.int32)
    q8 = torch.randn(4, 28, 128).to(FP8)
    kw = dict(k_descale=torch.tensor([0.7]), v_descale=torch.tensor([1.3]), causal=True)
    plain = paged_fp8_attention(q8, k_cache, v_cache, table, seqlens, cu_q, None, **kw)
    packed_out = paged_fp8_attention(q8, k_cache, v_cache, table, seqlens, cu_q, 1, **kw)
    assert [(c["max_q"], c["causal"]) for c in fake_kernel] == [(None, True), (7, False)]
    assert torch.allclose(plain.float(), packed_out.float(), atol=1e-2)


def test_exact_sizes_once_per_tensor_version_and_the_bound_without_them():
    k_cache, v_cache, table, seqlens = make_pool([5, 300, 1], 16)
    assert fp8_paged_kv.exact_sizes(seqlens) == (306, 300)
    seqlens._sglang_fa4_sizes = (seqlens._sglang_fa4_sizes[0], (7, 7))  # a cached answer is reused ...
    assert fp8_paged_kv.exact_sizes(seqlens) == (7, 7)
    seqlens.add_(1)  # ... until the tensor changes in place (SGLang's graph buffers are updated so)
    assert fp8_paged_kv.exact_sizes(seqlens) == (309, 301)
    k, v, cu_k, max_k = gather_paged_kv(k_cache, v_cache, table, seqlens, (309, 301))
    assert k.shape[0] == 309 and max_k == 301
    kb, vb, cu_b, max_b = gather_paged_kv(k_cache, v_cache, table, seqlens)  # capture: host bound
    assert kb.shape[0] == 3 * table.shape[1] * 16 and max_b == table.shape[1] * 16
    assert torch.equal(cu_b, cu_k) and torch.equal(kb[:309], k) and torch.equal(vb[:309], v)
    with pytest.raises(PagedKVError, match="does not fit"):
        gather_paged_kv(k_cache, v_cache, table, seqlens, (309, 10_000))


def test_route_dispatches_only_ver4_fp8_on_sm90(monkeypatch, fake_kernel):
    seen = []

    def original(q, k_cache, v_cache, k=None, v=None, page_table=None, cache_seqlens=None, cu_seqlens_q=None,
                 max_seqlen_q=None, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                 return_softmax_lse=False, num_splits=0, k_descale=None, v_descale=None, q_descale=None,
                 sinks=None, ver=3, out=None):
        seen.append(ver)
        return "upstream"

    k_cache, v_cache, table, seqlens = make_pool([40], 16)
    q = torch.randn(40, 8, 128).to(FP8)
    cu = torch.tensor([0, 40], dtype=torch.int32)
    kw = dict(page_table=table, cache_seqlens=seqlens, cu_seqlens_q=cu, max_seqlen_q=40, causal=True)
    # CPU tensors are not SM90: SGLang's code runs
    assert llm_fp8_kv.flash_attn_with_kvcache(original, q=q, k_cache=k_cache, v_cache=v_cache, ver=4, **kw) == "upstream"
    monkeypatch.setattr(llm_fp8_kv, "is_sm90", lambda device: True)
    assert llm_fp8_kv.flash_attn_with_kvcache(original, q=q, k_cache=k_cache, v_cache=v_cache, ver=3, **kw) == "upstream"
    bf16 = k_cache.to(torch.bfloat16)
    assert llm_fp8_kv.flash_attn_with_kvcache(original, q=q, k_cache=bf16, v_cache=bf16, ver=4, **kw) == "upstream"
    assert seen == [4, 3, 4]
    res = llm_fp8_kv.flash_attn_with_kvcache(original, q, k_cache, v_cache, ver=4, num_splits=0, **kw)
    assert res.shape == (40, 8, 128) and res.dtype == torch.bfloat16 and len(fake_kernel) == 1
    for bad, match in ((dict(softcap=30.0), "softcap=30.0"), (dict(sinks=torch.zeros(8)), "sinks"),
                       (dict(q_descale=torch.ones(1, 4)), "q_descale")):
        with pytest.raises(llm_fp8_kv.FP8KVRouteError, match=match):
            llm_fp8_kv.flash_attn_with_kvcache(original, q=q, k_cache=k_cache, v_cache=v_cache, ver=4, **kw, **bad)
    with pytest.raises(llm_fp8_kv.FP8KVRouteError, match="cast like SGLang's fa3 path"):
        llm_fp8_kv.flash_attn_with_kvcache(original, q=q.to(torch.bfloat16), k_cache=k_cache, v_cache=v_cache,
                                           ver=4, **kw)


# ---- the split-KV decode kernel on the route -------------------------------------------------------


def sglang_fa_call(q, k_cache, v_cache, k=None, v=None, page_table=None, cache_seqlens=None, cu_seqlens_q=None,
                   max_seqlen_q=None, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                   return_softmax_lse=False, num_splits=0, k_descale=None, v_descale=None, q_descale=None,
                   sinks=None, ver=3, out=None):
    """SGLang's flash_attn_with_kvcache signature (the route binds to it); its body must not run."""
    raise AssertionError("SGLang's own code must not run")


@pytest.fixture()
def split_kv_calls(request):
    """The split-KV kernel replaced by a recorder returning the fp32 reference (the kernel itself
    runs in Triton's interpreter in tests/test_fp8_paged_decode.py and in the SGLang harness below)."""
    calls = []

    def fake(plan, q, k_cache, v_cache, page_table, cache_seqlens, cu_q, k_descale, v_descale, softmax_scale, out):
        calls.append(dict(max_q=plan.max_seqlen_q, causal=plan.causal, window=plan.window, lse=plan.return_lse,
                          kd=k_descale, out=out))
        ref = paged_attention_fp32(q, k_cache, v_cache, page_table, cache_seqlens, cu_q, k_descale=k_descale,
                                   v_descale=v_descale, softmax_scale=softmax_scale, causal=plan.causal)
        o = ref.to(torch.bfloat16) if out is None else out.copy_(ref)
        return (o, torch.zeros(q.shape[1], q.shape[0])) if plan.return_lse else o

    previous = fp8_paged_kv.install_kernels(fp8_paged_kv.Kernels(fake, fp8_paged_kv.installed_kernels().gather))
    request.addfinalizer(lambda: fp8_paged_kv.install_kernels(previous))
    return calls


@pytest.mark.parametrize("threshold", [None, "1", "17", "0"])
def test_decode_and_short_extends_take_the_split_kv_kernel(fake_kernel, split_kv_calls, monkeypatch, threshold,
                                                           reload_settings):
    """max_seqlen_q <= SGLANG_FA4_FP8_KV_SPLIT_KV_MAX_Q (default 16): the pool read in place; above
    it (or with 0, or without a host max_seqlen_q) the gather + WGMMA kernel."""
    if threshold is not None:
        monkeypatch.setenv("SGLANG_FA4_FP8_KV_SPLIT_KV_MAX_Q", threshold)
    reload_settings()
    limit = 16 if threshold is None else int(threshold)
    k_cache, v_cache, table, seqlens = make_pool([70, 300], 16, 2, 64)
    kw = dict(k_descale=torch.tensor([0.7]).expand(2, 2), v_descale=torch.tensor([1.3]).expand(2, 2), causal=True)
    routes = []
    for max_q in (1, 16, 17, 40, None):
        new = [1, 1] if max_q in (1, None) else [max_q - 1, max_q]
        cu = cu_seqlens(new)
        q = torch.randn(sum(new), 8, 64).to(FP8)
        before = (len(split_kv_calls), len(fake_kernel))
        got = paged_fp8_attention(q, k_cache, v_cache, table, seqlens, cu, max_q, **kw)
        ref = paged_attention_fp32(q, k_cache, v_cache, table, seqlens, cu, k_descale=torch.tensor([0.7]),
                                        v_descale=torch.tensor([1.3]), causal=True)
        assert rel_err(got, ref) < 1e-2
        routes.append("split" if len(split_kv_calls) > before[0] else "gather" if len(fake_kernel) > before[1] else "?")
    assert routes == ["split" if m is not None and m <= limit else "gather" for m in (1, 16, 17, 40, None)], routes
    for c in split_kv_calls:  # SGLang's (batch, kv heads) descale passed through as it came
        assert c["kd"].shape == (2, 2) and c["causal"] is True and c["lse"] is False


def test_lse_request_takes_the_split_kv_kernel(fake_kernel, split_kv_calls, monkeypatch):
    """return_softmax_lse (SGLang's cascade attention, verify/extend of speculative decoding): the
    route returns (out, lse) from the split-KV kernel whatever the row count."""
    monkeypatch.setattr(llm_fp8_kv, "is_sm90", lambda device: True)
    original = sglang_fa_call
    k_cache, v_cache, table, seqlens = make_pool([40], 1, 4, 128)
    q = torch.randn(40, 8, 128).to(FP8)
    cu = torch.tensor([0, 40], dtype=torch.int32)
    o, lse = llm_fp8_kv.flash_attn_with_kvcache(original, q, k_cache, v_cache, page_table=table, cache_seqlens=seqlens,
                                                cu_seqlens_q=cu, max_seqlen_q=40, causal=False, ver=4,
                                                return_softmax_lse=True, window_size=(-1, -1))
    assert o.shape == (40, 8, 128) and lse.shape == (8, 40) and fake_kernel == []
    assert split_kv_calls[-1]["lse"] is True and split_kv_calls[-1]["max_q"] == 40


@pytest.mark.parametrize("new", [[1, 1, 1], [3, 16, 1], [40, 200, 7]])
def test_d512_bf16_q_takes_the_split_kv_kernel_at_every_call_size(fake_kernel, split_kv_calls, monkeypatch, new):
    """Gemma-4's full-attention layers (head dim 512) as SGLang 0.5.23 calls fa4 on an fp8_e4m3 pool:
    q left bf16 and no descales (prepare_paged_mha_query casts and scales only up to head dim 256),
    decode, a short extend and a prefill with a cached prefix: the route takes them as they come,
    every one to the split-KV kernel (no gather: the FP8 forward has no d512)."""
    monkeypatch.setattr(llm_fp8_kv, "is_sm90", lambda device: True)
    hq, hkv, d = 16, 2, 512
    lens = [n + 30 for n in new]
    k_cache, v_cache, table, seqlens = make_pool(lens, 16, hkv, d)
    cu = cu_seqlens(new)
    q = torch.randn(sum(new), hq, d).to(torch.bfloat16)
    out = torch.full((sum(new), hq, d), float("nan"), dtype=torch.bfloat16)
    got = llm_fp8_kv.flash_attn_with_kvcache(sglang_fa_call, q=q, k_cache=k_cache, v_cache=v_cache, page_table=table,
                                             cache_seqlens=seqlens, cu_seqlens_q=cu, max_seqlen_q=max(new),
                                             softmax_scale=1.0, causal=True, window_size=(-1, -1), num_splits=0,
                                             ver=4, out=out)
    assert got is out and fake_kernel == [] and len(split_kv_calls) == 1
    assert split_kv_calls[0]["max_q"] == max(new) and split_kv_calls[0]["kd"] is None
    ref = paged_attention_fp32(q, k_cache, v_cache, table, seqlens, cu, softmax_scale=1.0, causal=True)
    assert rel_err(out, ref) < 1e-2


def test_the_route_takes_bf16_q_exactly_at_d512(fake_kernel, split_kv_calls, monkeypatch):
    """bf16 q at head dim 512 (what SGLang hands there), E4M3 q elsewhere; each other pairing is
    refused naming q's dtype and the head dim."""
    monkeypatch.setattr(llm_fp8_kv, "is_sm90", lambda device: True)
    assert llm_fp8_kv.BF16_QUERY_HEAD_DIMS == (512,)

    def call(d, q_dtype):
        k_cache, v_cache, table, seqlens = make_pool([20], 16, 2, d)
        q = torch.randn(1, 8, d).to(q_dtype)
        return llm_fp8_kv.flash_attn_with_kvcache(sglang_fa_call, q=q, k_cache=k_cache, v_cache=v_cache,
                                                  page_table=table, cache_seqlens=seqlens,
                                                  cu_seqlens_q=cu_seqlens([1]), max_seqlen_q=1, causal=True, ver=4)

    assert call(512, torch.bfloat16).shape == (1, 8, 512) and call(128, FP8).shape == (1, 8, 128)
    with pytest.raises(llm_fp8_kv.FP8KVRouteError, match="q is torch.bfloat16 at head_dim 128 .*cast like SGLang"):
        call(128, torch.bfloat16)
    with pytest.raises(llm_fp8_kv.FP8KVRouteError, match="q is torch.float8_e4m3fn at head_dim 512 .*bf16 q"):
        call(512, FP8)
    with pytest.raises(llm_fp8_kv.FP8KVRouteError, match="q is torch.float16 at head_dim 512"):
        call(512, torch.float16)
    assert len(split_kv_calls) == 2 and fake_kernel == []


def test_prepare_query_hook_keeps_bf16_q_and_adds_the_pools_descales_at_d512(sglang_version):
    """SGLang's own prepare_paged_mha_query (0.5.20 / 0.5.23) around our hook, on a backend of the
    FP8 route: at head dim 512 SGLang leaves q bf16 and passes no descales (what it hands fa4,
    recorded here); the hook keeps q bf16 and adds layer.k_scale / v_scale expanded to (batch, kv
    heads), extend and decode alike. At 256 (the sliding layers) q is cast, the descales come from
    SGLang, extend included (the hook's earlier job)."""
    from sglang_harness import run_with_sglang

    out = run_with_sglang(sglang_version, """
import types, warnings; warnings.simplefilter("ignore")
from benchmark.sglang_on_gpu import cuda_only_stubs; cuda_only_stubs.install_missing()
import torch
from sglang.srt.layers.attention.flashattention_backend import FlashAttentionBackend
from sglang_fa4.integration import llm_fp8_kv
llm_fp8_kv.is_sm90 = lambda device: True
original = FlashAttentionBackend.prepare_paged_mha_query
backend = types.SimpleNamespace(fa_impl_ver=4, kv_cache_dtype_str="fp8_e4m3", kv_cache_dtype=torch.float8_e4m3fn,
                                kv_cache_is_mxfp8=False, use_mla=False, device="cuda")
res = {}
for d in (512, 256):
    for scaled in (True, False):
        layer = types.SimpleNamespace(head_dim=d, k_scale=torch.tensor([0.5]) if scaled else None,
                                      v_scale=torch.tensor([0.25]) if scaled else None)
        for prefill in (True, False):
            q = torch.randn(3, 8, d, dtype=torch.bfloat16)
            kw = dict(logical_batch_size=3, kv_head_num=2, is_prefill=prefill)
            up = original(backend, q, None, None, layer, **kw)
            ours = llm_fp8_kv.prepare_paged_mha_query(original, backend, q, None, None, layer, **kw)
            res[f"{d}-{scaled}-{prefill}"] = dict(
                sglang_q=str(up[0].dtype), sglang_kd=up[3] is not None, q=str(ours[0].dtype),
                kd=None if ours[3] is None else [list(ours[3].shape), float(ours[3][0, 0]), float(ours[4][2, 1])])
emit(res)
""")
    for scaled in (True, False):
        for prefill in (True, False):
            up = out[f"512-{scaled}-{prefill}"]
            assert up["sglang_q"] == "torch.bfloat16" and not up["sglang_kd"], up  # what SGLang hands fa4 at d512
            assert up["q"] == "torch.bfloat16", up
            assert up["kd"] == ([[3, 2], 0.5, 0.25] if scaled else None), up
            swa = out[f"256-{scaled}-{prefill}"]
            assert swa["q"] == "torch.float8_e4m3fn" and swa["kd"] == ([[3, 2], 0.5, 0.25] if scaled else None), swa


def sglang_fa_call_0523(q, k_cache, v_cache, k=None, v=None, page_table=None, cache_seqlens=None, cu_seqlens_q=None,
                        max_seqlen_q=None, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                        return_softmax_lse=False, num_splits=0, k_descale=None, v_descale=None, q_descale=None,
                        sinks=None, score_mod=None, aux_tensors=None, ver=3, out=None, mask_mod=None):
    """SGLang 0.5.22+'s flash_attn_with_kvcache arguments the image prefill uses; its body must not run."""
    raise AssertionError("SGLang's own code must not run")


def make_image_mask_mod(window_left: int = -1):
    """A stand-in of SGLang 0.5.22+'s flash_attention_v4.make_image_mask_mod: a cute.jit-style wrapper
    (functools.wraps) around ``image_mask``, whose closure holds ``window_left``."""
    import functools

    def image_mask(batch_idx, head_idx, q_idx, kv_idx, seqlen_info, aux_tensors):
        return window_left >= 0

    image_mask.__module__ = llm_fp8_kv.IMAGE_MASK_MODULE

    @functools.wraps(image_mask)
    def jitted(*args):
        return image_mask(*args)

    return jitted


@pytest.mark.parametrize("window_left", [-1, 20])
def test_gemma4_image_prefill_takes_the_split_kv_kernel_with_the_image_ranges(fake_kernel, monkeypatch, window_left):
    """SGLang 0.5.22+'s Gemma-4 image prefill on fa4: mask_mod = its image mask (window_left in the
    closure: -1 on the full layers, the window on the sliding ones), aux_tensors = [ranges,
    cu_seqlens_q], causal False, window (-1, -1). The route runs it causal with the window and the
    ranges on the split-KV kernel (here its torch contract: CPU tensors), never the gather, and
    matches the fp32 reference with each image row seeing its whole image."""
    from sglang_fa4.testing import attention_fp32
    from sglang_fa4.testing.paged_kv_torch import dequantized_paged_kv

    monkeypatch.setattr(llm_fp8_kv, "is_sm90", lambda device: True)
    hq, hkv, d = 16, 2, 512
    lens, new = [120, 60], [100, 60]
    k_cache, v_cache, table, seqlens = make_pool(lens, 16, hkv, d)
    cu = cu_seqlens(new)
    ranges = torch.full((160, 2), -1, dtype=torch.int32)
    ranges[10:42] = torch.tensor([30, 61], dtype=torch.int32)  # sequence 0 (prefix 20): an image at 30..61
    ranges[100:110] = torch.tensor([0, 9], dtype=torch.int32)  # sequence 1: an image at its start
    q = torch.randn(160, hq, d).to(torch.bfloat16)
    got = llm_fp8_kv.flash_attn_with_kvcache(
        sglang_fa_call_0523, q=q, k_cache=k_cache, v_cache=v_cache, page_table=table, cache_seqlens=seqlens,
        cu_seqlens_q=cu, max_seqlen_q=100, softmax_scale=1.0, causal=False, window_size=(-1, -1), ver=4,
        mask_mod=make_image_mask_mod(window_left), aux_tensors=[ranges, cu])
    assert fake_kernel == []
    k, v = dequantized_paged_kv(k_cache, v_cache, table, seqlens)
    window = (window_left, 0) if window_left >= 0 else (None, None)
    ref = attention_fp32(q, k, v, cu, offsets(lens), scale=1.0, causal=True, window=window, key_ranges=ranges)
    plain = attention_fp32(q, k, v, cu, offsets(lens), scale=1.0, causal=True, window=window)
    assert rel_err(got, ref) < 1e-2 and rel_err(got[10:41], plain[10:41]) > 0.1  # image rows saw their image


def test_the_route_refuses_other_masks_and_malformed_image_calls(monkeypatch):
    monkeypatch.setattr(llm_fp8_kv, "is_sm90", lambda device: True)
    k_cache, v_cache, table, seqlens = make_pool([20], 16, 2, 512)
    cu = cu_seqlens([20])
    ranges = torch.full((20, 2), -1, dtype=torch.int32)
    kw = dict(q=torch.randn(20, 8, 512).to(torch.bfloat16), k_cache=k_cache, v_cache=v_cache, page_table=table,
              cache_seqlens=seqlens, cu_seqlens_q=cu, max_seqlen_q=20, ver=4)

    def other_mask(*args):
        return True

    for bad, match in ((dict(mask_mod=other_mask, aux_tensors=[ranges, cu]), "only SGLang's Gemma-4 image mask"),
                       (dict(mask_mod=make_image_mask_mod(), aux_tensors=[ranges, cu.clone()]), "the call's own"),
                       (dict(mask_mod=make_image_mask_mod(), aux_tensors=[ranges]), "aux_tensors="),
                       (dict(mask_mod=make_image_mask_mod(), aux_tensors=[ranges, cu], causal=True), "causal=True"),
                       (dict(aux_tensors=[ranges, cu]), "aux_tensors=.* without SGLang's image mask_mod")):
        with pytest.raises(llm_fp8_kv.FP8KVRouteError, match=match):
            llm_fp8_kv.flash_attn_with_kvcache(sglang_fa_call_0523, **kw, **bad)
    with pytest.raises(PagedKVError, match=r"image_ranges must be a contiguous int32 \(total_q, 2\)"):
        fp8_paged_kv.plan(kw["q"], k_cache, v_cache, table, seqlens, cu, 20, causal=True, image_ranges=ranges[:5])
    with pytest.raises(PagedKVError, match="causal must be True"):
        fp8_paged_kv.plan(kw["q"], k_cache, v_cache, table, seqlens, cu, 20, image_ranges=ranges)


def test_sglangs_own_image_mask_is_recognised_with_its_window(sglang_version):
    """SGLang's real make_image_mask_mod (0.5.22+; built with the CUTLASS DSL it pins, on the CPU):
    its window_left read back; and the semantics the route models, pinned in SGLang's source (the
    callback's keep, what forward_extend hands fa4 with it)."""
    from sglang_harness import run_with_sglang

    dsl = ROOT / ".cache" / "cutlass-dsl-4.8.0"
    if not dsl.is_dir():
        pytest.skip(f"{dsl} is absent (tests/setup_env.sh)")
    out = run_with_sglang(sglang_version, """
import inspect, warnings; warnings.simplefilter("ignore")
from benchmark.sglang_on_gpu import cuda_only_stubs; cuda_only_stubs.install_missing()
import sglang.kernels.ops.attention.flash_attention_v4 as v4
if not hasattr(v4, "make_image_mask_mod"):
    emit({"has": False})
else:
    import sglang.srt.layers.attention.flashattention_backend as fab
    from sglang_fa4.integration import llm_fp8_kv
    emit({"has": True, "windows": [llm_fp8_kv.image_mask_window(v4.make_image_mask_mod(w)) for w in (-1, 1023)],
          "default": llm_fp8_kv.image_mask_window(v4.make_image_mask_mod()),
          "mask_src": inspect.getsource(v4.make_image_mask_mod), "backend_src": inspect.getsource(fab)})
""", env={"PYTHONPATH": os.pathsep.join([str(dsl), str(dsl / "nvidia_cutlass_dsl" / "dsl_packages"), str(ROOT)])})
    if not out["has"]:
        assert sglang_version < "0.5.22"  # no image masks on fa4 before 0.5.22: nothing to take
        return
    assert out["windows"] == [-1, 1023] and out["default"] == -1
    src = " ".join(out["mask_src"].split())
    assert "keep = (kv_idx <= absolute_q) | ((kv_idx >= begin) & (kv_idx <= end))" in src
    assert "keep = keep & (kv_idx >= absolute_q - window_left)" in src
    assert "absolute_q = q_idx + scalar_to_ssa( seqlen_info.seqlen_k - seqlen_info.seqlen_q, Int32 )" in src
    backend = " ".join(out["backend_src"].split())
    assert ('kwargs["mask_mod"] = make_image_mask_mod(window_size[0]) kwargs["aux_tensors"] = '
            '[metadata.image_token_ranges, metadata.cu_seqlens_q]') in backend
    assert "causal = False window_size = (-1, -1)" in backend


def test_decode_graph_capture_no_sync_grid_fixed_per_batch_size(monkeypatch, request):
    """SGLang's decode CUDA graphs (FlashAttentionBackend.init_cuda_graph_state): fixed buffers --
    cache_seqlens (max_bs,), cu_seqlens_q arange, page_table (max_bs, ceil(max_context_len / P)) --
    sliced [:bs] per captured batch size, lengths rewritten in place before each replay.  Through the
    route's entry (flash_attn_with_kvcache, ver=4) with a capture in progress: no tensor reaches the
    host, and each batch size's launches (grid, every host argument) are the same at capture and at
    replays with other lengths."""
    from sglang_fa4.kernels.fp8_paged_kv import decode as D

    monkeypatch.setattr(llm_fp8_kv, "is_sm90", lambda device: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    previous = fp8_paged_kv.install_kernels(None)  # the launch path a GPU call takes (launches recorded)
    request.addfinalizer(lambda: fp8_paged_kv.install_kernels(previous))
    launches = []
    for h in (D.SPLIT, D.COMBINE):
        monkeypatch.setattr(h, "launch", lambda grid, args, index, _n=h.name, **o: launches.append(
            (_n, grid, tuple(a for a in args if not isinstance(a, torch.Tensor)))))

    original = sglang_fa_call
    max_bs, P, max_context_len, hq, hkv, d = 8, 16, 32768, 28, 4, 128
    pool_pages = 64
    k_cache = torch.zeros(pool_pages, P, hkv, d).to(FP8)
    graph = {"cache_seqlens": torch.zeros(max_bs, dtype=torch.int32),
             "cu_seqlens_q": torch.arange(0, max_bs + 1, dtype=torch.int32),
             "page_table": torch.zeros(max_bs, -(-max_context_len // P), dtype=torch.int32)}
    per_bs = {}
    for bs in (1, 4, 8):
        for step, lens in enumerate(([1] * bs, [(977 * (b + 1)) % 1000 + 1 for b in range(bs)])):
            graph["cache_seqlens"][:bs].copy_(torch.tensor(lens, dtype=torch.int32))  # replay's in-place update
            q = torch.zeros(bs, hq, d).to(FP8)
            kd = torch.tensor([0.5]).expand(bs, hkv)
            launches.clear()
            with _NoSync():
                llm_fp8_kv.flash_attn_with_kvcache(
                    original, q=q, k_cache=k_cache, v_cache=k_cache, page_table=graph["page_table"][:bs],
                    cache_seqlens=graph["cache_seqlens"][:bs], cu_seqlens_q=graph["cu_seqlens_q"][:bs + 1],
                    max_seqlen_q=1, softmax_scale=d ** -0.5, causal=True, window_size=(-1, -1), ver=4,
                    k_descale=kd, v_descale=kd, num_splits=0, out=torch.empty(bs, hq, d, dtype=torch.bfloat16))
            per_bs.setdefault(bs, []).append(list(launches))
        assert per_bs[bs][0] == per_bs[bs][1] and per_bs[bs][0], bs  # capture == replay: the grid is fixed
    grids = {bs: runs[0][0][1] for bs, runs in per_bs.items()}
    from sglang_fa4.kernels.fp8_paged_kv.decode_plan import choose_splits

    assert grids == {bs: (1, bs * hkv, choose_splits(bs, hkv, 1, max_context_len, D.DEFAULT_SM_COUNT))
                     for bs in (1, 4, 8)}, grids


# ---- SGLang's real FlashAttentionBackend methods and fp8 KV pool --------------------------------


@functools.lru_cache(maxsize=None)
def real_backend_run(sglang_version: str) -> dict:
    """One subprocess per SGLang version runs tests/sglang_scripts/llm_fp8_kv_route_backend.py (its
    start-up dominates CI time)."""
    return run_file(sglang_version, "llm_fp8_kv_route_backend.py", env={
        "SGLANG_IS_FLASHINFER_AVAILABLE": "false", "SGLANG_FA4_FP8_KV_ROUTE": "1", "TRITON_INTERPRET": "1",
    }, timeout=600)


def test_hooks_on_sglangs_flash_attention_backend_and_fp8_pool(sglang_version):
    out = real_backend_run(sglang_version)
    assert out["hooked_dispatch"] and out["hooked_prepare"]
    # the long extend gathers for the WGMMA kernel (modelled); the short extend, decode and the LSE
    # request run the split-KV kernel itself (interpreted), per page size
    assert out["kernel_calls"] == 3
    assert out["split_calls"] == [False, False, True] * 3
    assert out["interpreted_launches"] == 3  # page 16: the kernel itself ran (interpreter) for each of them
    for P in (1, 16, 64):
        for mode in ("extend", "extend-short", "decode"):
            r = out[f"{mode}-P{P}"]
            # extend (SGLang's fa4 leaves q bf16 and passes no descales there) now casts q and passes the
            # pool's scales, as decode and SGLang's fa3 path do
            assert r["q_dtype"] == "torch.float8_e4m3fn", (mode, P, r)
            assert r["descale"][:2] == pytest.approx([0.05, 0.04]) and r["descale"][2] == [3 if mode == "decode" else 2, 4]
            assert r["err"] < 1e-2 and r["finite"], (mode, P, r)
        r = out[f"decode-P{P}"]
        assert r["lse_shape"] == [28, 3] and r["lse_same_out"] and r["lse_finite"], r


def test_backend_init_warms_the_fp8_variants(monkeypatch, reload_settings):
    """The backend's layer shape read off it, the warmup list (startup/variants) handed to the one
    warmup loop: the split-KV decode kernel, the FP8 forward's variants, the page gather."""
    import types

    from sglang_fa4.kernels.fp8_paged_kv import GatherShape, SplitKvShape
    from sglang_fa4.kernels.fp8_sm90 import Fp8Variant
    from sglang_fa4.startup import warmup

    warmed = []
    monkeypatch.setattr(warmup, "warm", lambda items, device: warmed.append(([tuple(i) for i in items], device))
                        or warmup.WarmupReport())
    backend = types.SimpleNamespace(fa_impl_ver=4, kv_cache_dtype_str="fp8_e4m3", kv_cache_dtype=FP8, use_mla=False,
                                    device="cuda", head_dim=128, has_swa=True, sliding_window_size=4095,
                                    num_attention_heads=28, num_kv_heads=4, page_size=16)
    assert llm_fp8_kv.warm_fp8_after_backend_init(None, backend) is None and warmed == []  # not SM90 here
    monkeypatch.setattr(llm_fp8_kv, "is_sm90", lambda device: True)
    reload_settings()
    llm_fp8_kv.warm_fp8_after_backend_init(None, backend)
    # decode takes the split-KV kernel (default): its variants, causal (extend), local (the sliding
    # window), the gather
    assert warmed.pop() == ([("fp8_paged_decode", SplitKvShape(128, 28, 4, 16, 16)),
                             ("fp8_forward", Fp8Variant(128, True, False)), ("fp8_forward", Fp8Variant(128, False, True)),
                             ("fp8_paged_gather", GatherShape(128, 4, 16))], torch.device("cuda"))
    monkeypatch.setenv("SGLANG_FA4_FP8_KV_SPLIT_KV_MAX_Q", "0")
    reload_settings()
    llm_fp8_kv.warm_fp8_after_backend_init(None, backend)
    # decode through the gather: no split-KV kernel; causal (extend), non-causal (GQA decode, the
    # group packed), local (the sliding window), and the page gather for this head dim, kv heads, page
    assert warmed == [([("fp8_forward", Fp8Variant(128, True, False)), ("fp8_forward", Fp8Variant(128, False, False)),
                        ("fp8_forward", Fp8Variant(128, False, True)), ("fp8_paged_gather", GatherShape(128, 4, 16))],
                       torch.device("cuda"))]
    for change in (dict(fa_impl_ver=3), dict(kv_cache_dtype_str="auto"), dict(use_mla=True), dict(head_dim=80)):
        llm_fp8_kv.warm_fp8_after_backend_init(None, types.SimpleNamespace(**{**vars(backend), **change}))
    monkeypatch.setenv("SGLANG_FA4_WARMUP", "0")
    llm_fp8_kv.warm_fp8_after_backend_init(None, backend)
    assert len(warmed) == 1


def test_route_warmup_counts_the_gather_and_arms_the_monitors(monkeypatch):
    """warm_llm_fp8_kv: the gather's compiles are warmup work; afterwards one is flagged."""
    from sglang_fa4.kernels import compile_events, triton_handles
    from sglang_fa4.kernels.fp8_paged_kv import gather as fp8_paged_gather
    from sglang_fa4.kernels.fp8_sm90 import launch
    from sglang_fa4.startup import jit_monitor, warmup
    from sglang_fa4.startup.variants import LlmAttentionShape

    jit_monitor.reset_state()
    monkeypatch.setenv("SGLANG_FA4_JIT_MONITOR", "raise")
    monkeypatch.setattr(launch, "compiled_kernel", lambda variant: None)
    event = triton_handles.CompileEvent("fp8_paged_gather", ("key",), 0.5, False, False)

    def fake_warm(shape, device):  # a compile inside the warmup: expected
        compile_events.record("triton", event)
        return 1

    monkeypatch.setattr(fp8_paged_gather, "warm", fake_warm)
    monkeypatch.setattr("sglang_fa4.kernels.fp8_paged_kv.warmup.warm_split_kv", lambda shape, device: 0)
    try:
        report = warmup.warm_llm_fp8_kv(LlmAttentionShape(128, 8, 4, 16), torch.device("cpu"))
        assert report.family("fp8_paged_gather") == {"variants": 1, "resolved": 1, "compiled": 1, "failed": 0}
        assert report.family("fp8_forward")["variants"] == 1 and not report.failures
        assert jit_monitor.warmup_finished() and jit_monitor.compiles_after_warmup() == 0
        with pytest.raises(jit_monitor.FA4CompileAfterWarmup, match="fp8_paged_gather"):
            compile_events.record("triton", event)  # the same compile on the request path
    finally:
        jit_monitor.reset_state()


def test_the_paged_form_plans_once_per_batch_shape(fake_kernel, split_kv_calls, monkeypatch):
    """paged_kv_attention: decode to the split-KV kernel, a long extend to the gather + FP8 forward,
    return_lse to the split-KV kernel with the LSE. Its arguments are checked and its route and
    launch plan made once per batch shape: the layers after the first (other pool tensors, other
    descales, the same shapes) find the plan, with no check run again."""
    checks = []
    real = paged_plan.check_paged
    monkeypatch.setattr(paged_plan, "check_paged", lambda *a: checks.append(1) or real(*a))
    paged_plan.clear()
    layers = [make_pool([70, 300], 16, 2, 64, seed=s) for s in range(3)]
    table, seqlens = layers[0][2], layers[0][3]
    for new, want in (([1, 1], "split"), ([30, 40], "gather")):
        cu, q = cu_seqlens(new), torch.randn(sum(new), 8, 64).to(FP8)
        before = (len(split_kv_calls), len(fake_kernel), len(checks), paged_plan.planned())
        for k_cache, v_cache, _, _ in layers:
            kd = torch.rand(1).expand(2, 2)  # each layer's own scale, SGLang's expand
            got = paged_fp8_attention(q, k_cache, v_cache, table, seqlens, cu, max(new), k_descale=kd, causal=True)
            ref = paged_attention_fp32(q, k_cache, v_cache, table, seqlens, cu, k_descale=kd, causal=True)
            assert rel_err(got, ref) < 1e-2
        took = "split" if len(split_kv_calls) == before[0] + 3 else "gather" if len(fake_kernel) == before[1] + 3 else "?"
        assert took == want
        assert len(checks) == before[2] + 1 and paged_plan.planned() == before[3] + 1  # one plan, three layers
    cu, q = cu_seqlens([1, 1]), torch.randn(2, 8, 64).to(FP8)
    out, lse = paged_fp8_attention(q, layers[0][0], layers[0][1], table, seqlens, cu, 1, causal=True, return_lse=True)
    assert split_kv_calls[-1]["lse"] is True and split_kv_calls[-1]["window"] == (-1, -1)
    assert out.shape == (2, 8, 64) and lse.shape == (8, 2)


@pytest.mark.parametrize("change,message", [
    (dict(page_table=torch.zeros(2, 3, dtype=torch.int64)), "page_table must be int32"),
    (dict(cache_seqlens=torch.zeros(3, dtype=torch.int32)), "cache_seqlens has 3 entries"),
    (dict(cu_seqlens_q=torch.zeros(4, dtype=torch.int32)), r"cu_seqlens_q must be int32 \(3,\)"),
    (dict(max_seqlen_q=1.0), "max_seqlen_q must be a host int"),
    (dict(q=torch.randn(2, 8, 64)), "q must be float8_e4m3fn"),
    (dict(softmax_scale="0.1"), "softmax_scale must be a real number"),
    (dict(return_lse=True, max_seqlen_q=None, backend="gather"), "only the split-KV kernel computes the LSE"),
    (dict(backend="fast"), "backend must be one of"),
])
def test_the_paged_plan_refuses_each_bad_argument(change, message):
    k_cache, v_cache, table, seqlens = make_pool([70, 300], 16, 2, 64)
    kw = dict(q=torch.randn(2, 8, 64).to(FP8), k_cache=k_cache, v_cache=v_cache, page_table=table,
              cache_seqlens=seqlens, cu_seqlens_q=cu_seqlens([1, 1]), max_seqlen_q=1)
    kw.update(change)
    with pytest.raises(PagedKVError, match=message):
        fp8_paged_kv.plan(**kw)


def test_decode_graphs_through_sglangs_own_graph_metadata(sglang_version):
    """SGLang's decode CUDA graphs end to end on its real FlashAttentionBackend + fp8 pool (page 16):
    init_cuda_graph_state(8, 8), then per captured batch size (1, 4, 8) init_forward_metadata_out_graph
    at capture (seq_lens = the backend's fill value) and forward_decode with a capture in progress
    (torch.cuda.is_current_stream_capturing faked True, every device->host path raising); then replays
    with longer lengths (several pages, off a page end, exactly one page) and shorter ones (the page
    table's tail left stale from the longer replay): the recorded launches (grid and every host
    argument) equal the capture's, the kernel reads SGLang's graph buffers themselves (same
    data_ptrs), and the kernel on what the replay left in those buffers (outside the faked capture:
    itself in Triton's interpreter at batch 4, its torch contract at 1 and 8) equals the fp32 reference on the dequantized pool for the new
    lengths (free pool memory poisoned with NaN; the reference's page table built from req_to_token,
    not from the buffers)."""
    from sglang_fa4.kernels.fp8_paged_kv.decode_plan import choose_splits
    from sglang_fa4.kernels.fp8_paged_kv.decode import DEFAULT_SM_COUNT

    g = real_backend_run(sglang_version)["graph"]
    max_context_len, hkv, P = g["max_context_len"], 4, 16
    width = max_context_len // P
    assert g["buffers"]["page_table"] == [8, width] and g["buffers"]["cache_seqlens"] == [8], g["buffers"]
    lens = {"long": [200, 17, 16, 129, 64, 1, 33, 177], "short": [3, 16, 1, 15, 2, 31, 48, 5]}
    grids = set()
    for bs in (1, 4, 8):
        r = g[f"bs{bs}"]
        assert r["metadata_is_graph_state"] and r["capture_from_buffers"], (bs, r)
        names = [launch[0] for launch in r["capture"]]
        assert names == ["split", "combine"], (bs, names)  # several splits: the combine runs too
        assert r["capture"][0][1] == [1, bs * hkv, choose_splits(bs, hkv, 1, max_context_len, DEFAULT_SM_COUNT)]
        grids.add(tuple(r["capture"][0][1]))
        for name in ("long", "short"):
            rep = r[name]
            assert rep["cache_seqlens"] == lens[name][:bs], (bs, name, rep)   # SGLang's replay wrote them
            assert rep["metadata_is_graph_state"] and rep["from_buffers"], (bs, name, rep)
            assert rep["launches_equal_capture"], (bs, name, rep)
            assert rep["finite"] and rep["err"] < 1e-2, (bs, name, rep)
            assert rep["interpreted_grids"] == ([r["capture"][0][1]] if bs == 4 else []), (bs, name, rep)
    assert len(grids) == 3  # one fixed grid per captured batch size
