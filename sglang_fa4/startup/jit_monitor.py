"""After the startup warmup, flag any FA4 configuration resolved in the process (a compile on the
request path or inside a graph capture): ``SGLANG_FA4_JIT_MONITOR`` = off / warn / raise.  The SM90
FP8 forward's variants (``kernels/fp8_sm90/launch.py``, compiled once per head dim x causal/local)
are counted and flagged the same way, and so are our Triton kernels (short-window attention, ViT
rotary: ``kernels/triton_handles.py``, one event per specialization resolved).

Startup work that may compile (the warmup itself, the ViT budget-graph capture) runs inside
:func:`expected_compiles`, so its compiles are not counted.
"""

from __future__ import annotations

import logging
import threading
from contextlib import contextmanager
from typing import Any, Iterator, Optional

from sglang_fa4.environ import envs

logger = logging.getLogger("sglang_fa4")

_state_lock = threading.Lock()
_expected = 0  # startup phases in progress (their compiles are expected)
_finished = False  # a warmup completed in this process
_after = 0  # configurations resolved after a finished warmup
_monitor: Optional[tuple[Any, Any]] = None  # (kernel cache, remover)
_fp8_remover: Optional[Any] = None  # removes the listener on the FP8 forward's compile cache
_triton_remover: Optional[Any] = None  # removes the listener on our Triton kernels' handles


class FA4CompileAfterWarmup(RuntimeError):
    """SGLANG_FA4_JIT_MONITOR=raise: an FA4 configuration was resolved after the warmup."""


@contextmanager
def expected_compiles(*, finishes_warmup: bool = False) -> Iterator[None]:
    """FA4 compiles inside this block are startup work. ``finishes_warmup``: when it ends, the
    warmup counts as done (later compiles are flagged)."""
    global _expected, _finished
    with _state_lock:
        _expected += 1
    try:
        yield
    finally:
        with _state_lock:
            _expected -= 1
            if finishes_warmup:
                _finished = True


def in_startup_phase() -> bool:
    return _expected > 0


def compiles_after_warmup() -> int:
    """FA4 configurations resolved in this process after a warmup finished."""
    return _after


def warmup_finished() -> bool:
    return _finished


def _count_after_warmup() -> Optional[int]:
    """Count one compile; its number after the warmup, or None when it is startup work."""
    global _after
    with _state_lock:
        if _expected or not _finished:
            return None
        _after += 1
        return _after


def _flag(message: str) -> None:
    mode = envs.SGLANG_FA4_JIT_MONITOR.get()
    if mode == "off":
        return
    if mode == "raise":
        raise FA4CompileAfterWarmup(message)
    logger.warning(message)


def _on_compile(event) -> None:
    """Listener on FA4's kernel cache (``fa4_kernel_cache.CompileEvent``)."""
    count = _count_after_warmup()
    if count is None:
        return
    what = "compiled" if event.fa4_compiled else "loaded"
    capture = " during CUDA-graph capture" if event.during_capture else ""
    _flag(
        f"sglang-fa4: FA4 {what} a kernel variant after the startup warmup{capture} "
        f"({event.seconds:.2f} s, #{count} after warmup): {event.config}"
    )


def _on_fp8_compile(event: dict) -> None:
    """Listener on the SM90 FP8 forward's compile cache (``launch.compiled_kernel``'s event dict:
    variant, seconds, capturing)."""
    count = _count_after_warmup()
    if count is None:
        return
    capture = " during CUDA-graph capture" if event.get("capturing") else ""
    _flag(
        f"sglang-fa4: the SM90 FP8 attention forward compiled a kernel variant after the startup "
        f"warmup{capture} ({event['seconds']:.2f} s, #{count} after warmup): {event['variant']}"
    )


def _on_quantize_compile(event: dict) -> None:
    """Listener on the FP8 ViT path's Triton quantize launches (``quantize_chunked``: kernel,
    head_dim, dtype, seconds, capturing)."""
    count = _count_after_warmup()
    if count is None:
        return
    capture = " during CUDA-graph capture" if event.get("capturing") else ""
    _flag(
        f"sglang-fa4: the FP8 q/k/v quantize (Triton) compiled a kernel after the startup "
        f"warmup{capture} ({event['seconds']:.2f} s, #{count} after warmup): {event['kernel']} "
        f"d={event['head_dim']} {event['dtype']}"
    )


def _on_triton_compile(event) -> None:
    """Listener on our Triton kernels' handles (``triton_handles.CompileEvent``)."""
    count = _count_after_warmup()
    if count is None:
        return
    capture = " during CUDA-graph capture" if event.during_capture else ""
    _flag(
        f"sglang-fa4: Triton kernel {event.kernel} {event.how} a specialization after the startup "
        f"warmup{capture} ({event.seconds:.2f} s, #{count} after warmup): {event.key}"
    )


def arm_triton_monitor() -> None:
    """Listen on our Triton kernels' handles (idempotent; :func:`arm_jit_monitor` calls it)."""
    global _triton_remover
    from sglang_fa4.kernels import triton_handles

    with _state_lock:
        if _triton_remover is None:
            _triton_remover = triton_handles.add_compile_listener(_on_triton_compile)


def arm_fp8_monitor() -> None:
    """Listen on the FP8 forward's compile cache and the quantize kernels' compiles (idempotent;
    :func:`arm_jit_monitor` calls it). Imports torch but not cutlass."""
    global _fp8_remover
    from sglang_fa4.kernels.fp8_sm90 import launch as fp8_launch
    from sglang_fa4.kernels.fp8_sm90 import quantize_chunked

    with _state_lock:
        if _fp8_remover is not None:
            return
        removers = (fp8_launch.add_compile_listener(_on_fp8_compile),
                    quantize_chunked.add_compile_listener(_on_quantize_compile))
        _fp8_remover = lambda: [remove() for remove in removers]  # noqa: E731


def arm_jit_monitor() -> bool:
    """Listen for FA4 configurations resolved, and FP8 forward variants compiled, after the warmup
    (idempotent; follows a replaced kernel cache). False when SGLANG_FA4_JIT_MONITOR=off."""
    global _monitor
    if envs.SGLANG_FA4_JIT_MONITOR.get() == "off":
        return False
    arm_fp8_monitor()
    arm_triton_monitor()
    from sglang_fa4.kernels import dispatch

    cache = dispatch.kernel_cache()
    with _state_lock:
        if _monitor is not None and _monitor[0] is cache:
            return True
        previous = _monitor
        _monitor = (cache, cache.add_compile_listener(_on_compile))
    if previous is not None:
        previous[1]()
    return True


def armed() -> bool:
    return _monitor is not None


def reset_state() -> None:
    """Forget warmup/monitor state (tests)."""
    global _finished, _after, _monitor, _expected, _fp8_remover, _triton_remover
    with _state_lock:
        if _monitor is not None:
            _monitor[1]()
        _monitor = None
        if _fp8_remover is not None:
            _fp8_remover()
        _fp8_remover = None
        if _triton_remover is not None:
            _triton_remover()
        _triton_remover = None
        _finished = False
        _after = 0
        _expected = 0
