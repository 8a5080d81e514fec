"""The FA4-specific half of :mod:`sglang_fa4.kernels.fa4_kernel_cache`: run FA4's own forward once per
configuration and record the compiled function and argument list it launched.

Written against flash-attn-4 4.0.0b36 (``flash_attn/cute/interface.py``):

* ``_flash_attn_fwd`` looks its compiled kernel up in ``_flash_attn_fwd.compile_cache`` (a
  ``JITCache``, or ``JITPersistentCache`` with ``FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1``) and
  calls ``compile_cache[compile_key](*call_args)`` exactly once for a non-MLA forward;
* above ``BIN_BATCH_SEARCH_THRESH`` (256) segments it first computes a per-call block cumsum
  (``_compute_tile_cumsum``) and, on SM100, a block -> segment index (``_compute_blocks_to_batch``).

While one call runs, the compile cache attribute is swapped for a recording proxy (``__setitem__``
tells whether FA4 compiled) and ``_compute_tile_cumsum`` for a wrapper that keeps its static
arguments, so later calls can recompute the scheduler aids themselves. FA4's caches are used, not
bypassed, so its in-memory and on-disk caches stay consistent.

flash_attn is imported inside the methods only.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

from sglang_fa4.kernels.fa4_kernel_cache import FA4LayoutError, FwdCall, Resolved

_SCHED_STATIC = ("tile_size", "q_stage", "cluster_shape_m", "qhead_per_kvhead", "pack_gqa")
_swap_lock = threading.Lock()


def _interface():
    from flash_attn.cute import interface

    return interface


class _RecordingCache:
    """Stands in for ``_flash_attn_fwd.compile_cache`` during one call."""

    def __init__(self, inner):
        self.inner = inner
        self.compiled = False
        self.launches: list[tuple[Any, Any, list]] = []  # (key, fn, args)

    def __contains__(self, key) -> bool:
        return key in self.inner

    def __setitem__(self, key, fn) -> None:
        self.compiled = True
        self.inner[key] = fn

    def __getitem__(self, key):
        fn = self.inner[key]

        def launch(*args):
            self.launches.append((key, fn, list(args)))
            return fn(*args)

        return launch

    def __getattr__(self, name):
        return getattr(self.inner, name)


class FA4Backend:
    """flash-attn-4 (flash_attn.cute) b36 behind the :class:`~sglang_fa4.kernels.fa4_kernel_cache.Backend` seam."""

    requires_cuda = True

    def arch(self) -> int:
        return int(_interface()._get_device_arch())

    def compile_and_run(self, call: FwdCall) -> Resolved:
        iface = _interface()
        fwd = iface._flash_attn_fwd
        sched_kwargs: dict[str, Any] = {}
        original_cumsum = iface._compute_tile_cumsum

        @functools.wraps(original_cumsum)  # also copies .compile_cache, which FA4 reads
        def recording_cumsum(**kwargs):  # through the module global while it runs
            sched_kwargs.update(kwargs)
            return original_cumsum(**kwargs)

        with _swap_lock:
            inner = fwd.compile_cache
            recorder = _RecordingCache(inner)
            fwd.compile_cache = recorder
            iface._compute_tile_cumsum = recording_cumsum
            try:
                fwd(
                    call.q,
                    call.k,
                    call.v,
                    cu_seqlens_q=call.cu_seqlens,
                    cu_seqlens_k=call.cu_seqlens,
                    max_seqlen_q=call.max_seqlen,
                    max_seqlen_k=call.max_seqlen,
                    softmax_scale=call.softmax_scale,
                    causal=False,
                    window_size_left=call.window_left,
                    window_size_right=call.window_right,
                    learnable_sink=call.sinks,
                    num_splits=1,
                    out=call.out,
                )
            finally:
                fwd.compile_cache = inner
                iface._compute_tile_cumsum = original_cumsum
        if len(recorder.launches) != 1:
            raise FA4LayoutError(
                f"FA4's forward launched {len(recorder.launches)} cached kernels for one call "
                f"(expected 1; sglang-fa4 is written against flash-attn-4 4.0.0b36)"
            )
        key, fn, args = recorder.launches[0]
        sched = None
        if sched_kwargs:
            if sched_kwargs.get("num_m_blocks") is not None or sched_kwargs.get("seqused") is not None:
                raise FA4LayoutError("FA4 built its scheduler cumsum from unexpected inputs")
            sched = _make_sched(iface, {k: sched_kwargs[k] for k in _SCHED_STATIC}, self.arch())
        return Resolved(fn=fn, args=args, fa4_compiled=recorder.compiled, sched=sched, fa4_key=key)

    def public(self, call: FwdCall):
        from flash_attn.cute import flash_attn_varlen_func

        result = flash_attn_varlen_func(
            call.q,
            call.k,
            call.v,
            cu_seqlens_q=call.cu_seqlens,
            cu_seqlens_k=call.cu_seqlens,
            max_seqlen_q=call.max_seqlen,
            max_seqlen_k=call.max_seqlen,
            softmax_scale=call.softmax_scale,
            window_size=(call.window_left, call.window_right),
            learnable_sink=call.sinks,
        )
        return result[0] if isinstance(result, tuple) else result


def _make_sched(iface, static: dict, arch: int):
    """Per-call scheduler aids for > 256 segments, computed the way FA4 computes them."""
    cumsum = iface._compute_tile_cumsum
    if arch // 10 not in (10, 11):

        def sched(cu_seqlens, total_q):
            return cumsum(cu_seqlens=cu_seqlens, **static)

        return sched

    to_batch = iface._compute_blocks_to_batch
    size = iface._blocks_to_batch_size
    tile_m, qpk, pack_gqa = static["tile_size"], static["qhead_per_kvhead"], static["pack_gqa"]

    if not iface.USE_BLOCKS_TO_BATCH:

        def sched_sm100_no_index(cu_seqlens, total_q):
            return (*cumsum(cu_seqlens=cu_seqlens, **static), None)

        return sched_sm100_no_index

    def sched_sm100(cu_seqlens, total_q):
        total_blocks, total_splits = cumsum(cu_seqlens=cu_seqlens, **static)
        num_blocks = size(total_q, cu_seqlens.shape[0] - 1, tile_m, qpk, pack_gqa)
        return total_blocks, total_splits, to_batch(total_blocks, num_blocks, total_blocks.device)

    return sched_sm100
