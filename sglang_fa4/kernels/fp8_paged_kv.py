"""Attention over a paged E4M3 KV cache (SGLang's fp8_e4m3 token pool) with the SM90 FP8 forward.

The FP8 kernel (:mod:`sglang_fa4.kernels.fp8_sm90`) reads K as one contiguous (total_k, Hkv, d)
tensor and V as the permuted V^T buffer, both by TMA; a paged cache is neither.  So each call
first gathers the pages the batch uses into that layout:

* ``gather_paged_kv``: page table + per-sequence lengths -> contiguous K and V rows (sequence b at
  rows ``cu_seqlens_k[b] ..``), plus ``cu_seqlens_k``.  Pure torch (CPU-testable).  The buffer is
  sized exactly from one read-back of the lengths per forward (``exact_sizes``: SGLang hands every
  layer the same ``cache_seqlens`` tensor, so one device sync per forward, not per layer); while a
  CUDA graph is captured (SGLang's decode graphs) no sync is possible and it is sized by the host
  bound ``batch * page_table.shape[1] * page_size`` rows -- SGLang's graph page table is as wide as
  the context length, so that buffer is batch x context length rows (graph-pool memory that SGLang's
  KV sizing does not know about);
* the V rows are then packed into V^T (``vt_pack.pack_vt``, one Triton launch).

Cost per call: read K and V pages once and write them twice (rows, then V^T): ~4x the KV bytes the
attention itself reads.  Fine against prefill's compute; it dominates decode (see the README).

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

FP8 = torch.float8_e4m3fn
#: Pack the GQA group into the M tile on decode-shaped calls (see the module doc); False: one CTA
#: per (sequence, q head), for side-by-side timing (benchmark/check_fp8_kv_route.py).
PACK_GQA_DECODE = True


class PagedKVError(ValueError):
    """The paged cache or its metadata cannot be used (the message says which argument)."""


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise PagedKVError(msg)


def check_paged(k_cache, v_cache, page_table, cache_seqlens) -> tuple[int, int, int, int]:
    """(pages, page_size, Hkv, d) after checking the cache and metadata shapes/dtypes."""
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        _need(isinstance(t, torch.Tensor) and t.dim() == 4,
              f"{name} must be a (pages, page_size, kv_heads, head_dim) tensor, got "
              f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
        _need(t.dtype in (FP8, torch.uint8), f"{name} must be float8_e4m3fn (or its uint8 storage), got {t.dtype}")
        _need(t.is_contiguous(), f"{name} must be contiguous (SGLang's NHD page layout), strides {t.stride()}")
    _need(tuple(k_cache.shape) == tuple(v_cache.shape),
          f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} must have one shape (v_head_dim == head_dim)")
    _need(isinstance(page_table, torch.Tensor) and page_table.dim() == 2 and page_table.dtype == torch.int32,
          f"page_table must be int32 (batch, pages_per_seq), got "
          f"{(page_table.dtype, tuple(page_table.shape)) if isinstance(page_table, torch.Tensor) else page_table!r}")
    _need(isinstance(cache_seqlens, torch.Tensor) and cache_seqlens.dim() == 1 and cache_seqlens.dtype == torch.int32,
          "cache_seqlens must be a 1-D int32 tensor")
    _need(cache_seqlens.shape[0] == page_table.shape[0],
          f"cache_seqlens has {cache_seqlens.shape[0]} entries, page_table {page_table.shape[0]} rows")
    pages, page_size, hkv, d = k_cache.shape
    return pages, page_size, hkv, d


def exact_sizes(cache_seqlens) -> Optional[tuple[int, int]]:
    """(total, longest) of ``cache_seqlens`` read back once per tensor version (SGLang passes the
    same tensor to every layer of a forward: one device sync per forward, not per layer); None
    while a CUDA graph is being captured (no sync possible: the host bound is used)."""
    if cache_seqlens.is_cuda and torch.cuda.is_current_stream_capturing():
        return None
    key = (cache_seqlens._version, cache_seqlens.data_ptr(), cache_seqlens.shape[0])
    hit = getattr(cache_seqlens, "_sglang_fa4_sizes", None)
    if hit is not None and hit[0] == key:
        return hit[1]
    if cache_seqlens.numel() == 0:
        sizes = (0, 0)
    else:
        total, longest = torch.stack([cache_seqlens.sum(dtype=torch.int64), cache_seqlens.max().to(torch.int64)]).tolist()
        sizes = (int(total), int(longest))
    cache_seqlens._sglang_fa4_sizes = (key, sizes)
    return sizes


def gather_paged_kv(k_cache, v_cache, page_table, cache_seqlens, sizes: Optional[tuple[int, int]] = None):
    """Contiguous (rows, Hkv, d) K and V (uint8 storage of E4M3) of every sequence's first
    ``cache_seqlens[b]`` cached tokens, sequence b at rows ``cu_seqlens_k[b]:cu_seqlens_k[b+1]``;
    returns (k, v, cu_seqlens_k, max_seqlen_k).  ``sizes`` = (total, longest) from
    :func:`exact_sizes` sizes the buffer exactly; without it the host bound
    ``batch * page_table.shape[1] * page_size`` is used (no sync) and rows past
    ``cu_seqlens_k[-1]`` hold page 0's first token (never read by the kernel).  Token t of sequence
    b lives in page ``page_table[b, t // page_size]`` at offset ``t % page_size`` (SGLang's layout)."""
    _, page_size, hkv, d = check_paged(k_cache, v_cache, page_table, cache_seqlens)
    batch, width = page_table.shape
    per_seq = width * page_size  # host bound on any sequence's length
    rows = max(batch * per_seq, 1)
    if sizes is not None:
        _need(sizes[1] <= per_seq, f"a sequence of {sizes[1]} tokens does not fit the page table's {per_seq}")
        rows, per_seq = max(sizes[0], 1), max(sizes[1], 1)
    device = k_cache.device
    lens = cache_seqlens.to(torch.int64)
    cu_k = torch.zeros(batch + 1, dtype=torch.int64, device=device)
    torch.cumsum(lens, 0, out=cu_k[1:])
    r = torch.arange(rows, device=device)
    seq = torch.searchsorted(cu_k[1:], r, right=True).clamp_(max=max(batch - 1, 0))
    t = r - cu_k[seq]
    valid = r < cu_k[-1]
    t = torch.where(valid, t, torch.zeros_like(t)).clamp_(max=per_seq - 1)
    page = page_table[seq, t // page_size].to(torch.int64)
    slot = torch.where(valid, page * page_size + t % page_size, torch.zeros_like(page))
    k_flat = k_cache.view(torch.uint8).view(-1, hkv, d)
    v_flat = v_cache.view(torch.uint8).view(-1, hkv, d)
    k = k_flat.index_select(0, slot)
    v = v_flat.index_select(0, slot)
    return k, v, cu_k.to(torch.int32), per_seq


def gather_paged_kv_reference(k_cache, v_cache, page_table, cache_seqlens):
    """Per-sequence reference of :func:`gather_paged_kv` (tests): the valid rows only, built from
    SGLang's page arithmetic directly (no cumulative offsets, no search)."""
    _, page_size, hkv, d = check_paged(k_cache, v_cache, page_table, cache_seqlens)
    k_flat = k_cache.view(torch.uint8).reshape(-1, hkv, d)
    v_flat = v_cache.view(torch.uint8).reshape(-1, hkv, d)
    ks, vs = [], []
    for b, n in enumerate(cache_seqlens.tolist()):
        t = torch.arange(n, device=k_cache.device)
        slots = page_table[b].to(torch.int64)[t // page_size] * page_size + t % page_size
        ks.append(k_flat[slots])
        vs.append(v_flat[slots])
    if not ks:
        empty = torch.empty((0, hkv, d), dtype=torch.uint8, device=k_cache.device)
        return empty, empty.clone()
    return torch.cat(ks), torch.cat(vs)


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
    return (PACK_GQA_DECODE and max_seqlen_q == 1 and q.shape[0] == batch and batch > 0
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
):
    """E4M3 q (total_q, Hq, d) against a paged E4M3 cache -> bf16 (total_q, Hq, d) (``out`` when it
    is a bf16 tensor of that shape; otherwise the result is copied into ``out``).  The causal
    diagonal is bottom-right aligned (query i of a sequence with n new tokens sees keys up to
    ``cache_seqlens[b] - n + i``): extend with a cached prefix and decode alike."""
    _need(isinstance(q, torch.Tensor) and q.dtype == FP8,
          f"q must be float8_e4m3fn (cast like SGLang's fa3 path), got {getattr(q, 'dtype', type(q).__name__)}")
    _need(q.dim() == 3, f"q must be (tokens, heads, head_dim), got {tuple(q.shape)}")
    _need(isinstance(cu_seqlens_q, torch.Tensor) and cu_seqlens_q.dtype == torch.int32,
          "cu_seqlens_q must be an int32 tensor (batch + 1,)")
    _need(cu_seqlens_q.shape[0] == page_table.shape[0] + 1,
          f"cu_seqlens_q has {cu_seqlens_q.shape[0]} entries for a page table of {page_table.shape[0]} sequences")
    k, v, cu_k, max_k = gather_paged_kv(k_cache, v_cache, page_table, cache_seqlens, exact_sizes(cache_seqlens))
    batch, hkv = page_table.shape[0], k.shape[1]
    from sglang_fa4.kernels.fp8_sm90.launch import fp8_varlen_attention

    want = (q.shape[0], q.shape[1], k.shape[2])
    desc = descales(k_descale, v_descale, batch, hkv, q.device)
    if decode_gqa_packable(q, batch, hkv, max_seqlen_q, window_size, causal):
        qp, cu_qp, g = decode_gqa_pack(q.contiguous(), hkv)
        # every packed row is the sequence's last token: it sees all keys, causal or not
        o = fp8_varlen_attention(qp, k.view(FP8), v.view(FP8), cu_qp, cu_k, g, max_k, descale=desc,
                                 softmax_scale=softmax_scale, causal=False, window_size=(-1, -1), out=None)
        result = decode_gqa_unpack(o, batch, hkv, g)
        if out is not None:
            out.copy_(result.view(out.shape))
            return out
        return result
    direct = out if (out is not None and out.dtype == torch.bfloat16 and tuple(out.shape) == want
                     and out.stride(-1) == 1) else None
    result = fp8_varlen_attention(
        q.contiguous(), k.view(FP8), v.view(FP8), cu_seqlens_q, cu_k, max_seqlen_q, max_k,
        descale=desc, softmax_scale=softmax_scale, causal=causal, window_size=window_size, out=direct,
    )
    if out is not None and direct is None:
        out.copy_(result.view(out.shape))
        return out
    return result


def paged_attention_reference(q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, *,
                              k_descale=None, v_descale=None, softmax_scale=None, causal=True):
    """fp32 reference on the dequantized cache (CPU/GPU): per sequence, bottom-right causal, GQA."""
    qf = q.float()
    hq, d = q.shape[1], q.shape[2]
    scale = d ** -0.5 if softmax_scale is None else softmax_scale
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    cq = cu_seqlens_q.tolist()
    for b, n in enumerate(cache_seqlens.tolist()):
        kb, vb = gather_paged_kv_reference(k_cache, v_cache, page_table[b:b + 1], cache_seqlens[b:b + 1])
        kf = kb.view(FP8).float().to(q.device)
        vf = vb.view(FP8).float().to(q.device)
        if k_descale is not None:
            kf = kf * k_descale.reshape(-1)[0].float() if k_descale.numel() == 1 else kf * k_descale[b].float()[None, :, None]
        if v_descale is not None:
            vf = vf * v_descale.reshape(-1)[0].float() if v_descale.numel() == 1 else vf * v_descale[b].float()[None, :, None]
        rep = hq // kf.shape[1]
        kf, vf = kf.repeat_interleave(rep, 1), vf.repeat_interleave(rep, 1)
        qb = qf[cq[b]:cq[b + 1]]
        s = torch.einsum("qhd,khd->hqk", qb, kf) * scale
        if causal:
            nq = qb.shape[0]
            i = torch.arange(nq, device=q.device)[:, None]
            j = torch.arange(n, device=q.device)[None, :]
            s = s.masked_fill(j > i + (n - nq), float("-inf"))
        out[cq[b]:cq[b + 1]] = torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), vf)
    return out
