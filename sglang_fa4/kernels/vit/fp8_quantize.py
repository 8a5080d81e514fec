"""bf16/fp16 q, k, v -> E4M3 + per-(batch, kv head) float32 descales, in one Triton launch.

One program per (sequence, kv head, tensor): a first pass over its tokens takes the amax (for q,
over the kv head's group of q heads, since FA3-style descales are per kv head), the descale is
amax / 448 (1 when the block is all zeros), a second pass writes x / descale as E4M3.  The head
dim is zero-padded to ``padded_head_dim`` (72, 80 -> 96).  v is written straight into the
permuted V^T buffer the attention kernel reads (``vt_pack``), so no separate pack launch is needed.

No host sync (max_seqlen_k only sizes nothing here; the loops run to each sequence's length on
the device), graph-capturable when the outputs are preallocated or come from the caching
allocator.  Triton's host launch cost (~20-40 us) is paid once per call for all three tensors.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from sglang_fa4.kernels.fp8_sm90 import (
    VT_ALIGN,
    padded_head_dim,
    pow2_at_least,
    vt_column_offset,
    vt_columns,
    vt_region_end,
    vt_source_key,
)

E4M3_MAX = 448.0


class Fp8QKV(NamedTuple):
    q: torch.Tensor  # (total_q, Hq, d_pad) float8_e4m3fn
    k: torch.Tensor  # (total_k, Hkv, d_pad) float8_e4m3fn
    vt: torch.Tensor  # (Hkv, d_pad, cols) uint8, the permuted V^T (see vt_pack)
    descale: torch.Tensor  # (3, batch, Hkv) float32: q, k, v descales
    head_dim: int  # the original head dim (before padding)


def check_qkv(q, k, v, cu_seqlens_q, cu_seqlens_k):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise ValueError(f"{name} must be bf16/fp16/fp32 to quantize, got {t.dtype}")
        if t.dim() != 3:
            raise ValueError(f"{name} must be (tokens, heads, head_dim), got {tuple(t.shape)}")
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its head dim")
    if k.shape != v.shape:
        raise ValueError(f"k and v shapes differ: {tuple(k.shape)} vs {tuple(v.shape)}")
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"q and k head dims differ: {q.shape[2]} vs {k.shape[2]}")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"q heads ({q.shape[1]}) must be a multiple of kv heads ({k.shape[1]})")
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if cu.dtype != torch.int32 or cu.dim() != 1 or cu.shape[0] < 2:
            raise ValueError(f"{name} must be a 1-D int32 tensor of batch+1 >= 2 entries")
    if cu_seqlens_q.shape[0] != cu_seqlens_k.shape[0]:
        raise ValueError("cu_seqlens_q and cu_seqlens_k must have the same length")


def quantize_qkv_reference(q, k, v, cu_seqlens_q, cu_seqlens_k) -> Fp8QKV:
    """Torch reference of :func:`quantize_qkv` (any device; loops on the host)."""
    check_qkv(q, k, v, cu_seqlens_q, cu_seqlens_k)
    d = q.shape[2]
    dp = padded_head_dim(d)
    hq, hkv = q.shape[1], k.shape[1]
    g = hq // hkv
    cq = [int(x) for x in cu_seqlens_q.tolist()]
    ck = [int(x) for x in cu_seqlens_k.tolist()]
    batch = len(cq) - 1

    def pad(x):
        return torch.nn.functional.pad(x.float(), (0, dp - d))

    qf, kf, vf = pad(q), pad(k), pad(v)
    q8 = torch.zeros(qf.shape, dtype=torch.float8_e4m3fn, device=q.device)
    k8 = torch.zeros(kf.shape, dtype=torch.float8_e4m3fn, device=q.device)
    cols, padded = vt_columns(k.shape[0], batch)
    vt = torch.zeros((hkv, dp, padded), dtype=torch.uint8, device=q.device)[:, :, :cols]
    descale = torch.ones((3, batch, hkv), dtype=torch.float32, device=q.device)
    for b in range(batch):
        for h in range(hkv):
            blocks = (
                (0, qf[cq[b] : cq[b + 1], h * g : (h + 1) * g]),
                (1, kf[ck[b] : ck[b + 1], h]),
                (2, vf[ck[b] : ck[b + 1], h]),
            )
            for which, x in blocks:
                amax = float(x.abs().max()) if x.numel() else 0.0
                ds = amax / E4M3_MAX if amax > 0 else 1.0
                descale[which, b, h] = ds
                x8 = (x / ds).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
                if which == 0:
                    q8[cq[b] : cq[b + 1], h * g : (h + 1) * g] = x8
                elif which == 1:
                    k8[ck[b] : ck[b + 1], h] = x8
                else:
                    seqlen = ck[b + 1] - ck[b]
                    base = vt_column_offset(ck[b], b)
                    for r in range(vt_region_end(ck[b + 1], b, batch, cols) - base):
                        src = vt_source_key(r)
                        if src < seqlen:
                            vt[h, :, base + r] = x8[src].view(torch.uint8)
    return Fp8QKV(q8, k8, vt, descale, d)


try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None


if triton is not None:

    @triton.jit
    def descale_and_inverse(a):
        """(descale, 1 / descale) of an amax, both IEEE round-to-nearest (``div_rn``): Triton's
        ``/`` is an approximate division (1 ulp off amax / 448 on the H200), and the torch
        reference and the chunked kernel must give the same bits."""
        ds = tl.where(a > 0, tl.math.div_rn(a, 448.0), 1.0)
        return ds, tl.math.div_rn(1.0, ds)

    @triton.jit
    def _amax_rows(src_ptr, start, seqlen, h0, nheads, s_t, s_h,
                   D: tl.constexpr, DP_POW2: tl.constexpr, BLOCK_T: tl.constexpr):
        dd = tl.arange(0, DP_POW2)
        tt = tl.arange(0, BLOCK_T)
        amax = tl.zeros((BLOCK_T, DP_POW2), dtype=tl.float32)
        for hh in range(0, nheads):
            for t0 in range(0, seqlen, BLOCK_T):
                t = t0 + tt
                m = (t < seqlen)[:, None] & (dd < D)[None, :]
                x = tl.load(
                    src_ptr + (start + t).to(tl.int64)[:, None] * s_t + (h0 + hh) * s_h + dd[None, :],
                    mask=m, other=0.0,
                ).to(tl.float32)
                amax = tl.maximum(amax, tl.abs(x))
        return tl.max(tl.max(amax, axis=1), axis=0)

    @triton.jit
    def _quant_rows(src_ptr, dst_ptr, start, seqlen, h0, nheads, s_t, s_h, d_t, d_h, inv,
                    D: tl.constexpr, DP: tl.constexpr, DP_POW2: tl.constexpr, BLOCK_T: tl.constexpr):
        dd = tl.arange(0, DP_POW2)
        tt = tl.arange(0, BLOCK_T)
        for hh in range(0, nheads):
            for t0 in range(0, seqlen, BLOCK_T):
                t = t0 + tt
                m = (t < seqlen)[:, None] & (dd < D)[None, :]
                x = tl.load(
                    src_ptr + (start + t).to(tl.int64)[:, None] * s_t + (h0 + hh) * s_h + dd[None, :],
                    mask=m, other=0.0,
                ).to(tl.float32)
                y = tl.clamp(x * inv, -448.0, 448.0).to(tl.float8e4nv)
                tl.store(
                    dst_ptr + (start + t).to(tl.int64)[:, None] * d_t + (h0 + hh) * d_h + dd[None, :],
                    y,
                    mask=(t < seqlen)[:, None] & (dd < DP)[None, :],
                )

    @triton.jit
    def _quant_vt(src_ptr, vt_ptr, start, nxt, b, batch, cols, h, s_t, s_h, svt_h, svt_d, inv,
                  D: tl.constexpr, DP: tl.constexpr, DP_POW2: tl.constexpr, ALIGN: tl.constexpr,
                  BLOCK_T: tl.constexpr):
        dd = tl.arange(0, DP_POW2)
        tt = tl.arange(0, BLOCK_T)
        seqlen = nxt - start
        base = (start + ALIGN - 1) // ALIGN * ALIGN + ALIGN * b  # layout.vt_column_offset
        end = tl.where(b == batch - 1, cols, (nxt + ALIGN - 1) // ALIGN * ALIGN + ALIGN * (b + 1))
        for r0 in range(0, end - base, BLOCK_T):
            r = r0 + tt
            lane = r % 16
            # layout.key_perm: slot 4q+i holds key 8*(i//2) + 2q + i%2
            src = (r // 16) * 16 + 8 * ((lane % 4) // 2) + 2 * (lane // 4) + (lane % 2)
            m = (src < seqlen)[:, None] & (dd < D)[None, :]
            x = tl.load(
                src_ptr + (start + src).to(tl.int64)[:, None] * s_t + h * s_h + dd[None, :],
                mask=m, other=0.0,
            ).to(tl.float32)
            y = tl.clamp(x * inv, -448.0, 448.0).to(tl.float8e4nv).to(tl.uint8, bitcast=True)
            col = (base + r).to(tl.int64)
            tl.store(
                vt_ptr + h * svt_h + dd[:, None] * svt_d + col[None, :],
                tl.trans(y),
                mask=(r < end - base)[None, :] & (dd < DP)[:, None],
            )

    @triton.jit
    def _quantize_kernel(
        q_ptr, k_ptr, v_ptr, q8_ptr, k8_ptr, vt_ptr, desc_ptr, cuq_ptr, cuk_ptr,
        sq_t, sq_h, sk_t, sk_h, sv_t, sv_h,
        s8q_t, s8q_h, s8k_t, s8k_h, svt_h, svt_d,
        batch, hkv, group, cols,
        D: tl.constexpr, DP: tl.constexpr, DP_POW2: tl.constexpr, ALIGN: tl.constexpr,
        BLOCK_T: tl.constexpr,
    ):
        b = tl.program_id(0)
        h = tl.program_id(1)
        which = tl.program_id(2)  # 0: q, 1: k, 2: v
        if which == 0:
            start = tl.load(cuq_ptr + b)
            seqlen = tl.load(cuq_ptr + b + 1) - start
            a = _amax_rows(q_ptr, start, seqlen, h * group, group, sq_t, sq_h, D, DP_POW2, BLOCK_T)
            ds, inv = descale_and_inverse(a)
            tl.store(desc_ptr + b * hkv + h, ds)
            _quant_rows(q_ptr, q8_ptr, start, seqlen, h * group, group, sq_t, sq_h, s8q_t, s8q_h,
                        inv, D, DP, DP_POW2, BLOCK_T)
        elif which == 1:
            start = tl.load(cuk_ptr + b)
            seqlen = tl.load(cuk_ptr + b + 1) - start
            a = _amax_rows(k_ptr, start, seqlen, h, 1, sk_t, sk_h, D, DP_POW2, BLOCK_T)
            ds, inv = descale_and_inverse(a)
            tl.store(desc_ptr + batch * hkv + b * hkv + h, ds)
            _quant_rows(k_ptr, k8_ptr, start, seqlen, h, 1, sk_t, sk_h, s8k_t, s8k_h,
                        inv, D, DP, DP_POW2, BLOCK_T)
        else:
            start = tl.load(cuk_ptr + b)
            nxt = tl.load(cuk_ptr + b + 1)
            a = _amax_rows(v_ptr, start, nxt - start, h, 1, sv_t, sv_h, D, DP_POW2, BLOCK_T)
            ds, inv = descale_and_inverse(a)
            tl.store(desc_ptr + 2 * batch * hkv + b * hkv + h, ds)
            _quant_vt(v_ptr, vt_ptr, start, nxt, b, batch, cols, h, sv_t, sv_h, svt_h, svt_d,
                      inv, D, DP, DP_POW2, ALIGN, BLOCK_T)


def outputs(q, k, batch: int, out: Optional[Fp8QKV]):
    """The quantized q, k, packed V^T and descales a quantize writes: ``out``'s, or new ones."""
    if out is not None:
        return out.q, out.k, out.vt, out.descale
    dp = padded_head_dim(q.shape[2])
    hq, hkv = q.shape[1], k.shape[1]
    q8 = torch.empty((q.shape[0], hq, dp), dtype=torch.float8_e4m3fn, device=q.device)
    k8 = torch.empty((k.shape[0], hkv, dp), dtype=torch.float8_e4m3fn, device=q.device)
    cols, padded = vt_columns(k.shape[0], batch)
    vt = torch.empty((hkv, dp, padded), dtype=torch.uint8, device=q.device)[:, :, :cols]
    descale = torch.empty((3, batch, hkv), dtype=torch.float32, device=q.device)
    return q8, k8, vt, descale


def quantize_qkv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: Optional[torch.Tensor] = None,
    out: Optional[Fp8QKV] = None,
) -> Fp8QKV:
    """Quantize q/k/v for :func:`fp8_varlen_attention` (pass ``k=res.k, v=None, vt=res.vt,
    descale=res.descale``).  Softmax scale stays the caller's (1/sqrt of the *original* head dim)."""
    if cu_seqlens_k is None:
        cu_seqlens_k = cu_seqlens_q
    check_qkv(q, k, v, cu_seqlens_q, cu_seqlens_k)
    if triton is None:
        raise RuntimeError("quantize_qkv needs triton")
    d = q.shape[2]
    dp = padded_head_dim(d)
    batch = cu_seqlens_q.shape[0] - 1
    hq, hkv = q.shape[1], k.shape[1]
    q8, k8, vt, descale = outputs(q, k, batch, out)
    _quantize_kernel[(batch, hkv, 3)](
        q, k, v, q8, k8, vt, descale, cu_seqlens_q, cu_seqlens_k,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        q8.stride(0), q8.stride(1), k8.stride(0), k8.stride(1), vt.stride(0), vt.stride(1),
        batch, hkv, hq // hkv, vt.shape[2],
        D=d, DP=dp, DP_POW2=pow2_at_least(dp), ALIGN=VT_ALIGN, BLOCK_T=64,
    )
    return Fp8QKV(q8, k8, vt, descale, d)
