"""SGLang's real ViTCudaGraphRunner with CUDA graphs faked and FA4 a CPU reference, inside a REAL
SGLang release (imported by the scripts of tests/test_vit_budgets.py, tests/test_vit_graph_outputs.py
and tests/test_internvl_startup_graphs.py). Importing it loads the plugin.

A fake graph's ``replay()`` re-runs the runner's own ``_create_graph`` body (the captured Python)
over the same static buffers and writes into the captured output tensor in place, as a real graph
does. FA4 is a torch reference varlen attention that fills only rows inside segments (others stay
NaN, like uninitialised memory) and raises if a segment is longer than the max_seqlen it was given.
"""

import io
import logging
import random
import warnings
from contextlib import contextmanager

import torch

warnings.simplefilter("ignore")

import sglang.srt.plugins as plugins  # noqa: E402

plugins.load_plugins()
from sglang.srt.layers.attention import vision  # noqa: E402,F401  (after the plugin: as SGLang imports it)
from sglang.srt.multimodal import vit_cuda_graph_runner as vr  # noqa: E402

import sglang_fa4.kernels.varlen  # noqa: E402
from sglang_fa4.startup import jit_monitor  # noqa: E402

log = io.StringIO()
logging.getLogger("sglang_fa4").addHandler(logging.StreamHandler(log))
logging.getLogger("sglang_fa4").setLevel(logging.INFO)  # the startup line is INFO
torch.manual_seed(0)
random.seed(0)
STATE = {"capturing": False, "replaying": False, "captures": 0, "attn_calls": 0, "startup": False, "warming": set()}


def ref_fa4(q, k, v, cu_seqlens, max_seqlen, **kw):
    # reference varlen attention: rows outside every segment stay NaN (uninitialised memory)
    STATE["attn_calls"] += 1
    STATE["warming"].add((STATE["startup"], jit_monitor._expected))
    cu = [int(c) for c in cu_seqlens.tolist()]
    out = torch.full_like(q, float("nan"))
    for a, b in zip(cu, cu[1:]):
        if b - a > max_seqlen:
            raise RuntimeError(f"segment {b - a} > max_seqlen {max_seqlen}")
        if b > a:
            s = torch.einsum("qhd,khd->hqk", q[a:b], k[a:b]) / q.shape[-1] ** 0.5
            out[a:b] = torch.einsum("hqk,khd->qhd", s.softmax(-1), v[a:b])
    return out


sglang_fa4.kernels.varlen.fa4_varlen_attention = ref_fa4


class FakeGraph:
    def __init__(self):
        self.again = None

    def replay(self):
        self.again()


@contextmanager
def fake_graph(g, *a, **k):
    STATE["capturing"] = True
    if not STATE["replaying"]:
        STATE["captures"] += 1
    try:
        yield
    finally:
        STATE["capturing"] = False


hooked_create = vr.ViTCudaGraphRunner._create_graph


def recording_create(self, graph_key, *a, **k):
    hooked_create(self, graph_key, *a, **k)
    graph = self.block_graphs[graph_key]
    static = self.block_output[graph_key]  # the memory the capture wrote, rewritten by every replay

    def again():
        STATE["replaying"] = True
        try:
            with torch.no_grad():
                hooked_create(self, graph_key, *a, **k)
        finally:
            STATE["replaying"] = False
        static.copy_(self.block_output[graph_key])  # like a real graph: same address, new values
        self.block_output[graph_key] = static
        self.block_graphs[graph_key] = graph
    graph.again = again
