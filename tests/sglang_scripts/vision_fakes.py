"""SGLang's vision attention on a CPU, for tests/test_sglang_integration.py: run inside a REAL SGLang
release by tests/sglang_harness.py (``run_script``). Stubbed, because it cannot run on a CPU, and
only that: the CUDA facts vision.py reads, the FA4 kernel call (-> a recorder of what it was
given), CUDA graph objects (capture runs the Python eagerly with ``STATE["capturing"]`` set,
replay is recorded).

:func:`setup` loads the plugin through SGLang's own loader (or not) and installs the recorder.
"""

from __future__ import annotations

from contextlib import contextmanager
from unittest import mock

import torch
from torch import nn

RECORDS: list = []
STATE = {"capturing": False}
H, D = 2, 8
vision = None  # sglang.srt.layers.attention.vision, once setup() ran


def record(cu, max_seqlen, q):
    RECORDS.append({"capturing": STATE["capturing"], "cu": [int(x) for x in cu.tolist()],
                    "max_seqlen": max_seqlen, "max_type": type(max_seqlen).__name__,
                    "cu_dtype": str(cu.dtype), "cu_device": str(cu.device), "q_shape": list(q.shape)})
    return torch.zeros_like(q)


def fake_fa4(q, k, v, cu_seqlens, max_seqlen, **kw):
    return record(cu_seqlens, max_seqlen, q)


def fake_flash_attn_func(q, k, v, cu_seqlens_q=None, max_seqlen_q=None, **kw):
    return record(cu_seqlens_q, max_seqlen_q, q)


def setup(plugin: bool):
    """Load the plugin (SGLang's load_plugins finds our entry point) when ``plugin``, then route
    every FA4 call, ours and upstream's, to the recorder. Returns SGLang's vision module."""
    global vision
    import sglang.srt.plugins as plugins

    if plugin:
        plugins.load_plugins()
    from sglang.srt.layers.attention import vision as loaded

    import sglang_fa4.kernels.varlen

    sglang_fa4.kernels.varlen.fa4_varlen_attention = fake_fa4
    loaded.flash_attn_func = fake_flash_attn_func  # only defined on CUDA builds; upstream's FA4 path calls it
    vision = loaded
    return loaded


def fa4_backend():
    with mock.patch.object(vision, "_is_cuda", True):
        return vision.VisionFlash4Attention()


class Attn(nn.Module):
    """A stand-in for SGLang's VisionAttention as the graph runners read it, with a real fa4 backend."""

    def __init__(self):
        super().__init__()
        self.qkv_backend_name = "fa4"
        self.num_attention_heads_per_partition = H
        self.head_size = D
        self.backend = fa4_backend()


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


def fake_cuda_graphs():
    """The CUDA graph objects a runner touches, replaced (a context manager)."""
    from contextlib import ExitStack

    stack = ExitStack()
    stack.enter_context(mock.patch.object(torch.cuda, "CUDAGraph", FakeGraph))
    stack.enter_context(mock.patch.object(torch.cuda, "graph", fake_graph))
    stack.enter_context(mock.patch.object(torch.cuda, "synchronize", lambda *a: None))
    return stack
