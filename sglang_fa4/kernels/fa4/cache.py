"""Per-configuration cache of FA4's compiled varlen forward kernel, and its direct launch.

``flash_attn.cute.flash_attn_varlen_func`` rebuilds a ~70-field compile key, allocates and routes
through ``torch.autograd.Function`` on every call: 100-165 us of host time on an H200 host, paid
24-32 times per image by a ViT. The kernel it ends up calling is a TVM-FFI function held in FA4's
compile cache that takes torch tensors and costs a few microseconds to launch.

A call is first normalised (:meth:`KernelCache.normalise`: cheap checks, FA4's alignment rules,
the window resolved, the output allocated, the configuration key of
:mod:`sglang_fa4.kernels.fa4.config`), then dispatched (:meth:`KernelCache.dispatch`): a known
configuration launches its kernel directly (:mod:`sglang_fa4.kernels.fa4.launcher`); a new one
goes once through FA4's own forward (so its compile and disk caches stay valid) while the backend
records what FA4 launched, or, when the cache has a shared-library store
(:mod:`sglang_fa4.kernels.fa4.shared_libs`), loads the kernel an earlier process stored there
without FA4 (and stores the ones FA4 resolves). Everything FA4-specific sits behind the backend seam
(:mod:`sglang_fa4.kernels.fa4.b36`); this module imports neither flash_attn nor cutlass.

:func:`kernel_cache` is the process's one cache (FA4's backend, the default store), created on
first use; every resolve is also a compile event of the process registry
(:mod:`sglang_fa4.kernels.compile_events`, source ``"fa4"``).
"""

from __future__ import annotations

import logging
import operator
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Protocol

import torch

from sglang_fa4.kernels import compile_events as compile_events_registry
from sglang_fa4.kernels.compile_events import KernelFamily
from sglang_fa4.kernels.fa4 import b36
from sglang_fa4.kernels.fa4.b36 import (
    ALIGN_BYTES,
    MANY_SEGMENTS,
    CallLayout,
    FA4LayoutError,
    Resolved,
    layout_for_arch,
    sm100_class,
)
from sglang_fa4.kernels.fa4.config import SINK_DTYPE_NAMES, CompileEvent, FA4Config, FwdCall, seqlen_class
from sglang_fa4.kernels.fa4.launcher import Launcher, PublicLauncher
from sglang_fa4.kernels.inputs import (
    DTYPE_NAMES,
    FA4FeatureError,
    FA4InputError,
    check_out_shape,
    check_scalars,
    check_tensors,
    describe,
    normalize_window,
)

logger = logging.getLogger("sglang_fa4")


class Backend(Protocol):
    """The FA4-specific half. :class:`sglang_fa4.kernels.fa4.b36.FA4Backend` is the real one."""

    #: check that tensors are on CUDA (fakes in CPU tests say False)
    requires_cuda: bool

    def arch(self) -> int: ...

    def compile_and_run(self, call: FwdCall) -> Resolved:
        """Run ``call`` through FA4's own forward, writing ``call.out``; return what it launched."""

    def public(self, call: FwdCall):
        """Run ``call`` through FA4's public (autograd) API; return the output tensor."""


_NO_WINDOW = (None, None)
_SGLANG_NO_WINDOW = (-1, -1)
_grad_enabled = torch.is_grad_enabled


def _host_int(value) -> int:
    if isinstance(value, (torch.Tensor, bool)):
        raise FA4InputError(
            "max_seqlen must be a host int or None (a tensor would be read on the host)"
        )
    try:
        return operator.index(value)
    except TypeError:
        raise FA4InputError(f"max_seqlen must be an int or None, got {value!r}") from None


def _aligned(t):
    """FA4's maybe_contiguous (b36) for a q/k/v tensor: keep it when its pointer and strides are
    ALIGN_BYTES-aligned with a unit last stride, else copy. Returns (tensor, plain contiguous)."""
    if t.is_contiguous():
        if t.data_ptr() % ALIGN_BYTES:
            t = t.clone(memory_format=torch.contiguous_format)
        return t, True
    if t.data_ptr() % ALIGN_BYTES:
        return t.clone(memory_format=torch.contiguous_format), False
    s0, s1, s2 = t.stride()
    step = ALIGN_BYTES // t.element_size()
    if s2 == 1 and not s0 % step and not s1 % step:  # stride 0 passes, as in FA4
        return t, False
    return t.contiguous(), False


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

    def __init__(self, backend: Backend, store=None):
        self.backend = backend
        #: shared_libs.Store (or None): kernels kept as shared libraries, loaded without FA4
        self.store = store
        self._launchers: dict[tuple, Launcher] = {}
        self._arch: Optional[int] = None
        self._layout: Optional[CallLayout] = None
        self._stats = _Stats()
        self._lock = threading.Lock()
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
            self._one_seqlen_class = not sm100_class(arch)
            self._arch = arch
        return self._arch

    # -- the call ----------------------------------------------------------------------------

    def __call__(self, q, k, v, cu_seqlens, max_seqlen, softmax_scale, window_size, sinks, out):
        call, key = self.normalise(q, k, v, cu_seqlens, max_seqlen, softmax_scale, window_size, sinks, out)
        if key is None:  # inputs that want an autograd graph: FA4's public path
            return self._public(call, out)
        return self.dispatch(call, key)

    def normalise(self, q, k, v, cu_seqlens, max_seqlen, softmax_scale, window_size, sinks, out):
        """The call as FA4's kernel takes it, and its configuration key (None: the inputs want
        an autograd graph, and ``call.out`` is the caller's ``out``).

        The hot path: cheap checks only (FA4 validates everything on a configuration's first
        call, and the compiled function checks ranks, dtypes and static dims on every call)."""
        check_scalars(max_seqlen, softmax_scale, q)
        total_q, nheads, head_dim, total_k, nheads_k, head_dim_v, dtype = check_tensors(
            q, k, v, cu_seqlens, self.backend.requires_cuda)
        # the GPU is asked only once the host checks passed (a malformed call fails the same way on any machine)
        arch = self._arch if self._arch is not None else self.arch
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
                call = FwdCall(q, k, v, cu_seqlens, max_seqlen, softmax_scale, causal, left, right, sinks, out)
                return call, None
            q, k, v = q.detach(), k.detach(), v.detach()  # as FA4 hands them to its kernel

        q, q_plain = _aligned(q)
        k, k_plain = _aligned(k)
        v, v_plain = _aligned(v)
        if not cu_seqlens.is_contiguous():
            cu_seqlens = cu_seqlens.contiguous()
        # stride-0 dims stay static in FA4's kernels; a contiguous tensor can only have them in
        # size-1 dims
        bc = None
        if not (q_plain and k_plain and v_plain) or min(total_q, total_k, nheads_k, head_dim, head_dim_v) < 2:
            bc = _broadcast_dims(q, k, v)

        if out is None:
            out = q.new_empty((total_q, nheads, head_dim_v))
        elif not (
            type(out) is torch.Tensor
            and out.dtype is dtype
            and out.shape == (total_q, nheads, head_dim_v)
            and out.is_contiguous()
            and not out.data_ptr() % ALIGN_BYTES
            and out.get_device() == q.get_device()
        ):
            self._check_out(out, total_q, nheads, head_dim_v, dtype, q)

        key = (
            dtype,
            head_dim,
            head_dim_v,
            nheads // nheads_k,
            "any" if self._one_seqlen_class else seqlen_class(arch, max_seqlen, total_q, nheads // nheads_k),
            causal,
            left is not None,
            right is not None,
            sink_dtype,
            cu_seqlens.shape[0] - 1 > MANY_SEGMENTS,
            bc,
        )
        return FwdCall(q, k, v, cu_seqlens, max_seqlen, softmax_scale, causal, left, right, sinks, out), key

    def dispatch(self, call: FwdCall, key: tuple):
        """Run a normalised call: its configuration's kernel directly, or FA4's forward once for a
        new configuration. Returns ``call.out``."""
        if not call.q.shape[0] or not call.k.shape[0]:
            call.out.zero_()  # FA4's own early exit
            return call.out
        launcher = self._launchers.get(key)
        if launcher is not None:
            launcher.launch(call)
            return call.out
        return self._resolve(key, call)

    def _check_sinks(self, sinks, nheads: int, arch: int) -> str:
        if not isinstance(sinks, torch.Tensor) or sinks.shape != (nheads,):
            raise FA4InputError(
                f"sinks must be a tensor of shape (heads,) = ({nheads},), got {describe(sinks)}"
            )
        sink_dtype = SINK_DTYPE_NAMES.get(sinks.dtype)
        if sink_dtype is None:
            raise FA4InputError(f"sinks must be float32, bfloat16 or float16, got {sinks.dtype}")
        if self.backend.requires_cuda and not sinks.is_cuda:
            raise FA4InputError("sinks must be a CUDA tensor")
        if arch // 10 in (8, 12):
            raise FA4FeatureError(
                f"attention sinks (learnable_sink) are not supported by FA4's sm_{arch} forward "
                f"kernel (FlashAttentionForwardSm80/Sm120); refusing to drop them"
            )
        return sink_dtype

    # -- slow paths --------------------------------------------------------------------------

    @staticmethod
    def _check_out(out, total_q, nheads, head_dim_v, dtype, q) -> None:
        check_out_shape(out, total_q, nheads, head_dim_v, dtype, q)
        strides = out.stride()
        if (
            0 in strides
            or strides[-1] != 1
            or out.data_ptr() % ALIGN_BYTES
            or any(s % (ALIGN_BYTES // out.element_size()) for s in strides[:-1])
        ):
            raise FA4InputError(
                "out must have a contiguous last dim, 16-byte aligned pointer and strides, and no "
                "broadcast dims"
            )

    def _public(self, call: FwdCall, out):
        if call.causal:
            call.window_left, call.window_right = None, 0  # FA4 resolves (None, 0) back to causal
        call.causal, call.out = False, None
        result = self.backend.public(call)
        if out is not None:
            out.copy_(result)
            return out
        return result

    def _resolve(self, key: tuple, call: FwdCall):
        arch = self.arch
        (dtype, head_dim, head_dim_v, qpk, sclass, causal, has_l, has_r, sink_dtype, many, bc) = key
        config = FA4Config(
            arch, DTYPE_NAMES[dtype], head_dim, head_dim_v, qpk, sclass, causal, has_l, has_r,
            sink_dtype, many, bc,
        )
        if sm100_class(arch) and head_dim_v > 128:
            # hd256 on SM100 also keys on batch * heads vs the SM count (2-CTA decode tiles);
            # not worth a class of its own for ViTs: run FA4's own path every call.
            self.backend.compile_and_run(_fa4_form(call))
            return call.out
        with self._lock:
            launcher = self._launchers.get(key)
            if launcher is not None:  # another thread resolved it meanwhile
                launcher.launch(call)
                return call.out
            capturing = bool(torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())
            t0 = time.perf_counter()
            launcher = self._from_store(config, call) if self.store is not None else None
            compiled, stored = False, launcher is not None
            try:
                if launcher is None:
                    resolved = self.backend.compile_and_run(_fa4_form(call))
                    launcher = Launcher.from_capture(resolved, self._layout, call, config)
                    compiled = bool(resolved.fa4_compiled)
                    if self.store is not None:
                        self.store.save(config, resolved, launcher.template, self._layout)
            except AssertionError as exc:  # FA4 validates with asserts
                raise FA4InputError(f"FA4 rejected configuration {config}: {exc}") from exc
            except FA4LayoutError as exc:
                # another flash-attn-4 than the one sglang-fa4 knows: this configuration takes FA4's
                # public API (slower host path, same kernel), never an error per call
                launcher, compiled = PublicLauncher(self, config), True
                _warn_layout_fallback(config, exc)
                launcher.launch(call)
            seconds = time.perf_counter() - t0
            self._launchers[key] = launcher
            event = CompileEvent(len(self._stats.events) + 1, config, seconds, compiled, capturing, stored)
            self._stats.events.append(event)
            listeners = list(self._stats.listeners)
        for callback in listeners:
            callback(event)
        compile_events_registry.record("fa4", event)  # the process registry the JIT monitor reads
        return call.out

    def _from_store(self, config: FA4Config, call: FwdCall) -> Optional[Launcher]:
        """The configuration's launcher from the shared-library store, having run ``call``; None
        (FA4's path) when the store has none or its kernel does not take the call."""
        stored = self.store.load(config, self._layout)
        if stored is None:
            return None
        launcher = Launcher.from_store(stored, self._layout, config)
        try:
            launcher.launch(call)
        except Exception as exc:  # noqa: BLE001 - TVM-FFI checks the arguments before launching
            logger.warning("sglang-fa4: stored FA4 kernel for %s rejected a call (%s: %s); FA4's own "
                           "path resolves it", config, type(exc).__name__, exc)
            return None
        return launcher

    def public_configs(self) -> list[FA4Config]:
        """Configurations that run through FA4's public API (their call layout was not recognised)."""
        with self._lock:
            return [launcher.config for launcher in self._launchers.values() if isinstance(launcher, PublicLauncher)]

    def clear(self) -> None:
        """Forget every resolved configuration and event (tests)."""
        with self._lock:
            self._launchers.clear()
            self._stats.events.clear()


_layout_fallback_warned = False


def _warn_layout_fallback(config: FA4Config, exc: Exception) -> None:
    """One warning per process: the fast launch path is off for configurations like ``config``."""
    global _layout_fallback_warned
    if _layout_fallback_warned:
        return
    _layout_fallback_warned = True

    logger.warning(
        "sglang-fa4: flash-attn-4 %s's kernel call is not the layout sglang-fa4 knows (written against %s: %s); "
        "configurations like %s run through FA4's public API (correct, ~100 us more host time per call)",
        b36.installed_version(), b36.FA4_VERSION, exc, config,
    )


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


_cache: Optional[KernelCache] = None
_cache_lock = threading.Lock()


def kernel_cache() -> KernelCache:
    """The process-wide cache (FA4's backend, the shared-library store when it is on), created on
    first use."""
    global _cache
    if _cache is None:
        with _cache_lock:
            if _cache is None:
                from sglang_fa4.kernels.fa4.b36 import FA4Backend
                from sglang_fa4.kernels.fa4.shared_libs import default_store

                _cache = KernelCache(FA4Backend(), default_store())
    return _cache


def process_cache() -> Optional[KernelCache]:
    """The process-wide cache if one was created, else None (nothing is created: host time)."""
    return _cache


def install_kernel_cache(cache: Optional[KernelCache]) -> Optional[KernelCache]:
    """Replace the process-wide cache (tests: a fake backend); returns the previous one."""
    global _cache
    with _cache_lock:
        previous, _cache = _cache, cache
    return previous


def warm_variant(variant, device) -> str:
    """The warmup registry's entry (family ``fa4``): resolve one configuration (compile it, or load
    it from FA4's caches or the store) through the process's cache, eagerly, on small random inputs
    of ``variant``'s shape (:class:`sglang_fa4.startup.variants.Variant`: heads, kv heads, head
    dim, dtype, max_seqlen, segments, window, sink dtype) on ``device``. The cache itself, not the
    ViT entry point: small warmup layouts would take the short-window route and leave the FA4
    configuration unresolved. Returns how it was resolved."""
    from itertools import accumulate

    cache = kernel_cache()
    dtype = getattr(torch, variant.dtype)
    lens = [variant.max_seqlen] + [1] * (variant.num_segments - 1)
    cu = torch.tensor(list(accumulate(lens, initial=0)), dtype=torch.int32, device=device)
    g = torch.Generator(device="cpu").manual_seed(0)
    q, k, v = (torch.randn(sum(lens), h, variant.head_dim, generator=g).to(device=device, dtype=dtype)
               for h in (variant.num_heads, variant.num_kv_heads, variant.num_kv_heads))
    sinks = None
    if variant.sink_dtype:
        sinks = torch.zeros(variant.num_heads, dtype=getattr(torch, variant.sink_dtype), device=device)
    before = cache.compile_count()
    with torch.no_grad():
        cache(q, k, v, cu, variant.max_seqlen, None, variant.window, sinks, None)
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    events = cache.compile_events()[before:]
    if not events:
        return "cached"
    if any(e.fa4_compiled for e in events):
        return "compiled"
    return "loaded from a stored shared library" if all(e.from_shared_library for e in events) else "loaded from FA4's cache"


#: the warmup registry's FA4 family (:mod:`sglang_fa4.kernels.warmup`)
FAMILIES = (KernelFamily("fa4", "fa4", warm_variant),)
