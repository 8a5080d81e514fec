"""Decode (and short extend) over SGLang's paged fp8_e4m3 KV pool, read in place: split-KV, no gather.

The gather route (:mod:`.extend`) copies every used page into the WGMMA
kernel's layout before attending -- twice the bytes the attention reads, which dominates decode.
This kernel reads K and V straight from the pool through the page table: key ``t`` of sequence
``b`` is token ``t % P`` of page ``page_table[b, t // P]`` (SGLang's layout, ``P`` any power of
two), K/V converted to fp16 in registers (exact for E4M3), the two products on fp16 tensor-core
inputs with fp32 accumulation, the softmax in fp32.  fp16 rather than bf16: P keeps three more
mantissa bits, and Triton's CPU interpreter (the tests) computes bf16 dots wrongly.

* **Rows.** One program takes one kv head of one sequence and a block of its query rows: every
  (new token i, q head j of the kv head's group) pair, flattened ``r = i * g + j`` -- all ``g`` q
  heads of a GQA group share each K/V load, and ``g`` need not be a power of two (7: the rows are
  masked).  Each row has its own key range: bottom-right causal (token ``i`` of ``n`` new tokens
  sits at key position ``cache_seqlens[b] - n + i``) and SGLang's ``window_size`` (left, right)
  around that position.  Decode is the case ``n = 1``; extend with a few new tokens runs through
  the same code, so a decode step and the extend row at the same position compute the same thing.
  An image row of SGLang's Gemma-4 prefill also sees the keys of its own image (``[begin, end]``
  per row, inclusive: bidirectional within the image, FA4's ``mask_mod`` in SGLang), still bounded
  by the window's left side.
* **Split-KV.** The keys a row block can see are cut into ``num_splits`` ranges
  (:func:`.decode_plan.choose_splits`), one program each; each writes its
  normalized partial output and log-sum-exp (fp32 scratch), and a second small kernel combines
  them weighted by exp(lse - max).  With one split the first kernel writes the output itself.
* **Head-dim pieces.** With launch ``d_pieces=2`` the key loop takes the head dim as two column
  pieces, each its own pair of products, so half a K/V tile is live in registers at once: the
  launch above head dim 128 while the batch does not fill the GPU, under a register cap that lets 3
  CTAs share an SM (:data:`.decode_plan.SPLIT_REGIME_LAUNCH`).
* **Page indices ahead.** With ``prefetch_pages`` (the default up to head dim 128:
  :func:`.decode_plan.prefetch_pages`) each key block's page indices are loaded one block ahead.
* **Host side.** :func:`launch` runs one layer from the route's plan (:mod:`.batch_plan`: the arguments
  checked, the launch plan and scratch sizes chosen once per batch shape): descale strides, the
  output and scratch allocations, the two launches. CUDA or Triton's interpreter only; the CPU
  harnesses install the same contract in fp32 torch (``sglang_fa4.testing.paged_kv_torch``).
* **CUDA graphs.** Nothing reads a device value on the host: the grid and the scratch size come
  from host facts only (batch, heads, ``max_seqlen_q``, the page table's width), every length is
  read in the kernel; capturable as SGLang's decode graphs capture it (page table at full width).

Descales: per (batch, kv head) or scalar, as SGLang passes them (``layer.k_scale.expand(...)``:
strides honoured, no copy); k's folds into the score scale, v's into the output.  q is taken as
E4M3 (SGLang's cast, no scale) or bf16 (converted to fp16: |q| beyond 65504 would overflow).
Head dims 64, 96, 128, 192, 256 and 512 (96 and 192 padded to the next power of two in registers,
masked). 512 (Gemma-4's full-attention layers, bf16 q) has no FP8 forward behind the gather route,
so this kernel runs it at every call size, prefills with a cached prefix included: smaller key and
row blocks there (:mod:`.decode_plan`).  Imports nothing from SGLang.
"""

from __future__ import annotations

from typing import Optional

import torch

from sglang_fa4.kernels.fp8_paged_kv.decode_plan import MAX_SPLITS, pow2_at_least
from sglang_fa4.kernels.fp8_paged_kv.gather import _need
from sglang_fa4.kernels.triton_handles import KernelHandles

FP8 = torch.float8_e4m3fn
HEAD_DIMS = (64, 96, 128, 192, 256, 512)
#: the SM count assumed off a GPU (interpreter tests): an H200's
DEFAULT_SM_COUNT = 132
#: a window side of "unbounded", as the kernel sees it
UNBOUNDED = 1 << 30
LOG2E = 1.4426950408889634


def window_bounds(causal: bool, window_size) -> tuple[int, int]:
    """(left, right) key distances a query may look back / ahead (UNBOUNDED for none), from
    SGLang's ``window_size`` (left, right; -1 or None unbounded) and ``causal`` (right 0)."""
    if window_size is None:
        window_size = (-1, -1)
    _need(len(window_size) == 2, f"window_size must be (left, right), got {window_size!r}")
    left, right = (UNBOUNDED if w is None or int(w) < 0 else min(int(w), UNBOUNDED) for w in window_size)
    if causal:
        _need(right in (0, UNBOUNDED), f"causal=True with a right window of {right}: use one or the other")
        right = 0
    return left, right


_sm_counts: dict = {}


def sm_count(device) -> int:
    """SMs of ``device`` (cached; a host fact), DEFAULT_SM_COUNT off a GPU."""
    if getattr(device, "type", None) != "cuda":
        return DEFAULT_SM_COUNT
    index = device.index if device.index is not None else torch.cuda.current_device()
    hit = _sm_counts.get(index)
    if hit is None:
        hit = _sm_counts[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return hit


# ------------------------------------------------------------------------------------------------
# The kernels
# ------------------------------------------------------------------------------------------------


def _make_split_kernel():
    import triton
    import triton.language as tl

    # integers that vary with the batch (row strides of the page table and the LSE buffers) or only
    # address scalars (descale strides) are not specialized: fewer variants to compile and warm
    @triton.jit(do_not_specialize=["num_splits", "min_chunk", "width", "left", "right", "pt_stride", "lse_stride_h",
                                   "lpart_stride_s", "kd_stride_b", "kd_stride_h", "vd_stride_b", "vd_stride_h"])
    def fp8_paged_decode_split(
        Q, K_CACHE, V_CACHE, PAGE_TABLE, SEQLENS, CU_Q, K_DESC, V_DESC, IMAGES,
        OUT, LSE, O_PART, LSE_PART,
        q_stride_t, q_stride_h, pt_stride, kd_stride_b, kd_stride_h, vd_stride_b, vd_stride_h,
        o_stride_t, o_stride_h, lse_stride_h, part_stride_s, part_stride_t, lpart_stride_s,
        num_splits, min_chunk, width, page_shift, tok_stride, hkv, qk_scale_log2, left, right,
        G: tl.constexpr, D: tl.constexpr, D_POW2: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr, SINGLE: tl.constexpr, WRITE_LSE: tl.constexpr, IMAGE: tl.constexpr,
        PREFETCH_PAGES: tl.constexpr, D_PIECES: tl.constexpr,
    ):
        rb = tl.program_id(0)
        bh = tl.program_id(1)
        split = tl.program_id(2)
        b = bh // hkv
        h = bh % hkv
        q_start = tl.load(CU_Q + b)
        n_q = tl.load(CU_Q + b + 1) - q_start
        seqlen = tl.load(SEQLENS + b)
        if rb * BLOCK_M < n_q * G:
            r = rb * BLOCK_M + tl.arange(0, BLOCK_M)
            row_ok = r < n_q * G
            tok = r // G
            head = h * G + r % G
            # the head dim in D_PIECES column pieces of DP, each its own pair of products (QK summed
            # over the pieces, P @ V per piece): a piece's K/V tile in registers, not the whole row
            DP: tl.constexpr = D_POW2 // D_PIECES
            dd = tl.arange(0, DP)
            d_ok0 = dd < D
            d_ok1 = DP + dd < D
            # each row's visible keys [lo_row, hi_row): bottom-right causal position, window around it
            pos = seqlen - n_q + tok
            lo_row = tl.maximum(pos - left, 0)
            hi_row = tl.minimum(pos + right + 1, seqlen)
            img_lo = tl.full([BLOCK_M], -1, tl.int32)
            img_hi = img_lo
            hi_any = hi_row
            if IMAGE:
                # SGLang's image rows (Gemma-4 prefill): also the keys [begin, end] of the row's own
                # image, inclusive (-1, -1 for text), still above the window's left bound
                img = IMAGES + (q_start + tok).to(tl.int64) * 2
                img_lo = tl.load(img, mask=row_ok, other=-1)
                img_hi = tl.minimum(tl.load(img + 1, mask=row_ok, other=-1), seqlen - 1)
                hi_any = tl.maximum(hi_row, img_hi + 1)
            lo = tl.min(tl.where(row_ok, lo_row, 1 << 30), axis=0)
            hi = tl.max(tl.where(row_ok, hi_any, 0), axis=0)
            lo = lo // BLOCK_N * BLOCK_N
            span = tl.maximum(hi - lo, 0)
            # at least min_chunk keys a split (rounded to whole key blocks), from the real span: a
            # page table wider than the contexts leaves the surplus splits empty
            chunk = tl.cdiv(tl.maximum(tl.cdiv(span, num_splits), min_chunk), BLOCK_N) * BLOCK_N
            k_start = lo + split * chunk
            k_end = tl.minimum(hi, k_start + chunk)

            q_ptr = Q + (q_start + tok).to(tl.int64)[:, None] * q_stride_t + head[:, None] * q_stride_h + dd[None, :]
            q0 = tl.load(q_ptr, mask=row_ok[:, None] & d_ok0[None, :], other=0.0).to(tl.float16)
            q1 = q0
            if D_PIECES == 2:
                q1 = tl.load(q_ptr + DP, mask=row_ok[:, None] & d_ok1[None, :], other=0.0).to(tl.float16)
            kd = tl.load(K_DESC + b * kd_stride_b + h * kd_stride_h)
            vd = tl.load(V_DESC + b * vd_stride_b + h * vd_stride_h)
            scale = qk_scale_log2 * kd
            pt_row = PAGE_TABLE + b.to(tl.int64) * pt_stride
            head_off = h * D + dd

            m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
            l_i = tl.zeros([BLOCK_M], tl.float32)
            acc0 = tl.zeros([BLOCK_M, DP], tl.float32)
            acc1 = tl.zeros([BLOCK_M, DP], tl.float32)
            if PREFETCH_PAGES:
                # each key block's page indices loaded one block ahead, into registers: with the
                # page-table load inside the block, Triton's pipeliner keeps one K/V buffer and waits
                # for every copy at each step, so no K/V load is in flight under the products; loaded
                # ahead, K and V are double-buffered (benchmark/lab/decode_pipeline.py)
                kn = k_start + tl.arange(0, BLOCK_N)
                page_next = tl.load(pt_row + (kn >> page_shift), mask=(kn < k_end) & ((kn >> page_shift) < width),
                                    other=0)
            for start in range(k_start, k_end, BLOCK_N):
                kk = start + tl.arange(0, BLOCK_N)
                # page sizes are powers of two: shifts, not integer divisions, per key
                col = kk >> page_shift
                k_ok = (kk < k_end) & (col < width)
                if PREFETCH_PAGES:
                    page = page_next.to(tl.int64)
                    kn = kk + BLOCK_N
                    page_next = tl.load(pt_row + (kn >> page_shift), mask=(kn < k_end) & ((kn >> page_shift) < width),
                                        other=0)
                else:
                    page = tl.load(pt_row + col, mask=k_ok, other=0).to(tl.int64)
                src = ((page << page_shift) + (kk & ((1 << page_shift) - 1))) * tok_stride
                kv_ptr = src[:, None] + head_off[None, :]
                kv_mask0 = k_ok[:, None] & d_ok0[None, :]
                kv_mask1 = k_ok[:, None] & d_ok1[None, :]
                # masked loads: free pool memory (NaN-poisoned in the tests) never reaches a register
                kt = tl.load(K_CACHE + kv_ptr, mask=kv_mask0, other=0.0).to(tl.float16)
                s = tl.dot(q0, tl.trans(kt))
                if D_PIECES == 2:
                    kt = tl.load(K_CACHE + DP + kv_ptr, mask=kv_mask1, other=0.0).to(tl.float16)
                    s = tl.dot(q1, tl.trans(kt), s)
                s = s * scale
                if IMAGE:
                    seen_key = (kk[None, :] < hi_row[:, None]) | ((kk[None, :] >= img_lo[:, None])
                                                                 & (kk[None, :] <= img_hi[:, None]))
                else:
                    seen_key = kk[None, :] < hi_row[:, None]
                vis = row_ok[:, None] & k_ok[None, :] & (kk[None, :] >= lo_row[:, None]) & seen_key
                s = tl.where(vis, s, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(s, axis=1))
                m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing seen yet
                alpha = tl.exp2(m_i - m_safe)
                p = tl.exp2(s - m_safe[:, None])
                l_i = l_i * alpha + tl.sum(p, axis=1)
                p = p.to(tl.float16)
                vt = tl.load(V_CACHE + kv_ptr, mask=kv_mask0, other=0.0).to(tl.float16)
                acc0 = acc0 * alpha[:, None] + tl.dot(p, vt)
                if D_PIECES == 2:
                    vt = tl.load(V_CACHE + DP + kv_ptr, mask=kv_mask1, other=0.0).to(tl.float16)
                    acc1 = acc1 * alpha[:, None] + tl.dot(p, vt)
                m_i = m_new
            seen = l_i > 0.0
            o_scale = (vd / tl.where(seen, l_i, 1.0))[:, None]
            lse2 = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("-inf"))  # log2 units
            t64 = (q_start + tok).to(tl.int64)
            if SINGLE:
                o_ptr = OUT + t64[:, None] * o_stride_t + head[:, None] * o_stride_h + dd[None, :]
                tl.store(o_ptr, (acc0 * o_scale).to(OUT.dtype.element_ty), mask=row_ok[:, None] & d_ok0[None, :])
                if D_PIECES == 2:
                    tl.store(o_ptr + DP, (acc1 * o_scale).to(OUT.dtype.element_ty),
                             mask=row_ok[:, None] & d_ok1[None, :])
                if WRITE_LSE:
                    tl.store(LSE + head * lse_stride_h + t64, lse2 * 0.6931471805599453, mask=row_ok)
            else:
                # an empty split writes only its -inf LSE: the combine reads no partial for it
                p_ptr = (O_PART + split.to(tl.int64) * part_stride_s + t64[:, None] * part_stride_t
                         + head[:, None] * D_POW2 + dd[None, :])
                tl.store(p_ptr, acc0 * o_scale, mask=row_ok[:, None] & (k_start < k_end))
                if D_PIECES == 2:
                    tl.store(p_ptr + DP, acc1 * o_scale, mask=row_ok[:, None] & (k_start < k_end))
                tl.store(LSE_PART + split.to(tl.int64) * lpart_stride_s + t64 * (hkv * G) + head, lse2, mask=row_ok)

    return fp8_paged_decode_split


def _make_combine_kernel():
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=["num_splits", "lpart_stride_s", "lse_stride_h"])
    def fp8_paged_decode_combine(
        O_PART, LSE_PART, OUT, LSE,
        part_stride_s, part_stride_t, lpart_stride_s, o_stride_t, o_stride_h, lse_stride_h,
        num_splits, hq,
        D: tl.constexpr, D_POW2: tl.constexpr, S_MAX: tl.constexpr, S_CHUNK: tl.constexpr,
        WRITE_LSE: tl.constexpr,
    ):
        # one program per (query token, q head). Every load is independent of the one before it:
        # the split LSEs as one vector, the partials S_CHUNK splits at a time (a loop of dependent
        # loads, one split per step, paid the memory latency once per split: at batch 1 with 64
        # splits that latency was most of a decode call)
        t = tl.program_id(0).to(tl.int64)
        head = tl.program_id(1)
        lse_row = LSE_PART + t * hq + head
        ss = tl.arange(0, S_MAX)
        lse_all = tl.load(lse_row + ss * lpart_stride_s, mask=ss < num_splits, other=float("-inf"))
        m = tl.max(lse_all, axis=0)
        m_safe = tl.where(m == float("-inf"), 0.0, m)
        total = tl.sum(tl.exp2(lse_all - m_safe), axis=0)
        # splits past the last one that saw a key are skipped: a page table wider than the contexts
        # (SGLang's decode graphs) plans more splits than the real lengths fill
        used = tl.max(tl.where(lse_all > float("-inf"), ss, -1), axis=0) + 1
        dd = tl.arange(0, D_POW2)
        acc = tl.zeros([D_POW2], tl.float32)
        part_row = O_PART + t * part_stride_t + head * D_POW2
        for s0 in range(0, used, S_CHUNK):
            sc = s0 + tl.arange(0, S_CHUNK)
            # a split that saw no key (empty, or all masked) has lse -inf, weight 0, and its
            # partial is not read (an empty split never wrote it)
            lse_c = tl.load(lse_row + sc * lpart_stride_s, mask=sc < num_splits, other=float("-inf"))
            w = tl.exp2(lse_c - m_safe)
            part = tl.load(part_row + sc.to(tl.int64)[:, None] * part_stride_s + dd[None, :],
                           mask=(lse_c > float("-inf"))[:, None], other=0.0)
            acc += tl.sum(w[:, None] * part, axis=0)
        seen = total > 0.0
        o = acc / tl.where(seen, total, 1.0)
        tl.store(OUT + t * o_stride_t + head * o_stride_h + dd, o.to(OUT.dtype.element_ty), mask=dd < D)
        if WRITE_LSE:
            lse_out = tl.where(seen, m_safe + tl.log2(tl.where(seen, total, 1.0)), float("-inf"))
            tl.store(LSE + head * lse_stride_h + t, lse_out * 0.6931471805599453)

    return fp8_paged_decode_combine


#: splits the combine reads a step (its partial tile: S_CHUNK x head dim fp32; masked past the split
#: count, one value so that one combine variant serves every split count)
COMBINE_CHUNK = 16


SPLIT = KernelHandles("fp8_paged_decode_split", _make_split_kernel)
COMBINE = KernelHandles("fp8_paged_decode_combine", _make_combine_kernel)


# ------------------------------------------------------------------------------------------------
# The host side
# ------------------------------------------------------------------------------------------------


def _descale(x, batch: int, hkv: int, device):
    """(tensor, batch stride, head stride) of a descale (checked by the plan): SGLang's (batch, Hkv)
    -- often an expand of a one-element scale, strides 0 -- or a scalar; 1 when None.  fp32 on the
    device, no copy when it already is."""
    if x is None:
        return torch.ones(1, dtype=torch.float32, device=device), 0, 0
    if x.dtype != torch.float32:
        x = x.float()
    if x.numel() == 1:
        return x.reshape(1), 0, 0
    return x, x.stride(0), x.stride(1)


def launch(plan, q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, k_descale, v_descale,
           softmax_scale: Optional[float], out, image_ranges=None):
    """One layer of a split-KV plan (:class:`.batch_plan.PagedPlan`, whose arguments were checked): q
    (total_q, Hq, d), E4M3 or bf16, against SGLang's paged E4M3 cache (pages, P, Hkv, d) -> bf16
    (total_q, Hq, d) (into ``out`` when given), and with the plan's ``return_lse`` also the
    log-sum-exp of the scaled scores, natural log, (Hq, total_q) fp32 (FlashAttention's varlen
    layout; -inf for a row that sees no key). Bottom-right causal, as the route. ``image_ranges``
    (a plan with ``image``): (total_q, 2) int32, each row's image [begin, end] in key positions
    (inclusive; -1, -1 for a text row), keys the row also sees (SGLang's Gemma-4 image prefill)."""
    p = plan.decode
    total_q, hq, d = q.shape
    batch, width, page_size, hkv, group = plan.batch, plan.width, plan.page_size, plan.kv_heads, plan.group
    scale = d ** -0.5 if softmax_scale is None else float(softmax_scale)
    device = q.device
    o = out if plan.out_direct else torch.empty((total_q, hq, d), dtype=torch.bfloat16, device=device)
    return_lse = plan.return_lse
    lse = torch.empty((hq, total_q), dtype=torch.float32, device=device) if return_lse else o
    if total_q and batch and plan.max_seqlen_q != 0:
        kd, kd_sb, kd_sh = _descale(k_descale, batch, hkv, device)
        vd, vd_sb, vd_sh = _descale(v_descale, batch, hkv, device)
        single = p.num_splits == 1
        d_pow2 = pow2_at_least(d)
        if single:
            o_part = lse_part = o  # unused
            part_s = part_t = lpart_s = 0
        else:
            o_part = torch.empty(plan.partial_shape, dtype=torch.float32, device=device)
            lse_part = torch.empty(plan.partial_shape[:3], dtype=torch.float32, device=device)
            part_s, part_t, lpart_s = o_part.stride(0), o_part.stride(1), lse_part.stride(0)
        lse_h = lse.stride(0) if return_lse else 0
        images = image_ranges if plan.image else cache_seqlens  # an unread int32 pointer without images
        args = (q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, kd, vd, images,
                o, lse, o_part, lse_part,
                q.stride(0), q.stride(1), page_table.stride(0), kd_sb, kd_sh, vd_sb, vd_sh,
                o.stride(0), o.stride(1), lse_h, part_s, part_t, lpart_s,
                p.num_splits, p.min_chunk, width, page_size.bit_length() - 1, hkv * d, hkv, scale * LOG2E, plan.left,
                plan.right,
                group, d, d_pow2, p.block_m, p.block_n, single, return_lse, plan.image, p.prefetch_pages,
                p.d_pieces)
        index = device.index or 0
        SPLIT.launch((p.row_blocks, batch * hkv, p.num_splits), args, index, num_warps=p.num_warps,
                     num_stages=p.num_stages, **({"maxnreg": p.maxnreg} if p.maxnreg else {}))
        if not single:
            COMBINE.launch((total_q, hq), (o_part, lse_part, o, lse, part_s, part_t, lpart_s, o.stride(0),
                                           o.stride(1), lse_h, p.num_splits, hq, d, d_pow2, MAX_SPLITS,
                                           COMBINE_CHUNK, return_lse),
                           index, num_warps=4)
    elif return_lse:
        lse.fill_(float("-inf"))
    if out is not None and not plan.out_direct:
        out.copy_(o.view(out.shape))
        o = out
    return (o, lse) if return_lse else o


def kv_bytes_read(lens, hkv: int, d: int, page_size: int) -> int:
    """K/V bytes one decode call reads (each cached token's K and V of every kv head once, E4M3)
    plus its page-table entries: the numerator of the achieved bandwidth."""
    return 2 * sum(int(n) for n in lens) * hkv * d + 4 * sum(-(-int(n) // page_size) for n in lens)
