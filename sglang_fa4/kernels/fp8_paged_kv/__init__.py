"""Attention over SGLang's paged FP8 (E4M3) KV cache on SM90: the LLM's fa4 backend on an fp8_e4m3 pool.

* :mod:`.attention` -- :func:`paged_kv_attention`, the form's one public function (plan, then
  run), and :func:`run` for a caller holding a plan;
* :mod:`.batch_plan` -- the route's plan: the arguments checked and the backend, launch plan and scratch
  sizes chosen once per batch shape, reused by every layer (FlashInfer's plan / run);
* :mod:`.decode` -- the split-KV kernel (decode and short extends: the pool read in place, Triton),
  :mod:`.decode_plan` -- its split count and launch config (pure);
* :mod:`.extend` -- longer extends: the pages gathered (:mod:`.gather`, one Triton launch) for the
  SM90 FP8 forward, the GQA group packed on decode-shaped calls;
* :mod:`.warmup` -- what it compiles per layer shape (:data:`FAMILIES`).

A new head dim is a row of ``decode.HEAD_DIMS`` with its block sizes in :mod:`.decode_plan`, and
of the FP8 forward's table for the gather route; one the FP8 forward lacks (512: Gemma-4's full
layers) runs the split-KV kernel at every call size (:func:`.batch_plan.route`). Outside this
package only the names below are used. Imports nothing from SGLang.
"""

from sglang_fa4.kernels.fp8_paged_kv.attention import (
    Kernels,
    install_kernels,
    installed_kernels,
    paged_decode_attention,
    paged_kv_attention,
    run,
)
from sglang_fa4.kernels.fp8_paged_kv.decode import DEFAULT_SM_COUNT, HEAD_DIMS, kv_bytes_read, sm_count
from sglang_fa4.kernels.fp8_paged_kv.decode_plan import CANDIDATE as DECODE_CANDIDATE
from sglang_fa4.kernels.fp8_paged_kv.decode_plan import DecodePlan, choose_splits
from sglang_fa4.kernels.fp8_paged_kv.decode_plan import plan as decode_launch_plan
from sglang_fa4.kernels.fp8_paged_kv.gather import (
    GatherShape,
    PagedKVError,
    bytes_moved,
    exact_sizes,
    gather_paged_kv,
    gather_paged_kv_vt,
)
from sglang_fa4.kernels.fp8_paged_kv.batch_plan import GATHER, SPLIT_KV, PagedPlan, plan
from sglang_fa4.kernels.fp8_paged_kv.warmup import FAMILIES, SplitKvShape

__all__ = [
    "paged_kv_attention", "plan", "run", "PagedPlan", "SPLIT_KV", "GATHER", "paged_decode_attention",
    "DecodePlan", "DECODE_CANDIDATE", "choose_splits", "decode_launch_plan", "sm_count", "DEFAULT_SM_COUNT", "HEAD_DIMS", "kv_bytes_read", "PagedKVError",
    "GatherShape", "gather_paged_kv", "gather_paged_kv_vt", "exact_sizes", "bytes_moved", "Kernels",
    "install_kernels", "installed_kernels", "SplitKvShape", "FAMILIES",
]
