"""Which Triton kernels the startup warmup compiles for a model (sglang_fa4/startup/triton_warmup.py):
the fused ViT rotary for every (head dim, heads, kv heads, dtype) of a rotary tower, the short-window
attention kernel only on SM90, only for windowed towers, only at its head dims, only with the route
on -- and a failing kernel reported without stopping the others. The kernels' own warm() calls are
recorded (no GPU)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from sglang_fa4.kernels.vit import short_windows as short_segments
from sglang_fa4.kernels.vit import short_window_kernel
from sglang_fa4.kernels.vit import rotary as vit_rotary
from sglang_fa4.startup import triton_warmup
from fake_vision_models import VLM, FakeVisionAttention, MiMoTower, QwenTower, internvl

CUDA = SimpleNamespace(type="cuda")


@pytest.fixture
def warmed(monkeypatch):
    calls = []
    monkeypatch.setattr(vit_rotary, "warm", lambda *s, device: calls.append(("vit_rotary", s)) or 1)
    monkeypatch.setattr(short_window_kernel, "warm", lambda *s, device: calls.append(("short_window_attention", s)) or 1)
    monkeypatch.setattr(short_segments, "route_max_seqlen", lambda: 64)
    return calls


def rotary(tower):
    tower.rotary_pos_emb = nn.Identity()  # Qwen2.5-VL / Qwen3-VL: the fused rotary runs in every block
    return tower


def qwen25(d=80, **kw):
    return VLM(rotary(QwenTower(d, fullatt=[3, 7], **kw)))


def kernels(report):
    return {name: [(r["head_dim"], r["heads"], r["kv_heads"], r["dtype"]) for r in report[name]]
            for name in ("vit_rotary", "short_window_attention")}


def test_windowed_rotary_tower_on_sm90_warms_both(warmed):
    report = triton_warmup.warm_triton(qwen25(), 90, CUDA)
    assert kernels(report) == {"vit_rotary": [(80, 16, 16, "bfloat16")],
                               "short_window_attention": [(80, 16, 16, "bfloat16")]}
    assert report["failures"] == [] and all(r["resolved"] == 1 for r in report["vit_rotary"])
    assert sorted(warmed) == [("short_window_attention", (80, 16, 16, "bfloat16")),
                              ("vit_rotary", (80, 16, 16, "bfloat16"))]


@pytest.mark.parametrize("arch", [80, 100, 103, 120])
def test_short_window_kernel_only_on_sm90(warmed, arch):
    assert kernels(triton_warmup.warm_triton(qwen25(), arch, CUDA)) == {
        "vit_rotary": [(80, 16, 16, "bfloat16")], "short_window_attention": []}


@pytest.mark.parametrize("d", short_segments.TRITON_HEAD_DIMS)
def test_short_window_kernel_at_each_of_its_head_dims(warmed, d):
    assert kernels(triton_warmup.warm_triton(qwen25(d), 90, CUDA))["short_window_attention"] == [(d, 16, 16, "bfloat16")]


def test_other_head_dims_stay_on_fa2(warmed):
    d = 96
    assert d not in short_segments.TRITON_HEAD_DIMS
    assert kernels(triton_warmup.warm_triton(qwen25(d), 90, CUDA)) == {
        "vit_rotary": [(d, 16, 16, "bfloat16")], "short_window_attention": []}


def test_route_off_or_no_windows_warms_no_short_window_kernel(warmed, monkeypatch):
    qwen3 = VLM(rotary(QwenTower(72)))  # full attention only: no fullatt_block_indexes
    assert kernels(triton_warmup.warm_triton(qwen3, 90, CUDA)) == {
        "vit_rotary": [(72, 16, 16, "bfloat16")], "short_window_attention": []}
    monkeypatch.setattr(short_segments, "route_max_seqlen", lambda: 0)
    assert kernels(triton_warmup.warm_triton(qwen25(), 90, CUDA))["short_window_attention"] == []


def test_no_rotary_tower_warms_no_rotary(warmed):
    assert kernels(triton_warmup.warm_triton(internvl(), 90, CUDA)) == {"vit_rotary": [], "short_window_attention": []}
    # MiMo-VL: windowed (fullatt_block_indexes) without rotary_pos_emb
    mimo = triton_warmup.warm_triton(VLM(MiMoTower(d=64)), 90, CUDA)
    assert kernels(mimo) == {"vit_rotary": [], "short_window_attention": [(64, 16, 16, "bfloat16")]}


def test_each_distinct_shape_once(warmed):
    tower = rotary(QwenTower(80, fullatt=[3, 7]))
    tower.blocks[1].attn = FakeVisionAttention(80, 16, kv_heads=8)
    tower.blocks[2].attn = FakeVisionAttention(80, 16, dtype=torch.float16)
    tower.blocks[4].attn = FakeVisionAttention(80, 8)
    got = kernels(triton_warmup.warm_triton(VLM(tower), 90, CUDA))
    shapes = [(80, 16, 16, "bfloat16"), (80, 16, 8, "bfloat16"), (80, 16, 16, "float16"), (80, 8, 8, "bfloat16")]
    assert got == {"vit_rotary": shapes, "short_window_attention": shapes}


def test_not_on_cuda_or_no_fa4_warms_nothing(warmed):
    empty = {"vit_rotary": [], "short_window_attention": [], "failures": []}
    assert triton_warmup.warm_triton(qwen25(), 90, torch.device("cpu")) == empty
    assert triton_warmup.warm_triton(qwen25(backend="triton_attn"), 90, CUDA) == empty
    assert warmed == []


def test_a_failing_kernel_is_reported_and_the_rest_still_warm(warmed, monkeypatch):
    def broken(*shape, device):
        raise RuntimeError("ptxas died")

    monkeypatch.setattr(vit_rotary, "warm", broken)
    report = triton_warmup.warm_triton(qwen25(), 90, CUDA)
    assert report["failures"] == [["vit_rotary", [80, 16, 16, "bfloat16"], "RuntimeError: ptxas died"]]
    assert kernels(report)["short_window_attention"] == [(80, 16, 16, "bfloat16")]
