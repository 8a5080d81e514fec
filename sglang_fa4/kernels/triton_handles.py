"""Launch our Triton kernels through a cached handle of the compiled kernel, and count their compiles.

``kernel[grid](*args)`` goes through Triton's JIT dispatch on every call: bind the arguments, compute
the specialization key, look the kernel up, then launch. On the H200 that is 40-50 us of host time
per call (issue #18: the short-window attention route at d=80/128), three times FA4's cached launch.
A :class:`KernelHandles` resolves a kernel once per *our* key (constexprs, launch options, the dtype
and 16-byte alignment of each tensor argument, and for each integer argument Triton specializes on
whether it is 1 or a multiple of 16: exactly what Triton's own key depends on) through that JIT path, keeps the compiled kernel's launcher,
function handle and packed metadata, and afterwards calls the launcher directly.

A resolve is the only place a kernel can compile (or load from Triton's disk cache, which makes a
restart compile-free); each one is a :class:`CompileEvent` given to the listeners, which the JIT
monitor flags after the startup warmup, so a kernel compiled on the request path or inside a CUDA-graph
capture is never silent. Under ``TRITON_INTERPRET=1`` (CPU tests) nothing is compiled: every call
goes through the interpreter and no event is counted.

Triton and torch are imported lazily; the launcher calling convention (grid, stream, function,
packed metadata, launch metadata, enter/exit hooks, then every argument of the signature, constexprs
included) is that of Triton 3.6-3.8's ``CompiledKernel.__getitem__``.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from sglang_fa4.environ import envs
from sglang_fa4.kernels import compile_events as compile_events_registry

logger = logging.getLogger("sglang_fa4")
_INT32_MAX = 2**31 - 1
#: remembered caller memos per kernel (distinct stride sets are few: a model's tensors keep theirs)
MEMO_LIMIT = 256
_lock = threading.Lock()


def int_kind(v: int) -> int:
    """What of an integer argument Triton specializes on: 1 (== 1), 2 (a multiple of 16), 3 (neither)."""
    return 1 if v == 1 else (2 if not v & 15 else 3)


@dataclass(frozen=True)
class CompileEvent:
    """One kernel specialization resolved in this process."""

    kernel: str
    key: tuple
    seconds: float
    cache_hit: Optional[bool]  # True: loaded from Triton's disk cache; False: compiled; None: unknown
    during_capture: bool

    @property
    def how(self) -> str:
        return {True: "loaded from Triton's disk cache", False: "compiled"}.get(self.cache_hit, "resolved")


def interpreting() -> bool:
    """Triton's interpreter is on (TRITON_INTERPRET, read as Triton reads it): kernels run on CPU
    tensors, nothing compiles."""
    return envs.TRITON_INTERPRET.get()


class _HitListener:
    """Triton's compilation listener, set only around one resolve: did it compile or load?"""

    def __init__(self):
        self.cache_hit: Optional[bool] = None

    def __enter__(self):
        from triton import knobs

        self.previous = knobs.compilation.listener

        def listener(*, src, metadata, metadata_group, times, cache_hit):
            self.cache_hit = cache_hit
            if self.previous is not None:
                self.previous(src=src, metadata=metadata, metadata_group=metadata_group, times=times,
                              cache_hit=cache_hit)

        knobs.compilation.listener = listener
        return self

    def __exit__(self, *exc):
        from triton import knobs

        knobs.compilation.listener = self.previous
        return False


class KernelHandles:
    """The compiled specializations of one ``@triton.jit`` kernel, launched directly.

    ``make_kernel()`` returns the jitted function (called once, lazily). Integer arguments that vary
    per call (token counts) belong in its ``do_not_specialize`` list; the others (strides, head
    counts) are keyed as Triton keys them (== 1, divisible by 16). :meth:`launch` takes every argument of the signature in order, constexprs
    included, and the launch options (``num_warps``...)."""

    def __init__(self, name: str, make_kernel: Callable[[], Any]):
        self.name = name
        self._make_kernel = make_kernel
        self._jit = None
        self._handles: dict[tuple, tuple] = {}
        self._stream_of: Optional[Callable[[int], int]] = None
        self._knobs = None
        self._kinds: Optional[tuple] = None
        self._jit_only: Optional[bool] = None  # interpreter, or no cached launch: Triton's dispatch
        # caller memo -> handle: a caller that knows which of its values fix the specialization (its
        # exact strides, dtype, constexprs; pointers known 16-byte aligned) skips _key per call
        self._memo: dict = {}

    def jit(self):
        if self._jit is None:
            self._jit = self._make_kernel()
        return self._jit

    def _classify(self, args: tuple) -> tuple:
        """Per argument position: what of it Triton's specialization depends on (0 constexpr: its
        value; 1 tensor: dtype, 16-byte alignment; 2 integer Triton specializes: == 1, % 16; 3
        integer in do_not_specialize: only i32 vs i64; 4 float: nothing; 5 other: its value)."""
        params = self.jit().params
        constexpr_at = {p.num for p in params if p.is_constexpr}
        specialized_at = {p.num for p in params if not p.is_constexpr and not p.do_not_specialize}
        kinds = []
        for i, a in enumerate(args):
            if i in constexpr_at:
                kinds.append(0)
            elif hasattr(a, "data_ptr"):
                kinds.append(1)
            elif isinstance(a, int) and not isinstance(a, bool):
                kinds.append(2 if i in specialized_at else 3)
            elif isinstance(a, float):
                kinds.append(4)
            else:
                kinds.append(5)
        return tuple(kinds)

    def _key(self, args: tuple, options: dict) -> Optional[tuple]:
        """What Triton's specialization of ``args`` depends on, and nothing it does not (a key per
        stride value or token count would resolve on the request path). Host time matters here: the
        argument kinds are classified once per argument count."""
        kinds = self._kinds
        if kinds is None or len(kinds) != len(args):
            kinds = self._kinds = self._classify(args)
        parts = []
        try:
            for kind, a in zip(kinds, args):
                if kind == 1:
                    parts.append((a.dtype, not a.data_ptr() & 15))
                elif kind == 2 or kind == 3:
                    if not -_INT32_MAX - 1 <= a <= _INT32_MAX:
                        return None  # an i64 argument: Triton's own dispatch decides, every time
                    parts.append(0 if kind == 3 else int_kind(a))
                elif kind == 4:
                    parts.append(None)  # always fp32 in the signature
                else:
                    parts.append(a)
        except (AttributeError, TypeError):  # an argument changed kind at its position
            self._kinds = self._classify(args)
            return self._key(args, options)
        return (tuple(parts), tuple(options.items()))

    def launch(self, grid: tuple, args: tuple, device_index: int, memo=None, **options) -> None:
        """Launch on the current stream of CUDA device ``device_index``.

        ``memo``: optional, hashable, from a caller on a hot path: values that determine this call's
        specialization (with ``options``) exactly as ``_key`` would, e.g. the dtype, the exact stride
        values and the constexprs of a call whose pointers the caller checked to be 16-byte aligned.
        A memo seen before launches its handle without computing the key (a few microseconds of
        host time less); a new one takes the keyed path once and is remembered (at most
        ``MEMO_LIMIT``; then the table starts over). None: the keyed path."""
        if memo is not None:
            entry = self._memo.get(memo)
            if entry is not None:
                self._run(entry, grid, args, device_index, options)
                return
        if self._jit_only is None:
            self._jit_only = interpreting()
        if self._jit_only:  # CPU tests (Triton's interpreter) or no cached launch: Triton's dispatch
            self.jit()[grid](*args, **options)
            return
        key = self._key(args, options)
        entry = self._handles.get(key) if key is not None else None
        if entry is None:
            self._resolve(key, grid, args, options)
            entry = self._handles.get(key) if key is not None else None
            if entry is not None and memo is not None:
                self._remember(memo, entry)
            return
        if memo is not None:
            self._remember(memo, entry)
        self._run(entry, grid, args, device_index, options)

    def _remember(self, memo, entry) -> None:
        if len(self._memo) >= MEMO_LIMIT:
            self._memo.clear()
        self._memo[memo] = entry

    def _run(self, entry, grid, args, device_index, options) -> None:
        run, function, packed, kernel = entry
        knobs = self._knobs.runtime
        enter, leave = knobs.launch_enter_hook, knobs.launch_exit_hook
        stream = self._stream_of(device_index)
        meta = kernel.launch_metadata(grid, stream, *args) if enter is not None else None
        try:
            run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1, stream, function, packed,
                meta, enter, leave, *args)
        except TypeError as exc:
            # the launcher's calling convention is not the one this module knows (a Triton outside
            # 3.6-3.8): argument parsing fails before any launch; Triton's own dispatch from now on
            logger.warning("sglang-fa4: cached launch of Triton kernel %s failed (%s); using Triton's dispatch",
                           self.name, exc)
            self._handles.clear()
            self._memo.clear()
            self._jit_only = True
            self.jit()[grid](*args, **options)

    def _resolve(self, key, grid, args, options) -> None:
        """Triton's own dispatch (compiles or loads, and launches); keep the compiled kernel."""
        jit = self.jit()
        import torch

        capturing = torch.cuda.is_current_stream_capturing()
        known = key in self._handles
        t0 = time.perf_counter()
        with _HitListener() as hit:
            kernel = jit[grid](*args, **options)
        seconds = time.perf_counter() - t0
        if hasattr(kernel, "result"):  # Triton's async compile mode
            kernel = kernel.result()
        if key is not None and not known and kernel is not None:
            if self._stream_of is None:
                from triton import knobs
                from triton.runtime.driver import driver

                self._knobs = knobs
                self._stream_of = driver.active.get_current_stream
            self._handles[key] = (kernel.run, kernel.function, kernel.packed_metadata, kernel)
        elif hit.cache_hit is None:
            return  # an i64 call Triton had already compiled: nothing resolved
        compile_events_registry.record("triton", CompileEvent(self.name, key, seconds, hit.cache_hit, capturing))

    def resolved(self) -> int:
        return len(self._handles)

    def clear(self) -> None:
        """Forget the handles (tests; the next launch of each key resolves again)."""
        self._handles.clear()
        self._memo.clear()
        self._jit_only = None
