"""What the paged FP8 KV route compiles per layer shape, for the warmup registry.

Two Triton families: the split-KV decode kernel (``fp8_paged_decode``, a :class:`SplitKvShape`:
decode with one split and with several, with and without the LSE, in each launch the plan may
choose (:func:`.decode_plan.launch_variants`), and the extend row blocks up to
the route's ``split_kv_max_q`` new tokens -- every row block size for a layer that takes this
kernel at every call size, head dim 512 with its bf16 q) and the page gather (``fp8_paged_gather``,
a :class:`~.gather.GatherShape`). The SM90 FP8 forward variants the gather route launches are the
``fp8_forward`` family's (:mod:`sglang_fa4.kernels.fp8_sm90`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from sglang_fa4.kernels import compile_events
from sglang_fa4.kernels.compile_events import KernelFamily
from sglang_fa4.kernels.fp8_paged_kv import gather
from sglang_fa4.kernels.fp8_paged_kv.attention import paged_decode_attention
from sglang_fa4.kernels.fp8_paged_kv.batch_plan import gather_runs
from sglang_fa4.kernels.fp8_paged_kv.decode_plan import block_m, launch_variants, max_block_m

FP8 = torch.float8_e4m3fn


class SplitKvShape(NamedTuple):
    """One layer shape of the split-KV kernel, and the most new tokens per sequence it takes."""

    head_dim: int
    q_heads: int
    kv_heads: int
    page_size: int
    max_q: int  # SGLANG_FA4_FP8_KV_SPLIT_KV_MAX_Q when the warmup list was made
    q_dtype: str = "float8_e4m3fn"  # the q the route hands the kernel (torch dtype name)
    images: bool = False  # a multimodal model: image prefill rows (SGLang's Gemma-4 image mask) at any size

    def every_call(self) -> bool:
        """The layer takes the split-KV kernel at every call size (the gather's FP8 forward cannot
        run it: bf16 q, head dim 512), prefills included."""
        return not gather_runs(self.head_dim, getattr(torch, self.q_dtype))

    def describe(self) -> str:
        q = "" if self.q_dtype == "float8_e4m3fn" else f" q={self.q_dtype}"
        rows = "every call" if self.every_call() else f"new tokens <= {self.max_q}"
        images = ", image rows" if self.images else ""
        return (f"fp8 split-KV decode d={self.head_dim} heads={self.q_heads}/{self.kv_heads} page={self.page_size}"
                f"{q} {rows}{images}")

    def as_dict(self) -> dict[str, Any]:
        return self._asdict()


def warm_split_kv(shape: SplitKvShape, device) -> int:
    """Resolve (compile, or load from Triton's disk cache) the variants the route launches for
    ``shape``, one small call each on ``device``; returns how many were newly resolved."""
    before = compile_events.count("triton")
    d, hq, hkv, page, limit = shape[:5]
    group = hq // hkv
    # one max_seqlen_q per row block size the route can meet (rows = new tokens x group): up to the
    # route's limit, or every size (they stop growing at max_block_m rows) for a layer on this
    # kernel at every call size or with image prefills
    every_size = max(limit, -(-max_block_m(d) // group))
    top = every_size if shape.every_call() or shape.images else limit
    rows_for = {}
    for max_q in range(1, top + 1):
        rows_for.setdefault(block_m(max_q * group, d), max_q)
    cache = torch.zeros((4, page, hkv, d), dtype=FP8, device=device)
    table = torch.zeros((1, 2), dtype=torch.int32, device=device)
    for bm, max_q in sorted(rows_for.items(), key=lambda kv: kv[1]):
        seqlens = torch.tensor([max_q + 1], dtype=torch.int32, device=device)
        cu = torch.tensor([0, max_q], dtype=torch.int32, device=device)
        q = torch.zeros((max_q, hq, d), dtype=getattr(torch, shape.q_dtype), device=device)
        plain = max_q <= limit or shape.every_call()  # else only image prefills take this kernel there
        images = torch.full((max_q, 2), -1, dtype=torch.int32, device=device)
        # each launch the plan may choose for this row block by itself (above head dim 128 the split
        # regime's and the filled GPU's: a small warm call would plan only one of them)
        for launch in launch_variants(d, bm):
            for splits in (1, 2):
                for lse in ((False, True) if max_q == 1 and plain else (False,)):
                    if plain:
                        paged_decode_attention(q, cache, cache, table, seqlens, cu, max_q, causal=True,
                                               num_splits=splits, return_lse=lse, launch=launch or None)
                    if shape.images and not lse:
                        paged_decode_attention(q, cache, cache, table, seqlens, cu, max_q, causal=True,
                                               num_splits=splits, image_ranges=images, launch=launch or None)
    return compile_events.count("triton") - before


def _how(new: int) -> str:
    return f"{new} resolved" if new else "cached"


#: the warmup registry's paged FP8 KV families (:mod:`sglang_fa4.kernels.warmup`)
FAMILIES = (
    KernelFamily("fp8_paged_decode", "triton", lambda shape, device: _how(warm_split_kv(shape, device))),
    KernelFamily("fp8_paged_gather", "triton", gather.warm_shape),
)
