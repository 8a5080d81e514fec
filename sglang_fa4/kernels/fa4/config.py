"""What one FA4 varlen forward configuration is: the readable key of a compiled kernel, and the
normalisation its callers share (the max_seqlen class, sink dtype names; the window and dtype
checks are :mod:`sglang_fa4.kernels.inputs`').

Only what can change the compiled kernel for ViT-style self attention (one ``cu_seqlens`` for q
and k, no LSE, no split-KV, no paging) is in the key:

* dtype, head_dim, head_dim_v, q heads per kv head (FA4 keys on the ratio, not the head count);
* the max_seqlen *class* (:func:`seqlen_class`);
* causal / whether each window side is bounded (the window sizes themselves are runtime values,
  as is softmax_scale);
* the sink dtype (or no sink);
* more than ``MANY_SEGMENTS`` segments (FA4 then feeds the tile scheduler a block cumsum);
* stride-0 (broadcast) dims of q/k/v, which CuTe keeps static.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Optional

import torch

from sglang_fa4.kernels.fa4.b36 import MANY_SEGMENTS, SM100_TILE_M, sm100_class
from sglang_fa4.kernels.inputs import DTYPE_NAMES, FA4InputError, normalize_window

SINK_DTYPE_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}


class FA4Config(NamedTuple):
    """One compiled-kernel configuration, readable form of the internal cache key."""

    arch: int
    dtype: str
    head_dim: int
    head_dim_v: int
    qhead_per_kvhead: int
    seqlen_class: str
    causal: bool
    window_left: bool  # a left window bound is set (its size is a runtime value)
    window_right: bool
    sink_dtype: Optional[str]
    many_segments: bool  # more than MANY_SEGMENTS segments
    broadcast: Optional[tuple]  # stride-0 dims of (q, k, v), None when there are none

    def as_dict(self) -> dict[str, Any]:
        return self._asdict()


def seqlen_class(arch: int, max_seqlen: Optional[int], total_q: int, qhead_per_kvhead: int = 1) -> str:
    """The part of max_seqlen that reaches FA4's compiled kernel, as a class name.

    SM80/SM90/SM120: nothing (``is_static_persistent`` is in FA4's key, but those kernels are
    built without it and take no max_seqlen argument), so one class serves every length.
    SM100/SM110 (tile_m 128): q_stage is 2 above tile_m, and the scheduler is static-persistent
    when the host bound fits one q_stage * tile_m block; without a host bound FA4 uses total_q
    and is never static. The bound is in packed rows: with GQA FA4 packs the q heads of a kv head
    into the sequence (``pack_gqa``, its default for qhead_per_kvhead > 1 below hd256), so it is
    max_seqlen * qhead_per_kvhead. There the kernel also takes max_seqlen as a runtime argument.
    """
    if not sm100_class(arch):
        return "any"
    bound = (total_q if max_seqlen is None else max_seqlen) * max(1, qhead_per_kvhead)
    two_stage = bound > SM100_TILE_M
    static = max_seqlen is not None and bound <= SM100_TILE_M * (2 if two_stage else 1)
    return f"q_stage{2 if two_stage else 1}" + ("-static" if static else "")


def config_for(
    arch: int,
    dtype,
    head_dim: int,
    head_dim_v: int,
    qhead_per_kvhead: int,
    max_seqlen: Optional[int],
    total_q: int,
    window_size=(None, None),
    sink_dtype=None,
    num_segments: int = 1,
    broadcast: Optional[tuple] = None,
) -> FA4Config:
    """The :class:`FA4Config` that :class:`~sglang_fa4.kernels.fa4.cache.KernelCache`
    resolves for a call with these properties (the same normalisation as its key;
    tests/test_warmup.py checks the two agree). ``dtype``/``sink_dtype``: torch dtypes or their
    FA4Config names."""
    causal, left, right = normalize_window(window_size)
    dtype_name = DTYPE_NAMES.get(dtype, dtype)
    if dtype_name not in DTYPE_NAMES.values():
        raise FA4InputError(f"dtype must be bfloat16 or float16, got {dtype!r}")
    if sink_dtype is not None:
        sink_dtype = SINK_DTYPE_NAMES.get(sink_dtype, sink_dtype)
        if sink_dtype not in SINK_DTYPE_NAMES.values():
            raise FA4InputError(f"sink dtype must be float32, bfloat16 or float16, got {sink_dtype!r}")
    return FA4Config(
        arch, dtype_name, head_dim, head_dim_v, qhead_per_kvhead, seqlen_class(arch, max_seqlen, total_q, qhead_per_kvhead),
        causal, left is not None, right is not None, sink_dtype, num_segments > MANY_SEGMENTS, broadcast,
    )


@dataclass
class FwdCall:
    """One forward call, canonicalised (aligned inputs, resolved window, output allocated)."""

    q: Any
    k: Any
    v: Any
    cu_seqlens: Any
    max_seqlen: Optional[int]
    softmax_scale: Optional[float]  # the caller's value (None: FA4's default)
    causal: bool
    window_left: Optional[int]
    window_right: Optional[int]
    sinks: Any
    out: Any


@dataclass(frozen=True)
class CompileEvent:
    """A configuration seen for the first time in this process (and resolved through FA4)."""

    index: int  # 1-based count of configurations in this process
    config: FA4Config
    seconds: float  # host time of the resolving call (compile + first launch)
    fa4_compiled: bool  # FA4 compiled it now (False: found in FA4's in-memory or disk cache)
    during_capture: bool  # first seen while a CUDA graph was being captured
    from_shared_library: bool = False  # loaded from fa4_shared_libs' store (FA4 not involved)

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "config": self.config.as_dict(),
            "seconds": self.seconds,
            "fa4_compiled": self.fa4_compiled,
            "during_capture": self.during_capture,
            "from_shared_library": self.from_shared_library,
        }
