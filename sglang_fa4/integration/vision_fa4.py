"""VisionFlash4Attention's forward, SGLang-independent.

The ViT graph runners hand the backend a list ``[cu_seqlens, max_seqlen]``; models without a runner
pass a tensor (or SGLang's SingletonCache, or None) even when ``SGLANG_VIT_ENABLE_CUDA_GRAPH`` is set
globally. So the form is decided by the argument's type, never by that variable. ``forward_metadata``
(precomputed by the encoder) wins over both.

The list form comes from graph runners, whose buffers must already be device int32 (a conversion
there would be captured into the graph or break it), so it is checked strictly. The tensor form is
converted like SGLang does, and its token count is checked when it is still host data.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any, Callable, Optional

from sglang_fa4.kernels import varlen
from sglang_fa4.kernels.inputs import window_bounds


class SeqlensError(ValueError):
    """The sequence-length arguments handed to the fa4 ViT backend are malformed."""


@dataclass(frozen=True)
class Seqlens:
    cu_seqlens: Any  # int32 tensor on q's device, (segments + 1,)
    max_seqlen: Optional[int]


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_device_cu_seqlens(cu, q, where: str) -> None:
    import torch

    if not isinstance(cu, torch.Tensor):
        raise SeqlensError(f"{where}: cu_seqlens must be a torch.Tensor, got {type(cu).__name__}")
    if cu.dtype != torch.int32:
        raise SeqlensError(f"{where}: cu_seqlens must be int32, got {cu.dtype}")
    if cu.device != q.device:
        raise SeqlensError(f"{where}: cu_seqlens is on {cu.device} but q is on {q.device}")
    if cu.dim() != 1 or cu.numel() < 2:
        raise SeqlensError(f"{where}: cu_seqlens must be 1-D with at least 2 entries, got shape {tuple(cu.shape)}")


def _check_max_seqlen(max_seqlen: Any, where: str) -> int:
    if not _is_int(max_seqlen):
        raise SeqlensError(
            f"{where}: max_seqlen must be a Python int, got {type(max_seqlen).__name__} ({max_seqlen!r})"
        )
    if max_seqlen <= 0:
        raise SeqlensError(f"{where}: max_seqlen must be positive, got {max_seqlen}")
    return int(max_seqlen)


def host_max_seqlen(cu_host) -> int:
    """Longest segment of a host (CPU) cu_seqlens tensor: no device sync."""
    return int((cu_host[1:] - cu_host[:-1]).max().item())


def resolve_seqlens(
    q,
    cu_seqlens,
    bsz: int,
    seq_len: int,
    forward_metadata=None,
    max_seqlen=None,
    resolve_tensor: Optional[Callable[..., Any]] = None,
) -> Seqlens:
    """Turn whatever SGLang passes into (device int32 cu_seqlens, host int max_seqlen).

    ``resolve_tensor(cu_seqlens, bsz, seq_len, device=...)`` is SGLang's own resolver for the
    tensor / SingletonCache / None forms (uniform segments when None).
    """
    import torch

    if forward_metadata is not None:
        return Seqlens(forward_metadata.cu_seqlens, forward_metadata.max_seqlen)

    if isinstance(cu_seqlens, (list, tuple)):
        where = "fa4 ViT attention (list form [cu_seqlens, max_seqlen])"
        if len(cu_seqlens) != 2:
            hint = (
                " - a 3-element list is the triton_attn runner layout [cu_seqlens, cu_seqlens_kk, max_seqlen]"
                if len(cu_seqlens) == 3
                else ""
            )
            raise SeqlensError(f"{where}: expected 2 elements, got {len(cu_seqlens)}{hint}")
        cu, max_len = cu_seqlens
        _check_device_cu_seqlens(cu, q, where)
        return Seqlens(cu, _check_max_seqlen(max_len, where))

    where = "fa4 ViT attention (tensor cu_seqlens)"
    if resolve_tensor is not None:
        cu = resolve_tensor(cu_seqlens, bsz, seq_len, device=q.device)
    elif cu_seqlens is None:
        cu = torch.arange(0, (bsz + 1) * seq_len, seq_len, dtype=torch.int32)
    else:
        cu = cu_seqlens
    if not isinstance(cu, torch.Tensor):
        raise SeqlensError(f"{where}: cu_seqlens must be a torch.Tensor, got {type(cu).__name__}")
    if cu.dim() != 1 or cu.numel() < 2:
        raise SeqlensError(f"{where}: cu_seqlens must be 1-D with at least 2 entries, got shape {tuple(cu.shape)}")
    if cu.is_floating_point():
        raise SeqlensError(f"{where}: cu_seqlens must be an integer tensor, got {cu.dtype}")
    if max_seqlen is not None:
        if isinstance(max_seqlen, torch.Tensor):
            max_seqlen = int(max_seqlen.item())
        max_seqlen = _check_max_seqlen(max_seqlen, where)
    if cu.device.type == "cpu":
        # host data: check it and take max_seqlen from it before it moves (no device sync later)
        total = int(cu[-1])
        if total != q.shape[0]:
            raise SeqlensError(
                f"{where}: cu_seqlens ends at {total} tokens but q has {q.shape[0]} rows"
            )
        if max_seqlen is None:
            max_seqlen = host_max_seqlen(cu)
    cu = cu.to(dtype=torch.int32, device=q.device)
    if max_seqlen is None:
        # device-only cu_seqlens and nobody passed max_seqlen: one sync, as SGLang does
        max_seqlen = int((cu[1:] - cu[:-1]).max().item())
    return Seqlens(cu, max_seqlen)


def vision_fa4_forward(
    q,
    k,
    v,
    cu_seqlens,
    bsz: int,
    seq_len: int,
    softmax_scale: Optional[float] = None,
    forward_metadata=None,
    resolve_tensor: Optional[Callable[..., Any]] = None,
    **kwargs,
):
    """The body of VisionFlash4Attention.forward: q/k/v (tokens, heads, head_dim) -> same shape."""
    seqlens = resolve_seqlens(
        q,
        cu_seqlens,
        bsz,
        seq_len,
        forward_metadata=forward_metadata,
        max_seqlen=kwargs.get("max_seqlen"),
        resolve_tensor=resolve_tensor,
    )
    window = window_bounds(kwargs.get("window_size"))
    sinks = kwargs.get("s_aux")
    # every route, SGLANG_FA4_VIT_ATTN_DTYPE=fp8's included, is chosen inside the ViT form's entry point
    return varlen.fa4_varlen_attention(
        q,
        k,
        v,
        seqlens.cu_seqlens,
        seqlens.max_seqlen,
        softmax_scale=softmax_scale,
        window_size=window,
        sinks=sinks,
    )
