"""What an attention call's arguments must be, checked on the host: the two errors every route
raises (:class:`FA4InputError`: a malformed argument; :class:`FA4FeatureError`: no kernel for a
feature), SGLang's window convention (:func:`window_bounds`: -1 is unbounded), and the checks the
16-bit routes make on their tensors (FA4's cached launch, the short-window Triton kernel, FA2; the
FP8 forward's own, ``fp8_sm90.launch.check_inputs``, make the same ones), so a malformed call is
one clear error whichever kernel the layout picks.

Host-side metadata only (shapes, dtypes, devices, Python scalars): nothing here reads device
memory or asks which GPU it is, so the checks run first, on any device (a CPU test included). What
cannot be checked without a device sync is the caller's contract (see :mod:`sglang_fa4.kernels.varlen`):
cu_seqlens must be non-decreasing, start at 0 and end at or below q's rows, and max_seqlen, when
given, at least the longest segment.
"""

from __future__ import annotations

import numbers
import operator
from typing import Optional

import torch

_INT32 = torch.int32
DTYPE_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16"}
#: Head dims (of q/k and of v) every 16-bit route can take: 8 to 256 in steps of 8 (16-byte rows).
#: FA4's per-architecture limits (sm_100: up to 128, or (192, 128) / (256, 256)) are FA4's own
#: checks, once the GPU is known.
HEAD_DIM_MIN, HEAD_DIM_MAX, HEAD_DIM_STEP = 8, 256, 8


class FA4InputError(ValueError):
    """The arguments cannot be handed to FA4 (wrong dtype, shape, device, layout...)."""


class FA4FeatureError(NotImplementedError):
    """FA4 has no kernel for a requested feature on this GPU architecture."""


def window_bounds(window_size) -> tuple[Optional[int], Optional[int]]:
    """(left, right) token bounds with "unbounded" as None: SGLang writes it -1 (FA2/FA3
    convention), or passes no window at all; FA4 b36 writes None and would read a lone -1 as a
    real bound."""
    if window_size is None:
        return None, None
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise FA4InputError(f"window_size must be a pair (left, right), got {window_size!r}") from None
    return _window_side(left, "left"), _window_side(right, "right")


def _window_side(value, side: str) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool) or isinstance(value, float):
        raise FA4InputError(f"window_size {side} must be an int or None, got {value!r}")
    try:
        value = operator.index(value)
    except TypeError:
        raise FA4InputError(f"window_size {side} must be an int or None, got {value!r}") from None
    return None if value < 0 else value


def normalize_window(window_size) -> tuple[bool, Optional[int], Optional[int]]:
    """(causal, left, right) as FA4 resolves them (``_resolve_causal_local_window``): after
    :func:`window_bounds`, (None, 0) is plain causal attention, any other bound is local
    (sliding-window) attention."""
    left, right = window_bounds(window_size)
    if left is None and right == 0:
        return True, None, None
    return False, left, right


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
        fp8 = any(t.dtype is torch.float8_e4m3fn for t in (q, k, v))
        raise FA4InputError(f"q, k, v must all be bfloat16 or all float16; got {q.dtype}, {k.dtype}, {v.dtype}" + (
            " (E4M3 q/k/v: sglang_fa4.kernels.fp8_sm90.fp8_varlen_attention; a paged E4M3 KV cache: "
            "sglang_fa4.kernels.fp8_paged_kv.paged_kv_attention)" if fp8 else ""))
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
