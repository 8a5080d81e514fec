"""SGLANG_FA4_VIT_ATTN_DTYPE (issue #16): the env var, the measured FP8-vs-bf16 table, the routing
of the fa4 ViT backend (FP8 only where the table says), the startup warmup of the FP8 path, and
the one-line fallback off SM90. CPU only: the FP8 path itself and FA4 are replaced by recorders."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sglang_fa4.environ import EnvValueError
from sglang_fa4.integration import vision_fa4
from sglang_fa4.kernels import compile_events, fa4, settings, vit
from sglang_fa4.kernels.fp8_sm90 import launch
from sglang_fa4.kernels.fp8_sm90.layout import Fp8Variant
from sglang_fa4.kernels.vit import attn_dtype as vit_attn_dtype
from sglang_fa4.startup import warmup
from sglang_fa4.startup.variants import enumerate_fp8_vit_shapes
from sglang_fa4.testing import cu_seqlens, offsets
from test_warmup import VLM, MiMoTower, fake_fa4, internvl, qwen3_vl, qwen25_vl  # noqa: F401,F811 (fixture)

ENV = "SGLANG_FA4_VIT_ATTN_DTYPE"
TABLE = {80: 4096, 72: 8192}


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    vit_attn_dtype.reset()
    vit_attn_dtype.set_min_segment_table(TABLE)
    settings.install(None)
    yield
    vit_attn_dtype.reset()
    settings.install(None)


def fp8_mode(monkeypatch, value="fp8"):
    """The variable set and the routing settings read again (as the plugin reads them at startup)."""
    monkeypatch.setenv(ENV, value)
    settings.reload()


# -- the env var ---------------------------------------------------------------------------------


def test_default_is_bf16_and_fp8_parses(monkeypatch):
    assert settings.settings().vit_attn_dtype == "bf16" and not settings.settings().vit_fp8
    fp8_mode(monkeypatch)
    assert settings.settings().vit_attn_dtype == "fp8" and settings.settings().vit_fp8


@pytest.mark.parametrize("bad", ["FP8", "e4m3", "fp16", "1"])
def test_bad_value_is_a_clear_error(monkeypatch, bad):
    with pytest.raises(EnvValueError, match=f"{ENV}.*{bad}|{bad}.*{ENV}") as info:
        fp8_mode(monkeypatch, bad)
    assert "'bf16'" in str(info.value) and "'fp8'" in str(info.value)


# -- the table -----------------------------------------------------------------------------------


def test_committed_table_covers_the_qwen_head_dims_only():
    assert set(vit_attn_dtype.FP8_MIN_SEGMENT) <= {72, 80}
    assert all(v > 64 for v in vit_attn_dtype.FP8_MIN_SEGMENT.values())  # windows never FP8


def test_equal_segments_switch_exactly_at_the_measured_length():
    for n in (1, 4, 32):
        assert not vit_attn_dtype.fp8_faster(80, 4095, n * 4095, n)
        assert vit_attn_dtype.fp8_faster(80, 4096, n * 4096, n)
    assert vit_attn_dtype.fp8_faster(72, 8192, 8192, 1) and not vit_attn_dtype.fp8_faster(72, 8191, 8191, 1)


def test_uneven_layouts_use_the_work_lower_bound():
    # one 4096-token image next to 4096 one-token segments: sum(len^2) ~ 4096^2 + 4096 < 4096 * 8192
    assert not vit_attn_dtype.fp8_faster(80, 4096, 8192, 4097)
    # next to one equally long image it is exactly two segments of L*
    assert vit_attn_dtype.fp8_faster(80, 4096, 8192, 2)
    assert vit_attn_dtype.work_lower_bound(10, 30, 3) == 100 + 200  # 10^2 + 20^2 / 2


@pytest.mark.parametrize("head_dim,max_seqlen", [(64, 10**6), (128, 10**6), (96, 10**6), (80, None), (80, 64)])
def test_unmeasured_dims_windows_and_unknown_lengths_stay_bf16(head_dim, max_seqlen):
    assert not vit_attn_dtype.fp8_faster(head_dim, max_seqlen, 10**6, 1)


def test_set_table_checks_entries_and_restores():
    with pytest.raises(ValueError, match="positive int"):
        vit_attn_dtype.set_min_segment_table({80: 0})
    vit_attn_dtype.set_min_segment_table(None)
    assert vit_attn_dtype.min_segment_table() == vit_attn_dtype.FP8_MIN_SEGMENT


# -- routing through the fa4 ViT backend and the ViT form's entry point (varlen) -----------------


class Calls(list):
    arch = 90


class FakeCache:
    """The process's FA4 kernel cache: records the bf16 FA4 calls and each architecture query."""

    def __init__(self, calls):
        self.calls = calls

    @property
    def arch(self):
        self.calls.append("arch")
        return self.calls.arch

    def __call__(self, q, k, v, cu_seqlens, max_seqlen, softmax_scale, window_size, sinks, out):
        self.calls.append(("bf16", max_seqlen, window_size))
        return q


@pytest.fixture
def recorders(monkeypatch):
    calls = Calls()
    monkeypatch.setattr(vit_attn_dtype, "on_cuda", lambda q: True)
    monkeypatch.setattr(vit, "should_route", lambda *a: False)
    previous = fa4.install_kernel_cache(FakeCache(calls))
    monkeypatch.setattr(vit, "fp8_attention", lambda q, k, v, c, m, scale=None: calls.append(("fp8", m, scale)) or q)
    yield calls
    fa4.install_kernel_cache(previous)


def forward(lens, d=80, dtype=torch.bfloat16, **kw):
    q = torch.randn(sum(lens), 2, d).to(dtype)
    return vision_fa4.vision_fa4_forward(q, q, q, [cu_seqlens(lens), max(lens)], 1, sum(lens), softmax_scale=0.1, **kw)


def test_bf16_mode_never_takes_the_fp8_path(recorders):
    forward([8192])
    assert recorders == [("bf16", 8192, (None, None))]


def test_fp8_mode_routes_only_where_the_table_says(monkeypatch, recorders):
    fp8_mode(monkeypatch)
    forward([8192])  # long full-attention segment, d80: FP8
    forward([1024, 1024])  # short: bf16
    forward([64] * 20)  # Qwen2.5-VL windows: bf16 (short-window route)
    forward([8192], d=64)  # d64: not in the table
    forward([8192], dtype=torch.float32)
    forward([8192], window_size=(64, 64))
    forward([8192], s_aux=torch.zeros(2))
    assert recorders == ["arch", ("fp8", 8192, 0.1), ("bf16", 1024, (None, None)), ("bf16", 64, (None, None)),
                         ("bf16", 8192, (None, None)), ("bf16", 8192, (None, None)), ("bf16", 8192, (64, 64)),
                         ("bf16", 8192, (None, None))]


def test_the_mode_is_read_once_not_per_call(monkeypatch, recorders):
    forward([8192])  # the settings read on first use: bf16
    monkeypatch.setenv(ENV, "fp8")
    forward([8192])  # not read again per call
    assert recorders == [("bf16", 8192, (None, None))] * 2
    settings.reload()
    forward([8192])
    assert recorders[-1] == ("fp8", 8192, 0.1)


@pytest.mark.parametrize("arch", [100, 103, 120])
def test_off_sm90_one_log_line_and_bf16(monkeypatch, recorders, caplog, arch):
    fp8_mode(monkeypatch)
    recorders.arch = arch
    with caplog.at_level(logging.WARNING, logger="sglang_fa4"):
        forward([8192])
        forward([16384])
    assert [c for c in recorders if c != "arch"] == [("bf16", 8192, (None, None)), ("bf16", 16384, (None, None))]
    lines = [r.getMessage() for r in caplog.records if ENV in r.getMessage()]
    assert len(lines) == 1 and f"sm_{arch}" in lines[0] and "stays bf16" in lines[0]
    if arch in (100, 103):
        assert "_flash_attn_fwd" in lines[0]


# -- warmup --------------------------------------------------------------------------------------


@pytest.fixture
def fake_fp8(monkeypatch, fake_fa4):  # noqa: F811 - pytest fixture from test_warmup
    compiled = []
    monkeypatch.setattr(launch, "compile_variant", lambda v, options="", config=None: compiled.append(v))
    monkeypatch.setattr(launch, "_compiled", {})
    monkeypatch.setattr(compile_events, "_events", [])
    monkeypatch.setattr(compile_events, "_listeners", [])
    monkeypatch.setattr("sglang_fa4.kernels.fa4.b36.fa4_available", lambda: True)
    return compiled


def test_fp8_shapes_follow_the_table():
    assert enumerate_fp8_vit_shapes(qwen25_vl(), TABLE) == [vit.VitShape(80, 16, 16, "bfloat16")]
    assert enumerate_fp8_vit_shapes(qwen3_vl(), TABLE)[0].fp8_kernel == Fp8Variant(96, False, False)
    assert enumerate_fp8_vit_shapes(qwen3_vl(), {80: 4096}) == []  # d72 never routed: nothing to warm
    assert enumerate_fp8_vit_shapes(internvl(), TABLE) == []  # d64
    assert enumerate_fp8_vit_shapes(VLM(MiMoTower()), {64: 100}) == [vit.VitShape(64, 16, 16, "bfloat16")]
    assert enumerate_fp8_vit_shapes(internvl(backend="triton_attn"), {64: 100}) == []


def test_warm_model_warms_the_fp8_path_when_the_env_asks(monkeypatch, fake_fp8):
    assert warmup.warm_model(qwen25_vl()).variants("fp8_forward") == []  # bf16: no FP8 work
    fp8_mode(monkeypatch)
    report = warmup.warm_model(qwen25_vl())
    assert fake_fp8 == [Fp8Variant(96, False, False)] and report.family("fp8_forward")["compiled"] == 1
    assert [v["head_dim"] for v in report.as_dict()["variants"] if v["family"] == "fp8_forward"] == [96]
    assert report.variants("fp8_vit") == []  # the quantize call needs a GPU: not on this CPU


def test_warm_model_off_sm90_logs_and_warms_nothing(monkeypatch, fake_fp8, caplog):
    fp8_mode(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="sglang_fa4"):
        report = warmup.warm_model(qwen25_vl(), arch=100)
    assert report.variants("fp8_forward") == [] and fake_fp8 == []
    assert sum(ENV in r.getMessage() for r in caplog.records) == 1


def test_chunked_quantize_equals_the_per_sequence_kernel_bitwise():
    """Triton's CPU interpreter: the token-chunked two-pass kernel (one linear chunk list over all
    sequences) gives exactly the per-sequence kernel's E4M3 q/k, V^T and descales (multi-chunk
    sequences, an empty one, k/v rows past cu_seqlens[-1], GQA, d72/d80 padded to 96, a ViT budget
    graph's layout with trailing empty slots and max_seqlen above every segment, a leading empty
    segment), into outputs poisoned with E4M3 NaN / NaN descales first: every byte rewritten."""
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(root)}
    script = root / "tests" / "sglang_scripts" / "vit_fp8_quantize_chunked_interpreted.py"
    p = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr[-3000:]


@pytest.mark.parametrize("lens,max_seqlen", [([42196] + [0] * 69, 42196), ([0, 700], 700), ([64] * 660, 64),
                                             ([1000, 300, 4, 6000, 17] + [0] * 65, 8192), ([0], 0)])
def test_chunk_list_bounds_the_quantize_grid_by_tokens_not_slots(lens, max_seqlen):
    """The quantize grid (per tensor and kv head) holds every chunk of the linear list (the Python
    twin of the kernels' _locate), each sequence's chunks consecutive, and grows with tokens +
    sequences: a 4K picture's budget graph (70 slots) launched 70 x 165 programs per pass and
    head before, now 305."""
    from sglang_fa4.kernels.vit import fp8_quantize_chunked as qc

    c = offsets(lens)
    grid = qc.chunk_grid(max_seqlen, c[-1], len(lens))
    seen = [qc.locate(c, i) for i in range(grid)]
    owned = [(b, ch) for b, ch, _first, _n in seen if b < len(lens)]
    assert owned == [(b, ch) for b, n in enumerate(lens) for ch in range(qc.chunks_of(n))]
    assert all(first + ch == i for i, (b, ch, first, _n) in enumerate(seen) if b < len(lens))
    assert grid <= -(-c[-1] // qc.CHUNK) + 2 * len(lens)
    if lens[0] == 42196:
        assert grid == 165 + 2 * 70


def test_chunked_quantize_rejects_a_tensor_max_seqlen():
    from sglang_fa4.kernels.vit.fp8_quantize_chunked import quantize_qkv_chunked

    q = torch.randn(8, 2, 80).to(torch.bfloat16)
    with pytest.raises(TypeError, match="max_seqlen must be a non-negative Python int"):
        quantize_qkv_chunked(q, q, q, cu_seqlens([8]), None, torch.tensor(8))


def test_a_quantize_compile_after_the_warmup_is_flagged(monkeypatch, fake_fp8, caplog):
    from sglang_fa4.kernels.vit import fp8_quantize_chunked as quantize_chunked
    from sglang_fa4.startup import jit_monitor

    monkeypatch.setattr(quantize_chunked, "_seen", {})
    monkeypatch.setattr(compile_events, "_events", [])
    monkeypatch.setattr(compile_events, "_listeners", [])
    kernel = object()
    with jit_monitor.expected_compiles(finishes_warmup=True):
        quantize_chunked._note_launch(kernel, "quantize", 80, torch.bfloat16, 0.0)  # startup work
    jit_monitor.arm_jit_monitor()
    quantize_chunked._note_launch(kernel, "quantize", 80, torch.bfloat16, 0.0)  # known: no event
    assert jit_monitor.compiles_after_warmup() == 0 and len(compile_events.events("fp8_quantize")) == 1
    with caplog.at_level(logging.WARNING, logger="sglang_fa4"):
        quantize_chunked._note_launch(object(), "quantize amax", 72, torch.bfloat16, 0.0)  # a new one
    assert jit_monitor.compiles_after_warmup() == 1
    assert any("quantize (Triton) compiled" in r.getMessage() and "d=72" in r.getMessage() for r in caplog.records)


def test_quantize_kernels_specialize_on_nothing_that_varies_per_layout():
    """A Triton specialization (an int's value 1 / divisibility by 16, a pointer's 16-byte
    alignment) not seen at the warmup compiles on the request path: every int argument and the
    cu_seqlens pointers (views at any int32 offset: seen on the H200 with Qwen2.5-VL's split host
    layouts) are exempt; only q/k/v/outputs keep their alignment (vectorized access)."""
    from sglang_fa4.kernels.vit import fp8_quantize_chunked as qc

    for fn in (qc._amax_pass, qc._quant_pass):
        specialized = {p.name for p in fn.params if not p.do_not_specialize and not p.is_constexpr}
        assert specialized <= {"q", "k", "v", "q8", "k8", "vt", "desc", "part"}, specialized


def test_explicit_fp8_warmup_covers_every_fp8_shape_the_table_does_not(monkeypatch, fake_fp8):
    vit_attn_dtype.set_min_segment_table({})  # nothing routed: the env-driven warmup has no FP8 work
    fp8_mode(monkeypatch)
    assert warmup.warm_model(qwen3_vl()).variants("fp8_forward") == []
    report = warmup.warm_model(qwen3_vl(), fp8=True)  # explicit: every FP8-capable shape
    assert fake_fp8 == [Fp8Variant(96, False, False)] and report.family("fp8_forward")["compiled"] == 1
