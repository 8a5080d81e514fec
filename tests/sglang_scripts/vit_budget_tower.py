"""A small Qwen2.5-VL-like (windows, full blocks, output permutation) and Qwen3-VL-like (deepstack
mergers) tower with the real fa4 backend, random image mixes, the unpadded eager reference, on
SGLang's real generic runner with graphs faked (tests/sglang_scripts/vit_graph_fakes.py)."""

import random
import types
from contextlib import ExitStack
from unittest import mock

import torch
import torch.nn as nn
from vit_graph_fakes import FakeGraph, fake_graph, recording_create, vision, vr  # first: loads the plugin

H, D = 2, 8
C = H * D


class Attn(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv_backend_name = "fa4"
        self.num_attention_heads_per_partition = H
        self.head_size = D
        with mock.patch.object(vision, "_is_cuda", True):
            self.backend = vision.VisionFlash4Attention()


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = Attn()
        self.norm1 = nn.LayerNorm(C)
        self.qkv = nn.Linear(C, 3 * C)
        self.proj = nn.Linear(C, C)
        self.mlp = nn.Sequential(nn.Linear(C, 2 * C), nn.GELU(), nn.Linear(2 * C, C))

    def forward(self, x, cu_seqlens=None, position_embeddings=None, output_ws=None,
                rotary_pos_emb_cos=None, rotary_pos_emb_sin=None):
        s = x.shape[0]
        cos, sin = position_embeddings if position_embeddings is not None else (rotary_pos_emb_cos, rotary_pos_emb_sin)
        q, k, v = self.qkv(self.norm1(x.reshape(s, C))).reshape(s, 3, H, D).unbind(1)
        q = q * cos[:, None] + q.flip(-1) * sin[:, None]
        k = k * cos[:, None] + k.flip(-1) * sin[:, None]
        o = self.attn.backend.forward(q, k, v, cu_seqlens=cu_seqlens, bsz=1, seq_len=s)
        y = x.reshape(s, C) + self.proj(o.reshape(s, C))
        return (y + self.mlp(y)).reshape(x.shape)


class Merger(nn.Module):  # Qwen: groups 4 consecutive tokens
    def __init__(self, out=12):
        super().__init__()
        self.lin = nn.Linear(4 * C, out)

    def forward(self, y):
        return self.lin(y.reshape(-1, 4 * C))


class ViT(nn.Module):
    def __init__(self, qwen3):
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(4)])
        if qwen3:
            self.deepstack_visual_indexes = [0, 2]
            self.deepstack_merger_list = nn.ModuleList([Merger(6), Merger(6)])
            self.rotary_pos_emb = mock.Mock(rotary_dim=D, spec=["rotary_dim"])  # Qwen3: get_rope(...)
        else:
            self.fullatt_block_indexes = [1, 3]
            self.window_size = 8
            self.patch_size = 2  # 16-token windows
            self.rotary_pos_emb = nn.Module()
            self.rotary_pos_emb.register_buffer("inv_freq", torch.ones(D // 4))
        self.merger = Merger()
        self.device = torch.device("cpu")
        self.dtype = torch.float32


def image_mix(qwen3):
    # random images (h, w even: token counts multiples of 4), Qwen2.5 windows of <= 16 tokens
    n = random.randint(1, 3)
    sizes = [2 * random.randint(1, 3) * 2 * random.randint(1, 3) for _ in range(n)]  # <= 108 tokens
    total = sum(sizes)
    full = [0] + [sum(sizes[:i + 1]) for i in range(n)]
    if qwen3:
        return total, full, None
    full = [0] + full
    win = [0]
    for s in sizes:
        left = s
        while left:
            w = min(left, 4 * random.randint(1, 4))
            left -= w
            win.append(win[-1] + w)
    return total, full, win


def reference(vit, x, full, win, tables, qwen3, perm):
    # eager, unpadded: the model's own loop over blocks
    fl = [torch.tensor(full, dtype=torch.int32), max(b - a for a, b in zip(full, full[1:]))]
    wl = None if win is None else [torch.tensor(win, dtype=torch.int32), max(b - a for a, b in zip(win, win[1:]))]
    kw = {"rotary_pos_emb_cos": tables[0], "rotary_pos_emb_sin": tables[1]} if qwen3 else {"position_embeddings": tables}
    y = x.unsqueeze(1)
    deep = []
    with torch.no_grad():
        for i, blk in enumerate(vit.blocks):
            y = blk(y, cu_seqlens=fl if (qwen3 or i in vit.fullatt_block_indexes) else wl, **kw)
            if qwen3 and i in vit.deepstack_visual_indexes:
                deep.append(vit.deepstack_merger_list[vit.deepstack_visual_indexes.index(i)](y))
        out = vit.merger(y)
        if deep:
            out = torch.cat([out] + deep, dim=1)
    return out if perm is None else out.index_select(0, perm)


def call_run(runner, x, full, win, tables, qwen3, perm):
    cu = torch.tensor(full, dtype=torch.int32)
    cw = None if win is None else torch.tensor(win, dtype=torch.int32)
    if qwen3:
        return runner.run(x=x, position_embeddings=None, rotary_pos_emb_cos=tables[0], rotary_pos_emb_sin=tables[1],
                          cu_seqlens=cu, cu_window_seqlens=None, output_indices=None,
                          attention_layout_key=(tuple(full), None))
    return runner.run(x=x, position_embeddings=tables, cu_seqlens=cu, cu_window_seqlens=cw,
                      output_indices=perm, attention_layout_key=(tuple(full), tuple(win)))


def tower_with_runner(qwen3):
    # the tower holding SGLang's generic runner, and a ModelRunner stand-in whose model holds the
    # tower (what the startup hook walks)
    vit = ViT(qwen3)
    runner = vr.ViTCudaGraphRunner(vit)
    setattr(vit, "graph_runners" if qwen3 else "cuda_graph_runner", runner)
    model = nn.Module()
    model.visual = vit
    return vit, runner, types.SimpleNamespace(model=model)


def faked_graphs():
    stack = ExitStack()
    for target, name, value in ((torch.cuda, "CUDAGraph", FakeGraph), (torch.cuda, "graph", fake_graph),
                                (torch.cuda, "synchronize", lambda *a: None),
                                (vr.ViTCudaGraphRunner, "_capture_context", lambda self: mock.MagicMock()),
                                (vr.ViTCudaGraphRunner, "_create_graph", recording_create)):
        stack.enter_context(mock.patch.object(target, name, value))
    return stack
