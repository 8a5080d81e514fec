"""The one compile-event registry (sglang_fa4.kernels.compile_events): every kernel source records
into it, counts and events are read per source from it (the one compile counter), listeners filter
by source, and the JIT monitor is one listener on it."""

from __future__ import annotations

import pytest

from sglang_fa4.kernels import compile_events, triton_handles
from sglang_fa4.kernels.compile_events import KernelFamily


@pytest.fixture(autouse=True)
def empty_registry(monkeypatch):
    monkeypatch.setattr(compile_events, "_events", [])
    monkeypatch.setattr(compile_events, "_listeners", [])


def test_sources_read_their_part_and_listeners_filter():
    seen_all, seen_fp8 = [], []
    compile_events.add_listener(lambda s, e: seen_all.append(s))
    remove = compile_events.add_listener(lambda s, e: seen_fp8.append(e), "fp8_forward")
    fp8_event = {"variant": {"head_dim": 64}, "seconds": 0.1, "capturing": False}
    triton_event = triton_handles.CompileEvent("k", (1,), 0.2, False, False)
    compile_events.record("fp8_forward", fp8_event)
    compile_events.record("triton", triton_event)
    compile_events.record("fp8_quantize", {"kernel": "quantize"})
    assert compile_events.events("fp8_forward") == [fp8_event] and compile_events.count("fp8_forward") == 1
    assert compile_events.events("triton") == [triton_event] and compile_events.count("triton") == 1
    assert compile_events.events("fp8_quantize") == [{"kernel": "quantize"}] and compile_events.count("fa4") == 0
    assert compile_events.events() == [("fp8_forward", fp8_event), ("triton", triton_event),
                                       ("fp8_quantize", {"kernel": "quantize"})]
    assert seen_all == ["fp8_forward", "triton", "fp8_quantize"] and seen_fp8 == [fp8_event]
    remove()
    compile_events.record("fp8_forward", fp8_event)
    assert seen_fp8 == [fp8_event] and compile_events.count() == 4 and compile_events.count("fp8_forward") == 2


def test_an_unknown_source_is_refused():
    with pytest.raises(ValueError, match="none of"):
        compile_events.record("fa5", {})
    assert compile_events.count() == 0
    with pytest.raises(ValueError, match="kernel family 'x': source 'fa5' is none of"):
        KernelFamily("x", "fa5", lambda variant, device: "")
    assert KernelFamily("x", "triton", lambda variant, device: "").source == "triton"


def test_the_monitor_is_one_listener_for_every_source(monkeypatch, caplog):
    import logging

    from sglang_fa4.startup import jit_monitor

    monkeypatch.setenv("SGLANG_FA4_JIT_MONITOR", "warn")
    jit_monitor.reset_state()
    try:
        with jit_monitor.expected_compiles(finishes_warmup=True):
            pass
        assert jit_monitor.arm_jit_monitor() and jit_monitor.arm_jit_monitor()
        assert compile_events.listener_count() == 1
        with caplog.at_level(logging.WARNING, logger="sglang_fa4"):
            compile_events.record("fp8_forward", {"variant": {"head_dim": 96}, "seconds": 1.0, "capturing": False})
            compile_events.record("triton", triton_handles.CompileEvent("gather", (2,), 0.3, True, True))
            compile_events.record("fp8_quantize", {"kernel": "quantize", "head_dim": 80, "dtype": "bfloat16",
                                                   "seconds": 0.1, "capturing": False})
        assert jit_monitor.compiles_after_warmup() == 3
        lines = [r.getMessage() for r in caplog.records if "after the startup warmup" in r.getMessage()]
        assert len(lines) == 3 and "FP8 attention forward" in lines[0] and "during CUDA-graph capture" in lines[1]
    finally:
        jit_monitor.reset_state()
    assert compile_events.listener_count() == 0
