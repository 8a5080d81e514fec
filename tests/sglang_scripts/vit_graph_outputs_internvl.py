"""Held outputs of SGLang's InternVL ViT runner survive later replays, inside a REAL SGLang release:
for tests/test_vit_graph_outputs.py."""

from unittest import mock

import torch
import torch.nn as nn
from vit_budget_tower import C
from vit_graph_fakes import FakeGraph, fake_graph
from vit_internvl_layers import Layer, ir, replaying_capture

from emit import emit


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([Layer() for _ in range(3)])


enc = Encoder()
held = []
with mock.patch.object(torch.cuda, "CUDAGraph", FakeGraph), mock.patch.object(torch.cuda, "graph", fake_graph), \
     mock.patch.object(torch.cuda, "synchronize", lambda *a: None), \
     mock.patch.object(ir.InternViTCudaGraphRunner, "_capture_graph", replaying_capture()):
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
