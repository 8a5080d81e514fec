"""Lab: the split-KV FP8 decode kernel in a transposed formulation, to time against the product's.

The product kernel (sglang_fa4/kernels/fp8_paged_kv/decode.py) computes S = Q K^T and O = P V with the
query rows as the MMA's M side (16 rows: a GQA group of 4-8 padded) on mma.sync.  Cross-compiled
for sm_90, its P V product reads the E4M3 V tile from shared memory one byte per load (64
ld.shared.b8 per thread per key block): the MMA's B operand needs the keys contiguous, V has the
head dim contiguous, and Triton moves the 8-bit tile, not the converted 16-bit one, through shared
memory.

Here everything is transposed: S^T = K Q^T and O^T = V^T P^T, so the keys (S^T) and the head dim
(O^T) are the M side and the query rows the N side (the GQA group as the MMA's N, as the fastest
Hopper decode kernels have it).  V^T is the A operand, which a warpgroup MMA takes from registers
in any layout: Triton builds it with byte permutes (prmt), no byte-wise shared-memory loads, and
both products become wgmma.  Same signature, same arithmetic (fp16 operands, fp32 accumulation),
so ``install()`` swaps it into the product's launch path for a timing run.
"""

from __future__ import annotations


def make_split_kernel_t():
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=["num_splits", "min_chunk", "width", "left", "right", "pt_stride", "lse_stride_h",
                                   "lpart_stride_s", "kd_stride_b", "kd_stride_h", "vd_stride_b", "vd_stride_h"])
    def fp8_paged_decode_split_t(
        Q, K_CACHE, V_CACHE, PAGE_TABLE, SEQLENS, CU_Q, K_DESC, V_DESC,
        OUT, LSE, O_PART, LSE_PART,
        q_stride_t, q_stride_h, pt_stride, kd_stride_b, kd_stride_h, vd_stride_b, vd_stride_h,
        o_stride_t, o_stride_h, lse_stride_h, part_stride_s, part_stride_t, lpart_stride_s,
        num_splits, min_chunk, width, page_shift, tok_stride, hkv, qk_scale_log2, left, right,
        G: tl.constexpr, D: tl.constexpr, D_POW2: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr, SINGLE: tl.constexpr, WRITE_LSE: tl.constexpr,
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
            dd = tl.arange(0, D_POW2)
            d_ok = dd < D
            pos = seqlen - n_q + tok
            lo_row = tl.maximum(pos - left, 0)
            hi_row = tl.minimum(pos + right + 1, seqlen)
            lo = tl.min(tl.where(row_ok, lo_row, 1 << 30), axis=0)
            hi = tl.max(tl.where(row_ok, hi_row, 0), axis=0)
            lo = lo // BLOCK_N * BLOCK_N
            span = tl.maximum(hi - lo, 0)
            chunk = tl.cdiv(tl.maximum(tl.cdiv(span, num_splits), min_chunk), BLOCK_N) * BLOCK_N
            k_start = lo + split * chunk
            k_end = tl.minimum(hi, k_start + chunk)

            # Q^T: (D, rows)
            qt_ptr = (Q + (q_start + tok).to(tl.int64)[None, :] * q_stride_t + head[None, :] * q_stride_h
                      + dd[:, None])
            qt = tl.load(qt_ptr, mask=row_ok[None, :] & d_ok[:, None], other=0.0).to(tl.float16)
            kd = tl.load(K_DESC + b * kd_stride_b + h * kd_stride_h)
            vd = tl.load(V_DESC + b * vd_stride_b + h * vd_stride_h)
            scale = qk_scale_log2 * kd
            pt_row = PAGE_TABLE + b.to(tl.int64) * pt_stride
            head_off = h * D + dd

            m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
            l_i = tl.zeros([BLOCK_M], tl.float32)
            acc = tl.zeros([D_POW2, BLOCK_M], tl.float32)  # O^T
            for start in range(k_start, k_end, BLOCK_N):
                kk = start + tl.arange(0, BLOCK_N)
                col = kk >> page_shift
                k_ok = (kk < k_end) & (col < width)
                page = tl.load(pt_row + col, mask=k_ok, other=0).to(tl.int64)
                src = ((page << page_shift) + (kk & ((1 << page_shift) - 1))) * tok_stride
                kv_mask = k_ok[:, None] & d_ok[None, :]
                kt = tl.load(K_CACHE + src[:, None] + head_off[None, :], mask=kv_mask, other=0.0).to(tl.float16)
                st = tl.dot(kt, qt) * scale  # S^T: (keys, rows)
                vis = (row_ok[None, :] & k_ok[:, None] & (kk[:, None] >= lo_row[None, :])
                       & (kk[:, None] < hi_row[None, :]))
                st = tl.where(vis, st, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(st, axis=0))
                m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
                alpha = tl.exp2(m_i - m_safe)
                pt = tl.exp2(st - m_safe[None, :])
                l_i = l_i * alpha + tl.sum(pt, axis=0)
                v = tl.load(V_CACHE + src[:, None] + head_off[None, :], mask=kv_mask, other=0.0).to(tl.float16)
                acc = acc * alpha[None, :] + tl.dot(tl.trans(v), pt.to(tl.float16))  # O^T += V^T P^T
                m_i = m_new
            seen = l_i > 0.0
            ot = acc * (vd / tl.where(seen, l_i, 1.0))[None, :]
            lse2 = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
            t64 = (q_start + tok).to(tl.int64)
            if SINGLE:
                o_ptr = OUT + t64[None, :] * o_stride_t + head[None, :] * o_stride_h + dd[:, None]
                tl.store(o_ptr, ot.to(OUT.dtype.element_ty), mask=row_ok[None, :] & d_ok[:, None])
                if WRITE_LSE:
                    tl.store(LSE + head * lse_stride_h + t64, lse2 * 0.6931471805599453, mask=row_ok)
            else:
                p_ptr = (O_PART + split.to(tl.int64) * part_stride_s + t64[None, :] * part_stride_t
                         + head[None, :] * D_POW2 + dd[:, None])
                tl.store(p_ptr, ot, mask=row_ok[None, :] & (k_start < k_end))
                tl.store(LSE_PART + split.to(tl.int64) * lpart_stride_s + t64 * (hkv * G) + head, lse2, mask=row_ok)

    return fp8_paged_decode_split_t


_installed = {}


def install(on: bool):
    """Swap the transposed kernel into the product's launch path (``on``), or back."""
    from sglang_fa4.kernels.fp8_paged_kv import decode as fpd
    from sglang_fa4.kernels.triton_handles import KernelHandles

    if "product" not in _installed:
        _installed["product"] = fpd.SPLIT
        _installed["transposed"] = KernelHandles("fp8_paged_decode_split_t", make_split_kernel_t)
    fpd.SPLIT = _installed["transposed" if on else "product"]
