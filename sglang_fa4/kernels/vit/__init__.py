"""The ViT-only kernels: the short-window route (SM90 windows leave FA4 for a Triton kernel or FA2),
the fused rotary of SGLang's ViT graph path, and FP8 ViT attention (bf16 q/k/v quantized on the
device, then the SM90 FP8 forward), with the measured table that says when a call takes it.

* :mod:`.short_windows` -- the route's rule and call; :mod:`.short_window_kernel` its Triton kernel;
* :mod:`.rotary` -- the fused rotary (:mod:`.rotary_triton`, its Triton kernel);
* :mod:`.attn_dtype` -- when a ViT call runs FP8, and the call; :mod:`.fp8_quantize`,
  :mod:`.fp8_quantize_chunked` -- bf16 -> E4M3 + descales (one launch; over token chunks);
* :mod:`.shape` -- what the kernels compile per; :data:`FAMILIES` -- their warmup entries.

Outside this package only the names below are used. Imports nothing from SGLang.
"""

from sglang_fa4.kernels.compile_events import KernelFamily
from sglang_fa4.kernels.vit.attn_dtype import (
    FP8_MIN_SEGMENT,
    fp8_attention,
    fp8_enabled,
    min_segment_table,
    set_min_segment_table,
    use_fp8,
)
from sglang_fa4.kernels.vit.rotary import apply_rotary, supported, usable
from sglang_fa4.kernels.vit.shape import VitShape
from sglang_fa4.kernels.vit.short_window_kernel import BLOCK_S, short_window_attention
from sglang_fa4.kernels.vit.short_windows import ROUTED_ARCHS, TRITON_HEAD_DIMS, fa2_varlen_attention, should_route, short_attention
from sglang_fa4.kernels.vit import attn_dtype as _attn_dtype, rotary as _rotary, short_window_kernel as _short

#: the warmup registry's ViT families (:mod:`sglang_fa4.kernels.warmup`), each warming a VitShape
FAMILIES = (
    KernelFamily("vit_rotary", "triton", _rotary.warm_shape),
    KernelFamily("vit_short_window", "triton", _short.warm_shape),
    KernelFamily("fp8_vit", "fp8_quantize", _attn_dtype.warm_shape),
)



def __getattr__(name: str):
    """The quantize (its module imports Triton), imported on first access."""
    if name in ("quantize_qkv", "Fp8QKV"):
        from sglang_fa4.kernels.vit import fp8_quantize

        value = globals()[name] = getattr(fp8_quantize, name)
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "short_attention", "should_route", "fa2_varlen_attention", "short_window_attention", "ROUTED_ARCHS",
    "TRITON_HEAD_DIMS", "BLOCK_S", "apply_rotary", "supported", "usable", "fp8_attention", "use_fp8",
    "fp8_enabled", "min_segment_table", "set_min_segment_table", "FP8_MIN_SEGMENT", "quantize_qkv", "Fp8QKV",
    "VitShape", "FAMILIES",
]
