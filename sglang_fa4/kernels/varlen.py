"""The one attention entry point: every route -- FA4 (bf16/fp16 ViT attention), the short-window
Triton kernel and FA2 (:mod:`.short_segments`), the FP8 ViT path (:mod:`.vit_attn_dtype`) and the
SM90 FP8 forward itself (E4M3 q/k/v, also for the paged FP8 KV cache, :mod:`.fp8_paged_kv`) -- is
taken inside :func:`fa4_varlen_attention`.

Contract (everything else in sglang_fa4 calls only this):
    fa4_varlen_attention(q, k, v, cu_seqlens, max_seqlen, *, softmax_scale=None,
                         window_size=(None, None), sinks=None, out=None) -> Tensor
q, k, v: (total_tokens, heads, head_dim) CUDA bf16/fp16; cu_seqlens: int32 CUDA, (segments + 1,);
max_seqlen: a host int (or None). Returns (total_tokens, heads, head_dim_v): ``out`` when given.
window_size: (left, right) token bounds of a sliding window; None or negative (SGLang's -1) is
unbounded on that side; (None, 0) is causal. sinks: per-head attention-sink logits, (heads,)
float32/bf16/fp16 (FA4's ``learnable_sink``; not supported by FA4 on sm_80/sm_120: raises).
float8_e4m3fn q/k/v (SM90) with ``q_descale``/``k_descale``/``v_descale`` (float32, per (batch, kv
head) or a scalar; all three or none) go to the native FP8 forward (:mod:`sglang_fa4.kernels.fp8_sm90`),
bf16 output; E4M3 k/v with another q dtype, or descales with non-FP8 q/k/v, raise FA4InputError.
The paged form (keyword-only ``page_table`` and ``cache_seqlens``; SGLang's FP8 KV cache): E4M3 q
against ``k``/``v`` as SGLang's paged E4M3 pool (pages, page_size, kv heads, d), ``cu_seqlens`` and
``max_seqlen`` those of the new query rows, ``k_descale``/``v_descale`` the pool's scales, causal
bottom-right aligned; decode and short extends run the paged split-KV kernel (the pool read in
place), longer extends the gather + FP8 forward (:mod:`.fp8_paged_kv`); ``return_lse`` gives
(out, lse (Hq, total_q)).
The FP8 forward also takes (keyword-only, E4M3 q only) ``cu_seqlens_k`` / ``max_seqlen_k`` (keys
laid out apart from the queries), ``causal`` (bottom-right aligned), ``descale`` ((3, batch, Hkv)
float32 instead of the three), ``vt`` (the permuted V^T instead of v) and ``kernel_config`` (a
:class:`~sglang_fa4.kernels.fp8_sm90.kernel_config.Fp8KernelConfig` other than the table's:
benchmarks). bf16/fp16 q/k/v go to the FP8 forward (quantized on the device) only where
``SGLANG_FA4_VIT_ATTN_DTYPE=fp8`` and the measured table of :mod:`.vit_attn_dtype` say so.

Every route checks the tensors' shapes, dtypes and devices on the host (``kernels.inputs``); what
cannot be checked without reading device memory is the caller's contract, as it is FA4's: cu_seqlens
starts at 0, never decreases and ends at or below q's rows, and ``max_seqlen``, when given, is at least
the longest segment (the short-window route sizes its tiles from it: a smaller value gives NaN or
wrong rows, not an error).

The output is bitwise what ``flash_attn.cute.flash_attn_varlen_func`` returns, but each
configuration's compiled kernel is resolved once (through FA4's own forward, so its caches stay
valid) and then launched directly on the current torch stream: a few microseconds of host time,
CUDA-graph capturable. See :mod:`sglang_fa4.kernels.fa4_config` for what a configuration is.
Inputs that require grad (with grad mode on) take FA4's public autograd path instead.
Layouts of short segments only (ViT windows) are routed to faster kernels where measured: see
:mod:`sglang_fa4.kernels.short_segments`.

``compile_count()``, ``compile_events()``, ``configs_seen()`` and ``add_compile_listener()``
report the configurations resolved in this process (for warmup and "no compiles after warmup"
checks).

flash_attn.cute is imported lazily: importing this module costs nothing. With the shared-library
store on (``SGLANG_FA4_SHARED_LIBS``, :mod:`sglang_fa4.kernels.fa4_shared_libs`), a configuration
stored by an earlier process is loaded with tvm_ffi alone: FA4 is imported only for a new one.
"""

from __future__ import annotations

import threading
from typing import Callable, Optional

from sglang_fa4.kernels import short_segments, vit_attn_dtype
from sglang_fa4.kernels.fa4_b36 import FA4LayoutError
from sglang_fa4.kernels.fa4_config import CompileEvent, FA4Config, FA4FeatureError, FA4InputError
from sglang_fa4.kernels.fa4_kernel_cache import KernelCache

__all__ = [
    "fa4_varlen_attention",
    "compile_count",
    "compile_events",
    "configs_seen",
    "add_compile_listener",
    "kernel_cache",
    "install_kernel_cache",
    "CompileEvent",
    "FA4Config",
    "FA4FeatureError",
    "FA4InputError",
    "FA4LayoutError",
]

_cache: Optional[KernelCache] = None
_cache_lock = threading.Lock()


def kernel_cache() -> KernelCache:
    """The process-wide cache (FA4 backend), created on first use."""
    global _cache
    if _cache is None:
        with _cache_lock:
            if _cache is None:
                from sglang_fa4.kernels.fa4_b36 import FA4Backend
                from sglang_fa4.kernels.fa4_shared_libs import default_store

                _cache = KernelCache(FA4Backend(), default_store())
    return _cache


def install_kernel_cache(cache: Optional[KernelCache]) -> Optional[KernelCache]:
    """Replace the process-wide cache (tests: a fake backend); returns the previous one."""
    global _cache
    with _cache_lock:
        previous, _cache = _cache, cache
    return previous


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
    q_descale=None,
    k_descale=None,
    v_descale=None,
    causal: bool = False,
    cu_seqlens_k=None,
    max_seqlen_k: Optional[int] = None,
    descale=None,
    vt=None,
    kernel_config=None,
    page_table=None,
    cache_seqlens=None,
    return_lse: bool = False,
):
    fp8 = _fp8 if _fp8 is not None else _float8_e4m3fn()
    if page_table is not None or cache_seqlens is not None or return_lse:
        return _paged_fp8(q, k, v, cu_seqlens, max_seqlen, page_table, cache_seqlens, return_lse,
                          softmax_scale=softmax_scale, window_size=window_size, sinks=sinks, out=out,
                          q_descale=q_descale, k_descale=k_descale, v_descale=v_descale, causal=causal,
                          cu_seqlens_k=cu_seqlens_k, max_seqlen_k=max_seqlen_k, descale=descale, vt=vt,
                          kernel_config=kernel_config)
    if getattr(q, "dtype", None) is fp8:
        # E4M3 q/k/v (SM90): the native FP8 forward, see sglang_fa4.kernels.fp8_sm90
        if sinks is not None:
            raise FA4FeatureError("attention sinks are not supported by the FP8 (E4M3) forward")
        from sglang_fa4.kernels.fp8_sm90.launch import fp8_varlen_attention

        extra = {} if kernel_config is None else {"kernel_config": kernel_config}
        return fp8_varlen_attention(
            q, k, v, cu_seqlens, cu_seqlens if cu_seqlens_k is None else cu_seqlens_k, max_seqlen,
            max_seqlen if cu_seqlens_k is None else max_seqlen_k, q_descale=q_descale, k_descale=k_descale,
            v_descale=v_descale, descale=descale, softmax_scale=softmax_scale, causal=causal,
            window_size=window_size, out=out, vt=vt, **extra,
        )
    if getattr(k, "dtype", None) is fp8 or getattr(v, "dtype", None) is fp8:
        raise FA4InputError(
            f"mixed dtypes: k/v are float8_e4m3fn but q is {getattr(q, 'dtype', None)} (FP8 attention "
            "needs q, k and v all float8_e4m3fn)"
        )
    fp8_only = {"q_descale": q_descale, "k_descale": k_descale, "v_descale": v_descale, "descale": descale,
                "vt": vt, "kernel_config": kernel_config, "cu_seqlens_k": cu_seqlens_k, "max_seqlen_k": max_seqlen_k}
    given = [name for name, x in fp8_only.items() if x is not None]
    if given:
        raise FA4InputError(f"{', '.join(given)} apply to float8_e4m3fn q/k/v only; q is {getattr(q, 'dtype', None)}")
    if causal:
        window_size = _causal_window(window_size)
    cache = _cache if _cache is not None else kernel_cache()
    if vit_attn_dtype.use_fp8(lambda: cache.arch, q, cu_seqlens, max_seqlen, window_size, sinks):
        # SGLANG_FA4_VIT_ATTN_DTYPE=fp8 where the measured table says so (a host-only decision)
        result = vit_attn_dtype.fp8_attention(q, k, v, cu_seqlens, max_seqlen, softmax_scale)
        return result if out is None else out.copy_(result)
    if short_segments.should_route(cache.arch if q.is_cuda else -1, q, max_seqlen, window_size, sinks):
        return short_segments.short_attention(q, k, v, cu_seqlens, max_seqlen, softmax_scale, out)
    return cache(q, k, v, cu_seqlens, max_seqlen, softmax_scale, window_size, sinks, out)


def _paged_fp8(q, k_cache, v_cache, cu_seqlens_q, max_seqlen_q, page_table, cache_seqlens, return_lse, *,
               softmax_scale, window_size, out, k_descale, v_descale, causal, **contiguous_only):
    """The paged form: E4M3 q against SGLang's paged E4M3 KV pool (``k``/``v`` the caches, pages x
    page_size x kv heads x d) through its page table; :mod:`.fp8_paged_kv` picks the split-KV decode
    kernel or the gather + FP8 forward."""
    if page_table is None or cache_seqlens is None:
        raise FA4InputError("page_table and cache_seqlens go together (the paged FP8 KV form); "
                            f"got page_table={'set' if page_table is not None else None}, "
                            f"cache_seqlens={'set' if cache_seqlens is not None else None}"
                            + (" (return_lse is for the paged form only)" if return_lse else ""))
    given = [name for name, x in contiguous_only.items() if x is not None]
    if given:
        raise FA4InputError(f"{', '.join(given)} do not apply to the paged FP8 KV form (page_table given)")
    from sglang_fa4.kernels import fp8_paged_kv  # its names looked up per call (checks count them)

    return fp8_paged_kv.paged_fp8_attention(
        q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, max_seqlen_q, k_descale=k_descale,
        v_descale=v_descale, softmax_scale=softmax_scale, causal=causal,
        window_size=tuple(-1 if w is None else w for w in (window_size or (None, None))), out=out,
        return_lse=return_lse)


def _causal_window(window_size):
    """``causal=True`` on the 16-bit routes: the window (left, 0)."""
    left, right = (None, None) if window_size is None else window_size
    if right is not None and right > 0:
        raise FA4InputError(f"causal=True with a right window of {right}: use one or the other")
    return (left, 0)


_fp8 = None


def _float8_e4m3fn():
    global _fp8
    import torch

    _fp8 = torch.float8_e4m3fn
    return _fp8


def compile_count() -> int:
    """Configurations resolved (compiled, or loaded from FA4's caches) in this process."""
    return kernel_cache().compile_count()


def compile_events() -> list[CompileEvent]:
    return kernel_cache().compile_events()


def configs_seen() -> list[FA4Config]:
    return kernel_cache().configs_seen()


def add_compile_listener(callback: Callable[[CompileEvent], None]) -> Callable[[], None]:
    """Call ``callback(event)`` whenever a new configuration is resolved; returns a remover."""
    return kernel_cache().add_compile_listener(callback)
