"""The ViT/varlen attention form's one public function: :func:`fa4_varlen_attention`.

Contract (what the fa4 ViT backend and the benchmarks call)::

    fa4_varlen_attention(q, k, v, cu_seqlens, max_seqlen, *, softmax_scale=None,
                         window_size=(None, None), sinks=None, out=None, causal=False) -> Tensor

q, k, v: (total_tokens, heads, head_dim) CUDA bf16/fp16 (k/v heads dividing q's); cu_seqlens:
int32, (segments + 1,), one for q and k; max_seqlen: a host int (or None). Returns (total_tokens,
heads, head_dim_v): ``out`` when given. window_size: (left, right) token bounds of a sliding window;
None or negative (SGLang's -1) is unbounded on that side; (None, 0) -- or ``causal=True`` -- is
causal. sinks: per-head attention-sink logits, (heads,) float32/bf16/fp16 (FA4's
``learnable_sink``; not supported by FA4 on sm_80/sm_120: raises).

The route is decided once per call, on the host, by :func:`route` from the call's facts and the
routing settings read once per process (:mod:`sglang_fa4.kernels.settings`):

* ``SGLANG_FA4_VIT_ATTN_DTYPE=fp8`` and the measured table say FP8 (:mod:`.vit.attn_dtype`):
  quantize on the device, the SM90 FP8 forward, bf16 out;
* a layout of short segments on SM90 (:mod:`.vit.short_windows`): the short-window Triton kernel
  or FA2;
* else FA4 through the process's kernel cache (:mod:`.fa4.cache`): each configuration resolved once
  through FA4's own forward, then launched directly on the current stream (bitwise what
  ``flash_attn.cute.flash_attn_varlen_func`` returns, a few microseconds of host time,
  CUDA-graph capturable). Inputs that require grad (with grad mode on) take FA4's autograd path.

Each backend checks the tensors once, on the host (:mod:`.inputs`); what cannot be checked
without reading device memory is the caller's contract, as it is FA4's: cu_seqlens starts at 0,
never decreases and ends at or below q's rows, and ``max_seqlen``, when given, is at least the
longest segment (the short-window route sizes its tiles from it). No backend calls back here.

The other forms have their own public functions: E4M3 q/k/v with descales, the SM90 FP8 forward
(:func:`sglang_fa4.kernels.fp8_sm90.fp8_varlen_attention`); SGLang's paged FP8 KV cache
(:func:`sglang_fa4.kernels.fp8_paged_kv.paged_kv_attention`). flash_attn.cute is imported lazily:
importing this module costs nothing.
"""

from __future__ import annotations

from typing import Optional

from sglang_fa4.kernels import fa4, vit
from sglang_fa4.kernels.inputs import FA4InputError
from sglang_fa4.kernels.settings import settings

__all__ = ["fa4_varlen_attention", "route", "FP8_VIT", "SHORT_WINDOWS", "FA4"]

#: the routes
FP8_VIT, SHORT_WINDOWS, FA4 = "fp8_vit", "short_windows", "fa4"


def route(q, cu_seqlens, max_seqlen: Optional[int], window_size, sinks, cache=None) -> str:
    """Which backend a ViT call takes, from its host facts (dtypes, shapes, the device type, the
    window, sinks, ``max_seqlen``) and the routing settings; the GPU's arch is asked (``cache.arch``,
    once per process) only when a route needs it."""
    s = settings()
    if s.vit_fp8 or s.short_route_max_seqlen:
        cache = cache if cache is not None else fa4.kernel_cache()
        if s.vit_fp8 and vit.use_fp8(True, lambda: cache.arch, q, cu_seqlens, max_seqlen, window_size, sinks):
            return FP8_VIT
        if getattr(q, "is_cuda", False) and vit.should_route(cache.arch, q, max_seqlen, window_size, sinks,
                                                             s.short_route_max_seqlen):
            return SHORT_WINDOWS
    return FA4


def fa4_varlen_attention(q, k, v, cu_seqlens, max_seqlen: Optional[int], *, softmax_scale: Optional[float] = None,
                         window_size=(None, None), sinks=None, out=None, causal: bool = False):
    """Attention within each segment of ``cu_seqlens`` over 16-bit q/k/v (see the module's contract)."""
    if causal:
        window_size = _causal_window(window_size)
    cache = fa4.kernel_cache()
    taken = route(q, cu_seqlens, max_seqlen, window_size, sinks, cache)
    if taken == FA4:
        return cache(q, k, v, cu_seqlens, max_seqlen, softmax_scale, window_size, sinks, out)
    if taken == SHORT_WINDOWS:
        return vit.short_attention(q, k, v, cu_seqlens, max_seqlen, softmax_scale, out)
    result = vit.fp8_attention(q, k, v, cu_seqlens, max_seqlen, softmax_scale)
    return result if out is None else out.copy_(result)


def _causal_window(window_size):
    """``causal=True``: the window (left, 0)."""
    left, right = (None, None) if window_size is None else window_size
    if right is not None and right > 0:
        raise FA4InputError(f"causal=True with a right window of {right}: use one or the other")
    return (left, 0)
