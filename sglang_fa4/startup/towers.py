"""What a loaded vision model's modules say about its attention, read duck-typed from public
attributes (no SGLang import): its fa4 ``VisionAttention`` modules, their dtype and device,
Qwen2.5-VL-style towers' full-attention blocks and window size, fixed-resolution towers' tokens
per image. The warmup's variant enumeration and the ViT graph budgets read the same facts here.
"""

from __future__ import annotations

from typing import Any, Optional

from sglang_fa4.selection import FA4

#: Qwen2.5-VL: window_size 112 px / patch 14 px -> 8 x 8 patches
DEFAULT_WINDOW_TOKENS = 64


def is_fa4_attention(module) -> bool:
    return (
        getattr(module, "qkv_backend_name", None) == FA4
        and hasattr(module, "head_size")
        and hasattr(module, "num_attention_heads_per_partition")
        and hasattr(module, "num_attention_kv_heads_per_partition")
    )


def find_fa4_attention(model) -> list[tuple[str, Any]]:
    """(name, module) of every fa4 VisionAttention in ``model``."""
    if model is None or not hasattr(model, "named_modules"):
        return []
    return [(name, m) for name, m in model.named_modules() if is_fa4_attention(m)]


def dtype_name(dtype) -> Optional[str]:
    name = str(dtype).replace("torch.", "")
    return name if name in ("bfloat16", "float16") else None


def module_dtype(module, default: str = "bfloat16") -> str:
    """The activation dtype an attention module runs in: its qkv projection's weight dtype when
    that is fp16/bf16 (quantised weights are not), else any fp16/bf16 parameter, else default."""
    proj = getattr(module, "qkv_proj", None)
    weight = getattr(proj, "weight", None)
    name = dtype_name(getattr(weight, "dtype", None))
    if name:
        return name
    if hasattr(module, "parameters"):
        for p in module.parameters():
            name = dtype_name(p.dtype)
            if name:
                return name
    return default


def module_device(module):
    if hasattr(module, "parameters"):
        for p in module.parameters():
            return p.device
    return None


def full_attention_blocks(tower) -> frozenset:
    """Indexes of a windowed tower's full-attention blocks (Qwen2.5-VL ``fullatt_block_indexes``,
    a list or a tensor); empty for a tower without them."""
    indexes = getattr(tower, "fullatt_block_indexes", None)
    if indexes is None:
        return frozenset()
    if hasattr(indexes, "tolist"):
        indexes = indexes.tolist()
    return frozenset(int(i) for i in indexes)


def window_tokens(tower) -> int:
    """Tokens per attention window of a windowed tower: ``(window_size // patch_size) ** 2``
    (Qwen2.5-VL: 64), or DEFAULT_WINDOW_TOKENS when the tower does not say."""
    window, patch = getattr(tower, "window_size", None), getattr(tower, "patch_size", None)
    if isinstance(window, int) and isinstance(patch, int) and 0 < patch <= window:
        return (window // patch) ** 2
    return DEFAULT_WINDOW_TOKENS


def own_fixed_seqlen(module) -> Optional[int]:
    """Tokens per image if ``module`` is a fixed-resolution tower (InternViT, SigLIP...)."""
    emb = getattr(module, "embeddings", None)
    num = getattr(emb, "num_positions", None)
    if isinstance(num, int) and num > 0:
        return num
    config = getattr(module, "config", None)
    size, patch = getattr(config, "image_size", None), getattr(config, "patch_size", None)
    if (
        isinstance(size, int) and isinstance(patch, int) and patch > 0
        and getattr(config, "spatial_merge_size", None) is None
        and getattr(config, "temporal_patch_size", None) is None
    ):
        return (size // patch) ** 2
    return None
