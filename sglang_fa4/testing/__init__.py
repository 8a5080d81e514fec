"""What tests and checks compare the kernels against; nothing here is used by the serving path.

* :mod:`.reference` -- varlen layouts from segment lengths, the one fp32 reference attention,
  SGLang's page table for a shuffled allocation, the relative error;
* :mod:`.paged_kv_torch` -- the paged FP8 KV kernels' contracts in fp32 torch: what the CPU
  harnesses install in the kernels' place, the pool read back per sequence and the fp32 reference
  attention over it.
"""

from sglang_fa4.testing.reference import (
    attention_fp32,
    cu_seqlens,
    lengths,
    offsets,
    page_table,
    rel_err,
)
from sglang_fa4.testing.paged_kv_torch import paged_attention_fp32

__all__ = ["attention_fp32", "cu_seqlens", "lengths", "offsets", "page_table", "paged_attention_fp32", "rel_err"]
