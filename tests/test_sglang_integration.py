"""The plugin against the REAL SGLang 0.5.20 and 0.5.23 (CPU, one fresh interpreter per case).

The plugin is loaded through SGLang's own loader (``sglang.srt.plugins.load_plugins()`` finds our
installed entry point). Stubbed, because it cannot run on a CPU, and only that:
- the CUDA facts vision.py reads (``is_cuda``, ``get_device_capability``, the platform's is_blackwell,
  ``_is_cuda`` for VisionFlash4Attention's constructor);
- the FA4 kernel call itself (``sglang_fa4.kernels.dispatch.fa4_varlen_attention``, or SGLang's
  ``flash_attn_func`` when the plugin is off) -> a recorder;
- CUDA graph objects (``torch.cuda.CUDAGraph``, ``torch.cuda.graph``, ``torch.cuda.synchronize``) and the
  runner's tensor-parallel capture context.
"""

import pytest

from sglang_harness import run_with_sglang

COMMON = """
import warnings, sys
warnings.simplefilter("ignore")
from unittest import mock
import torch
import sglang.srt.plugins as plugins
if PLUGIN:
    plugins.load_plugins()
from sglang.srt.layers.attention import vision

RECORDS = []
STATE = {"capturing": False}

def record(cu, max_seqlen, q):
    RECORDS.append({"capturing": STATE["capturing"], "cu": [int(x) for x in cu.tolist()],
                    "max_seqlen": max_seqlen, "max_type": type(max_seqlen).__name__,
                    "cu_dtype": str(cu.dtype), "cu_device": str(cu.device), "q_shape": list(q.shape)})
    return torch.zeros_like(q)

def fake_fa4(q, k, v, cu_seqlens, max_seqlen, **kw):
    return record(cu_seqlens, max_seqlen, q)

def fake_flash_attn_func(q, k, v, cu_seqlens_q=None, max_seqlen_q=None, **kw):
    return record(cu_seqlens_q, max_seqlen_q, q)

import sglang_fa4.kernels.dispatch
sglang_fa4.kernels.dispatch.fa4_varlen_attention = fake_fa4
vision.flash_attn_func = fake_flash_attn_func  # only defined on CUDA builds; upstream's FA4 path calls it

def fa4_backend():
    with mock.patch.object(vision, "_is_cuda", True):
        return vision.VisionFlash4Attention()

# a stand-in for SGLang's VisionAttention as the graph runners read it, with a real fa4 backend
import torch.nn as nn
H, D = 2, 8

class Attn(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv_backend_name = "fa4"
        self.num_attention_heads_per_partition = H
        self.head_size = D
        self.backend = fa4_backend()

# CUDA graph stand-ins: capture runs the Python eagerly with STATE["capturing"] set; replay is recorded
from contextlib import contextmanager

class FakeGraph:
    def replay(self):
        RECORDS.append({"replay": True})

@contextmanager
def fake_graph(g, *a, **k):
    STATE["capturing"] = True
    try:
        yield
    finally:
        STATE["capturing"] = False
"""

BACKEND_MATRIX = """
from sglang.srt.runtime_context import get_context, override_platform
out = {}
for server_arg in (None, "sdpa"):
    fields = {} if server_arg is None else {"mm_attention_backend": server_arg}
    with get_context().override_server_args(**fields):
        for cap in [(9, 0), (10, 0), (10, 3), (12, 0)]:
            for passed in (None, "triton_attn", "fa3"):
                with mock.patch.object(vision, "is_cuda", lambda: True), \\
                     mock.patch.object(vision, "get_device_capability", lambda cap=cap: cap), \\
                     override_platform(is_blackwell=cap[0] in (10, 11, 12)):
                    try:
                        got = vision.VisionAttention._determine_attention_backend(object(), passed)
                    except ValueError as exc:
                        got = "error: " + str(exc)
                out[f"{server_arg}|{passed}|{cap[0]}.{cap[1]}"] = got
emit(out)
"""


def snippet(body: str, plugin: bool) -> str:
    return f"PLUGIN = {plugin}\n" + COMMON + body


@pytest.mark.parametrize("plugin", [True, False])
def test_backend_selection_matrix(sglang_version, plugin):
    out = run_with_sglang(sglang_version, snippet(BACKEND_MATRIX, plugin))
    defaults = {c: out[f"None|None|{c}"] for c in ("9.0", "10.0", "10.3", "12.0")}
    if plugin or sglang_version != "0.5.20":
        assert defaults == {"9.0": "fa3", "10.0": "fa4", "10.3": "fa4", "12.0": "triton_attn"}
    else:  # the B300 bug the plugin fixes
        assert defaults == {"9.0": "fa3", "10.0": "fa4", "10.3": "triton_attn", "12.0": "triton_attn"}
    for cap in ("9.0", "10.0", "10.3", "12.0"):
        # an explicit --mm-attention-backend wins over the model and the default
        assert out[f"sdpa|None|{cap}"] == "sdpa" and out[f"sdpa|triton_attn|{cap}"] == "sdpa"
        assert out[f"None|triton_attn|{cap}"] == "triton_attn"
    for cap in ("10.0", "10.3", "12.0"):
        assert out[f"None|fa3|{cap}"].startswith("error:") and "Blackwell" in out[f"None|fa3|{cap}"]
    assert out["None|fa3|9.0"] == "fa3"


def test_env_override_of_the_default(sglang_version):
    out = run_with_sglang(sglang_version, snippet(BACKEND_MATRIX, True),
                          env={"SGLANG_FA4_MM_ATTENTION_BACKEND_DEFAULT": "triton_attn"})
    assert out["None|None|10.0"] == "triton_attn" and out["None|None|10.3"] == "triton_attn"
    assert out["None|fa3|9.0"] == "fa3" and out["sdpa|None|10.0"] == "sdpa"


FORWARD = """
attn = fa4_backend()
q = torch.randn(10, 2, 8)
cu = torch.tensor([0, 4, 10], dtype=torch.int32)
result = {}
for name, arg in (("list", [cu, 6]), ("tensor", cu.to(torch.int64)), ("triton_list", [cu, cu[1:] - cu[:-1], 6])):
    try:
        o = attn.forward(q, q, q, cu_seqlens=arg, bsz=1, seq_len=10, softmax_scale=0.3)
        result[name] = {"ok": list(o.shape), "call": RECORDS[-1]}
    except Exception as exc:
        result[name] = {"error": type(exc).__name__ + ": " + str(exc)}
VENDORED_FA4 = ("sglang.kernels.ops.attention.flash_attn", "sglang.kernels.ops.attention.flash_attention_v4")
result["vendored_fa4"] = sorted(m for m in sys.modules if m.startswith(VENDORED_FA4))
emit(result)
"""


@pytest.mark.parametrize("graph_env", ["0", "1"])
def test_fa4_forward_list_and_tensor_forms(sglang_version, graph_env):
    out = run_with_sglang(sglang_version, snippet(FORWARD, True), env={"SGLANG_VIT_ENABLE_CUDA_GRAPH": graph_env})
    for form in ("list", "tensor"):
        call = out[form]["call"]
        assert out[form]["ok"] == [10, 2, 8]
        assert call["cu"] == [0, 4, 10] and call["cu_dtype"] == "torch.int32" and call["cu_device"] == "cpu"
        assert call["max_seqlen"] == 6 and call["max_type"] == "int"
    assert "SeqlensError" in out["triton_list"]["error"] and "triton_attn runner layout" in out["triton_list"]["error"]
    # one FA4 for the ViT: the hooked forward never imports SGLang's vendored copy (README)
    assert out["vendored_fa4"] == []


def test_fa4_forward_without_plugin(sglang_version):
    out = run_with_sglang(sglang_version, snippet(FORWARD, False), env={"SGLANG_VIT_ENABLE_CUDA_GRAPH": "1"})
    assert out["tensor"]["ok"] == [10, 2, 8]
    if sglang_version == "0.5.20":  # no list branch upstream: the runner's layout dies here
        assert "cu_seqlens must be a torch.Tensor" in out["list"]["error"]
    else:
        assert out["list"]["ok"] == [10, 2, 8]


GENERIC_RUNNER = """
from sglang.srt.multimodal import vit_cuda_graph_runner as vr



class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = Attn()
    def forward(self, x, cu_seqlens=None, position_embeddings=None, output_ws=None,
                rotary_pos_emb_cos=None, rotary_pos_emb_sin=None):
        s = x.shape[0]
        q = x.reshape(s, H, D)
        return x + self.attn.backend.forward(q, q, q, cu_seqlens=cu_seqlens, bsz=1, seq_len=s).reshape(x.shape)

class ViT(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(4)])
        self.fullatt_block_indexes = [1, 3]
        self.merger = nn.Identity()
        self.device = torch.device("cpu")
        self.dtype = torch.float32

vit = ViT()
tokens = 24
cu_full = torch.tensor([0, 0, 24], dtype=torch.int32)       # Qwen2.5-VL: a leading empty segment
cu_window = torch.tensor([0, 16, 20, 24], dtype=torch.int32)  # windows with irregular edges
x = torch.randn(tokens, H * D)
cos = torch.randn(tokens, D); sin = torch.randn(tokens, D)
with mock.patch.object(torch.cuda, "CUDAGraph", FakeGraph), mock.patch.object(torch.cuda, "graph", fake_graph), \\
     mock.patch.object(torch.cuda, "synchronize", lambda *a: None), \\
     mock.patch.object(vr.ViTCudaGraphRunner, "_capture_context", lambda self: mock.MagicMock()):
    runner = vr.ViTCudaGraphRunner(vit)
    try:
        runner.run(x, cu_full, cu_window, position_embeddings=(cos, sin))
        emit({"records": RECORDS})
    except Exception as exc:
        emit({"error": type(exc).__name__ + ": " + str(exc), "records": RECORDS})
"""


def test_generic_runner_with_fa4(sglang_version):
    out = run_with_sglang(sglang_version, snippet(GENERIC_RUNNER, True), env={"SGLANG_VIT_ENABLE_CUDA_GRAPH": "1"})
    assert "error" not in out, out
    calls = [r for r in out["records"] if "cu" in r]
    first_capture = next(i for i, r in enumerate(calls) if r["capturing"])
    warm = calls[:first_capture]
    captured = calls[first_capture:]
    window, full = [0, 16, 20, 24], [0, 0, 24]
    # every layout the blocks will use was compiled eagerly before capture started
    assert {tuple(r["cu"]) for r in warm} == {tuple(window), tuple(full)}
    assert all(not r["capturing"] for r in warm)
    # the capture: one call per block, [cu_seqlens, max_seqlen] with the block's layout
    assert [r["cu"] for r in captured] == [window, full, window, full]
    assert [r["max_seqlen"] for r in captured] == [16, 24, 16, 24]
    assert all(r["capturing"] and r["max_type"] == "int" for r in captured)
    assert out["records"][-1] == {"replay": True}


def test_generic_runner_fa4_fails_without_plugin_on_0_5_20(sglang_version):
    out = run_with_sglang(sglang_version, snippet(GENERIC_RUNNER, False), env={"SGLANG_VIT_ENABLE_CUDA_GRAPH": "1"})
    if sglang_version == "0.5.20":
        assert "cu_seqlens must be a torch.Tensor" in out["error"]
        assert not any(r.get("capturing") for r in out["records"])
    else:  # upstream took the fix: both layouts warmed, then captured
        assert "error" not in out, out
        assert any(r.get("capturing") for r in out["records"])


INTERNVL_RUNNER = """
from sglang.srt.multimodal import internvl_vit_cuda_graph_runner as ir



class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = Attn()

class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = Outer()
        self.proj = nn.Linear(H * D, H * D)
    def forward(self, x, cu_seqlens=None, output_ws=None):
        b, s, h = x.shape
        q = x.reshape(b * s, H, D)
        o = self.attn.attn.backend.forward(q, q, q, cu_seqlens=cu_seqlens, bsz=b, seq_len=s)
        return x + o.reshape(x.shape)

class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([Layer() for _ in range(3)])

x = torch.randn(2, 5, H * D)
with mock.patch.object(torch.cuda, "CUDAGraph", FakeGraph), mock.patch.object(torch.cuda, "graph", fake_graph), \\
     mock.patch.object(torch.cuda, "synchronize", lambda *a: None):
    runner = ir.InternViTCudaGraphRunner(Encoder())
    try:
        runner.run(x)
        emit({"records": RECORDS})
    except Exception as exc:
        emit({"error": type(exc).__name__ + ": " + str(exc), "records": RECORDS})
"""


@pytest.mark.parametrize("plugin", [True, False])
def test_internvl_runner_with_fa4(sglang_version, plugin):
    out = run_with_sglang(sglang_version, snippet(INTERNVL_RUNNER, plugin), env={"SGLANG_VIT_ENABLE_CUDA_GRAPH": "1"})
    if sglang_version == "0.5.20" and not plugin:
        assert "does not support attention backend: fa4" in out["error"]
        return
    assert "error" not in out, out
    calls = [r for r in out["records"] if "cu" in r]
    assert [r["capturing"] for r in calls] == [False] * 3 + [True] * 3  # eager warmup, then capture
    assert all(r["cu"] == [0, 5, 10] and r["max_seqlen"] == 5 and r["max_type"] == "int" for r in calls)
