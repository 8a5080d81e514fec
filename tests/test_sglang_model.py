"""What sglang_fa4/sglang_model.py reads off each model family's SGLang objects, with the defaults
it falls back to: Qwen2.5-VL's window tokens ((window_size // patch_size) ** 2, 64 when the tower
does not say) and full-attention blocks (a list or a tensor), fixed-resolution towers' tokens per
image (InternViT's embeddings.num_positions, SigLIP's (image_size // patch_size) ** 2, none for
Qwen's dynamic-resolution configs), the activation dtype (the qkv projection's, else any 16-bit
parameter, else bf16), the attention shape, sinks and block positions."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from sglang_fa4 import sglang_model
from fake_vision_models import VLM, FakeVisionAttention, MiMoTower, QwenTower, internvl


@pytest.mark.parametrize("window,patch,tokens", [
    (112, 14, 64),    # Qwen2.5-VL
    (112, 16, 49),    # 7 x 7 patches of 16 px
    (128, 14, 81),    # MiMo-VL's 128 px windows: 9 x 9 (floor)
    (14, 14, 1),      # a window of one patch
    (None, 14, sglang_model.DEFAULT_WINDOW_TOKENS),
    (112, None, sglang_model.DEFAULT_WINDOW_TOKENS),
    (112, 0, sglang_model.DEFAULT_WINDOW_TOKENS),
    (10, 14, sglang_model.DEFAULT_WINDOW_TOKENS),  # patch larger than the window: not a layout
])
def test_window_tokens_per_model(window, patch, tokens):
    assert sglang_model.window_tokens(SimpleNamespace(window_size=window, patch_size=patch)) == tokens
    assert sglang_model.DEFAULT_WINDOW_TOKENS == 64  # Qwen2.5-VL's 112 px / 14 px


def test_full_attention_blocks_list_tensor_or_none():
    assert sglang_model.full_attention_blocks(SimpleNamespace(fullatt_block_indexes=[7, 15, 23, 31])) == {7, 15, 23, 31}
    assert sglang_model.full_attention_blocks(SimpleNamespace(fullatt_block_indexes=torch.tensor([3, 7]))) == {3, 7}
    assert sglang_model.full_attention_blocks(SimpleNamespace()) == frozenset()
    assert sglang_model.full_attention_blocks(SimpleNamespace(fullatt_block_indexes=[])) == frozenset()


def cfg(**kw):
    return SimpleNamespace(config=SimpleNamespace(**kw))


@pytest.mark.parametrize("module,tokens", [
    (SimpleNamespace(embeddings=SimpleNamespace(num_positions=1025)), 1025),           # InternViT 448 px
    (SimpleNamespace(embeddings=SimpleNamespace(num_positions=0), **cfg(image_size=448, patch_size=14).__dict__), 1024),
    (cfg(image_size=384, patch_size=14), 729),                                         # SigLIP-so400m 384
    (cfg(image_size=224, patch_size=16), 196),
    (cfg(image_size=448, patch_size=14, spatial_merge_size=2), None),                   # Qwen: dynamic resolution
    (cfg(image_size=448, patch_size=14, temporal_patch_size=2), None),
    (cfg(image_size=448, patch_size=0), None),
    (cfg(image_size="448", patch_size=14), None),
    (SimpleNamespace(), None),
])
def test_fixed_seqlen_per_model(module, tokens):
    assert sglang_model.own_fixed_seqlen(module) == tokens


def test_module_dtype_prefers_the_qkv_projection_then_any_16_bit_parameter():
    assert sglang_model.module_dtype(FakeVisionAttention(64, 4, dtype=torch.float16)) == "float16"
    first_bf16 = nn.Module()
    first_bf16.norm = nn.LayerNorm(4).to(torch.bfloat16)  # registered (and iterated) first
    first_bf16.qkv_proj = nn.Linear(4, 4).to(torch.float16)
    assert sglang_model.module_dtype(first_bf16) == "float16"
    quantised = FakeVisionAttention(64, 4)
    quantised.qkv_proj.weight = nn.Parameter(torch.zeros(4, 4, dtype=torch.int8), requires_grad=False)
    quantised.qkv_proj.bias = None
    quantised.norm = nn.LayerNorm(4).to(torch.float16)
    assert sglang_model.module_dtype(quantised) == "float16"  # not the int8 weight, the fp16 norm
    fp32 = nn.Linear(4, 4)
    assert sglang_model.module_dtype(fp32) == "bfloat16" and sglang_model.module_dtype(fp32, default="float16") == "float16"
    assert sglang_model.dtype_name(torch.float32) is None and sglang_model.dtype_name(torch.bfloat16) == "bfloat16"


def test_attention_facts_of_each_family():
    found = sglang_model.find_fa4_attention(VLM(QwenTower(80, heads=16, kv_heads=8, fullatt=[3, 7])))
    assert len(found) == 8 and found[0][0] == "visual.blocks.0.attn"
    assert sglang_model.attention_shape(found[0][1]) == (80, 16, 8)
    assert sglang_model.attention_sinks(found[0][1]) is None and sglang_model.sink_dtype(found[0][1]) is None
    mimo = dict(sglang_model.find_fa4_attention(VLM(MiMoTower())))
    assert sglang_model.sink_dtype(mimo["visual.blocks.0.attn"]) == "bfloat16"
    assert sglang_model.attention_window(mimo["visual.blocks.0.attn"]) == (64, 64)
    assert sglang_model.find_fa4_attention(internvl(backend="sdpa")) == []  # only fa4 modules count
    assert sglang_model.find_fa4_attention(None) == [] and sglang_model.find_fa4_attention(object()) == []


def test_towers_and_block_positions():
    model = VLM(rotary := QwenTower(80, fullatt=[3, 7]))
    rotary.rotary_pos_emb = nn.Identity()
    assert [name for name, _ in sglang_model.windowed_towers(model)] == ["visual"]
    assert sglang_model.windowed_towers(VLM(QwenTower(72))) == []
    assert sglang_model.block_index(rotary, "visual", "visual.blocks.12.attn") == 12
    assert sglang_model.block_index(rotary, "", "blocks.3.attn") == 3
    assert sglang_model.block_index(rotary, "visual", "visual.merger.attn") is None
    assert sglang_model.block_index(rotary, "visual", "visual.blocks.x.attn") is None
    assert sglang_model.block_index(SimpleNamespace(), "visual", "visual.blocks.1.attn") is None
    assert sglang_model.is_rotary_tower(rotary) and not sglang_model.is_rotary_tower(QwenTower(72))
