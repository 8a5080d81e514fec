"""Extend (and prefill) over a paged E4M3 KV cache (SGLang's fp8_e4m3 pool): the pages gathered, then the
SM90 FP8 forward.

The FP8 kernel (:mod:`sglang_fa4.kernels.fp8_sm90`) reads K as one contiguous (total_k, Hkv, d)
tensor and V as the permuted V^T buffer, both by TMA; a paged cache is neither.  So each call
first gathers the pages the batch uses into that layout with one Triton launch
(:func:`.gather.gather_paged_kv_vt`: K rows and V^T columns written
from one read of each used page; sized exactly from one read-back of the lengths per forward, or by
the page table's host bound inside a CUDA-graph capture), then calls the kernel.  The gather moves
twice the bytes the attention reads: fine against prefill's compute, a large share of decode's
time (docs/fp8-kv-cache.md): decode and short extends take the split-KV kernel (:mod:`.decode`),
which reads the pages in place; the route's plan (:mod:`.batch_plan`) chooses.

Decode on this route (``SGLANG_FA4_FP8_KV_SPLIT_KV_MAX_Q=0``) packs the GQA group (``decode_gqa_pack``): with one new token per sequence, the g q heads
that share a kv head see the same keys (a decode query sees the whole cache, causal or not), so
they are handed to the kernel as g query rows of one head -- q (batch, Hq, d) viewed as
(batch * g, Hkv, d), ``cu_seqlens_q`` = 0, g, 2g, ..., non-causal -- and the output is permuted
back.  One CTA per (sequence, kv head) with g live rows of its 128, instead of one per (sequence,
q head) with one row each re-reading the same K/V: g times fewer CTAs and K/V reads.

Imports nothing from SGLang.
"""

from __future__ import annotations

import torch

from sglang_fa4.kernels import fp8_sm90
from sglang_fa4.kernels.fp8_paged_kv.gather import exact_sizes

FP8 = torch.float8_e4m3fn


def descales(k_descale, v_descale, batch: int, hkv: int, device) -> torch.Tensor:
    """The kernel's (3, batch, Hkv) float32 descales (checked by the plan): q 1 (SGLang casts q to
    E4M3 without a scale), k/v from the pool's scales (SGLang passes ``layer.k_scale.expand(batch,
    Hkv)``), 1 when the pool has none.  Built with device ops only (capturable)."""
    out = torch.ones((3, batch, hkv), dtype=torch.float32, device=device)
    for i, x in enumerate((k_descale, v_descale), start=1):
        if x is not None:
            out[i].copy_(x.reshape(()).expand(batch, hkv) if x.numel() == 1 else x)
    return out


def decode_gqa_pack(q, hkv: int):
    """q (batch, Hq, d), head h = kvh * g + j -> (batch * g, Hkv, d) with row b * g + j of head kvh
    = q[b, kvh * g + j], and its cu_seqlens_q (0, g, 2g, ...; device ops only, capturable)."""
    batch, hq, d = q.shape
    g = hq // hkv
    packed = q.view(batch, hkv, g, d).transpose(1, 2).reshape(batch * g, hkv, d)
    cu = torch.arange(0, (batch + 1) * g, g, dtype=torch.int32, device=q.device)
    return packed, cu, g


def decode_gqa_unpack(o, batch: int, hkv: int, g: int):
    """The inverse permutation of :func:`decode_gqa_pack` on the output: (batch * g, Hkv, d) ->
    (batch, Hq, d)."""
    return o.view(batch, g, hkv, o.shape[-1]).transpose(1, 2).reshape(batch, g * hkv, o.shape[-1])


def run(plan, q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, k_descale, v_descale,
        softmax_scale, out, gather):
    """One layer of a gather plan (:class:`.batch_plan.PagedPlan`, arguments checked): the pages gathered
    by ``gather`` (:func:`.gather.gather_paged_kv_vt`: sized exactly from one read-back of the
    lengths per forward, by the host bound inside a capture), then the FP8 forward -> bf16
    (total_q, Hq, d), into ``out`` when given. The causal diagonal is bottom-right aligned; a
    decode-shaped plan packs the GQA group (every packed row is its sequence's last token: it sees
    all keys, causal or not)."""
    k, vt, cu_k, max_k = gather(k_cache, v_cache, page_table, cache_seqlens, exact_sizes(cache_seqlens))
    batch, hkv = plan.batch, plan.kv_heads
    desc = descales(k_descale, v_descale, batch, hkv, q.device)
    if plan.gqa_pack:
        qp, cu_qp, g = decode_gqa_pack(q.contiguous(), hkv)
        o = fp8_sm90.fp8_varlen_attention(qp, k.view(FP8), None, cu_qp, cu_k, g, max_k, descale=desc,
                                          softmax_scale=softmax_scale, causal=False, vt=vt)
        result = decode_gqa_unpack(o, batch, hkv, g)
        if out is not None:
            out.copy_(result.view(out.shape))
            return out
        return result
    direct = out if plan.out_direct else None
    result = fp8_sm90.fp8_varlen_attention(
        q.contiguous(), k.view(FP8), None, cu_seqlens_q, cu_k, plan.max_seqlen_q, max_k, descale=desc,
        softmax_scale=softmax_scale, causal=plan.causal, window_size=plan.window, out=direct, vt=vt,
    )
    if out is not None and direct is None:
        out.copy_(result.view(out.shape))
        return out
    return result
