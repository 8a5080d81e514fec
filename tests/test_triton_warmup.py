"""Which Triton kernels the startup warmup compiles for a model (``startup/variants.triton_shapes``,
run by the one warmup loop through the registry's ``vit_rotary`` / ``vit_short_window`` families):
the fused ViT rotary for every (head dim, heads, kv heads, dtype) of a rotary tower, the short-window
attention kernel only on SM90, only for windowed towers, only at its head dims, only with the route
on -- and a failing kernel reported without stopping the others. The kernels' own warm() calls are
recorded (no GPU)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from sglang_fa4.kernels.settings import RoutingSettings
from sglang_fa4.kernels.vit import TRITON_HEAD_DIMS
from sglang_fa4.kernels.vit import rotary as vit_rotary
from sglang_fa4.kernels.vit import short_window_kernel
from sglang_fa4.startup import variants, warmup
from fake_vision_models import VLM, FakeVisionAttention, MiMoTower, QwenTower, internvl

CUDA = SimpleNamespace(type="cuda")
ROUTE_ON = RoutingSettings(short_route_max_seqlen=64)


@pytest.fixture
def warmed(monkeypatch):
    calls = []
    monkeypatch.setattr(vit_rotary, "warm", lambda *s, device: calls.append(("vit_rotary", s)) or 1)
    monkeypatch.setattr(short_window_kernel, "warm", lambda *s, device: calls.append(("vit_short_window", s)) or 1)
    return calls


def rotary(tower):
    tower.rotary_pos_emb = nn.Identity()  # Qwen2.5-VL / Qwen3-VL: the fused rotary runs in every block
    return tower


def qwen25(d=80, **kw):
    return VLM(rotary(QwenTower(d, fullatt=[3, 7], **kw)))


def kernels(model, arch=90, settings=ROUTE_ON) -> dict:
    items = variants.triton_shapes(model, arch, settings)
    return {name: [tuple(i.variant) for i in items if i.family == name] for name in ("vit_rotary", "vit_short_window")}


def test_windowed_rotary_tower_on_sm90_warms_both(warmed):
    assert kernels(qwen25()) == {"vit_rotary": [(80, 16, 16, "bfloat16")], "vit_short_window": [(80, 16, 16, "bfloat16")]}
    report = warmup.warm(variants.triton_shapes(qwen25(), 90, ROUTE_ON), CUDA)
    assert report.failures == [] and report.hows == ["1 resolved", "1 resolved"]
    assert sorted(warmed) == [("vit_rotary", (80, 16, 16, "bfloat16")), ("vit_short_window", (80, 16, 16, "bfloat16"))]


@pytest.mark.parametrize("arch", [80, 100, 103, 120])
def test_short_window_kernel_only_on_sm90(arch):
    assert kernels(qwen25(), arch) == {"vit_rotary": [(80, 16, 16, "bfloat16")], "vit_short_window": []}


@pytest.mark.parametrize("d", TRITON_HEAD_DIMS)
def test_short_window_kernel_at_each_of_its_head_dims(d):
    assert kernels(qwen25(d))["vit_short_window"] == [(d, 16, 16, "bfloat16")]


def test_other_head_dims_stay_on_fa2():
    d = 96
    assert d not in TRITON_HEAD_DIMS
    assert kernels(qwen25(d)) == {"vit_rotary": [(d, 16, 16, "bfloat16")], "vit_short_window": []}


def test_route_off_or_no_windows_warms_no_short_window_kernel():
    qwen3 = VLM(rotary(QwenTower(72)))  # full attention only: no fullatt_block_indexes
    assert kernels(qwen3) == {"vit_rotary": [(72, 16, 16, "bfloat16")], "vit_short_window": []}
    assert kernels(qwen25(), settings=RoutingSettings(short_route_max_seqlen=0))["vit_short_window"] == []


def test_no_rotary_tower_warms_no_rotary():
    assert kernels(internvl()) == {"vit_rotary": [], "vit_short_window": []}
    # MiMo-VL: windowed (fullatt_block_indexes) without rotary_pos_emb
    assert kernels(VLM(MiMoTower(d=64))) == {"vit_rotary": [], "vit_short_window": [(64, 16, 16, "bfloat16")]}


def test_each_distinct_shape_once():
    tower = rotary(QwenTower(80, fullatt=[3, 7]))
    tower.blocks[1].attn = FakeVisionAttention(80, 16, kv_heads=8)
    tower.blocks[2].attn = FakeVisionAttention(80, 16, dtype=torch.float16)
    tower.blocks[4].attn = FakeVisionAttention(80, 8)
    shapes = [(80, 16, 16, "bfloat16"), (80, 16, 8, "bfloat16"), (80, 16, 16, "float16"), (80, 8, 8, "bfloat16")]
    assert kernels(VLM(tower)) == {"vit_rotary": shapes, "vit_short_window": shapes}


def test_not_on_a_gpu_or_no_fa4_warms_no_triton_kernel():
    def triton(model, on_gpu):
        return [i for i in variants.vit_warmup_list(model, 90, ROUTE_ON, on_gpu=on_gpu, fp8=False)
                if i.family in ("vit_rotary", "vit_short_window")]

    assert triton(qwen25(), on_gpu=False) == [] and len(triton(qwen25(), on_gpu=True)) == 2
    assert triton(qwen25(backend="triton_attn"), on_gpu=True) == []


def test_a_failing_kernel_is_reported_and_the_rest_still_warm(warmed, monkeypatch):
    def broken(*shape, device):
        raise RuntimeError("ptxas died")

    monkeypatch.setattr(vit_rotary, "warm", broken)
    report = warmup.warm(variants.triton_shapes(qwen25(), 90, ROUTE_ON), CUDA)
    assert [(i.family, tuple(i.variant), m) for i, m in report.failures] == [
        ("vit_rotary", (80, 16, 16, "bfloat16"), "RuntimeError: ptxas died")]
    assert report.hows == ["failed", "1 resolved"] and warmed == [("vit_short_window", (80, 16, 16, "bfloat16"))]
    assert report.family("vit_rotary")["failed"] == 1 and report.family("vit_short_window")["failed"] == 0
