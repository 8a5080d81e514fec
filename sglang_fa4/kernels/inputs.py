"""The checks every attention route makes on its tensors (FA4's cached launch, the short-window
Triton kernel, FA2; the FP8 forward's own, ``fp8_sm90.launch.check_inputs``, make the same ones),
so a malformed call is one clear error whichever kernel the layout picks.

Host-side metadata only (shapes, dtypes, devices, Python scalars): nothing here reads device
memory or asks which GPU it is, so the checks run first, on any device (a CPU test included). What cannot be
checked without a device sync is the caller's contract (see ``kernels.dispatch``): cu_seqlens must
be non-decreasing, start at 0 and end at or below q's rows, and max_seqlen, when given, at least the
longest segment.
"""

from __future__ import annotations

import numbers

import torch

from sglang_fa4.kernels.fa4_config import DTYPE_NAMES, FA4InputError

_INT32 = torch.int32
#: Head dims (of q/k and of v) every 16-bit route can take: 8 to 256 in steps of 8 (16-byte rows).
#: FA4's per-architecture limits (sm_100: up to 128, or (192, 128) / (256, 256)) are FA4's own
#: checks, once the GPU is known.
HEAD_DIM_MIN, HEAD_DIM_MAX, HEAD_DIM_STEP = 8, 256, 8


def describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"{tuple(x.shape)} {x.dtype}"
    return type(x).__name__


def check_tensors(q, k, v, cu_seqlens, require_cuda: bool):
    """q, k, v (tokens, heads, head_dim) of one 16-bit float dtype, k/v sharing tokens and heads,
    q heads a multiple of k/v heads, k with q's head_dim, cu_seqlens 1-D int32. Returns
    ``(total_q, nheads, head_dim, total_k, nheads_k, head_dim_v, dtype)``."""
    try:
        total_q, nheads, head_dim = q.shape
        total_k, nheads_k, head_dim_k = k.shape
        total_v, nheads_v, head_dim_v = v.shape
        dtype = q.dtype
        cu_ok = cu_seqlens.dtype is _INT32 and cu_seqlens.dim() == 1
        # CUDA tensors compare by index (a few ns: the hot path); others (CPU, meta: all -1) by device
        device = q.get_device()
        same_device = k.get_device() == device and v.get_device() == device and cu_seqlens.get_device() == device
        if same_device and device < 0:
            same_device = k.device == q.device and v.device == q.device and cu_seqlens.device == q.device
    except (AttributeError, ValueError, TypeError):
        raise FA4InputError(
            "q, k, v must be (total_tokens, heads, head_dim) tensors and cu_seqlens a 1-D "
            f"tensor; got {describe(q)}, {describe(k)}, {describe(v)}, {describe(cu_seqlens)}"
        ) from None
    if dtype not in DTYPE_NAMES or k.dtype is not dtype or v.dtype is not dtype:
        raise FA4InputError(f"q, k, v must all be bfloat16 or all float16; got {q.dtype}, {k.dtype}, {v.dtype}")
    if total_v != total_k or nheads_v != nheads_k or head_dim_k != head_dim:
        raise FA4InputError(
            f"k {tuple(k.shape)} and v {tuple(v.shape)} must share tokens and heads, and k "
            f"must have q's head_dim {head_dim}"
        )
    if not nheads:
        raise FA4InputError(f"q heads (0): q {tuple(q.shape)} must have at least one head")
    if not nheads_k or nheads % nheads_k:
        raise FA4InputError(f"q heads ({nheads}) must be a multiple of k/v heads ({nheads_k})")
    if not (HEAD_DIM_MIN <= head_dim <= HEAD_DIM_MAX and HEAD_DIM_MIN <= head_dim_v <= HEAD_DIM_MAX) or \
            (head_dim | head_dim_v) % HEAD_DIM_STEP:
        raise FA4InputError(f"head_dim {head_dim} / v head_dim {head_dim_v}: each must be {HEAD_DIM_MIN} to "
                            f"{HEAD_DIM_MAX} and a multiple of {HEAD_DIM_STEP}")
    if not cu_ok:
        raise FA4InputError("cu_seqlens must be a 1-D int32 tensor (segments + 1,)")
    if cu_seqlens.shape[0] < 2:
        raise FA4InputError(f"cu_seqlens must have segments + 1 >= 2 entries, got {cu_seqlens.shape[0]}")
    if not same_device:
        raise FA4InputError(f"q, k, v and cu_seqlens must be on one device, got {q.device}, {k.device}, "
                            f"{v.device}, {cu_seqlens.device}")
    if require_cuda and device < 0:
        raise FA4InputError("q, k, v and cu_seqlens must be CUDA tensors")
    return total_q, nheads, head_dim, total_k, nheads_k, head_dim_v, dtype


def check_scalars(max_seqlen, softmax_scale, q=None) -> None:
    """``max_seqlen``: None or a positive host integer (it sizes grids and tiles; a tensor would
    sync; 0 only for a call without tokens, ``q`` of 0 rows); ``softmax_scale``: None or a real
    number.  A few type tests: cheap enough for every call."""
    if max_seqlen is not None and type(max_seqlen) is not int:
        if isinstance(max_seqlen, (torch.Tensor, bool)):
            raise FA4InputError("max_seqlen must be a host int or None (a tensor would be read on the host)")
        if not isinstance(max_seqlen, numbers.Integral):
            raise FA4InputError(f"max_seqlen must be an int or None, got {max_seqlen!r}")
    if max_seqlen is not None and max_seqlen <= 0 and not (max_seqlen == 0 and _rows(q) == 0):
        raise FA4InputError(f"max_seqlen must be > 0 (the longest segment's length), got {max_seqlen}")
    if softmax_scale is not None and type(softmax_scale) is not float:
        if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, numbers.Real):
            raise FA4InputError(f"softmax_scale must be a real number (or None), got {softmax_scale!r}")


def _rows(q):
    try:
        return q.shape[0]
    except (AttributeError, IndexError, TypeError):
        return None


def check_out_shape(out, total_q, nheads, head_dim_v, dtype, q) -> None:
    """``out``: a tensor of the result's shape and dtype on q's device."""
    if not isinstance(out, torch.Tensor):
        raise FA4InputError("out must be a torch tensor or None")
    if out.shape != (total_q, nheads, head_dim_v) or out.dtype != dtype:
        raise FA4InputError(
            f"out must be {(total_q, nheads, head_dim_v)} {dtype}, got {tuple(out.shape)} {out.dtype}"
        )
    if out.get_device() != q.get_device():
        raise FA4InputError(f"out is on {out.device}, q on {q.device}")
