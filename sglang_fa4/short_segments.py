"""Short segments (ViT windows) go to torch's bundled FlashAttention-2 varlen forward.

FA4's SM90 kernel gives every segment its own 128/192-row tile and CTA, so on 64-token windows its
time is per-tile pipeline latency: on the H200 it runs 700 x 64-token windows at d=80 in ~800 us where
SGLang's triton_attn takes ~550 us and FA2's varlen kernel (``aten._flash_attention_forward``, in every
CUDA build of torch) ~260 us, 1.2-2.1x faster than triton_attn at d=64/80/128 and 7-9x at d=72, on
every windowed layout measured (benchmark/results/h200/short_windows.json). On long segments FA4 is
1.4-1.9x faster than FA2, so only layouts whose longest segment is short are routed, and only where
that was measured (SM90); Blackwell keeps FA4 until it is measured there.
FA2 has no attention sinks: calls with sinks stay on FA4. Results are exact attention within bf16
rounding (rel. error vs fp32 ~2.3e-3, as FA4), not bitwise FA4's.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Optional

from sglang_fa4.environ import envs
from sglang_fa4.fa4_kernel_cache import normalize_window

# compute capabilities (major*10+minor) where the route was measured faster than FA4 and triton_attn
ROUTED_ARCHS = (90,)


@lru_cache(maxsize=1)
def route_max_seqlen() -> int:
    """Longest segment still routed (SGLANG_FA4_SHORT_SEQLEN_ROUTE_MAX; 0 disables). Read once."""
    return envs.SGLANG_FA4_SHORT_SEQLEN_ROUTE_MAX.get()


def should_route(arch: int, q, max_seqlen: Optional[int], window_size, sinks) -> bool:
    limit = route_max_seqlen()
    return (
        limit > 0
        and max_seqlen is not None
        and max_seqlen <= limit
        and arch in ROUTED_ARCHS
        and sinks is None
        and q.is_cuda
        and normalize_window(window_size) == (False, None, None)
        and q.shape[-1] % 8 == 0
        and q.shape[-1] <= 256
    )


def fa2_varlen_attention(q, k, v, cu_seqlens, max_seqlen: int, softmax_scale: Optional[float], out=None):
    import torch

    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    result = torch.ops.aten._flash_attention_forward(
        q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, 0.0, False, False, scale=scale
    )[0]
    if out is not None:
        out.copy_(result)
        return out
    return result
