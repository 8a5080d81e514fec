"""The paged FP8 KV form's one public function, and the per-layer run of a plan.

:func:`paged_kv_attention` is what SGLang's fa4 backend on an fp8_e4m3 pool reaches (through
``integration/llm_fp8_kv``): :func:`.batch_plan.plan` (the arguments checked and the route chosen once
per batch shape, then found again) and :func:`run` (the launch). A caller that holds the batch's
plan -- a benchmark timing the layers, the split-KV kernel's tests -- calls :func:`run` with it
directly, as FlashInfer's ``plan`` / ``run``.

The two backends never come back here: the split-KV kernel (:func:`.decode.launch`) and the page
gather + SM90 FP8 forward (:func:`.extend.run`). Which gather runs is a seam
(:func:`install_kernels`): the CPU harnesses install the torch models of the kernels' contracts
(``sglang_fa4.testing.paged_kv_torch``); nothing on the launch path looks at the device.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

from sglang_fa4.kernels.fp8_paged_kv import decode, extend, gather
from sglang_fa4.kernels.fp8_paged_kv.batch_plan import SPLIT_KV, PagedPlan, plan


class Kernels(NamedTuple):
    """The launches a plan's run ends in (the CUDA / Triton-interpreter ones by default)."""

    #: split_kv(plan, q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, k_descale, v_descale,
    #: softmax_scale, out[, image_ranges=]) -> out, or (out, lse) for a plan with return_lse
    #: (image_ranges passed only for a plan with image rows)
    split_kv: Callable
    #: gather(k_cache, v_cache, page_table, cache_seqlens, sizes) -> (k, vt, cu_seqlens_k, max_seqlen_k)
    gather: Callable


DEFAULT_KERNELS = Kernels(decode.launch, gather.gather_paged_kv_vt)
_kernels = DEFAULT_KERNELS


def install_kernels(kernels: Optional[Kernels]) -> Kernels:
    """Use ``kernels`` for every later run (None: the default ones); returns the previous ones."""
    global _kernels
    previous, _kernels = _kernels, kernels or DEFAULT_KERNELS
    return previous


def installed_kernels() -> Kernels:
    """The kernels runs use now."""
    return _kernels


def run(plan: PagedPlan, q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, *, k_descale=None,
        v_descale=None, softmax_scale: Optional[float] = None, out=None, image_ranges=None):
    """One layer of ``plan`` (arguments of the shapes it was made for): bf16 (total_q, Hq, d), into
    ``out`` when given; (out, lse (Hq, total_q)) for a plan with ``return_lse``."""
    if plan.backend == SPLIT_KV:
        images = {"image_ranges": image_ranges} if plan.image else {}
        return _kernels.split_kv(plan, q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, k_descale,
                                 v_descale, softmax_scale, out, **images)
    return extend.run(plan, q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, k_descale, v_descale,
                      softmax_scale, out, _kernels.gather)


def paged_kv_attention(q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, max_seqlen_q: Optional[int],
                       *, k_descale=None, v_descale=None, softmax_scale: Optional[float] = None,
                       causal: bool = False, window_size=(-1, -1), out=None, return_lse: bool = False,
                       image_ranges=None):
    """E4M3 q (total_q, Hq, d) against SGLang's paged E4M3 pool -> bf16 (total_q, Hq, d) (bf16 q at
    head dim 512, and wherever the split-KV kernel runs).

    ``k_cache``/``v_cache``: (pages, page_size, kv heads, d) E4M3 (or its uint8 storage);
    ``page_table`` (batch, pages per sequence) int32; ``cache_seqlens`` (batch,) int32, each
    sequence's cached tokens, new ones included; ``cu_seqlens_q`` (batch + 1,) int32 and
    ``max_seqlen_q`` (a host int, or None) the new query rows; ``k_descale``/``v_descale`` the
    pool's scales, scalar or (batch, kv heads). The causal diagonal is bottom-right aligned (query i
    of a sequence with n new tokens sees keys up to ``cache_seqlens[b] - n + i``): extend with a
    cached prefix and decode alike; ``window_size`` is SGLang's (left, right), -1 unbounded.
    ``out``: written when it is a bf16 tensor of the result's shape, else the result is copied into
    it. ``return_lse``: (out, lse (Hq, total_q)) as FlashAttention's varlen call returns them.
    ``image_ranges``: (total_q, 2) int32 inclusive key positions of each row's image (-1, -1 for
    text), keys a causal row also sees (SGLang's Gemma-4 image prefill).
    Decode and short extends run the split-KV kernel (the pool read in place), longer extends the
    page gather + SM90 FP8 forward, unless that forward cannot run the call (:mod:`.batch_plan`)."""
    p = plan(q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, max_seqlen_q, k_descale=k_descale,
             v_descale=v_descale, softmax_scale=softmax_scale, causal=causal, window_size=window_size, out=out,
             return_lse=return_lse, image_ranges=image_ranges)
    return run(p, q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, k_descale=k_descale,
               v_descale=v_descale, softmax_scale=softmax_scale, out=out, image_ranges=image_ranges)


def paged_decode_attention(q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, max_seqlen_q: Optional[int],
                           *, k_descale=None, v_descale=None, softmax_scale: Optional[float] = None,
                           causal: bool = False, window_size=(-1, -1), out=None, return_lse: bool = False,
                           num_splits: Optional[int] = None, sms: Optional[int] = None,
                           launch: Optional[dict] = None, image_ranges=None):
    """The split-KV kernel on any call (its tests, the decode benchmark, the tuning lab): a plan
    with that backend forced (``num_splits``, ``sms``, ``launch``: :func:`.batch_plan.plan`'s options),
    then its run. q may be bf16 here (converted to fp16 in registers)."""
    p = plan(q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, max_seqlen_q, k_descale=k_descale,
             v_descale=v_descale, softmax_scale=softmax_scale, causal=causal, window_size=window_size, out=out,
             return_lse=return_lse, image_ranges=image_ranges, backend=SPLIT_KV, num_splits=num_splits, sms=sms,
             launch=launch)
    return run(p, q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, k_descale=k_descale,
               v_descale=v_descale, softmax_scale=softmax_scale, out=out, image_ranges=image_ranges)
