"""A Triton kernel for varlen attention whose segments are all short (ViT windows of <= 64 tokens).

One program per (segment, head): the whole segment's q, k and v tiles sit in registers, S = QK^T is one
64 x 64 tile, the softmax needs no online rescaling, and O = PV is one more tile. No pipeline, no
tile scheduler: the time is the bytes of q, k, v and o, which is what a layout of many 64-token
windows is bound by. Segments longer than BLOCK_S tokens are not supported (the caller routes only
layouts whose longest segment fits). Empty segments write nothing.

Compiled at the startup warmup (:func:`warm`) and launched through a cached handle of the compiled
kernel (:mod:`sglang_fa4.kernels.triton_handles`) with a memo of the call's specialization:
12.6-14.7 us of host time per call on the H200 (issue #18). Strides that are multiples of 8 elements
(checked on the host) let the kernel load 16-byte vectors whatever Triton knows of them (d=72: a head
stride of 72 gave 2-byte loads). Triton (and torch) are imported lazily.
"""

from __future__ import annotations

import math
from typing import Optional

from sglang_fa4.kernels import compile_events
from sglang_fa4.kernels.triton_handles import KernelHandles

#: the longest segment this kernel handles (one tile)
BLOCK_S = 64
_LOG2E = math.log2(math.e)


def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def short_window_attention(
        Q, K, V, O, CU,
        stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
        qk_scale,  # softmax_scale * log2(e)
        KV_GROUP: tl.constexpr,  # q heads per kv head
        HEAD_DIM: tl.constexpr,
        BLOCK_D: tl.constexpr,
        BLOCK_S: tl.constexpr,
        ALIGN8: tl.constexpr,  # every stride a multiple of 8 elements (the host checked): 16-byte rows
    ):
        seg = tl.program_id(0)
        head = tl.program_id(1)
        kv_head = head // KV_GROUP
        start = tl.load(CU + seg)
        n = tl.load(CU + seg + 1) - start
        if n > 0:
            rows = tl.arange(0, BLOCK_S)
            cols = tl.arange(0, BLOCK_D)
            row_ok = rows < n
            col_ok = cols < HEAD_DIM
            tok = (start + rows).to(tl.int64)
            mask = row_ok[:, None] & col_ok[None, :]
            q_rows = tok * stride_qt + head * stride_qh
            k_rows = tok * stride_kt + kv_head * stride_kh
            v_rows = tok * stride_vt + kv_head * stride_vh
            o_rows = tok * stride_ot + head * stride_oh
            if ALIGN8:
                # Triton knows an int argument's divisibility only as "% 16": a head stride of 72
                # (d=72) leaves it none, and every load was a 2-byte one (4x slower than d=80).
                # The host checked the strides are multiples of 8: 16-byte vector loads.
                q_rows = tl.multiple_of(q_rows, 8)
                k_rows = tl.multiple_of(k_rows, 8)
                v_rows = tl.multiple_of(v_rows, 8)
                o_rows = tl.multiple_of(o_rows, 8)
            q = tl.load(Q + q_rows[:, None] + cols[None, :], mask=mask, other=0.0)
            k = tl.load(K + k_rows[:, None] + cols[None, :], mask=mask, other=0.0)
            v = tl.load(V + v_rows[:, None] + cols[None, :], mask=mask, other=0.0)
            s = tl.dot(q, tl.trans(k)) * qk_scale
            s = tl.where(row_ok[None, :], s, float("-inf"))  # keys past the segment
            m = tl.max(s, 1)
            p = tl.exp2(s - m[:, None])
            denom = tl.sum(p, 1)
            o = tl.dot(p.to(v.dtype), v) / denom[:, None]
            tl.store(O + o_rows[:, None] + cols[None, :], o.to(O.dtype.element_ty), mask=mask)

    return short_window_attention


HANDLES = KernelHandles("short_window_attention", _kernel)


def short_window_attention(q, k, v, cu_seqlens, max_seqlen: int, softmax_scale: Optional[float] = None, out=None,
                           num_warps: int = 4):
    """Attention within each segment of ``cu_seqlens``; q (tokens, heads, d), k/v (tokens, kv_heads, d)
    with a contiguous last dim; every segment at most BLOCK_S tokens."""
    if max_seqlen > BLOCK_S:
        raise ValueError(f"short_window_attention handles segments of <= {BLOCK_S} tokens, got max_seqlen {max_seqlen}")
    heads, kv_heads = q.shape[1], k.shape[1]
    if heads % kv_heads:
        raise ValueError(f"{heads} q heads are not a multiple of {kv_heads} kv heads")
    for name, t in (("q", q), ("k", k), ("v", v)) + ((("out", out),) if out is not None else ()):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} needs a contiguous last dim")
        if t.dtype != q.dtype:
            raise ValueError(f"{name} is {t.dtype}, q is {q.dtype}: one dtype for q, k, v and out")
    import torch

    if cu_seqlens.dtype is not torch.int32:
        raise ValueError(f"cu_seqlens must be int32, got {cu_seqlens.dtype}")
    if out is None:
        out = q.new_empty(q.shape)
    tokens, heads, d = q.shape
    return launch_checked(q, k, v, cu_seqlens, softmax_scale, out, tokens, heads, k.shape[1], d,
                          q.stride(), k.stride(), v.stride(), out.stride(), num_warps)


def launch_checked(q, k, v, cu_seqlens, softmax_scale: Optional[float], out, tokens: int, heads: int, kv_heads: int,
                   d: int, qs: tuple, ks: tuple, vs: tuple, os_: tuple, num_warps: int = 4):
    """The launch alone, for a caller that has checked the call and read its shapes and strides
    (:func:`.short_windows.short_attention`: dtypes, devices, unit last strides, segments <= BLOCK_S,
    ``out`` of q's shape and dtype). Host time is the point here (issue #18): nothing is read twice,
    and a memo of the values that fix the specialization lets a repeated layout launch without
    computing Triton's key."""
    segments = cu_seqlens.numel() - 1
    if segments <= 0 or tokens == 0:
        return out
    group = heads // kv_heads
    scale = (softmax_scale if softmax_scale is not None else d ** -0.5) * _LOG2E
    # all five pointers 16-byte aligned (the usual case): the memo is exact; otherwise the keyed path
    aligned = not (q.data_ptr() | k.data_ptr() | v.data_ptr() | out.data_ptr() | cu_seqlens.data_ptr()) & 15
    memo = (q.dtype, qs, ks, vs, os_, group, d, num_warps) if aligned else None
    align8 = not (qs[0] | qs[1] | ks[0] | ks[1] | vs[0] | vs[1] | os_[0] | os_[1]) & 7
    # plain integer maths for BLOCK_D: triton.next_power_of_2 is a constexpr function (tens of us per
    # host call, measured on this project's machine with Triton 3.8)
    HANDLES.launch(
        (segments, heads),
        (q, k, v, out, cu_seqlens, qs[0], qs[1], ks[0], ks[1], vs[0], vs[1], os_[0], os_[1], scale,
         group, d, _BLOCK_D[d] if d in _BLOCK_D else max(16, 1 << (d - 1).bit_length()), BLOCK_S, align8),
        max(q.get_device(), 0),
        memo,
        num_warps=num_warps,
    )
    return out


_BLOCK_D = {d: max(16, 1 << (d - 1).bit_length()) for d in (64, 72, 80, 128)}


def warm(head_dim: int, heads: int, kv_heads: int, dtype: str = "bfloat16", device=None) -> int:
    """Resolve (compile, or load from Triton's disk cache) the kernel for this head dim, heads and
    dtype, on q/k/v as SGLang hands them (contiguous, or views into one qkv projection: the same
    specialization when the strides keep their divisibility). Returns how many were newly resolved."""
    import torch

    before = compile_events.count("triton")
    dt = getattr(torch, dtype)
    g = torch.Generator(device="cpu").manual_seed(0)
    lens = [BLOCK_S, 16, 3]
    cu = torch.tensor([0, lens[0], lens[0] + lens[1], sum(lens)], dtype=torch.int32, device=device)
    tokens = sum(lens)
    q = torch.randn(tokens, heads, head_dim, generator=g).to(device=device, dtype=dt)
    k, v = (torch.randn(tokens, kv_heads, head_dim, generator=g).to(device=device, dtype=dt) for _ in range(2))
    for _ in range(2):  # the second call takes the cached handle: checked here, not on a request
        short_window_attention(q, k, v, cu, BLOCK_S)
    return compile_events.count("triton") - before


def warm_shape(shape, device) -> str:
    """The warmup registry's entry (family ``vit_short_window``): :func:`warm` for a
    :class:`~sglang_fa4.kernels.vit.shape.VitShape`."""
    new = warm(shape.head_dim, shape.heads, shape.kv_heads, shape.dtype, device=device)
    return f"{new} resolved" if new else "cached"
