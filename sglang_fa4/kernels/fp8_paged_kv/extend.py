"""Attention over a paged E4M3 KV cache (SGLang's fp8_e4m3 token pool) with the SM90 FP8 forward.

The FP8 kernel (:mod:`sglang_fa4.kernels.fp8_sm90`) reads K as one contiguous (total_k, Hkv, d)
tensor and V as the permuted V^T buffer, both by TMA; a paged cache is neither.  So each call
first gathers the pages the batch uses into that layout with one Triton launch
(:func:`sglang_fa4.kernels.fp8_paged_gather.gather_paged_kv_vt`: K rows and V^T columns written
from one read of each used page; sized exactly from one read-back of the lengths per forward, or by
the page table's host bound inside a CUDA-graph capture), then calls the kernel.  The gather moves
twice the bytes the attention reads: fine against prefill's compute, a large share of decode's
time (docs/fp8-kv-cache.md); only reading pages through the page table in the kernel removes it.

Decode packs the GQA group (``decode_gqa_pack``): with one new token per sequence, the g q heads
that share a kv head see the same keys (a decode query sees the whole cache, causal or not), so
they are handed to the kernel as g query rows of one head -- q (batch, Hq, d) viewed as
(batch * g, Hkv, d), ``cu_seqlens_q`` = 0, g, 2g, ..., non-causal -- and the output is permuted
back.  One CTA per (sequence, kv head) with g live rows of its 128, instead of one per (sequence,
q head) with one row each re-reading the same K/V: g times fewer CTAs and K/V reads.

Imports nothing from SGLang.
"""

from __future__ import annotations

from typing import Optional

import torch

from sglang_fa4.kernels.fp8_paged_gather import (  # noqa: F401 (the route's names, re-exported)
    PagedKVError,
    _need,
    check_paged,
    exact_sizes,
    gather_paged_kv,
    gather_paged_kv_reference,
    gather_paged_kv_vt,
)
from sglang_fa4.kernels.fp8_paged_decode import paged_decode_attention, takes_split_kv

FP8 = torch.float8_e4m3fn


def descales(k_descale, v_descale, batch: int, hkv: int, device) -> torch.Tensor:
    """The kernel's (3, batch, Hkv) float32 descales: q 1 (SGLang casts q to E4M3 without a
    scale), k/v from the pool's scales (SGLang passes ``layer.k_scale.expand(batch, Hkv)``), 1 when
    the pool has none.  Built with device ops only (capturable)."""
    out = torch.ones((3, batch, hkv), dtype=torch.float32, device=device)
    for i, (name, x) in enumerate((("k_descale", k_descale), ("v_descale", v_descale)), start=1):
        if x is None:
            continue
        _need(isinstance(x, torch.Tensor), f"{name} must be a tensor, got {type(x).__name__}")
        _need(x.numel() == 1 or tuple(x.shape) == (batch, hkv),
              f"{name} must be a scalar or (batch, kv_heads) = {(batch, hkv)}, got {tuple(x.shape)}")
        out[i].copy_(x.reshape(()).expand(batch, hkv) if x.numel() == 1 else x)
    return out


def decode_gqa_packable(q, batch: int, hkv: int, max_seqlen_q: Optional[int], window_size, causal: bool) -> bool:
    """Exactly one query token per sequence (host facts: ``max_seqlen_q`` 1 and ``batch`` rows),
    more q heads than kv heads, no bounded window (a window moves with the query position, which
    packing would misplace): the group can be packed."""
    from sglang_fa4.kernels.fp8_sm90.layout import normalize_window

    _, local, _, _ = normalize_window(causal, window_size)
    return (max_seqlen_q == 1 and q.shape[0] == batch and batch > 0
            and q.shape[1] > hkv and not local)


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


def paged_fp8_attention(
    q,
    k_cache,
    v_cache,
    page_table,
    cache_seqlens,
    cu_seqlens_q,
    max_seqlen_q: Optional[int],
    *,
    k_descale=None,
    v_descale=None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size=(-1, -1),
    out=None,
    return_lse: bool = False,
):
    """E4M3 q (total_q, Hq, d) against a paged E4M3 cache -> bf16 (total_q, Hq, d) (``out`` when it
    is a bf16 tensor of that shape; otherwise the result is copied into ``out``).  The causal
    diagonal is bottom-right aligned (query i of a sequence with n new tokens sees keys up to
    ``cache_seqlens[b] - n + i``): extend with a cached prefix and decode alike.  Decode-shaped
    calls (``max_seqlen_q`` 1) pack the GQA group (decode_gqa_packable); ``max_seqlen_q`` None runs
    one CTA per (sequence, q head) instead.  ``return_lse``: (out, lse (Hq, total_q)) as FA's varlen
    call returns them; only the split-KV kernel computes the LSE, so such calls always take it."""
    _need(isinstance(q, torch.Tensor) and q.dtype == FP8,
          f"q must be float8_e4m3fn (cast like SGLang's fa3 path), got {getattr(q, 'dtype', type(q).__name__)}")
    _need(q.dim() == 3, f"q must be (tokens, heads, head_dim), got {tuple(q.shape)}")
    _need(isinstance(cu_seqlens_q, torch.Tensor) and cu_seqlens_q.dtype == torch.int32,
          "cu_seqlens_q must be an int32 tensor (batch + 1,)")
    _need(cu_seqlens_q.shape[0] == page_table.shape[0] + 1,
          f"cu_seqlens_q has {cu_seqlens_q.shape[0]} entries for a page table of {page_table.shape[0]} sequences")
    if return_lse or takes_split_kv(max_seqlen_q):  # decode / few new rows: the pool read in place, no gather
        return paged_decode_attention(q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, max_seqlen_q,
                                      k_descale=k_descale, v_descale=v_descale, softmax_scale=softmax_scale,
                                      causal=causal, window_size=window_size, out=out,
                                      **({"return_lse": True} if return_lse else {}))
    sizes = exact_sizes(cache_seqlens)
    k, vt, cu_k, max_k = gather_paged_kv_vt(k_cache, v_cache, page_table, cache_seqlens, sizes)
    batch, hkv = page_table.shape[0], k.shape[1]
    from sglang_fa4.kernels.dispatch import fa4_varlen_attention

    want = (q.shape[0], q.shape[1], k.shape[2])
    desc = descales(k_descale, v_descale, batch, hkv, q.device)
    if decode_gqa_packable(q, batch, hkv, max_seqlen_q, window_size, causal):
        qp, cu_qp, g = decode_gqa_pack(q.contiguous(), hkv)
        # every packed row is the sequence's last token: it sees all keys, causal or not
        o = fa4_varlen_attention(qp, k.view(FP8), None, cu_qp, g, cu_seqlens_k=cu_k, max_seqlen_k=max_k,
                                 descale=desc, softmax_scale=softmax_scale, causal=False, vt=vt)
        result = decode_gqa_unpack(o, batch, hkv, g)
        if out is not None:
            out.copy_(result.view(out.shape))
            return out
        return result
    direct = out if (out is not None and out.dtype == torch.bfloat16 and tuple(out.shape) == want
                     and out.stride(-1) == 1) else None
    result = fa4_varlen_attention(
        q.contiguous(), k.view(FP8), None, cu_seqlens_q, max_seqlen_q, cu_seqlens_k=cu_k, max_seqlen_k=max_k,
        descale=desc, softmax_scale=softmax_scale, causal=causal, window_size=window_size, out=direct, vt=vt,
    )
    if out is not None and direct is None:
        out.copy_(result.view(out.shape))
        return out
    return result


def dequantized_paged_kv(k_cache, v_cache, page_table, cache_seqlens, *, k_descale=None, v_descale=None,
                         device=None):
    """Every sequence's cached K and V, gathered from the paged E4M3 pool and dequantized to float32
    (one descale, or one per (sequence, kv head)), packed by sequence: ``(sum(cache_seqlens), hkv, d)``
    each. What the fp32 reference (``sglang_fa4.testing.paged_attention_fp32``) attends over."""

    def descaled(x, scale, b):
        if scale is None:
            return x
        return x * scale.reshape(-1)[0].float() if scale.numel() == 1 else x * scale[b].float()[None, :, None]

    ks, vs = [], []
    for b in range(cache_seqlens.shape[0]):
        kb, vb = gather_paged_kv_reference(k_cache, v_cache, page_table[b:b + 1], cache_seqlens[b:b + 1])
        ks.append(descaled(kb.view(FP8).float().to(device), k_descale, b))
        vs.append(descaled(vb.view(FP8).float().to(device), v_descale, b))
    return torch.cat(ks), torch.cat(vs)
