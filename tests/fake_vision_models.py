"""Stand-ins for SGLang's loaded vision models, with the attributes sglang-fa4 reads from them
(sglang_fa4/sglang_model.py): fa4 ``VisionAttention`` modules in Qwen2.5-VL (windowed, full blocks
3 and 7), Qwen3-VL (full attention), InternViT (fixed resolution) and MiMo-VL (sliding window with
sinks) towers. Shared by the warmup, FP8 warmup, Triton warmup and model-facts tests."""

from __future__ import annotations

import torch
from torch import nn


class FakeVisionAttention(nn.Module):
    """The attributes of SGLang's VisionAttention that the warmup reads."""

    def __init__(self, d, heads, kv_heads=None, backend="fa4", dtype=torch.bfloat16,
                 window_size=(-1, -1), use_sink=False):
        super().__init__()
        kv_heads = heads if kv_heads is None else kv_heads
        self.head_size = d
        self.num_attention_heads_per_partition = heads
        self.num_attention_kv_heads_per_partition = kv_heads
        self.qkv_backend_name = backend
        self.qkv_proj = nn.Linear(4, 4).to(dtype)
        self.window_size = window_size
        self.sinks = nn.Parameter(torch.zeros(heads, dtype=torch.bfloat16), requires_grad=False) if use_sink else None


class Block(nn.Module):
    def __init__(self, attn):
        super().__init__()
        self.attn = attn
        self.mlp = nn.Linear(4, 4)


class QwenTower(nn.Module):
    def __init__(self, d, depth=8, heads=16, fullatt=None, window_size=112, patch_size=14, **attn_kw):
        super().__init__()
        if fullatt is not None:
            self.fullatt_block_indexes = fullatt
            self.window_size = window_size
        self.patch_size = patch_size
        self.blocks = nn.ModuleList(Block(FakeVisionAttention(d, heads, **attn_kw)) for _ in range(depth))


class VLM(nn.Module):
    def __init__(self, visual, attr="visual"):
        super().__init__()
        setattr(self, attr, visual)
        self.language_model = nn.Linear(4, 4)  # no VisionAttention in the LLM


def qwen25_vl(**kw):  # windows of 64 tokens, full blocks 3 and 7, d=80
    return VLM(QwenTower(80, fullatt=[3, 7], **kw))


def qwen3_vl(**kw):  # full attention only, d=72
    return VLM(QwenTower(72, **kw))


class InternEmbeddings(nn.Module):
    def __init__(self):
        super().__init__()
        self.num_positions = 1025  # 448 px / 14 px = 32 x 32 patches + class token


class InternViT(nn.Module):
    def __init__(self, d=64, heads=16, backend="fa4"):
        super().__init__()
        self.embeddings = InternEmbeddings()
        self.encoder = nn.ModuleList(Block(FakeVisionAttention(d, heads, backend=backend)) for _ in range(4))


def internvl(**kw):
    return VLM(InternViT(**kw), attr="vision_model")


class MiMoTower(nn.Module):
    def __init__(self, d=64, heads=16, depth=4, fullatt=(3,)):
        super().__init__()
        self.fullatt_block_indexes = list(fullatt)
        self.window_size = 128
        self.patch_size = 14
        self.blocks = nn.ModuleList(
            Block(FakeVisionAttention(d, heads, window_size=(64, 64), use_sink=i not in fullatt)) for i in range(depth)
        )
