"""What sglang-fa4 reads off SGLang's loaded vision models: the one module that knows the
attribute names of SGLang's model objects (``VisionAttention``'s ``qkv_backend_name``,
``head_size``, ``num_attention_heads_per_partition``...; Qwen2.5-VL's ``fullatt_block_indexes``,
``window_size``, ``blocks``, ``rotary_pos_emb``; InternViT's ``embeddings.num_positions``...).

Read duck-typed from public attributes, with no SGLang import, so the startup layer (the warmup's
variant enumeration, the Triton warmup) and the integration (the ViT graph budgets) can both ask it;
an SGLang release that renames one of these is a diff of this file. ``SGLANG_ATTRIBUTES`` lists
the names; tests/test_architecture.py checks no module outside ``integration/`` and this one reads them.
"""

from __future__ import annotations

from typing import Any, Optional

from sglang_fa4.selection import FA4

#: Qwen2.5-VL: window_size 112 px / patch 14 px -> 8 x 8 patches
DEFAULT_WINDOW_TOKENS = 64

#: the attribute names of SGLang's model objects read here (and under integration/) only
SGLANG_ATTRIBUTES = frozenset({
    "qkv_backend_name", "head_size", "num_attention_heads_per_partition",
    "num_attention_kv_heads_per_partition", "qkv_proj", "sinks", "fullatt_block_indexes",
    "window_size", "patch_size", "blocks", "rotary_pos_emb", "embeddings", "num_positions",
    "image_size", "spatial_merge_size", "temporal_patch_size",
})


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


def attention_shape(module) -> tuple[int, int, int]:
    """(head dim, query heads, kv heads) of one tensor-parallel rank's fa4 attention module."""
    return (int(module.head_size), int(module.num_attention_heads_per_partition),
            int(module.num_attention_kv_heads_per_partition))


def attention_sinks(module):
    """The module's learnable attention sinks (MiMo-VL: a per-head tensor), None without them."""
    return getattr(module, "sinks", None)


def sink_dtype(module) -> Optional[str]:
    """The dtype name of the module's attention sinks ("float32"...), None without them."""
    sinks = attention_sinks(module)
    if sinks is None:
        return None
    return dtype_name(sinks.dtype) or str(sinks.dtype).replace("torch.", "")


def attention_window(module):
    """The module's own ``window_size`` (a sliding window, with sinks: MiMo-VL), None without one."""
    return getattr(module, "window_size", None)


def windowed_towers(model) -> list[tuple[str, Any]]:
    """(name, module) of the towers that lay their blocks out on windows + full attention
    (Qwen2.5-VL: ``fullatt_block_indexes``)."""
    return [(name, m) for name, m in model.named_modules()
            if getattr(m, "fullatt_block_indexes", None) is not None]


def block_index(tower, tower_name: str, module_name: str) -> Optional[int]:
    """The index of the tower block that holds ``module_name`` (``<tower>.blocks.<i>.``...), None
    when the tower has no ``blocks`` or the module is not in one."""
    prefix = f"{tower_name}.blocks." if tower_name else "blocks."
    if getattr(tower, "blocks", None) is None or not module_name.startswith(prefix):
        return None
    index = module_name[len(prefix):].split(".", 1)[0]
    return int(index) if index.isdigit() else None


def is_rotary_tower(module) -> bool:
    """A tower with a rotary position embedding (Qwen2.5-VL, Qwen3-VL: ``rotary_pos_emb``)."""
    return hasattr(module, "rotary_pos_emb") and hasattr(module, "blocks")
