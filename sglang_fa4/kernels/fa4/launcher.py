"""One configuration's compiled FA4 kernel and the template of the argument list it takes.

The first call of a configuration goes through FA4's own forward while the b36 backend records
the compiled function and the arguments FA4 handed it (:mod:`sglang_fa4.kernels.fa4.b36`);
:meth:`Launcher.from_capture` checks that list against the b36 layout, keeps its static part,
and :meth:`Launcher.launch` fills in a call's tensors and calls the function directly on the
current torch stream (a few microseconds of host time, CUDA-graph capturable).
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from sglang_fa4.kernels.fa4.b36 import MANY_SEGMENTS, CallLayout, FA4LayoutError, Resolved
from sglang_fa4.kernels.fa4.config import FA4Config, FwdCall


def _same_tensor(a, b) -> bool:
    return isinstance(a, torch.Tensor) and a.data_ptr() == b.data_ptr() and a.shape == b.shape


class Launcher:
    """Calls one compiled FA4 kernel with a fresh argument list built from a template."""

    __slots__ = ("fn", "template", "layout", "default_scale", "sched", "config")

    def __init__(self, fn, template: list, layout: CallLayout, default_scale: float, sched, config):
        self.fn = fn
        self.template = template
        self.layout = layout
        self.default_scale = default_scale
        self.sched = sched
        self.config = config

    @classmethod
    def from_capture(cls, resolved: Resolved, layout: CallLayout, call: FwdCall, config: FA4Config):
        """Check FA4's captured argument list against ``layout`` and turn it into a template."""
        args = list(resolved.args)

        def fail(what: str):
            raise FA4LayoutError(
                f"FA4's forward kernel call does not match the layout sglang-fa4 expects "
                f"(flash-attn-4 4.0.0b36): {what}; got {len(args)} arguments"
            )

        if len(args) != layout.nargs:
            fail(f"expected {layout.nargs} arguments")
        for name, tensor in (
            ("q", call.q),
            ("k", call.k),
            ("v", call.v),
            ("out", call.out),
            ("cu_seqlens_q", call.cu_seqlens),
            ("cu_seqlens_k", call.cu_seqlens),
        ):
            if not _same_tensor(args[getattr(layout, name)], tensor):
                fail(f"argument {getattr(layout, name)} is not {name}")
        if args[layout.lse] is not None:
            fail(f"argument {layout.lse} (lse) is not None")
        default_scale = 1.0 / math.sqrt(call.q.shape[-1])  # FA4's default, bit for bit
        scale = default_scale if call.softmax_scale is None else call.softmax_scale
        if args[layout.softmax_scale] != scale:
            fail(f"argument {layout.softmax_scale} is not softmax_scale={scale!r}")
        for name, value in (("window_left", call.window_left), ("window_right", call.window_right)):
            if args[getattr(layout, name)] != value:
                fail(f"argument {getattr(layout, name)} is not {name}={value!r}")
        if call.sinks is None:
            if args[layout.sink] is not None:
                fail(f"argument {layout.sink} (learnable_sink) is not None")
        elif not _same_tensor(args[layout.sink], call.sinks):
            fail(f"argument {layout.sink} is not learnable_sink")
        if layout.max_seqlen is not None:
            expected = call.q.shape[0] if call.max_seqlen is None else call.max_seqlen
            if args[layout.max_seqlen] != expected:
                fail(f"argument {layout.max_seqlen} is not max_seqlen_q={expected}")
        sched = None
        if config.many_segments:
            if resolved.sched is None or not isinstance(args[layout.sched[0]], torch.Tensor):
                fail(f"no scheduler block cumsum at argument {layout.sched[0]} for "
                     f">{MANY_SEGMENTS} segments")
            sched = resolved.sched
        elif any(args[i] is not None for i in layout.sched):
            fail(f"unexpected scheduler aids at arguments {layout.sched}")
        # Keep only the static arguments: the per-call ones must not pin the first call's tensors.
        per_call = [
            layout.q, layout.k, layout.v, layout.out, layout.softmax_scale, layout.cu_seqlens_q,
            layout.cu_seqlens_k, layout.window_left, layout.window_right, layout.sink, *layout.sched,
        ]
        if layout.max_seqlen is not None:
            per_call.append(layout.max_seqlen)
        for i in per_call:
            args[i] = None
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                fail(f"argument {i} is a tensor this cache does not know how to refresh")
        return cls(resolved.fn, args, layout, default_scale, sched, config)

    @classmethod
    def from_store(cls, stored, layout: CallLayout, config: FA4Config):
        """The launcher of a kernel loaded from the shared-library store
        (:class:`~sglang_fa4.kernels.fa4.shared_libs.Stored`); its template was one of ours."""
        default_scale = 1.0 / math.sqrt(config.head_dim)  # as from_capture computes it
        return cls(stored.fn, list(stored.template), layout, default_scale, stored.sched, config)

    def launch(self, call: FwdCall) -> None:
        """Run ``call`` (normalised, same configuration) into ``call.out``."""
        lay = self.layout
        cu_seqlens = call.cu_seqlens
        args = self.template.copy()
        args[lay.q] = call.q
        args[lay.k] = call.k
        args[lay.v] = call.v
        args[lay.out] = call.out
        args[lay.softmax_scale] = self.default_scale if call.softmax_scale is None else call.softmax_scale
        args[lay.cu_seqlens_q] = cu_seqlens
        args[lay.cu_seqlens_k] = cu_seqlens
        args[lay.window_left] = call.window_left
        args[lay.window_right] = call.window_right
        args[lay.sink] = call.sinks
        if lay.max_seqlen is not None or self.sched is not None:
            total_q = call.q.shape[0]
            if lay.max_seqlen is not None:
                args[lay.max_seqlen] = total_q if call.max_seqlen is None else call.max_seqlen
            if self.sched is not None:
                for i, t in zip(lay.sched, self.sched(cu_seqlens, total_q)):
                    args[i] = t
        self.fn(*args)


class PublicLauncher:
    """A configuration whose kernel call sglang-fa4 does not recognise: FA4's public API, into the
    call's ``out`` (what :class:`Launcher` does for recognised ones, with FA4's host cost)."""

    def __init__(self, cache, config: Optional[FA4Config] = None):
        self.cache = cache  # the KernelCache
        self.config = config

    def launch(self, call: FwdCall) -> None:
        out = call.out
        call = FwdCall(**dict(call.__dict__))  # the cache's _public rewrites its argument's fields
        self.cache._public(call, out)
