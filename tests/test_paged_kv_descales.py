"""Per-(sequence, kv-head) descales of the FP8 paged-KV path, on the CPU: their checks where they enter
(the route's plan), the gather route's descale tensor (``fp8_paged_kv.extend.descales``: row 0 q,
1 k, 2 v; each row (batch, kv_heads)) and the fp32
reference on the paged cache, against the shared reference (sglang_fa4/testing.py) on K/V
dequantized by hand. Every (sequence, kv head) gets its own scale, so a transposed, shared or
misplaced scale changes the answer."""

from __future__ import annotations

import pytest
import torch

from sglang_fa4.kernels import fp8_paged_kv
from sglang_fa4.kernels.fp8_paged_kv import PagedKVError
from sglang_fa4.kernels.fp8_paged_kv.extend import FP8, descales
from sglang_fa4.testing import attention_fp32, cu_seqlens, offsets, paged_attention_fp32, rel_err

BATCH, HKV = 3, 2


def scales(base: float) -> torch.Tensor:
    """(batch, kv_heads) scales, all distinct: base * (1 + b + 0.25 h)."""
    return torch.tensor([[base * (1 + b + 0.25 * h) for h in range(HKV)] for b in range(BATCH)])


def test_descales_keep_each_sequence_and_kv_head():
    k, v = scales(0.02), scales(0.5)
    out = descales(k, v, BATCH, HKV, "cpu")
    assert out.shape == (3, BATCH, HKV) and out.dtype == torch.float32
    assert torch.equal(out[0], torch.ones(BATCH, HKV))  # q: SGLang casts it to E4M3 unscaled
    assert torch.equal(out[1], k) and torch.equal(out[2], v)


def test_descales_scalar_broadcast_and_none():
    out = descales(torch.tensor(0.25), None, BATCH, HKV, "cpu")
    assert torch.equal(out[1], torch.full((BATCH, HKV), 0.25)) and torch.equal(out[2], torch.ones(BATCH, HKV))
    out = descales(None, torch.tensor([[0.5]]), BATCH, HKV, "cpu")  # one element, any shape
    assert torch.equal(out[1], torch.ones(BATCH, HKV)) and torch.equal(out[2], torch.full((BATCH, HKV), 0.5))


@pytest.mark.parametrize("name,bad,message", [
    ("k_descale", torch.ones(HKV, BATCH), r"k_descale must be a scalar or \(batch, kv_heads\) = \(3, 2\), got \(2, 3\)"),
    ("v_descale", torch.ones(BATCH), r"v_descale must be a scalar or \(batch, kv_heads\) = \(3, 2\), got \(3,\)"),
    ("k_descale", torch.ones(BATCH, HKV, 1), r"got \(3, 2, 1\)"),
    ("v_descale", 0.5, "v_descale must be a tensor, got float"),
])
def test_descales_refuse_each_bad_shape(name, bad, message):
    """Checked where they enter the route (its plan), on either backend."""
    cache = torch.zeros(4, 16, HKV, 64).to(FP8)
    table = torch.zeros(BATCH, 2, dtype=torch.int32)
    lens = torch.full((BATCH,), 5, dtype=torch.int32)
    for max_q in (1, 40):  # split-KV, gather
        q = torch.zeros(BATCH * max_q, 4, 64).to(FP8)
        with pytest.raises(PagedKVError, match=message):
            fp8_paged_kv.plan(q, cache, cache, table, lens, cu_seqlens([max_q] * BATCH), max_q,
                              **{"k_descale": None, "v_descale": None, name: bad})


def test_paged_reference_applies_each_sequences_kv_head_scale():
    torch.manual_seed(0)
    page, d, hq, lens, q_lens = 4, 16, 4, [5, 9, 3], [2, 9, 1]
    pages = sum(-(-n // page) for n in lens) + 1
    k_cache = (torch.randn(pages, page, HKV, d) * 2).to(FP8)
    v_cache = (torch.randn(pages, page, HKV, d) * 2).to(FP8)
    table, nxt = torch.zeros(BATCH, 3, dtype=torch.int32), pages - 1  # pages handed out backwards
    for b, n in enumerate(lens):
        for p in range(-(-n // page)):
            table[b, p], nxt = nxt, nxt - 1
    q = torch.randn(sum(q_lens), hq, d)
    ks, vs = scales(0.05), scales(0.3)
    got = paged_attention_fp32(q, k_cache, v_cache, table, torch.tensor(lens, dtype=torch.int32),
                                    cu_seqlens(q_lens), k_descale=ks, v_descale=vs)
    # the same attention on K/V gathered and dequantized by hand, per sequence and kv head
    kk, vv = [], []
    for b, n in enumerate(lens):
        rows = torch.arange(n)
        slots = table[b, rows // page].long(), rows % page
        kk.append(k_cache[slots].float() * ks[b][None, :, None])
        vv.append(v_cache[slots].float() * vs[b][None, :, None])
    want = attention_fp32(q, torch.cat(kk), torch.cat(vv), offsets(q_lens), offsets(lens), causal=True)
    assert rel_err(got, want) < 1e-6
    # and a scale of another sequence or kv head would not give it
    swapped = paged_attention_fp32(q, k_cache, v_cache, table, torch.tensor(lens, dtype=torch.int32),
                                        cu_seqlens(q_lens),
                                        k_descale=ks.flip(1), v_descale=vs)
    assert rel_err(swapped, want) > 1e-3
