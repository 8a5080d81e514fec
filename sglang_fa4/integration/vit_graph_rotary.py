"""The fused rotary in SGLang's ViT graph path: an AROUND hook on
``vision.apply_rotary_pos_emb_native_eager``, the unfused fp32 rotary ``VisionAttention`` calls when
SGLANG_VIT_ENABLE_CUDA_GRAPH is set (0.5.20 and 0.5.23 alike; torch.compile's rotary would compile
inside the capture). Our Triton kernel (:mod:`sglang_fa4.kernels.vit.rotary`) runs the shapes the
startup warmup compiled it for; anything else runs SGLang's.

SGLang's hook registry also rebinds the name where its torch.compile'd rotary calls it, so the body
starts with ``torch.compiler.is_compiling()``: a traced call is SGLang's original, nothing of ours
enters an Inductor graph. torch is imported at module level for that reason (no import statement
inside the traced body).
"""

from __future__ import annotations

import torch

from sglang_fa4.kernels import vit

VISION = "sglang.srt.layers.attention.vision"
ROTARY_NATIVE_EAGER = f"{VISION}.apply_rotary_pos_emb_native_eager"


def around_native_eager(original, q, k, cos, sin, unsqueeze_dim=1):
    """AROUND vision.apply_rotary_pos_emb_native_eager: the fused kernel where :func:`sglang_fa4.kernels.vit.usable`."""
    if torch.compiler.is_compiling():
        return original(q, k, cos, sin, unsqueeze_dim)
    if vit.usable(q, k, cos, sin, unsqueeze_dim):
        return vit.apply_rotary(q, k, cos, sin, checked=True)
    return original(q, k, cos, sin, unsqueeze_dim)
