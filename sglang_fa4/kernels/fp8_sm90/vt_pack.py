"""V (total_k, Hkv, d) E4M3 -> the permuted V^T buffer (Hkv, d, cols) the FP8 kernel reads.

Sequence b owns columns [vt_column_offset(cu_k[b], b), vt_region_end(...)) (16-aligned starts, see
layout.py); column r of it holds key ``layout.vt_source_key(r)`` (keys permuted inside groups of 16)
or zero past the sequence.  Every column of the buffer is written (no garbage NaN bytes can reach
the MMA: a masked P of 0 times a NaN would be NaN).

Triton kernel (one launch; host launch cost of Triton ~20-40 us is the price of this first
version) plus a torch reference used by the CPU tests.
"""

from __future__ import annotations

import torch

from sglang_fa4.kernels.fp8_sm90.layout import (
    KEY_PERM,
    VT_ALIGN,
    pow2_at_least,
    vt_column_offset,
    vt_columns,
    vt_region_end,
    vt_source_key,
)

_BLOCK_R = 64


def allocate_vt(v: torch.Tensor, batch: int) -> torch.Tensor:
    """Uninitialised (Hkv, d, cols) uint8 V^T view over a buffer with a 16-aligned row stride."""
    total_k, hkv, d = v.shape
    cols, padded = vt_columns(total_k, batch)
    return torch.empty((hkv, d, padded), dtype=torch.uint8, device=v.device)[:, :, :cols]


def pack_vt_reference(v: torch.Tensor, cu_seqlens_k: torch.Tensor) -> torch.Tensor:
    """Torch (CPU or GPU) reference of :func:`pack_vt`, on any dtype; zeros outside sequences."""
    cu = [int(x) for x in cu_seqlens_k.tolist()]
    batch = len(cu) - 1
    total_k, hkv, d = v.shape
    cols, padded = vt_columns(total_k, batch)
    out = torch.full((hkv, d, padded), 255, dtype=v.dtype, device=v.device)[:, :, :cols]  # 255: poison
    for b in range(batch):
        seqlen = cu[b + 1] - cu[b]
        base = vt_column_offset(cu[b], b)
        end = vt_region_end(cu[b + 1], b, batch, cols)
        for r in range(end - base):
            src = vt_source_key(r)
            out[:, :, base + r] = v[cu[b] + src].to(out.dtype) if src < seqlen else 0
    return out


def unpack_vt_reference(vt: torch.Tensor, cu_seqlens_k: torch.Tensor) -> torch.Tensor:
    """The inverse of the pack (tests, torch models of the kernel): V (total_k, Hkv, d) read back
    from V^T's columns, key ``vt_source_key(r)`` of sequence b at column ``base_b + r``."""
    cu = [int(x) for x in cu_seqlens_k.tolist()]
    hkv, d, _ = vt.shape
    v = torch.empty((cu[-1], hkv, d), dtype=vt.dtype, device=vt.device)
    for b in range(len(cu) - 1):
        n, base = cu[b + 1] - cu[b], vt_column_offset(cu[b], b)
        slots = torch.arange(-(-n // 16) * 16)
        keys = torch.tensor([vt_source_key(int(s)) for s in slots], dtype=torch.int64)
        keep = keys < n
        v[cu[b] + keys[keep]] = vt[:, :, base + slots[keep]].permute(2, 0, 1)
    return v


try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only environments without triton: the reference still imports
    triton = None


if triton is not None:

    @triton.jit
    def _pack_vt_kernel(
        v_ptr,
        vt_ptr,
        cu_ptr,
        batch,
        cols,
        stride_v_tok,
        stride_v_head,
        stride_vt_head,
        stride_vt_d,
        D: tl.constexpr,
        D_POW2: tl.constexpr,
        ALIGN: tl.constexpr,
        BLOCK_R: tl.constexpr,
    ):
        pid_r = tl.program_id(0)
        b = tl.program_id(1)
        h = tl.program_id(2)
        start = tl.load(cu_ptr + b)
        nxt = tl.load(cu_ptr + b + 1)
        seqlen = nxt - start
        base = (start + ALIGN - 1) // ALIGN * ALIGN + ALIGN * b  # layout.vt_column_offset
        end = tl.where(b == batch - 1, cols, (nxt + ALIGN - 1) // ALIGN * ALIGN + ALIGN * (b + 1))
        if pid_r * BLOCK_R < end - base:
            r = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
            lane = r % 16
            # layout.key_perm: slot 4q+i holds key 8*(i//2) + 2q + i%2
            src = (r // 16) * 16 + 8 * ((lane % 4) // 2) + 2 * (lane // 4) + (lane % 2)
            dd = tl.arange(0, D_POW2)
            ld_mask = (src < seqlen)[:, None] & (dd < D)[None, :]
            vals = tl.load(
                v_ptr + (start + src).to(tl.int64)[:, None] * stride_v_tok + h * stride_v_head + dd[None, :],
                mask=ld_mask,
                other=0,
            )
            st_mask = (r < end - base)[None, :] & (dd < D)[:, None]
            col = (base + r).to(tl.int64)
            tl.store(
                vt_ptr + h * stride_vt_head + dd[:, None] * stride_vt_d + col[None, :],
                tl.trans(vals),
                mask=st_mask,
            )


def pack_vt(v: torch.Tensor, cu_seqlens_k: torch.Tensor, max_seqlen_k: int, out=None) -> torch.Tensor:
    """Permuted V^T of E4M3 ``v`` as uint8 (Hkv, d, cols); one Triton launch, no host sync."""
    if triton is None:
        raise RuntimeError("pack_vt needs triton (pip install triton)")
    total_k, hkv, d = v.shape
    batch = cu_seqlens_k.shape[0] - 1
    v8 = v.view(torch.uint8) if v.dtype != torch.uint8 else v
    if v8.stride(2) != 1:
        raise ValueError("v must be contiguous in its head dim")
    vt = allocate_vt(v, batch) if out is None else out
    # a region spans at most max_seqlen_k rounded up plus the alignment slack; the last one runs
    # to the end of the buffer (at most 2 * ALIGN past its keys)
    grid = (-(-(int(max_seqlen_k) + 3 * VT_ALIGN) // _BLOCK_R), batch, hkv)  # ceil-div without triton.cdiv's host cost
    _pack_vt_kernel[grid](
        v8,
        vt,
        cu_seqlens_k,
        batch,
        vt.shape[2],
        v8.stride(0),
        v8.stride(1),
        vt.stride(0),
        vt.stride(1),
        D=d,
        D_POW2=pow2_at_least(d),
        ALIGN=VT_ALIGN,
        BLOCK_R=_BLOCK_R,
    )
    return vt


assert KEY_PERM[2] == 8  # the Triton formula above and layout.key_perm must agree
