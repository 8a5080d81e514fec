"""Short segments (ViT windows) leave FA4 for kernels measured faster on them.

FA4's SM90 kernel gives every segment its own 128/192-row tile and CTA, so on 64-token windows its
time is per-tile pipeline latency: on the H200, 700 x 64-token windows at d=80 take ~800 us in FA4,
~550 us in SGLang's triton_attn, ~260 us in torch's bundled FA2 varlen forward
(``aten._flash_attention_forward``) and ~140 us in our one-tile-per-segment Triton kernel
(:mod:`.short_window_kernel`), against an HBM floor of ~108 us
(benchmark/results/h200/short_windows*.json). So, on SM90, a layout whose longest segment is short:
- head_dim 64/72/80/128 (on 180+ windows 1.0-1.35x the HBM floor at d=64/80/128, 1.5-1.75x at d=72,
  1.6-2.0x faster than FA2 there once its rows load as 16-byte vectors, short_windows_d72.json):
  the Triton kernel;
- other head dims: FA2.
Host time per call on the H200 (kernels_host_routes.md, kernels_d72_triton.md, kernels_host_d64.md):
12.6-14.7 us on the Triton route, as FA4's own cached launch (11.5-12.6 us); FA2 took 27-47 us.
On long segments FA4 is 1.4-1.9x faster than FA2, so nothing else is routed; Blackwell keeps FA4
until measured there. Neither route has attention sinks or sliding windows: such calls stay on FA4.
Results are exact attention within bf16 rounding (rel. error vs fp32 ~2.3e-3, as FA4), not
bitwise FA4's.
"""

from __future__ import annotations

from typing import Optional

from sglang_fa4.kernels.inputs import check_out_shape, check_scalars, check_tensors, normalize_window
from sglang_fa4.kernels.vit import short_window_kernel

# compute capabilities (major*10+minor) where the route was measured faster than FA4 and triton_attn
ROUTED_ARCHS = (90,)
# head dims where the Triton short-window kernel was measured faster than FA2 (the rest use FA2)
TRITON_HEAD_DIMS = (64, 72, 80, 128)


_NO_WINDOW = (None, None)
_SGLANG_NO_WINDOW = (-1, -1)


def should_route(arch: int, q, max_seqlen: Optional[int], window_size, sinks, limit: int) -> bool:
    """Whether a ViT call takes this route: SM90, no sinks, no window, a CUDA q of a 16-byte head
    dim, and its longest segment at most ``limit`` (SGLANG_FA4_SHORT_SEQLEN_ROUTE_MAX, from
    :mod:`sglang_fa4.kernels.settings`; 0: never). Host facts only."""
    # cheapest tests first: this runs on every ViT attention call (host time, issue #18)
    if max_seqlen is None or arch not in ROUTED_ARCHS or sinks is not None:
        return False
    if not (0 < limit and max_seqlen <= limit):
        return False
    if not (window_size is None or window_size == _NO_WINDOW or window_size == _SGLANG_NO_WINDOW) and \
            normalize_window(window_size) != (False, None, None):
        return False
    head_dim = q.shape[-1]
    return q.is_cuda and head_dim % 8 == 0 and head_dim <= 256


def short_attention(q, k, v, cu_seqlens, max_seqlen: int, softmax_scale: Optional[float], out=None):
    """The routed call: the Triton kernel where it was measured best, FA2 elsewhere. The same input
    checks as FA4's route: a malformed call fails the same way whichever kernel its layout picks."""
    check_scalars(max_seqlen, softmax_scale, q)
    total_q, nheads, head_dim, _, nheads_k, head_dim_v, dtype = check_tensors(q, k, v, cu_seqlens, require_cuda=True)
    if out is not None:
        check_out_shape(out, total_q, nheads, head_dim_v, dtype, q)
    if head_dim in TRITON_HEAD_DIMS and max_seqlen <= short_window_kernel.BLOCK_S:
        qs, ks, vs = q.stride(), k.stride(), v.stride()
        if qs[2] == 1 and ks[2] == 1 and vs[2] == 1:
            if out is None:
                out = q.new_empty((total_q, nheads, head_dim_v))
            os_ = out.stride()
            if os_[2] == 1:
                # checked above: the launch without the kernel module's own checks (host time, issue #18)
                return short_window_kernel.launch_checked(q, k, v, cu_seqlens, softmax_scale, out, total_q, nheads,
                                                          nheads_k, head_dim, qs, ks, vs, os_)
    return fa2_varlen_attention(q, k, v, cu_seqlens, max_seqlen, softmax_scale, out=out)


_fa2_forward = None


def fa2_varlen_attention(q, k, v, cu_seqlens, max_seqlen: int, softmax_scale: Optional[float], out=None):
    global _fa2_forward
    if _fa2_forward is None:  # the op overload itself: no overload resolution per call
        import torch

        _fa2_forward = torch.ops.aten._flash_attention_forward.default
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    result = _fa2_forward(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, 0.0, False, False, scale=scale)[0]
    if out is not None:
        out.copy_(result)
        return out
    return result
