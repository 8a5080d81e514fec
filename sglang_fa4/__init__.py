"""sglang-fa4: FlashAttention-4 as SGLang's vision-transformer attention backend.

Importing this package is cheap: it never imports torch's CUDA extensions, flash_attn or CUTLASS.
"""

__version__ = "0.1.0"
