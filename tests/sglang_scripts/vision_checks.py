"""The checks tests/test_sglang_integration.py runs inside a REAL SGLang release (CPU, fakes from
vision_fakes.py): the ViT backend selection matrix, the fa4 forward's cu_seqlens forms, and the
generic (Qwen2.5-VL-style) and InternViT CUDA-graph runners driving the fa4 backend. Each returns
a JSON-able dict; :func:`run` runs several in one interpreter (SGLang's import is the cost), each
on fresh records, and returns {check: result}."""

from __future__ import annotations

import sys
from unittest import mock

import torch
from torch import nn

import vision_fakes as fakes
from vision_fakes import RECORDS, Attn, D, H


def backend_matrix() -> dict:
    """``_determine_attention_backend`` for (--mm-attention-backend, model's backend, capability)."""
    from sglang.srt.runtime_context import get_context, override_platform

    vision = fakes.vision
    out = {}
    for server_arg in (None, "sdpa"):
        fields = {} if server_arg is None else {"mm_attention_backend": server_arg}
        with get_context().override_server_args(**fields):
            for cap in [(9, 0), (10, 0), (10, 3), (12, 0)]:
                for passed in (None, "triton_attn", "fa3"):
                    with mock.patch.object(vision, "is_cuda", lambda: True), \
                         mock.patch.object(vision, "get_device_capability", lambda cap=cap: cap), \
                         override_platform(is_blackwell=cap[0] in (10, 11, 12)):
                        try:
                            got = vision.VisionAttention._determine_attention_backend(object(), passed)
                        except ValueError as exc:
                            got = "error: " + str(exc)
                    out[f"{server_arg}|{passed}|{cap[0]}.{cap[1]}"] = got
    return out


def forward_forms() -> dict:
    """The fa4 backend's forward with cu_seqlens as [tensor, max], an int64 tensor, and the
    triton_attn runner's [cu, lengths, max]; and whether SGLang's vendored FA4 got imported."""
    attn = fakes.fa4_backend()
    q = torch.randn(10, 2, 8)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    result = {}
    for name, arg in (("list", [cu, 6]), ("tensor", cu.to(torch.int64)), ("triton_list", [cu, cu[1:] - cu[:-1], 6])):
        try:
            o = attn.forward(q, q, q, cu_seqlens=arg, bsz=1, seq_len=10, softmax_scale=0.3)
            result[name] = {"ok": list(o.shape), "call": RECORDS[-1]}
        except Exception as exc:  # noqa: BLE001 - the error is the result
            result[name] = {"error": type(exc).__name__ + ": " + str(exc)}
    vendored = ("sglang.kernels.ops.attention.flash_attn", "sglang.kernels.ops.attention.flash_attention_v4")
    result["vendored_fa4"] = sorted(m for m in sys.modules if m.startswith(vendored))
    return result


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = Attn()

    def forward(self, x, cu_seqlens=None, position_embeddings=None, output_ws=None,
                rotary_pos_emb_cos=None, rotary_pos_emb_sin=None):
        s = x.shape[0]
        q = x.reshape(s, H, D)
        return x + self.attn.backend.forward(q, q, q, cu_seqlens=cu_seqlens, bsz=1, seq_len=s).reshape(x.shape)


class _ViT(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([_Block() for _ in range(4)])
        self.fullatt_block_indexes = [1, 3]
        self.merger = nn.Identity()
        self.device = torch.device("cpu")
        self.dtype = torch.float32


def generic_runner() -> dict:
    """SGLang's ViTCudaGraphRunner (Qwen2.5-VL layout: windows + full blocks) capturing and
    replaying a 4-block tower on the fa4 backend."""
    from sglang.srt.multimodal import vit_cuda_graph_runner as vr

    tokens = 24
    cu_full = torch.tensor([0, 0, 24], dtype=torch.int32)       # Qwen2.5-VL: a leading empty segment
    cu_window = torch.tensor([0, 16, 20, 24], dtype=torch.int32)  # windows with irregular edges
    x = torch.randn(tokens, H * D)
    cos, sin = torch.randn(tokens, D), torch.randn(tokens, D)
    with fakes.fake_cuda_graphs(), \
         mock.patch.object(vr.ViTCudaGraphRunner, "_capture_context", lambda self: mock.MagicMock()):
        runner = vr.ViTCudaGraphRunner(_ViT())
        try:
            runner.run(x, cu_full, cu_window, position_embeddings=(cos, sin))
            return {"records": list(RECORDS)}
        except Exception as exc:  # noqa: BLE001 - the error is the result
            return {"error": type(exc).__name__ + ": " + str(exc), "records": list(RECORDS)}


class _Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = Attn()


class _Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = _Outer()
        self.proj = nn.Linear(H * D, H * D)

    def forward(self, x, cu_seqlens=None, output_ws=None):
        b, s, h = x.shape
        q = x.reshape(b * s, H, D)
        o = self.attn.attn.backend.forward(q, q, q, cu_seqlens=cu_seqlens, bsz=b, seq_len=s)
        return x + o.reshape(x.shape)


class _Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([_Layer() for _ in range(3)])


def internvl_runner() -> dict:
    """SGLang's InternViTCudaGraphRunner over a 3-layer encoder on the fa4 backend."""
    from sglang.srt.multimodal import internvl_vit_cuda_graph_runner as ir

    x = torch.randn(2, 5, H * D)
    with fakes.fake_cuda_graphs():
        runner = ir.InternViTCudaGraphRunner(_Encoder())
        try:
            runner.run(x)
            return {"records": list(RECORDS)}
        except Exception as exc:  # noqa: BLE001 - the error is the result
            return {"error": type(exc).__name__ + ": " + str(exc), "records": list(RECORDS)}


CHECKS = {"forward_forms": forward_forms, "backend_matrix": backend_matrix,
          "generic_runner": generic_runner, "internvl_runner": internvl_runner}


def run(plugin: bool, checks) -> dict:
    import warnings

    warnings.simplefilter("ignore")
    fakes.setup(plugin)
    out = {}
    for name in checks:
        RECORDS.clear()
        fakes.STATE["capturing"] = False
        out[name] = CHECKS[name]()
    return out
