"""A paged E4M3 KV cache (SGLang's fp8_e4m3 token pool) -> the contiguous K and permuted V^T the SM90
FP8 forward reads by TMA, in ONE Triton launch.

The kernel (:mod:`sglang_fa4.kernels.fp8_sm90`) reads K as one contiguous (total_k, Hkv, d)
tensor, sequence b at rows ``cu_seqlens_k[b] ..``, and V as the permuted V^T buffer of
:mod:`~sglang_fa4.kernels.fp8_sm90.vt_pack` (Hkv, d, cols): sequence b's columns start at the
16-aligned ``layout.vt_column_offset(cu_seqlens_k[b], b)``, column r holds key
``layout.vt_source_key(r)`` (keys permuted inside groups of 16), zeros past the keys.  A paged cache
is neither, so every routed call builds both from the page table:

* :func:`gather_paged_kv_vt` (the route): one program per (block of ``BLOCK_T`` keys, sequence, kv
  head) computes its sequence's start (a prefix sum of ``cache_seqlens``, also written out as
  ``cu_seqlens_k``), reads the block's K and V rows from their pages once (page ``page_table[b, t //
  P]``, offset ``t % P``: SGLang's layout) and writes the K rows and the V^T columns.  No host sync,
  no allocation but the outputs: CUDA-graph capturable.
* :func:`gather_paged_kv` + ``vt_pack.pack_vt`` (torch index ops, then one Triton launch): the
  previous route, kept as the reference the fused kernel is tested against (bitwise), for
  side-by-side timing (``benchmark/release/check_fp8_kv_route.py``) and as the CPU harnesses'
  model of the gather (``sglang_fa4.testing.paged_kv_torch``).

Bytes per call, T cached tokens of the batch, Hkv x d bytes per token and tensor: the fused kernel
reads K and V once and writes K and V^T once, 4 T Hkv d (plus the page table, T / P int32), the
floor for any gather into the kernel's layout (2x what the attention then reads: the route moves
3x the attention's bytes at best).  The torch path moved ~6.6 T Hkv d at Hkv=4, d=128 (4.6x the
attention's): K/V read and written by ``index_select`` (4), V read and written again by the pack
(2), and ~19 elementwise int64 passes over the rows computing the slots (~300 bytes a row against
2 Hkv d = 1024), in ~20 launches.  Only a kernel reading pages through the page table itself
removes the gather.

Sizing: exact from one read-back of the lengths per forward (:func:`exact_sizes`: SGLang hands
every layer the same ``cache_seqlens`` tensor); while a CUDA graph is captured (SGLang's decode
graphs) by the host bound ``batch * page_table.shape[1] * page_size`` rows (that buffer is batch x
context-length rows of graph-pool memory SGLang's KV sizing does not know about).  With the bound,
K rows past the last sequence are not written (the kernel's S mask is a select: nothing read there
reaches O) and V^T columns are written up to a key tile past each sequence's keys (every column the
kernel can read; the torch path's pack stopped at ``max_seqlen_k + 48``, short of a 192-key tile
past a sequence at the bound).

Imports nothing from SGLang; Triton and the device are only touched by the launch.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from sglang_fa4.kernels import compile_events
from sglang_fa4.kernels.fp8_sm90 import VT_ALIGN, pow2_at_least, vt_columns
from sglang_fa4.kernels.triton_handles import KernelHandles

FP8 = torch.float8_e4m3fn
#: keys (K rows / V^T columns) per program
BLOCK_T = 64
#: cache_seqlens entries a program reads per step of its prefix sum
BLOCK_B = 128
#: the widest key tile the FP8 forward reads (forward.Fp8AttentionForwardSm90: 128, 192 wide, debug
#: options up to 256): how far past a sequence's keys its V^T columns must be finite
MAX_KEY_TILE = 256


class PagedKVError(ValueError):
    """The paged cache or its metadata cannot be used (the message says which argument)."""


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise PagedKVError(msg)


def check_paged(k_cache, v_cache, page_table, cache_seqlens) -> tuple[int, int, int, int]:
    """(pages, page_size, Hkv, d) after checking the cache and metadata shapes/dtypes."""
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        _need(isinstance(t, torch.Tensor) and t.dim() == 4,
              f"{name} must be a (pages, page_size, kv_heads, head_dim) tensor, got "
              f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
        _need(t.dtype in (FP8, torch.uint8), f"{name} must be float8_e4m3fn (or its uint8 storage), got {t.dtype}")
        _need(t.is_contiguous(), f"{name} must be contiguous (SGLang's NHD page layout), strides {t.stride()}")
    _need(tuple(k_cache.shape) == tuple(v_cache.shape),
          f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} must have one shape (v_head_dim == head_dim)")
    _need(isinstance(page_table, torch.Tensor) and page_table.dim() == 2 and page_table.dtype == torch.int32,
          f"page_table must be int32 (batch, pages_per_seq), got "
          f"{(page_table.dtype, tuple(page_table.shape)) if isinstance(page_table, torch.Tensor) else page_table!r}")
    _need(page_table.stride(1) == 1, f"page_table rows must be contiguous, strides {page_table.stride()}")
    _need(isinstance(cache_seqlens, torch.Tensor) and cache_seqlens.dim() == 1 and cache_seqlens.dtype == torch.int32,
          "cache_seqlens must be a 1-D int32 tensor")
    _need(cache_seqlens.shape[0] == page_table.shape[0],
          f"cache_seqlens has {cache_seqlens.shape[0]} entries, page_table {page_table.shape[0]} rows")
    devices = {t.device for t in (k_cache, v_cache, page_table, cache_seqlens)}
    _need(len(devices) == 1, f"the cache and its metadata must be on one device, got {sorted(map(str, devices))}")
    pages, page_size, hkv, d = k_cache.shape
    return pages, page_size, hkv, d


def exact_sizes(cache_seqlens) -> Optional[tuple[int, int]]:
    """(total, longest) of ``cache_seqlens`` read back once per tensor version (SGLang passes the
    same tensor to every layer of a forward: one device sync per forward, not per layer); None
    while a CUDA graph is being captured (no sync possible: the host bound is used)."""
    if cache_seqlens.is_cuda and torch.cuda.is_current_stream_capturing():
        return None
    key = (cache_seqlens._version, cache_seqlens.data_ptr(), cache_seqlens.shape[0])
    hit = getattr(cache_seqlens, "_sglang_fa4_sizes", None)
    if hit is not None and hit[0] == key:
        return hit[1]
    if cache_seqlens.numel() == 0:
        sizes = (0, 0)
    else:
        total, longest = torch.stack([cache_seqlens.sum(dtype=torch.int64), cache_seqlens.max().to(torch.int64)]).tolist()
        sizes = (int(total), int(longest))
    cache_seqlens._sglang_fa4_sizes = (key, sizes)
    return sizes


def bounds(page_table, page_size: int, sizes: Optional[tuple[int, int]]) -> tuple[int, int]:
    """(K rows, longest sequence) the buffers are sized for: ``sizes`` when known, else the host
    bound (batch x page-table width x page size rows, width x page size per sequence)."""
    batch, width = page_table.shape
    per_seq = width * page_size
    if sizes is None:
        return max(batch * per_seq, 1), per_seq
    _need(sizes[1] <= per_seq, f"a sequence of {sizes[1]} tokens does not fit the page table's {per_seq}")
    return max(sizes[0], 1), max(sizes[1], 1)


# ------------------------------------------------------------------------------------------------
# The torch path (reference, side-by-side timing)
# ------------------------------------------------------------------------------------------------


def gather_paged_kv(k_cache, v_cache, page_table, cache_seqlens, sizes: Optional[tuple[int, int]] = None):
    """Torch index ops: contiguous (rows, Hkv, d) K and V (uint8 storage of E4M3) of every
    sequence's first ``cache_seqlens[b]`` cached tokens, sequence b at rows
    ``cu_seqlens_k[b]:cu_seqlens_k[b+1]``; returns (k, v, cu_seqlens_k, max_seqlen_k), sized by
    :func:`bounds`.  Rows past ``cu_seqlens_k[-1]`` hold page 0's first token."""
    _, page_size, hkv, d = check_paged(k_cache, v_cache, page_table, cache_seqlens)
    batch = page_table.shape[0]
    rows, per_seq = bounds(page_table, page_size, sizes)
    device = k_cache.device
    lens = cache_seqlens.to(torch.int64)
    cu_k = torch.zeros(batch + 1, dtype=torch.int64, device=device)
    torch.cumsum(lens, 0, out=cu_k[1:])
    r = torch.arange(rows, device=device)
    seq = torch.searchsorted(cu_k[1:], r, right=True).clamp_(max=max(batch - 1, 0))
    t = r - cu_k[seq]
    valid = r < cu_k[-1]
    t = torch.where(valid, t, torch.zeros_like(t)).clamp_(max=per_seq - 1)
    page = page_table[seq, t // page_size].to(torch.int64)
    slot = torch.where(valid, page * page_size + t % page_size, torch.zeros_like(page))
    k_flat = k_cache.view(torch.uint8).view(-1, hkv, d)
    v_flat = v_cache.view(torch.uint8).view(-1, hkv, d)
    k = k_flat.index_select(0, slot)
    v = v_flat.index_select(0, slot)
    return k, v, cu_k.to(torch.int32), per_seq


# ------------------------------------------------------------------------------------------------
# The fused kernel
# ------------------------------------------------------------------------------------------------


def _make_kernel():
    import triton
    import triton.language as tl

    # the V^T strides stay specialized: always multiples of 16 (vt_columns), which lets Triton
    # vectorize the V^T stores; the token counts and the page-table width vary per call
    @triton.jit(do_not_specialize=["batch", "cols", "width", "pt_stride"])
    def fp8_paged_gather(
        K_CACHE, V_CACHE, PAGE_TABLE, SEQLENS, K_OUT, VT_OUT, CU_OUT,
        batch, cols, width, pt_stride, vt_stride_h, vt_stride_d,
        page_size, tok_stride,  # tok_stride = Hkv * d: a cache token's bytes and a K row's
        D: tl.constexpr, D_POW2: tl.constexpr, ALIGN: tl.constexpr, BLOCK_T: tl.constexpr,
        BLOCK_B: tl.constexpr,
    ):
        blk = tl.program_id(0)
        b = tl.program_id(1)
        h = tl.program_id(2)
        # sequence b's first K row: the lengths before it (cu_seqlens_k[b])
        start = b * 0
        for i in range(0, b, BLOCK_B):
            idx = i + tl.arange(0, BLOCK_B)
            start += tl.sum(tl.load(SEQLENS + idx, mask=idx < b, other=0))
        seqlen = tl.load(SEQLENS + b)
        nxt = start + seqlen
        if (blk == 0) & (h == 0):
            tl.store(CU_OUT + b + 1, nxt)
            if b == 0:
                tl.store(CU_OUT, start)
        base = (start + ALIGN - 1) // ALIGN * ALIGN + ALIGN * b  # layout.vt_column_offset
        end = tl.where(b == batch - 1, cols, (nxt + ALIGN - 1) // ALIGN * ALIGN + ALIGN * (b + 1))
        if blk * BLOCK_T < end - base:
            r = blk * BLOCK_T + tl.arange(0, BLOCK_T)
            dd = tl.arange(0, D_POW2)
            d_ok = dd < D  # all true at a power-of-two head dim: left out of the masks there (vector loads)
            row = PAGE_TABLE + b.to(tl.int64) * pt_stride
            head = h.to(tl.int64) * D + dd
            # K: key r -> row start + r
            k_ok = (r < seqlen) & (r // page_size < width)
            page = tl.load(row + r // page_size, mask=k_ok, other=0).to(tl.int64)
            src = (page * page_size + r % page_size) * tok_stride
            if D == D_POW2:
                m = k_ok[:, None]
            else:
                m = k_ok[:, None] & d_ok[None, :]
            keys = tl.load(K_CACHE + src[:, None] + head[None, :], mask=m)
            tl.store(K_OUT + (start + r).to(tl.int64)[:, None] * tok_stride + head[None, :], keys, mask=m)
            # V^T: column base + r holds key vt_source_key(r) (layout.key_perm: slot 4q+i of a group
            # of 16 holds key 8*(i//2) + 2q + i%2), zero past the keys
            lane = r % 16
            key = (r // 16) * 16 + 8 * ((lane % 4) // 2) + 2 * (lane // 4) + (lane % 2)
            v_ok = (key < seqlen) & (key // page_size < width)
            vpage = tl.load(row + key // page_size, mask=v_ok, other=0).to(tl.int64)
            vsrc = (vpage * page_size + key % page_size) * tok_stride
            if D == D_POW2:
                vm = v_ok[:, None]
            else:
                vm = v_ok[:, None] & d_ok[None, :]
            vals = tl.load(V_CACHE + vsrc[:, None] + head[None, :], mask=vm, other=0)
            col = (base + r).to(tl.int64)
            dst = VT_OUT + h.to(tl.int64) * vt_stride_h + dd.to(tl.int64)[:, None] * vt_stride_d + col[None, :]
            # a region spans whole groups of 16 columns (end - base is a multiple of 16): the mask
            # in groups keeps it constant over 16 bytes (vector stores)
            in_region = (r // 16) < (end - base) // 16
            if D == D_POW2:
                sm = in_region[None, :]
            else:
                sm = in_region[None, :] & d_ok[:, None]
            tl.store(dst, tl.trans(vals), mask=sm)

    return fp8_paged_gather


HANDLES = KernelHandles("fp8_paged_gather", _make_kernel)


def allocate(rows: int, batch: int, hkv: int, d: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Uninitialised (k (rows, Hkv, d) uint8, vt (Hkv, d, cols) uint8 view over a 16-aligned row
    stride, cu_seqlens_k (batch + 1,) int32) for :func:`launch`."""
    cols, padded = vt_columns(rows, batch)
    k = torch.empty((rows, hkv, d), dtype=torch.uint8, device=device)
    vt = torch.empty((hkv, d, padded), dtype=torch.uint8, device=device)[:, :, :cols]
    return k, vt, torch.empty(batch + 1, dtype=torch.int32, device=device)


def grid_blocks(max_seqlen_k: int) -> int:
    """Key blocks per (sequence, kv head): a sequence's V^T region plus a key tile past its keys."""
    return -(-(int(max_seqlen_k) + 3 * VT_ALIGN + MAX_KEY_TILE) // BLOCK_T)


def launch(k_cache, v_cache, page_table, cache_seqlens, k, vt, cu_k, max_seqlen_k: int) -> None:
    """Fill ``k``, ``vt``, ``cu_k`` (from :func:`allocate`; any content) from the paged cache.
    ``max_seqlen_k`` bounds every sequence's length (host int: it sizes the grid)."""
    _, page_size, hkv, d = k_cache.shape
    batch, width = page_table.shape
    if batch == 0:
        cu_k.zero_()
        return
    args = (k_cache.view(torch.uint8), v_cache.view(torch.uint8), page_table, cache_seqlens, k, vt, cu_k,
            batch, vt.shape[2], width, page_table.stride(0), vt.stride(0), vt.stride(1),
            page_size, hkv * d, d, pow2_at_least(d), VT_ALIGN, BLOCK_T, BLOCK_B)
    HANDLES.launch((grid_blocks(max_seqlen_k), batch, hkv), args, k_cache.device.index or 0, num_warps=4)


def gather_paged_kv_vt(k_cache, v_cache, page_table, cache_seqlens, sizes: Optional[tuple[int, int]] = None):
    """(k (rows, Hkv, d) uint8, vt (Hkv, d, cols) uint8, cu_seqlens_k int32, max_seqlen_k): the
    kernel's inputs from the paged cache (checked by the route's plan), sized by :func:`bounds`
    (``sizes`` from :func:`exact_sizes`, or the host bound while capturing).  One Triton launch, on
    a CUDA device or under TRITON_INTERPRET (the CPU harnesses install the torch path,
    ``sglang_fa4.testing.paged_kv_torch``)."""
    _, page_size, hkv, d = k_cache.shape
    rows, per_seq = bounds(page_table, page_size, sizes)
    k, vt, cu_k = allocate(rows, page_table.shape[0], hkv, d, k_cache.device)
    launch(k_cache, v_cache, page_table, cache_seqlens, k, vt, cu_k, per_seq)
    return k, vt, cu_k, per_seq


def bytes_moved(lens, hkv: int, d: int, page_size: int) -> int:
    """Bytes the fused gather moves for sequences of ``lens`` cached tokens, at least: K and V of
    every token read once from its page and written once (K rows, V^T columns), the page-table
    entries read; the V^T alignment padding and the lengths' prefix sums (L2-resident) are not
    counted."""
    return 4 * sum(lens) * hkv * d + 4 * sum(-(-int(n) // page_size) for n in lens)


class GatherShape(NamedTuple):
    """What selects one compiled gather kernel: head dim, kv heads (their product is a token's
    stride) and the page size (Triton specializes an integer argument of 1)."""

    head_dim: int
    kv_heads: int
    page_size: int

    def as_dict(self) -> dict:
        return self._asdict()

    def describe(self) -> str:
        return f"fp8 paged KV gather d={self.head_dim} kv_heads={self.kv_heads} page={self.page_size}"


def warm(shape: GatherShape, device) -> int:
    """Resolve (compile, or load from Triton's disk cache) the kernel the route will launch for
    this shape, with one small call on ``device``; returns how many were newly resolved."""
    before = compile_events.count("triton")
    d, hkv, page = shape
    lens = [3 * page + 1, 1]
    pages = sum(-(-n // page) for n in lens) + 1
    cache = torch.zeros((pages, page, hkv, d), dtype=torch.uint8, device=device)
    width = -(-max(lens) // page)
    table = torch.arange(1, 1 + len(lens) * width, dtype=torch.int32, device=device).clamp_(max=pages - 1)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    gather_paged_kv_vt(cache, cache, table.view(len(lens), width), seqlens, (sum(lens), max(lens)))
    return compile_events.count("triton") - before


def warm_shape(shape: GatherShape, device) -> str:
    """The warmup registry's entry (family ``fp8_paged_gather``): :func:`warm`."""
    new = warm(shape, device)
    return f"{new} resolved" if new else "cached"
