"""Benchmarks: `sglang-fa4 bench kernels` (attention kernels alone) and `sglang-fa4 bench vit`
(a transformers vision tower end to end). Pure-Python parts (layouts, statistics, report schema)
import without torch; everything touching the GPU imports it lazily."""
