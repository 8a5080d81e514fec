"""Startup wiring of the SM90 FP8 forward (issue #15 item 1), on CPU with a fake compiler: every
FP8 variant is counted by the JIT monitor and warmable at startup.  ``launch.compile_variant`` is
replaced (no cutlass, no GPU); everything around it -- the compile cache, its events and
listeners, the warmup bookkeeping, the monitor -- is the real code."""

from __future__ import annotations

import logging

import pytest

from sglang_fa4.kernels.fp8_sm90 import launch
from sglang_fa4.kernels import compile_events
from sglang_fa4.kernels.fp8_sm90.layout import Fp8Variant
from sglang_fa4.startup import jit_monitor, warmup
from sglang_fa4.kernels.settings import RoutingSettings
from sglang_fa4.startup.variants import WarmItem, vit_warmup_list
from test_warmup import VLM, MiMoTower, fake_fa4, internvl, qwen3_vl, qwen25_vl  # noqa: F401 (fixture)

D128 = Fp8Variant(128, False, False)
D64_CAUSAL = Fp8Variant(64, True, False)
D96_LOCAL = Fp8Variant(96, False, True)


def warm_fp8(variants):
    """The FP8 forward's variants through the one warmup loop (the registry's fp8_forward family)."""
    return warmup.warm([WarmItem("fp8_forward", v) for v in variants], "cpu")


@pytest.fixture
def fake_fp8(monkeypatch, fake_fa4):  # noqa: F811 - pytest fixture from test_warmup
    """An empty FP8 compile cache whose compiles are recorded instead of run."""
    compiled = []

    def fake_compile(variant, options="--enable-tvm-ffi", config=None):
        compiled.append(variant)
        return lambda *args: None

    monkeypatch.setattr(launch, "compile_variant", fake_compile)
    monkeypatch.setattr(launch, "_compiled", {})
    monkeypatch.setattr(compile_events, "_events", [])
    monkeypatch.setattr(compile_events, "_listeners", [])
    return compiled


def test_warm_fp8_variants_compiles_each_once_with_a_log_line(fake_fp8, caplog):
    with caplog.at_level(logging.INFO, logger="sglang_fa4"):
        report = warm_fp8([D128, D64_CAUSAL, D96_LOCAL])
    assert fake_fp8 == [D128, D64_CAUSAL, D96_LOCAL]
    assert report.resolved == report.compiled == 3 and not report.failures
    assert report.variants("fp8_forward") == [D128, D64_CAUSAL, D96_LOCAL] and len(report.seconds) == 3
    assert report.family("fp8_forward") == {"variants": 3, "resolved": 3, "compiled": 3, "failed": 0}
    lines = [r.getMessage() for r in caplog.records if "warmup [" in r.getMessage()]
    assert lines[0].startswith("sglang-fa4 warmup [1/3] fp8_forward fp8 e4m3 d=128 full: ")
    assert lines[0].endswith(" s (compiled)") and "d=64 causal" in lines[1] and "d=96 local" in lines[2]
    assert jit_monitor.warmup_finished()
    # warmed variants are in the launch path's cache: a call would not compile again
    assert launch.compiled_kernel(D128) is launch._compiled[D128] and len(fake_fp8) == 3
    again = warm_fp8([D128])
    assert again.compiled == 0 and len(fake_fp8) == 3
    assert again.as_dict()["variants"][0]["head_dim"] == 128


def test_warmup_compiles_are_not_flagged_later_ones_warn(fake_fp8, caplog):
    warmup.warm([], "cpu")
    assert jit_monitor.arm_jit_monitor()
    with caplog.at_level(logging.WARNING, logger="sglang_fa4"):
        warm_fp8([D128])  # startup work, even after the FA4 warmup
        assert jit_monitor.compiles_after_warmup() == 0
        launch.compiled_kernel(D128)  # warmed: no compile
        assert jit_monitor.compiles_after_warmup() == 0
        launch.compiled_kernel(D64_CAUSAL)  # not warmed: a compile on the request path
    assert jit_monitor.compiles_after_warmup() == 1
    warned = [r.getMessage() for r in caplog.records if "after the startup warmup" in r.getMessage()]
    assert len(warned) == 1 and "FP8" in warned[0] and "'head_dim': 64" in warned[0] and "'causal': True" in warned[0]
    assert jit_monitor.arm_jit_monitor() and compile_events.listener_count() == 1  # idempotent, one listener


def test_post_warmup_fp8_compile_raises(fake_fp8, monkeypatch):
    monkeypatch.setenv("SGLANG_FA4_JIT_MONITOR", "raise")
    warm_fp8([D128])
    jit_monitor.arm_jit_monitor()
    with pytest.raises(jit_monitor.FA4CompileAfterWarmup, match="FP8 .*'head_dim': 96"):
        launch.compiled_kernel(D96_LOCAL)
    assert jit_monitor.compiles_after_warmup() == 1


def test_monitor_off_ignores_fp8(fake_fp8, monkeypatch):
    monkeypatch.setenv("SGLANG_FA4_JIT_MONITOR", "off")
    warm_fp8([])
    assert jit_monitor.arm_jit_monitor() is False and compile_events.listener_count() == 0
    launch.compiled_kernel(D128)
    assert jit_monitor.compiles_after_warmup() == 0


def test_reset_state_removes_the_monitors_listener(fake_fp8):
    jit_monitor.arm_jit_monitor()
    assert compile_events.listener_count() == 1
    jit_monitor.reset_state()
    assert compile_events.listener_count() == 0


def test_fp8_warmup_failure_is_reported_not_raised(fake_fp8, monkeypatch):
    def broken(variant, options="", config=None):
        raise RuntimeError("no cutlass here")

    monkeypatch.setattr(launch, "compile_variant", broken)
    report = warm_fp8([D128])
    assert [(i.variant, m) for i, m in report.failures] == [(D128, "RuntimeError: no cutlass here")]
    assert report.compiled == 0 and report.family("fp8_forward")["failed"] == 1


def test_every_fp8_shape_pads_head_dims_and_skips_sinks():
    """warm_model(fp8=True)'s FP8 forward variants: every shape the forward can take, padded."""
    def kernels(model):
        return [i.variant for i in vit_warmup_list(model, 90, RoutingSettings(), on_gpu=False, fp8=True)
                if i.family == "fp8_forward"]

    assert kernels(qwen25_vl()) == [Fp8Variant(96, False, False)]  # d=80 -> 96
    assert kernels(qwen3_vl()) == [Fp8Variant(96, False, False)]  # d=72 -> 96
    assert kernels(internvl()) == [Fp8Variant(64, False, False)]
    # MiMo-VL: sink blocks stay on FA4; its full block (no sinks) is plain full attention
    assert kernels(VLM(MiMoTower())) == [Fp8Variant(64, False, False)]
    assert kernels(internvl(backend="triton_attn")) == []
    assert kernels(VLM(MiMoTower(fullatt=()))) == []  # every block has sinks


def test_warm_model_fp8_warms_the_models_fp8_variants_then_arms(fake_fp8, monkeypatch):
    from sglang_fa4.kernels.fa4 import b36 as fa4_b36

    monkeypatch.setattr(fa4_b36, "fa4_available", lambda: True)
    report = warmup.warm_model(qwen25_vl(), fp8=True)
    assert fake_fp8 == [Fp8Variant(96, False, False)] and report.family("fp8_forward")["compiled"] == 1
    assert report.as_dict()["by_family"]["fp8_forward"]["compiled"] == 1
    assert jit_monitor.armed() and compile_events.listener_count() == 1
    assert warmup.warm_model(qwen3_vl()).variants("fp8_forward") == []  # default: no FP8 work
