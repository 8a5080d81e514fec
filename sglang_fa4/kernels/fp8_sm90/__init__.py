"""Native FP8 (E4M3 Q/K/V) attention forward for SM90 (H100/H200), written in CuTe DSL.

* :mod:`.layout`   -- pure-Python facts: supported shapes, the P/V key permutation, the V^T
  layout the kernel reads, variant keys.
* :mod:`.kernel_config` -- the compile-time config of each kernel: one table, one row per variant.
* :mod:`.forward`  -- the CuTe DSL kernel's class and host side (imports cutlass), mixing in
  :mod:`.kernel_entry` (device entry, producer), :mod:`.consumer_mainloop` /
  :mod:`.consumer_mainloop_wide` (GEMM main loops, epilogue), :mod:`.tile_softmax` (mask, online
  softmax, P -> E4M3), the persistent kernel's :mod:`.persistent_entry` / :mod:`.persistent_consumer`
  and :mod:`.first_key_tile`, :mod:`.kv_pipes`, :mod:`.schedule`; :mod:`.kernel_shape`.
* :mod:`.launch`   -- compile-once cache, argument checks and :func:`fp8_varlen_attention` (torch
  tensors in): the public function of the contiguous E4M3 form.
* :mod:`.vt_pack`  -- V -> the permuted V^T buffer the kernel reads (Triton), and its torch reference.

Outside this package only the names below are used; the torch-using ones are imported on first
access (the layout facts are pure Python). Imports nothing from SGLang.
"""

from sglang_fa4.kernels.fp8_sm90.layout import (
    SUPPORTED_HEAD_DIMS,
    VT_ALIGN,
    Fp8Variant,
    all_variants,
    padded_head_dim,
    pow2_at_least,
    variant_for,
    vt_column_offset,
    vt_columns,
    vt_region_end,
    vt_source_key,
)

__all__ = [
    # variants and the input layout (pure)
    "SUPPORTED_HEAD_DIMS", "Fp8Variant", "all_variants", "variant_for", "padded_head_dim", "pow2_at_least",
    "VT_ALIGN", "vt_columns", "vt_column_offset", "vt_region_end", "vt_source_key",
    # the forward (torch; cutlass on the first compile)
    "fp8_varlen_attention", "Fp8AttentionError", "compiled_kernel", "FAMILIES",
    # V -> V^T
    "pack_vt", "pack_vt_reference", "unpack_vt_reference",
]

_LAUNCH = ("fp8_varlen_attention", "Fp8AttentionError", "compiled_kernel", "FAMILIES")
_VT_PACK = ("pack_vt", "pack_vt_reference", "unpack_vt_reference")


def __getattr__(name: str):
    """The torch-using names, imported on first access."""
    if name in _LAUNCH:
        from sglang_fa4.kernels.fp8_sm90 import launch as module
    elif name in _VT_PACK:
        from sglang_fa4.kernels.fp8_sm90 import vt_pack as module
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = globals()[name] = getattr(module, name)  # looked up here once
    return value
