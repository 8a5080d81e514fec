"""After the startup warmup, flag any FA4 configuration resolved in the process (a compile on the
request path or inside a graph capture): ``SGLANG_FA4_JIT_MONITOR`` = off / warn / raise.  The SM90
FP8 forward's variants (``kernels/fp8_sm90/launch.py``, compiled once per head dim x causal/local)
are counted and flagged the same way, and so are our Triton kernels (short-window attention, ViT
rotary: ``kernels/triton_handles.py``, one event per specialization resolved) and the FP8 quantize.
All of them report to one registry, ``kernels/compile_events.py``; the monitor is one listener on it.

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
_remover: Optional[Any] = None  # removes the monitor's listener on the compile-event registry
#: the registry's sources being watched (arm_jit_monitor: all; the startup warmup arms the FP8 and
#: Triton ones even with the monitor off, for its own counts)
_watched: set = set()

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


_FORMATS = {"fa4": _on_compile, "fp8_forward": _on_fp8_compile, "triton": _on_triton_compile,
            "fp8_quantize": _on_quantize_compile}


def _on_event(source: str, event) -> None:
    """The monitor's one listener on the compile-event registry."""
    if source in _watched:
        _FORMATS[source](event)


def _watch(*sources: str) -> None:
    global _remover
    from sglang_fa4.kernels import compile_events

    with _state_lock:
        _watched.update(sources)
        if _remover is None:
            _remover = compile_events.add_listener(_on_event)


def arm_triton_monitor() -> None:
    """Watch our Triton kernels' compiles (idempotent; :func:`arm_jit_monitor` calls it)."""
    _watch("triton")


def arm_fp8_monitor() -> None:
    """Watch the FP8 forward's and the quantize kernels' compiles (idempotent; :func:`arm_jit_monitor`
    calls it). Imports nothing heavy."""
    _watch("fp8_forward", "fp8_quantize")


def arm_jit_monitor() -> bool:
    """Watch every source of the compile-event registry -- FA4 configurations, FP8 forward
    variants, Triton kernels, the FP8 quantize -- for compiles after the warmup (idempotent).
    False when SGLANG_FA4_JIT_MONITOR=off."""
    if envs.SGLANG_FA4_JIT_MONITOR.get() == "off":
        return False
    _watch("fa4", "fp8_forward", "fp8_quantize", "triton")
    return True


def armed() -> bool:
    return "fa4" in _watched


def reset_state() -> None:
    """Forget warmup/monitor state (tests)."""
    global _finished, _after, _expected, _remover
    with _state_lock:
        if _remover is not None:
            _remover()
        _remover = None
        _watched.clear()
        _finished = False
        _after = 0
        _expected = 0
