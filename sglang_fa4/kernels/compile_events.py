"""The one registry of kernel compiles in this process, and the one compile counter.

Every source of compiled kernels reports each kernel it resolves (compiled, or loaded from a cache)
here: FA4's kernel cache (``"fa4"``, :class:`.fa4.config.CompileEvent`), the SM90 FP8 forward
(``"fp8_forward"``, ``fp8_sm90.launch``'s event dict), our Triton kernels' handles (``"triton"``,
:class:`.triton_handles.CompileEvent`) and the FP8 ViT quantize (``"fp8_quantize"``,
``vit.fp8_quantize_chunked``'s event dict).  The JIT monitor (``startup/jit_monitor.py``) listens
here, once, for all of them; :func:`count` and :func:`events` are what everyone else reads.

A :class:`KernelFamily` is how a kernel family tells the warmup registry
(:mod:`sglang_fa4.kernels.warmup`) what it compiles: its name, the source its resolves are counted
under, and how to warm one of its variants.  Pure Python, thread-safe.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
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


@dataclass(frozen=True)
class KernelFamily:
    """One family of our compiled kernels, as the warmup registry knows it."""

    #: the name startup asks for ("fa4", "fp8_forward", "fp8_paged_decode", ...)
    name: str
    #: the compile-event source its resolves are recorded under (one of SOURCES)
    source: str
    #: ``warm(variant, device) -> str``: compile (or load from a cache) what one variant of the
    #: family needs, with a small call on ``device`` where a launch is needed; says how it went
    warm: Callable[[Any, Any], str]

    def __post_init__(self):
        if self.source not in SOURCES:
            raise ValueError(f"kernel family {self.name!r}: source {self.source!r} is none of {SOURCES}")
