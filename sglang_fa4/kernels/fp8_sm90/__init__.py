"""Native FP8 (E4M3 Q/K/V) attention forward for SM90 (H100/H200), written in CuTe DSL.

* :mod:`.layout`   -- pure-Python facts: supported shapes, the P/V key permutation, variant keys.
* :mod:`.kernel_config` -- the compile-time config of each kernel: one table, one row per variant.
* :mod:`.forward`  -- the CuTe DSL kernel's class and host side (imports cutlass), mixing in
  :mod:`.kernel_entry` (device entry, producer), :mod:`.consumer_mainloop` (GEMM main loop,
  epilogue), :mod:`.tile_softmax` (mask, online softmax, P -> E4M3); :mod:`.kernel_shape`.
* :mod:`.launch`   -- compile-once cache and :func:`fp8_varlen_attention` (torch tensors in).
* :mod:`.vt_pack`  -- V -> the permuted V^T buffer the kernel reads (Triton).
* :mod:`.quantize` -- bf16 q/k/v -> E4M3 + per-(batch, kv head) descales on the device (Triton).

Imports nothing from SGLang.
"""

from sglang_fa4.kernels.fp8_sm90.layout import SUPPORTED_HEAD_DIMS, Fp8Variant, all_variants, variant_for


def fp8_varlen_attention(*args, **kwargs):
    """See :func:`sglang_fa4.kernels.fp8_sm90.launch.fp8_varlen_attention` (imported lazily)."""
    from sglang_fa4.kernels.fp8_sm90.launch import fp8_varlen_attention as impl

    return impl(*args, **kwargs)


def quantize_qkv(*args, **kwargs):
    """See :func:`sglang_fa4.kernels.fp8_sm90.quantize.quantize_qkv` (imported lazily)."""
    from sglang_fa4.kernels.fp8_sm90.quantize import quantize_qkv as impl

    return impl(*args, **kwargs)


__all__ = ["SUPPORTED_HEAD_DIMS", "Fp8Variant", "all_variants", "variant_for", "fp8_varlen_attention", "quantize_qkv"]
