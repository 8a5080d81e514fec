"""The one place that calls FlashAttention-4 for ViT attention.

Contract (everything else in sglang_fa4 calls only this):
    fa4_varlen_attention(q, k, v, cu_seqlens, max_seqlen, *, softmax_scale=None,
                         window_size=(None, None), sinks=None, out=None) -> Tensor
q, k, v: (total_tokens, heads, head_dim) CUDA bf16/fp16; cu_seqlens: int32 CUDA, (segments + 1,);
max_seqlen: a host int (or None). Returns (total_tokens, heads, head_dim).

flash_attn.cute is imported lazily: importing this module costs nothing.
"""

from __future__ import annotations

from typing import Optional


def fa4_varlen_attention(
    q,
    k,
    v,
    cu_seqlens,
    max_seqlen: Optional[int],
    *,
    softmax_scale: Optional[float] = None,
    window_size: tuple[Optional[int], Optional[int]] = (None, None),
    sinks=None,
    out=None,
):
    from flash_attn.cute import flash_attn_varlen_func

    result = flash_attn_varlen_func(
        q,
        k,
        v,
        cu_seqlens_q=cu_seqlens,
        cu_seqlens_k=cu_seqlens,
        max_seqlen_q=max_seqlen,
        max_seqlen_k=max_seqlen,
        softmax_scale=softmax_scale,
        window_size=window_size,
        learnable_sink=sinks,
    )
    result = result[0] if isinstance(result, tuple) else result
    if out is not None:
        out.copy_(result)
        return out
    return result
