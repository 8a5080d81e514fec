"""The references: varlen layouts built from segment lengths, the one fp32 reference attention, the
relative error.

The reference is plain softmax attention in float32, one segment at a time, with the conventions
the kernels share: packed ``(tokens, heads, head_dim)`` tensors split by ``cu_seqlens``; grouped
query heads (query head ``h`` reads kv head ``h // (heads / kv_heads)``); causal and sliding-window
masks aligned bottom-right when a segment has more keys than queries (FlashAttention's
convention: query ``i`` of ``nq`` sits at key position ``i + nk - nq``); a window
``(left, right)`` keeps keys ``j`` with ``-left <= j - pos(i) <= right`` (None or a negative
bound: unbounded, SGLang's -1); per-row key ranges a row also sees past the causal / right bound
(SGLang's Gemma-4 image rows: bidirectional within their image), the left bound still applying;
attention sinks as one extra per-head logit in each row's softmax denominator (no value); a row
whose keys are all masked is zero (as the kernels write it).

Imports torch only.
"""

from __future__ import annotations

from itertools import accumulate
from typing import Optional, Sequence

import torch


def offsets(lens: Sequence[int]) -> list[int]:
    """Segment lengths -> cumulative offsets: ``[3, 0, 2] -> [0, 3, 3, 5]``. A negative length
    is an error (it would make a cu_seqlens that no kernel accepts)."""
    lens = [int(n) for n in lens]
    if any(n < 0 for n in lens):
        raise ValueError(f"segment lengths must be >= 0, got {lens}")
    return list(accumulate(lens, initial=0))


def cu_seqlens(lens: Sequence[int], device="cpu", dtype=torch.int32) -> torch.Tensor:
    """Segment lengths -> the ``cu_seqlens`` tensor (int32 unless told) every varlen kernel takes."""
    return torch.tensor(offsets(lens), dtype=dtype, device=device)


def lengths(cu: "torch.Tensor | Sequence[int]") -> list[int]:
    """``cu_seqlens`` -> segment lengths (the inverse of :func:`offsets`)."""
    c = [int(x) for x in (cu.tolist() if isinstance(cu, torch.Tensor) else cu)]
    return [b - a for a, b in zip(c, c[1:])]


def _unbounded(bound) -> bool:
    return bound is None or bound < 0


def attention_fp32(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q,
    cu_seqlens_k=None,
    *,
    scale: Optional[float] = None,
    causal: bool = False,
    window: tuple = (None, None),
    sinks: Optional[torch.Tensor] = None,
    fill: float = 0.0,
    dtype: torch.dtype = torch.float32,
    return_lse: bool = False,
    key_ranges: Optional[torch.Tensor] = None,
):
    """fp32 varlen attention of ``q (tq, hq, d)`` over ``k (tk, hkv, d)`` / ``v (tk, hkv, dv)``,
    segment by segment (``cu_seqlens_k`` defaults to ``cu_seqlens_q``: self-attention).
    ``scale`` defaults to ``d ** -0.5``. Rows outside every segment are ``fill``. Returns a
    ``(tq, hq, dv)`` tensor on q's device, float32 unless ``dtype`` asks for more (float64: a
    reference finer than what it checks). ``return_lse``: also the natural-log sum of each row's
    softmax denominator, ``(hq, tq)`` (sinks included; -inf for a row with nothing to attend to).
    ``key_ranges``: ``(tq, 2)`` inclusive key indices within each row's segment that the row also
    sees beyond the causal / right bound (-1, -1: none), e.g. an image row's own image."""
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(f"q, k, v must be (tokens, heads, dim), got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    hq, hkv = q.shape[1], k.shape[1]
    if hq % hkv or v.shape[1] != hkv:
        raise ValueError(f"query heads {hq} must be a multiple of kv heads {hkv} (k and v alike)")
    cq = [int(x) for x in (cu_seqlens_q.tolist() if isinstance(cu_seqlens_q, torch.Tensor) else cu_seqlens_q)]
    ck = cq if cu_seqlens_k is None else [
        int(x) for x in (cu_seqlens_k.tolist() if isinstance(cu_seqlens_k, torch.Tensor) else cu_seqlens_k)]
    if len(cq) != len(ck):
        raise ValueError(f"cu_seqlens_q has {len(cq) - 1} segments, cu_seqlens_k {len(ck) - 1}")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    left, right = window
    group = hq // hkv
    out = torch.full((q.shape[0], hq, v.shape[-1]), fill, dtype=dtype, device=q.device)
    lse = torch.full((hq, q.shape[0]), float("-inf"), dtype=dtype, device=q.device)
    for (q0, q1), (k0, k1) in zip(zip(cq, cq[1:]), zip(ck, ck[1:])):
        nq, nk = q1 - q0, k1 - k0
        if nq == 0:
            continue
        if nk == 0:
            out[q0:q1] = 0.0
            if sinks is not None:
                lse[:, q0:q1] = sinks.to(dtype=dtype, device=q.device)[:, None]
            continue
        qs = q[q0:q1].to(dtype).transpose(0, 1)  # (hq, nq, d)
        ks = k[k0:k1].to(dtype).transpose(0, 1).repeat_interleave(group, 0)
        vs = v[k0:k1].to(dtype).transpose(0, 1).repeat_interleave(group, 0)
        s = qs @ ks.transpose(1, 2) * scale  # (hq, nq, nk)
        rel = torch.arange(nk, device=q.device)[None, :] - (torch.arange(nq, device=q.device) + nk - nq)[:, None]
        masked = torch.zeros(nq, nk, dtype=torch.bool, device=q.device)
        if causal:
            masked |= rel > 0
        if not _unbounded(right):
            masked |= rel > right
        if key_ranges is not None:
            j = torch.arange(nk, device=q.device)[None, :]
            r = key_ranges[q0:q1].to(device=q.device, dtype=torch.long)
            masked &= ~((j >= r[:, :1]) & (j <= r[:, 1:]))
        if not _unbounded(left):
            masked |= rel < -left
        s = s.masked_fill(masked, float("-inf"))
        if sinks is not None:
            s = torch.cat([s, sinks.to(dtype=dtype, device=q.device)[:, None, None].expand(hq, nq, 1)], dim=-1)
        lse[:, q0:q1] = torch.logsumexp(s, dim=-1)
        p = torch.softmax(s, dim=-1)[..., :nk].nan_to_num(0.0)  # an all-masked row: zero
        out[q0:q1] = (p @ vs).transpose(0, 1)
    return (out, lse) if return_lse else out


def page_table(pages_needed: Sequence[int], perm: torch.Tensor, width: Optional[int] = None,
               fill: int = 0) -> torch.Tensor:
    """SGLang's page table (int32) for a shuffled allocation: sequence b owns the next
    ``pages_needed[b]`` page ids of ``perm``; rows are ``width`` wide (default: the most pages plus
    one, as SGLang's table is wider than needed) and hold ``fill`` past a sequence's pages."""
    width = width or max(max(pages_needed), 1) + 1
    table = torch.full((len(pages_needed), width), fill, dtype=torch.int32)
    at = 0
    for b, n in enumerate(pages_needed):
        table[b, :n] = perm[at:at + n].to(torch.int32)
        at += n
    return table


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``||out - ref|| / ||ref||`` in float64; NaN when ``out`` has a non-finite value (so a
    threshold comparison fails instead of passing on ``inf - inf``)."""
    o, r = out.double(), ref.double()
    if not torch.isfinite(o).all():
        return float("nan")
    return float(torch.linalg.vector_norm(o - r) / torch.linalg.vector_norm(r))
