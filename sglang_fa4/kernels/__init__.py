"""The attention kernels: four sub-packages by concern behind their faces (``fa4``, ``fp8_sm90``,
``fp8_paged_kv``, ``vit``) and the modules they share; imports nothing from SGLang.

The public function of each form: :func:`sglang_fa4.kernels.varlen.fa4_varlen_attention` (ViT /
varlen, 16-bit), :func:`sglang_fa4.kernels.fp8_sm90.fp8_varlen_attention` (E4M3 q/k/v) and
:func:`sglang_fa4.kernels.fp8_paged_kv.paged_kv_attention` (SGLang's paged FP8 KV cache).
docs/architecture.md draws the layout. Importing this package imports nothing.
"""
