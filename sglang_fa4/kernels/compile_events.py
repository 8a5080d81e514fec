"""The one registry of kernel compiles in this process.

Every source of compiled kernels reports each kernel it resolves (compiled, or loaded from a cache)
here: FA4's kernel cache (``"fa4"``, :class:`.fa4_kernel_cache.CompileEvent`), the SM90 FP8
forward (``"fp8_forward"``, ``fp8_sm90.launch``'s event dict), our Triton kernels' handles
(``"triton"``, :class:`.triton_handles.CompileEvent`) and the FP8 q/k/v quantize (``"fp8_quantize"``,
``fp8_sm90.quantize_chunked``'s event dict).  The JIT monitor (``startup/jit_monitor.py``) listens
here, once, for all of them; each source's ``compile_events()`` / ``compile_count()`` read their
part of it.  Pure Python, thread-safe.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional

SOURCES = ("fa4", "fp8_forward", "triton", "fp8_quantize")

_lock = threading.Lock()
_events: list[tuple[str, Any]] = []
_listeners: list[tuple[Optional[str], Callable[[str, Any], None]]] = []


def record(source: str, event: Any) -> None:
    """``source`` resolved a kernel (``event``: the source's own record of it); tells the listeners."""
    if source not in SOURCES:
        raise ValueError(f"compile event source {source!r} is none of {SOURCES}")
    with _lock:
        _events.append((source, event))
        listeners = [cb for want, cb in _listeners if want in (None, source)]
    for callback in listeners:
        callback(source, event)


def add_listener(callback: Callable[[str, Any], None], source: Optional[str] = None) -> Callable[[], None]:
    """Call ``callback(source, event)`` on every later event (of ``source`` only, if given);
    returns the remover."""
    entry = (source, callback)
    with _lock:
        _listeners.append(entry)

    def remove() -> None:
        with _lock:
            if entry in _listeners:
                _listeners.remove(entry)

    return remove


def events(source: Optional[str] = None) -> list:
    """The events so far (of ``source``: its events; else (source, event) pairs), in order."""
    with _lock:
        return [e for s, e in _events if s == source] if source else list(_events)


def count(source: Optional[str] = None) -> int:
    with _lock:
        return sum(1 for s, _ in _events if source in (None, s))


def listener_count() -> int:
    with _lock:
        return len(_listeners)
