"""Per-configuration cache of FA4's compiled varlen forward kernel, and its direct launch.

``flash_attn.cute.flash_attn_varlen_func`` rebuilds a ~70-field compile key, allocates and routes
through ``torch.autograd.Function`` on every call: 100-165 us of host time on an H200 host, paid
24-32 times per image by a ViT. The kernel it ends up calling is a TVM-FFI function held in
``_flash_attn_fwd.compile_cache`` that takes torch tensors and costs a few microseconds to launch.

This module keeps our own, much smaller key -- only what can change the compiled kernel for
ViT-style self attention (one ``cu_seqlens`` for q and k, no LSE, no split-KV, no paging):

* dtype, head_dim, head_dim_v, q heads per kv head (FA4 keys on the ratio, not the head count);
* the max_seqlen *class*: on SM80/SM90/SM120 max_seqlen enters FA4's key only through
  ``is_static_persistent`` (max_seqlen <= tile_m), which those kernels never receive, so one
  class serves every length; on SM100/SM110 it selects q_stage (> tile_m) and
  ``is_static_persistent`` (<= q_stage * tile_m), and the kernel takes it as a runtime argument;
* causal / whether each window side is bounded (the window sizes themselves are runtime values,
  as is softmax_scale);
* the sink dtype (or no sink);
* more than 256 segments (FA4 then feeds the tile scheduler a block cumsum it computes per call);
* stride-0 (broadcast) dims of q/k/v, which CuTe keeps static.

The first call of a configuration goes through FA4's own ``_flash_attn_fwd`` (so its compile and
disk caches stay valid) while a backend records the compiled function and the argument list FA4
hands it; later calls rebuild that list from a template and call the function directly on the
current torch stream. Everything FA4-specific sits behind the backend seam
(:mod:`sglang_fa4.kernels.fa4_b36`); this module imports neither flash_attn nor cutlass.
"""

from __future__ import annotations

import math
import operator
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Optional, Protocol, Sequence

import torch

#: FA4's varlen scheduler switches to a block-cumsum lookup above this many segments
#: (``BIN_BATCH_SEARCH_THRESH`` in flash_attn/cute/interface.py, b36).
MANY_SEGMENTS = 256
#: SM100/SM110 non-MLA forward tile_m (``_get_fwd_config``'s default 128x128, b36).
SM100_TILE_M = 128

_DTYPE_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16"}
_SINK_DTYPES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}


class FA4InputError(ValueError):
    """The arguments cannot be handed to FA4 (wrong dtype, shape, device, layout...)."""


class FA4FeatureError(NotImplementedError):
    """FA4 has no kernel for a requested feature on this GPU architecture."""


class FA4LayoutError(RuntimeError):
    """FA4's kernel call no longer looks like the one this cache was written against (b36)."""


# --------------------------------------------------------------------------------------------
# Configuration keys
# --------------------------------------------------------------------------------------------


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


def arch_family(arch: int) -> int:
    return arch // 10


def normalize_window(window_size) -> tuple[bool, Optional[int], Optional[int]]:
    """(causal, left, right) as FA4 resolves them; a None or negative side is unbounded.

    SGLang writes "no bound" as -1 (FA2/FA3 convention); FA4 b36 writes it as None and would
    read a lone -1 as a real bound, so negatives become None here. Then, like FA4's
    ``_resolve_causal_local_window``: (None, 0) is plain causal attention, any other bound is
    local (sliding-window) attention.
    """
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise FA4InputError(f"window_size must be a pair (left, right), got {window_size!r}") from None
    left = _window_side(left, "left")
    right = _window_side(right, "right")
    if left is None and right == 0:
        return True, None, None
    return False, left, right


def _window_side(value, side: str) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool) or isinstance(value, float):
        raise FA4InputError(f"window_size {side} must be an int or None, got {value!r}")
    try:
        value = operator.index(value)
    except TypeError:
        raise FA4InputError(f"window_size {side} must be an int or None, got {value!r}") from None
    return None if value < 0 else value


def seqlen_class(arch: int, max_seqlen: Optional[int], total_q: int) -> str:
    """The part of max_seqlen that reaches FA4's compiled kernel, as a class name.

    SM80/SM90/SM120: nothing (``is_static_persistent`` is in FA4's key, but those kernels are
    built without it and take no max_seqlen argument). SM100/SM110 (tile_m 128): q_stage is 2
    above tile_m, and the scheduler is static-persistent when the host bound fits one
    q_stage * tile_m block; without a host bound FA4 uses total_q and is never static.
    """
    if arch_family(arch) not in (10, 11):
        return "any"
    bound = total_q if max_seqlen is None else max_seqlen
    two_stage = bound > SM100_TILE_M
    static = max_seqlen is not None and bound <= SM100_TILE_M * (2 if two_stage else 1)
    return f"q_stage{2 if two_stage else 1}" + ("-static" if static else "")


# --------------------------------------------------------------------------------------------
# The backend seam
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CallLayout:
    """Where each per-call value sits in the argument list FA4 passes its compiled kernel."""

    nargs: int
    q: int = 0
    k: int = 1
    v: int = 2
    out: int = 3
    lse: int = 4
    softmax_scale: int = 5
    cu_seqlens_q: int = 6
    cu_seqlens_k: int = 7
    window_left: int = 11
    window_right: int = 12
    sink: int = 13
    sched: tuple[int, ...] = ()  # scheduler aids for > MANY_SEGMENTS segments
    max_seqlen: Optional[int] = None  # runtime max_seqlen_q (SM100/SM110)


#: flash-attn-4 4.0.0b36 ``_flash_attn_fwd`` call_args, non-MLA. SM80/SM90/SM120: 14 common
#: args, block-sparse tensors, AuxData, cu_total_m_blocks, cu_total_splits_m_blocks.
LAYOUT_SM90 = CallLayout(nargs=18, sched=(16, 17))
#: SM100/SM110: 14 common args, descale, block-sparse, AuxData, num_splits_dynamic,
#: tile_count_semaphore, virtual_batch_idx, num_nheads_in_l2, cu_total_m_blocks,
#: cu_total_splits_m_blocks, blocks_to_batch_idx, max_seqlen_q.
LAYOUT_SM100 = CallLayout(nargs=25, sched=(21, 22, 23), max_seqlen=24)


def layout_for_arch(arch: int) -> CallLayout:
    return LAYOUT_SM100 if arch_family(arch) in (10, 11) else LAYOUT_SM90


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


@dataclass
class Resolved:
    """What a backend captured while FA4 ran one call of a new configuration."""

    fn: Callable[..., Any]  # FA4's compiled kernel (TVM-FFI function)
    args: list  # the argument list FA4 passed it
    fa4_compiled: bool  # FA4 ran cute.compile (False: its memory or disk cache had it)
    #: (cu_seqlens, total_q) -> tensors for layout.sched, when FA4 computed scheduler aids
    sched: Optional[Callable[[Any, int], tuple]] = None
    fa4_key: Any = None


class Backend(Protocol):
    """The FA4-specific half. :class:`sglang_fa4.kernels.fa4_b36.FA4Backend` is the real one."""

    #: check that tensors are on CUDA (fakes in CPU tests say False)
    requires_cuda: bool

    def arch(self) -> int: ...

    def compile_and_run(self, call: FwdCall) -> Resolved:
        """Run ``call`` through FA4's own forward, writing ``call.out``; return what it launched."""

    def public(self, call: FwdCall):
        """Run ``call`` through FA4's public (autograd) API; return the output tensor."""


# --------------------------------------------------------------------------------------------
# Compile events
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CompileEvent:
    """A configuration seen for the first time in this process (and resolved through FA4)."""

    index: int  # 1-based count of configurations in this process
    config: FA4Config
    seconds: float  # host time of the resolving call (compile + first launch)
    fa4_compiled: bool  # FA4 compiled it now (False: found in FA4's in-memory or disk cache)
    during_capture: bool  # first seen while a CUDA graph was being captured

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "config": self.config.as_dict(),
            "seconds": self.seconds,
            "fa4_compiled": self.fa4_compiled,
            "during_capture": self.during_capture,
        }


# --------------------------------------------------------------------------------------------
# Launcher: one configuration's compiled function plus its argument template
# --------------------------------------------------------------------------------------------


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

    def launch(self, q, k, v, out, softmax_scale, cu_seqlens, left, right, sinks, max_seqlen, total_q):
        lay = self.layout
        args = self.template.copy()
        args[lay.q] = q
        args[lay.k] = k
        args[lay.v] = v
        args[lay.out] = out
        args[lay.softmax_scale] = self.default_scale if softmax_scale is None else softmax_scale
        args[lay.cu_seqlens_q] = cu_seqlens
        args[lay.cu_seqlens_k] = cu_seqlens
        args[lay.window_left] = left
        args[lay.window_right] = right
        args[lay.sink] = sinks
        if lay.max_seqlen is not None:
            args[lay.max_seqlen] = total_q if max_seqlen is None else max_seqlen
        if self.sched is not None:
            for i, t in zip(lay.sched, self.sched(cu_seqlens, total_q)):
                args[i] = t
        self.fn(*args)


# --------------------------------------------------------------------------------------------
# The cache
# --------------------------------------------------------------------------------------------


_INT32 = torch.int32
_NO_WINDOW = (None, None)
_SGLANG_NO_WINDOW = (-1, -1)
_grad_enabled = torch.is_grad_enabled


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"{tuple(x.shape)} {x.dtype}"
    return type(x).__name__


def _host_int(value) -> int:
    if isinstance(value, (torch.Tensor, bool)):
        raise FA4InputError(
            "max_seqlen must be a host int or None (a tensor would be read on the host)"
        )
    try:
        return operator.index(value)
    except TypeError:
        raise FA4InputError(f"max_seqlen must be an int or None, got {value!r}") from None


def _aligned_strided(t, align: int = 16):
    """FA4's maybe_contiguous (b36) for a non-contiguous 3-D tensor: keep it when its pointer and
    strides are ``align``-byte aligned with a unit last stride, else copy."""
    if t.data_ptr() % align:
        return t.clone(memory_format=torch.contiguous_format)
    s0, s1, s2 = t.stride()
    step = align // t.element_size()
    if s2 == 1 and not s0 % step and not s1 % step:  # stride 0 passes, as in FA4
        return t
    return t.contiguous()


def _broadcast_dims(q, k, v):
    sq, sk, sv = q.stride(), k.stride(), v.stride()
    if 0 in sq or 0 in sk or 0 in sv:
        return tuple(tuple(x == 0 for x in s) for s in (sq, sk, sv))
    return None


@dataclass
class _Stats:
    events: list = field(default_factory=list)
    listeners: list = field(default_factory=list)


class KernelCache:
    """Resolves each configuration once through FA4, then launches its kernel directly."""

    def __init__(self, backend: Backend):
        self.backend = backend
        self._launchers: dict[tuple, Launcher] = {}
        self._arch: Optional[int] = None
        self._layout: Optional[CallLayout] = None
        self._stats = _Stats()
        self._lock = threading.Lock()
        self._slow_configs: set = set()
        self._one_seqlen_class = False

    # -- introspection -----------------------------------------------------------------------

    def compile_count(self) -> int:
        """New configurations resolved (compiled, or loaded from FA4's caches) in this process."""
        return len(self._stats.events)

    def compile_events(self) -> list[CompileEvent]:
        return list(self._stats.events)

    def configs_seen(self) -> list[FA4Config]:
        return [e.config for e in self._stats.events]

    def add_compile_listener(self, callback: Callable[[CompileEvent], None]) -> Callable[[], None]:
        """Call ``callback(event)`` after each new configuration; returns a remover."""
        self._stats.listeners.append(callback)

        def remove() -> None:
            if callback in self._stats.listeners:
                self._stats.listeners.remove(callback)

        return remove

    @property
    def arch(self) -> int:
        if self._arch is None:
            arch = int(self.backend.arch())
            self._layout = layout_for_arch(arch)
            self._one_seqlen_class = arch_family(arch) not in (10, 11)
            self._arch = arch
        return self._arch

    # -- the call ----------------------------------------------------------------------------

    def __call__(self, q, k, v, cu_seqlens, max_seqlen, softmax_scale, window_size, sinks, out):
        # The hot path: cheap checks only (FA4 validates everything on a configuration's first
        # call, and the compiled function checks ranks, dtypes and static dims on every call).
        arch = self._arch if self._arch is not None else self.arch
        try:
            total_q, nheads, head_dim = q.shape
            total_k, nheads_k, head_dim_k = k.shape
            total_v, nheads_v, head_dim_v = v.shape
            dtype = q.dtype
            cu_ok = cu_seqlens.dtype is _INT32 and cu_seqlens.dim() == 1
        except (AttributeError, ValueError, TypeError):
            raise FA4InputError(
                "q, k, v must be (total_tokens, heads, head_dim) tensors and cu_seqlens a 1-D "
                f"tensor; got {_describe(q)}, {_describe(k)}, {_describe(v)}, {_describe(cu_seqlens)}"
            ) from None
        if dtype not in _DTYPE_NAMES or k.dtype is not dtype or v.dtype is not dtype:
            raise FA4InputError(
                f"q, k, v must all be bfloat16 or all float16; got {q.dtype}, {k.dtype}, {v.dtype}"
            )
        if total_v != total_k or nheads_v != nheads_k or head_dim_k != head_dim:
            raise FA4InputError(
                f"k {tuple(k.shape)} and v {tuple(v.shape)} must share tokens and heads, and k "
                f"must have q's head_dim {head_dim}"
            )
        if not nheads_k or nheads % nheads_k:
            raise FA4InputError(f"q heads ({nheads}) must be a multiple of k/v heads ({nheads_k})")
        if not cu_ok:
            raise FA4InputError("cu_seqlens must be a 1-D int32 tensor (segments + 1,)")
        if self.backend.requires_cuda and not (
            q.is_cuda and k.is_cuda and v.is_cuda and cu_seqlens.is_cuda
        ):
            raise FA4InputError("q, k, v and cu_seqlens must be CUDA tensors")
        if max_seqlen is not None and type(max_seqlen) is not int:
            max_seqlen = _host_int(max_seqlen)
        if softmax_scale is not None and type(softmax_scale) is not float:
            softmax_scale = float(softmax_scale)
        if window_size is _NO_WINDOW or window_size == _NO_WINDOW or window_size == _SGLANG_NO_WINDOW:
            causal, left, right = False, None, None
        else:
            causal, left, right = normalize_window(window_size)

        sink_dtype = None
        if sinks is not None:
            sink_dtype = self._check_sinks(sinks, nheads, arch)
            if not sinks.is_contiguous() or sinks.data_ptr() & 3:
                sinks = sinks.clone(memory_format=torch.contiguous_format)

        # Autograd: the direct launch is forward-only; inputs that want a graph go the public way.
        if q.requires_grad or k.requires_grad or v.requires_grad or (
            sinks is not None and sinks.requires_grad
        ):
            if _grad_enabled():
                return self._public(
                    q, k, v, cu_seqlens, max_seqlen, softmax_scale, causal, left, right, sinks, out
                )
            q, k, v = q.detach(), k.detach(), v.detach()  # as FA4 hands them to its kernel

        # FA4's maybe_contiguous: 16-byte aligned pointers and strides, unit last stride.
        plain = True
        if q.is_contiguous():
            if q.data_ptr() & 15:
                q = q.clone(memory_format=torch.contiguous_format)
        else:
            q, plain = _aligned_strided(q), False
        if k.is_contiguous():
            if k.data_ptr() & 15:
                k = k.clone(memory_format=torch.contiguous_format)
        else:
            k, plain = _aligned_strided(k), False
        if v.is_contiguous():
            if v.data_ptr() & 15:
                v = v.clone(memory_format=torch.contiguous_format)
        else:
            v, plain = _aligned_strided(v), False
        if not cu_seqlens.is_contiguous():
            cu_seqlens = cu_seqlens.contiguous()
        # stride-0 dims stay static in FA4's kernels; a contiguous tensor can only have them in
        # size-1 dims
        bc = None
        if not plain or total_q < 2 or total_k < 2 or nheads_k < 2 or head_dim < 2 or head_dim_v < 2:
            bc = _broadcast_dims(q, k, v)

        if out is None:
            out = q.new_empty((total_q, nheads, head_dim_v))
        elif not (
            type(out) is torch.Tensor
            and out.dtype is dtype
            and out.shape == (total_q, nheads, head_dim_v)
            and out.is_contiguous()
            and not out.data_ptr() & 15
            and out.get_device() == q.get_device()
        ):
            self._check_out(out, total_q, nheads, head_dim_v, dtype, q)

        if total_q == 0 or total_k == 0:
            out.zero_()  # FA4's own early exit
            return out

        num_segments = cu_seqlens.shape[0] - 1
        key = (
            dtype,
            head_dim,
            head_dim_v,
            nheads // nheads_k,
            "any" if self._one_seqlen_class else seqlen_class(arch, max_seqlen, total_q),
            causal,
            left is not None,
            right is not None,
            sink_dtype,
            num_segments > MANY_SEGMENTS,
            bc,
        )
        launcher = self._launchers.get(key)
        if launcher is not None:  # Launcher.launch, inlined
            lay = launcher.layout
            args = launcher.template.copy()
            args[lay.q] = q
            args[lay.k] = k
            args[lay.v] = v
            args[lay.out] = out
            args[lay.softmax_scale] = launcher.default_scale if softmax_scale is None else softmax_scale
            args[lay.cu_seqlens_q] = cu_seqlens
            args[lay.cu_seqlens_k] = cu_seqlens
            args[lay.window_left] = left
            args[lay.window_right] = right
            args[lay.sink] = sinks
            if lay.max_seqlen is not None:
                args[lay.max_seqlen] = total_q if max_seqlen is None else max_seqlen
            if launcher.sched is not None:
                for i, t in zip(lay.sched, launcher.sched(cu_seqlens, total_q)):
                    args[i] = t
            launcher.fn(*args)
            return out
        call = FwdCall(q, k, v, cu_seqlens, max_seqlen, softmax_scale, causal, left, right, sinks, out)
        return self._resolve(key, call)

    def _check_sinks(self, sinks, nheads: int, arch: int) -> str:
        if not isinstance(sinks, torch.Tensor) or sinks.shape != (nheads,):
            raise FA4InputError(
                f"sinks must be a tensor of shape (heads,) = ({nheads},), got {_describe(sinks)}"
            )
        sink_dtype = _SINK_DTYPES.get(sinks.dtype)
        if sink_dtype is None:
            raise FA4InputError(f"sinks must be float32, bfloat16 or float16, got {sinks.dtype}")
        if self.backend.requires_cuda and not sinks.is_cuda:
            raise FA4InputError("sinks must be a CUDA tensor")
        if arch_family(arch) in (8, 12):
            raise FA4FeatureError(
                f"attention sinks (learnable_sink) are not supported by FA4's sm_{arch} forward "
                f"kernel (FlashAttentionForwardSm80/Sm120); refusing to drop them"
            )
        return sink_dtype

    # -- slow paths --------------------------------------------------------------------------

    @staticmethod
    def _check_out(out, total_q, nheads, head_dim_v, dtype, q) -> None:
        if not isinstance(out, torch.Tensor):
            raise FA4InputError("out must be a torch tensor or None")
        if out.shape != (total_q, nheads, head_dim_v) or out.dtype != dtype:
            raise FA4InputError(
                f"out must be {(total_q, nheads, head_dim_v)} {dtype}, got {tuple(out.shape)} {out.dtype}"
            )
        if out.get_device() != q.get_device():
            raise FA4InputError(f"out is on {out.device}, q on {q.device}")
        strides = out.stride()
        if (
            0 in strides
            or strides[-1] != 1
            or out.data_ptr() % 16
            or any(s % (16 // out.element_size()) for s in strides[:-1])
        ):
            raise FA4InputError(
                "out must have a contiguous last dim, 16-byte aligned pointer and strides, and no "
                "broadcast dims"
            )

    def _public(self, q, k, v, cu_seqlens, max_seqlen, softmax_scale, causal, left, right, sinks, out):
        if causal:
            left, right = None, 0  # FA4 resolves (None, 0) back to causal
        call = FwdCall(q, k, v, cu_seqlens, max_seqlen, softmax_scale, False, left, right, sinks, None)
        result = self.backend.public(call)
        if out is not None:
            out.copy_(result)
            return out
        return result

    def _resolve(self, key: tuple, call: FwdCall):
        arch = self.arch
        (dtype, head_dim, head_dim_v, qpk, sclass, causal, has_l, has_r, sink_dtype, many, bc) = key
        config = FA4Config(
            arch, _DTYPE_NAMES[dtype], head_dim, head_dim_v, qpk, sclass, causal, has_l, has_r,
            sink_dtype, many, bc,
        )
        if arch_family(arch) in (10, 11) and head_dim_v > 128:
            # hd256 on SM100 also keys on batch * heads vs the SM count (2-CTA decode tiles);
            # not worth a class of its own for ViTs: run FA4's own path every call.
            if config not in self._slow_configs:
                self._slow_configs.add(config)
            self.backend_run(call)
            return call.out
        with self._lock:
            launcher = self._launchers.get(key)
            if launcher is not None:  # another thread resolved it meanwhile
                launcher.launch(
                    call.q, call.k, call.v, call.out, call.softmax_scale, call.cu_seqlens,
                    call.window_left, call.window_right, call.sinks, call.max_seqlen, call.q.shape[0],
                )
                return call.out
            capturing = bool(torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())
            t0 = time.perf_counter()
            try:
                resolved = self.backend.compile_and_run(_fa4_form(call))
            except AssertionError as exc:  # FA4 validates with asserts
                raise FA4InputError(f"FA4 rejected configuration {config}: {exc}") from exc
            seconds = time.perf_counter() - t0
            launcher = Launcher.from_capture(resolved, self._layout, call, config)
            self._launchers[key] = launcher
            event = CompileEvent(
                len(self._stats.events) + 1, config, seconds, bool(resolved.fa4_compiled), capturing
            )
            self._stats.events.append(event)
            listeners = list(self._stats.listeners)
        for callback in listeners:
            callback(event)
        return call.out

    def backend_run(self, call: FwdCall) -> None:
        """FA4's own forward for one call, nothing cached by us."""
        self.backend.compile_and_run(_fa4_form(call))

    def clear(self) -> None:
        """Forget every resolved configuration and event (tests)."""
        with self._lock:
            self._launchers.clear()
            self._stats.events.clear()
            self._slow_configs.clear()


def _fa4_form(call: FwdCall) -> FwdCall:
    """The call as FA4's forward takes it: (None, 0) for causal (FA4 resolves it itself), and
    detached tensors (with a tensor that requires grad FA4 would also compute an LSE)."""
    fields = dict(call.__dict__)
    if call.causal:
        fields["window_left"], fields["window_right"] = None, 0
    for name in ("q", "k", "v", "sinks"):
        t = fields[name]
        if t is not None and t.requires_grad:
            fields[name] = t.detach()
    return FwdCall(**fields)


def describe(configs: Sequence[FA4Config]) -> list[dict[str, Any]]:
    return [c.as_dict() for c in configs]


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
    """The :class:`FA4Config` that :class:`KernelCache` resolves for a call with these properties
    (the same normalisation as ``KernelCache.__call__``'s key; tests/test_warmup.py checks the two
    agree). ``dtype``/``sink_dtype``: torch dtypes or their FA4Config names."""
    causal, left, right = normalize_window(window_size)
    dtype_name = _DTYPE_NAMES.get(dtype, dtype)
    if dtype_name not in _DTYPE_NAMES.values():
        raise FA4InputError(f"dtype must be bfloat16 or float16, got {dtype!r}")
    if sink_dtype is not None:
        sink_dtype = _SINK_DTYPES.get(sink_dtype, sink_dtype)
        if sink_dtype not in _SINK_DTYPES.values():
            raise FA4InputError(f"sink dtype must be float32, bfloat16 or float16, got {sink_dtype!r}")
    sclass = "any" if arch_family(arch) not in (10, 11) else seqlen_class(arch, max_seqlen, total_q)
    return FA4Config(
        arch, dtype_name, head_dim, head_dim_v, qhead_per_kvhead, sclass, causal,
        left is not None, right is not None, sink_dtype, num_segments > MANY_SEGMENTS, broadcast,
    )
