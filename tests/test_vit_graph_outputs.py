"""ViT CUDA-graph outputs own their memory (sglang_fa4.integration.vit_graph_outputs): hold what one call
returned, run other images through the same graph, and the held output is unchanged.

SGLang's embedding cache keeps what the tower returns and reads it again later (a cache hit, the
next chunk of a chunked prefill), so an output that is a view of a graph's static buffer is rewritten
by the next request of the same layout or budget: one request's image features silently become
another's. Checked on the real SGLang 0.5.20 / 0.5.23 runners (generic: Qwen2.5-VL-like with windows
and an output permutation, Qwen3-VL-like with deepstack mergers; InternVL), with CUDA graphs faked so
that a replay rewrites the captured output tensor in place, as a real graph does.
"""

import pytest

from sglang_fa4.integration.vit_graph_outputs import owned, shares_storage
from sglang_harness import run_with_sglang
from test_vit_budgets import MODEL


def test_owned_copies_only_views_of_static_memory():
    import torch

    static = torch.randn(8, 4)
    fresh = torch.randn(3, 4)
    view = static[:3]
    assert shares_storage(view, [None, static]) and not shares_storage(fresh, [static])
    copy = owned(view, None, static)
    assert copy is not view and torch.equal(copy, view) and not shares_storage(copy, [static])
    assert owned(fresh, static) is fresh  # already its own memory: no copy
    assert owned(static, static) is not static


# Hold every output of many calls through each graph path; at the end count the held outputs whose
# values changed since they were returned (an aliased output shows the last replay's values).
GENERIC_HOLD = MODEL + r"""
def hold_pass(runner, qwen3, layouts, calls):
    held = []
    for i in range(calls):
        total, full, win = layouts[i % len(layouts)]
        x = torch.randn(total, C)
        tables = (torch.randn(total, D), torch.randn(total, D))
        perm = None if qwen3 else torch.randperm(total // 4)
        got = call_run(runner, x, full, win, tables, qwen3, perm)
        want = reference(vit, x, full, win, tables, qwen3, perm)
        held.append((got, got.clone(), float((got - want).abs().max())))
    return {"changed": sum(not torch.equal(g, snap) for g, snap, _ in held),
            "max_err": max(err for _, _, err in held), "calls": calls}

result = {}
with faked_graphs():
    for qwen3 in (False, True):
        name = "qwen3" if qwen3 else "qwen25"
        layouts = [image_mix(qwen3) for _ in range(3)]  # few layouts: every exact-layout graph replays often
        # SGLang's own exact-layout graphs (no budgets on this runner)
        vit, runner, _ = tower_with_runner(qwen3)
        result[name + "_exact"] = hold_pass(runner, qwen3, layouts, 24)
        result[name + "_exact"]["graphs"] = len(runner.block_graphs)
        # the startup budget graphs: random mixes, many share a budget
        vit, runner, mr = tower_with_runner(qwen3)
        vb.capture_budgets_after_load_model(None, mr)
        result[name + "_budgets"] = hold_pass(runner, qwen3, [image_mix(qwen3) for _ in range(24)], 24)
        result[name + "_budgets"]["replays"] = vb.budget_state(runner).replays
emit(result)
"""


_generic_runs: dict = {}  # one subprocess per SGLang version serves every (tower, path) case


def generic_hold(version: str) -> dict:
    if version not in _generic_runs:
        _generic_runs[version] = run_with_sglang(version, GENERIC_HOLD, env={
            "SGLANG_VIT_ENABLE_CUDA_GRAPH": "1", "SGLANG_FA4_VIT_GRAPH_BUDGETS_ENABLE": "1",
            "SGLANG_FA4_VIT_GRAPH_BUDGETS": "128,32,64"})
    return _generic_runs[version]


@pytest.mark.parametrize("path", ["exact", "budgets"])
@pytest.mark.parametrize("tower", ["qwen25", "qwen3"])
def test_generic_runner_outputs_survive_later_replays(sglang_version, tower, path):
    r = generic_hold(sglang_version)[f"{tower}_{path}"]
    assert r["max_err"] < 1e-4, r  # each output was right when it was returned
    if path == "exact":
        assert r["graphs"] == 3, r  # 3 layouts, 24 calls: each graph replayed for other images
    else:
        assert r["replays"] >= 12, r  # most calls replayed a shared budget graph
    assert r["changed"] == 0, r  # ... and no later replay changed a held output


# InternViT-shaped layers for SGLang's InternVL runner (it reads layers[0].attn.attn's backend name)
INTERNVL_LAYERS = r"""
from sglang.srt.multimodal import internvl_vit_cuda_graph_runner as ir

class Outer(nn.Module):  # InternAttention: VisionAttention as .attn
    def __init__(self, backend="fa4"):
        super().__init__(); self.attn = Attn(); self.attn.qkv_backend_name = backend

class Layer(nn.Module):  # InternViT: [B, S, H] tiles, attention over each tile
    def __init__(self, backend="fa4"):
        super().__init__(); self.attn = Outer(backend); self.proj = nn.Linear(C, C)
    def forward(self, x, cu_seqlens=None, output_ws=None):
        b, s, h = x.shape
        q = x.reshape(b * s, H, D)
        o = self.attn.attn.backend.forward(q, q, q, cu_seqlens=cu_seqlens, bsz=b, seq_len=s)
        return x + self.proj(o.reshape(x.shape))
"""

INTERNVL_HOLD = MODEL + INTERNVL_LAYERS + r"""
class Encoder(nn.Module):
    def __init__(self):
        super().__init__(); self.layers = nn.ModuleList([Layer() for _ in range(3)])

hooked_capture = ir.InternViTCudaGraphRunner._capture_graph
def recording_capture(self, key):
    hooked_capture(self, key)
    static = self.out[key]
    def again():  # the captured body over the same static buffers, written into the same output
        with torch.no_grad():
            y = self.inp[key]
            for blk in self.encoder.layers:
                y = blk(y, cu_seqlens=[self.cu[key], int(self.cu_kk[key].max())], output_ws=self.ws[key])
        static.copy_(y)
    self.graphs[key].again = again

enc = Encoder()
held = []
with mock.patch.object(torch.cuda, "CUDAGraph", FakeGraph), mock.patch.object(torch.cuda, "graph", fake_graph), \
     mock.patch.object(torch.cuda, "synchronize", lambda *a: None), \
     mock.patch.object(ir.InternViTCudaGraphRunner, "_capture_graph", recording_capture):
    runner = ir.InternViTCudaGraphRunner(enc)
    for i in range(12):
        x = torch.randn(1 + i % 3, 5, C)  # 1..3 tiles of 5 tokens: three graphs, each replayed 4 times
        got = runner.run(x)
        with torch.no_grad():
            want = x
            for blk in enc.layers:
                want = blk(want, cu_seqlens=[torch.arange(0, x.shape[0] * 5 + 1, 5, dtype=torch.int32), 5])
        held.append((got, got.clone(), float((got - want).abs().max())))
emit({"graphs": len(runner.graphs), "changed": sum(not torch.equal(g, s) for g, s, _ in held),
      "max_err": max(e for _, _, e in held)})
"""


def test_internvl_runner_outputs_survive_later_replays(sglang_version):
    out = run_with_sglang(sglang_version, INTERNVL_HOLD, env={"SGLANG_VIT_ENABLE_CUDA_GRAPH": "1"})
    assert out["graphs"] == 3 and out["max_err"] < 1e-4, out
    assert out["changed"] == 0, out
