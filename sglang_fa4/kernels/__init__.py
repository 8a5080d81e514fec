"""Attention kernels of sglang-fa4 that import nothing from SGLang (CuTe DSL / Triton / torch only)."""
