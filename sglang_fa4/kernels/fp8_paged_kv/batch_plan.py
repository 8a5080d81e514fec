"""The paged FP8 KV route's plan: a batch's host facts, checked and computed once, reused by every layer.

FlashInfer splits paged attention into *plan* (per batch, on the host: which kernel, its grid, its
scratch) and *run* (per layer: the launch). SGLang calls the attention once per layer with the same
batch metadata (page table, lengths, query rows) and layer tensors of one shape, so :func:`plan`
keeps its answer under everything it looked at -- the shapes, dtypes, strides and devices of the
tensors, and the host ints and flags -- and a step's later layers find it ready: no argument
checks, no route choice, no split count or grid arithmetic again; what is left per layer is the
launch (:func:`sglang_fa4.kernels.fp8_paged_kv.attention.run`). The key holds no tensor data (no
device read): a CUDA graph's capture plans once per captured batch size, its replays find that plan.

Every argument is checked here, where it enters the route, and nowhere after it: the page table,
the lengths and query offsets, the pool, q, the descales, ``out``, the window and the scale. A
malformed one raises :class:`~sglang_fa4.kernels.fp8_paged_kv.gather.PagedKVError` naming it.

The route (:class:`PagedPlan` ``.backend``, one rule: :func:`route`): the split-KV kernel
(:mod:`.decode`, the pool read in place) when every sequence brings at most ``split_kv_max_q`` new
tokens (:mod:`sglang_fa4.kernels.settings`, read once) or the LSE is asked for; otherwise the page
gather and the SM90 FP8 forward (:mod:`.extend`) -- but only for a call that forward can run (E4M3
q, a head dim of its table): bf16 q and head dims it lacks (512) take the split-KV kernel at every
call size. Imports nothing from SGLang.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Optional

import torch

from sglang_fa4.kernels.fp8_paged_kv import decode_plan
from sglang_fa4.kernels.fp8_sm90 import SUPPORTED_HEAD_DIMS as GATHER_HEAD_DIMS
from sglang_fa4.kernels.fp8_paged_kv.decode import HEAD_DIMS, UNBOUNDED, sm_count, window_bounds
from sglang_fa4.kernels.fp8_paged_kv.decode_plan import DecodePlan, pow2_at_least
from sglang_fa4.kernels.fp8_paged_kv.gather import _need, check_paged
from sglang_fa4.kernels.settings import settings

FP8 = torch.float8_e4m3fn
SPLIT_KV = "split_kv"
GATHER = "gather"
BACKENDS = (SPLIT_KV, GATHER)
#: plans kept (a server meets one per batch shape and captured batch size: a few dozen)
MAX_PLANS = 1024


@dataclass(frozen=True)
class PagedPlan:
    """One batch's host facts: the shapes the arguments were checked against, the route, and the
    chosen kernel's launch facts. Equal arguments give the same (cached) plan."""

    backend: str  # SPLIT_KV or GATHER
    batch: int
    width: int  # page-table columns
    page_size: int
    kv_heads: int
    q_heads: int
    head_dim: int
    total_q: int
    #: the host bound of new tokens per sequence (None: not given; the split-KV kernel then uses total_q)
    max_seqlen_q: Optional[int]
    causal: bool
    #: SGLang's (left, right) window, -1 unbounded on a side
    window: tuple
    return_lse: bool
    #: per-row image key ranges given (SGLang's Gemma-4 image prefill): the split-KV kernel's IMAGE
    image: bool = False
    #: the split-KV kernel's key bounds (decode.UNBOUNDED for none), its launch plan and scratch
    left: int = 0
    right: int = 0
    decode: Optional[DecodePlan] = None
    #: split-KV: partial outputs (splits, total_q, Hq, d_pow2) and their LSEs (splits, total_q, Hq), fp32
    partial_shape: Optional[tuple] = None
    #: gather route: one query token per sequence with a GQA group to pack (extend.decode_gqa_pack)
    gqa_pack: bool = False
    #: ``out`` given as a bf16 (total_q, Hq, d) tensor with a unit last stride: written directly
    out_direct: bool = False

    @property
    def group(self) -> int:
        return self.q_heads // self.kv_heads


_plans: dict = {}


def _tensor_key(t) -> tuple:
    """What a check looks at in an argument: a tensor's metadata (never its data), else the value."""
    if isinstance(t, torch.Tensor):
        return (t.shape, t.dtype, t.stride(), t.device)
    try:
        hash(t)
    except TypeError:
        return (type(t), id(t))  # an unhashable wrong type: checked (and refused) on every call
    return (type(t), t)


def plan(q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, max_seqlen_q: Optional[int], *,
         k_descale=None, v_descale=None, softmax_scale: Optional[float] = None, causal: bool = False,
         window_size=(-1, -1), out=None, return_lse: bool = False, image_ranges=None,
         backend: Optional[str] = None, num_splits: Optional[int] = None, sms: Optional[int] = None,
         launch: Optional[dict] = None) -> PagedPlan:
    """The plan of a paged call with these arguments, checked and made on the first call with their
    shapes and host values, then found again. ``image_ranges``: (total_q, 2) int32, each query row's
    image as inclusive key positions [begin, end] (-1, -1 for text), keys that row also sees
    (SGLang's Gemma-4 image prefill; the split-KV kernel only). Beyond the call's own arguments, for the split-KV
    kernel's tests, benchmarks and tuning: ``backend`` forces a route, ``num_splits`` a split count,
    ``sms`` the SM count the split choice aims at, ``launch`` the launch config
    (:func:`.decode_plan.plan`)."""
    if backend is None:
        backend = route(getattr(q, "shape", (0,))[-1], getattr(q, "dtype", None), max_seqlen_q, return_lse,
                        image_ranges is not None)
    key = (backend, _tensor_key(q), _tensor_key(k_cache), _tensor_key(v_cache), _tensor_key(page_table),
           _tensor_key(cache_seqlens), _tensor_key(cu_seqlens_q), max_seqlen_q, _tensor_key(k_descale),
           _tensor_key(v_descale), type(softmax_scale), causal,
           tuple(window_size) if isinstance(window_size, (tuple, list)) else window_size,
           _tensor_key(out), return_lse, _tensor_key(image_ranges), num_splits, sms,
           tuple(sorted(launch.items())) if launch else None)
    found = _plans.get(key)
    if found is None:
        found = _make(q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, max_seqlen_q, k_descale, v_descale,
                      softmax_scale, causal, window_size, out, return_lse, image_ranges, backend, num_splits, sms,
                      launch)
        if len(_plans) >= MAX_PLANS:
            _plans.clear()
        _plans[key] = found
    return found


def gather_runs(head_dim, q_dtype) -> bool:
    """The gather route's FP8 forward can take a call: E4M3 q and a head dim of its table."""
    return q_dtype == FP8 and head_dim in GATHER_HEAD_DIMS


def route(head_dim, q_dtype, max_seqlen_q, return_lse: bool, images: bool = False) -> str:
    """The backend of a call (host facts only): the split-KV kernel for decode and short extends
    (``max_seqlen_q`` a host int in 1..``split_kv_max_q``), for an LSE request or image rows, and
    for every call the FP8 forward cannot run (bf16 q; head dim 512: prefills with a cached prefix
    included); the page gather + FP8 forward otherwise."""
    if not gather_runs(head_dim, q_dtype) or return_lse or images:
        return SPLIT_KV
    if isinstance(max_seqlen_q, int) and 0 < max_seqlen_q <= settings().split_kv_max_q:
        return SPLIT_KV  # decode / few new rows: the pool read in place, no gather
    return GATHER


def clear() -> None:
    """Forget every plan (tests; a settings change)."""
    _plans.clear()


def planned() -> int:
    """Plans made and kept (tests)."""
    return len(_plans)


def _make(q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, max_seqlen_q, k_descale, v_descale,
          softmax_scale, causal, window_size, out, return_lse, image_ranges, backend, num_splits, sms,
          launch) -> PagedPlan:
    _need(backend in BACKENDS, f"backend must be one of {BACKENDS}, got {backend!r}")
    _, page_size, hkv, d = check_paged(k_cache, v_cache, page_table, cache_seqlens)
    q_dtypes = (FP8, torch.bfloat16) if backend == SPLIT_KV else (FP8,)  # the split-KV kernel takes bf16 q too
    names = " or ".join(str(dt).replace("torch.", "") for dt in q_dtypes)
    _need(isinstance(q, torch.Tensor) and q.dtype in q_dtypes,
          f"q must be {names} (cast like SGLang's fa3 path), got {getattr(q, 'dtype', type(q).__name__)}")
    _need(q.dim() == 3, f"q must be (tokens, heads, head_dim), got {tuple(q.shape)}")
    total_q, hq, qd = q.shape
    _need(qd == d, f"q's head_dim {qd} differs from the cache's {d}")
    _need(d in HEAD_DIMS, f"head_dim {d} is not one the FP8 KV kernels run ({', '.join(map(str, HEAD_DIMS))})")
    _need(hq % hkv == 0 and hq >= hkv, f"q heads {hq} must be a multiple of kv heads {hkv}")
    _need(q.stride(-1) == 1, f"q's last dim must be contiguous, strides {q.stride()}")
    _need(q.device == k_cache.device, f"q is on {q.device}, the cache on {k_cache.device}")
    batch, width = page_table.shape
    _need(isinstance(cu_seqlens_q, torch.Tensor) and cu_seqlens_q.dtype == torch.int32
          and tuple(cu_seqlens_q.shape) == (batch + 1,),
          f"cu_seqlens_q must be int32 ({batch + 1},) for a page table of {batch} sequences, got "
          f"{(getattr(cu_seqlens_q, 'dtype', None), tuple(getattr(cu_seqlens_q, 'shape', ())))}")
    _need(cu_seqlens_q.device == q.device, f"cu_seqlens_q is on {cu_seqlens_q.device}, q on {q.device}")
    _need(max_seqlen_q is None or (isinstance(max_seqlen_q, int) and not isinstance(max_seqlen_q, bool)
                                   and max_seqlen_q >= 0),
          f"max_seqlen_q must be a host int >= 0 or None, got {max_seqlen_q!r}")
    _need(softmax_scale is None or (isinstance(softmax_scale, numbers.Real) and not isinstance(softmax_scale, bool)),
          f"softmax_scale must be a real number or None, got {softmax_scale!r}")
    for name, x in (("k_descale", k_descale), ("v_descale", v_descale)):
        if x is None:
            continue
        _need(isinstance(x, torch.Tensor), f"{name} must be a tensor, got {type(x).__name__}")
        _need(x.device == q.device, f"{name} is on {x.device}, the cache on {q.device}")
        _need(x.numel() == 1 or tuple(x.shape) == (batch, hkv),
              f"{name} must be a scalar or (batch, kv_heads) = {(batch, hkv)}, got {tuple(x.shape)}")
    out_direct = False
    if out is not None:
        _need(isinstance(out, torch.Tensor) and out.numel() == total_q * hq * d,
              f"out must hold {(total_q, hq, d)}, got {tuple(getattr(out, 'shape', ()))}")
        out_direct = out.dtype == torch.bfloat16 and tuple(out.shape) == (total_q, hq, d) and out.stride(-1) == 1
    if image_ranges is not None:
        _need(isinstance(image_ranges, torch.Tensor) and image_ranges.dtype == torch.int32
              and tuple(image_ranges.shape) == (total_q, 2) and image_ranges.is_contiguous(),
              f"image_ranges must be a contiguous int32 (total_q, 2) = {(total_q, 2)} tensor, got "
              f"{(getattr(image_ranges, 'dtype', type(image_ranges).__name__), tuple(getattr(image_ranges, 'shape', ())))}")
        _need(image_ranges.device == q.device, f"image_ranges is on {image_ranges.device}, q on {q.device}")
        _need(causal, "image_ranges widen a causal mask: causal must be True")
    window = tuple(-1 if w is None else w for w in (window_size or (None, None)))
    left, right = window_bounds(causal, window)  # checks the window and causal together
    facts = dict(backend=backend, batch=batch, width=width, page_size=page_size, kv_heads=hkv, q_heads=hq,
                 head_dim=d, total_q=total_q, max_seqlen_q=max_seqlen_q, causal=bool(causal), window=window,
                 return_lse=bool(return_lse), image=image_ranges is not None, left=left, right=right,
                 out_direct=out_direct)
    if backend == SPLIT_KV:
        _need(page_size & (page_size - 1) == 0, f"page size {page_size} must be a power of two")
        rows = max(max_seqlen_q if max_seqlen_q is not None else total_q, 1)
        launch_plan = decode_plan.plan(batch, hkv, hq // hkv, d, rows, width * page_size, sms or sm_count(q.device),
                                       num_splits, launch=launch)
        partial = ((launch_plan.num_splits, total_q, hq, pow2_at_least(d))
                   if launch_plan.num_splits > 1 else None)
        return PagedPlan(**facts, decode=launch_plan, partial_shape=partial)
    _need(not return_lse, "return_lse: only the split-KV kernel computes the LSE")
    _need(image_ranges is None, "image_ranges: only the split-KV kernel takes image rows")
    _need(d in GATHER_HEAD_DIMS, f"head_dim {d}: the gather route's SM90 FP8 forward runs "
                                 f"{', '.join(map(str, GATHER_HEAD_DIMS))} (the split-KV kernel takes it)")
    return PagedPlan(**facts, gqa_pack=decode_gqa_packable(q, batch, hkv, max_seqlen_q, left, right))


def decode_gqa_packable(q, batch: int, hkv: int, max_seqlen_q: Optional[int], left: int, right: int) -> bool:
    """Exactly one query token per sequence (host facts: ``max_seqlen_q`` 1 and ``batch`` rows),
    more q heads than kv heads, no bounded window (``left``/``right``: :func:`.decode.window_bounds`;
    a window moves with the query position, which packing would misplace): the gather route can
    pack the GQA group (:func:`.extend.decode_gqa_pack`)."""
    local = left != UNBOUNDED or right not in (0, UNBOUNDED)
    return max_seqlen_q == 1 and q.shape[0] == batch and batch > 0 and q.shape[1] > hkv and not local
