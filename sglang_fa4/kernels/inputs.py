"""The checks every attention route makes on its tensors (FA4's cached launch, the short-window
Triton kernel, FA2), so a malformed call is one clear error whichever kernel the layout picks.

Host-side metadata only (shapes, dtypes, devices): nothing here reads device memory. What cannot be
checked without a device sync is the caller's contract (see ``kernels.dispatch``): cu_seqlens must
be non-decreasing, start at 0 and end at or below q's rows, and max_seqlen, when given, at least the
longest segment.
"""

from __future__ import annotations

import torch

from sglang_fa4.kernels.fa4_config import DTYPE_NAMES, FA4InputError

_INT32 = torch.int32


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
    if not nheads_k or nheads % nheads_k:
        raise FA4InputError(f"q heads ({nheads}) must be a multiple of k/v heads ({nheads_k})")
    if not cu_ok:
        raise FA4InputError("cu_seqlens must be a 1-D int32 tensor (segments + 1,)")
    if require_cuda and not (q.is_cuda and k.is_cuda and v.is_cuda and cu_seqlens.is_cuda):
        raise FA4InputError("q, k, v and cu_seqlens must be CUDA tensors")
    return total_q, nheads, head_dim, total_k, nheads_k, head_dim_v, dtype


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
