"""V (total_k, Hkv, d) E4M3 -> the permuted V^T buffer (Hkv, d, cols) the FP8 kernel reads.

Sequence b owns columns [cu_k[b] + 16 b, cu_k[b+1] + 16 (b+1)); column r of it holds key
``layout.vt_source_key(r)`` (keys permuted inside groups of 16, see layout.py) or zero past the
sequence.  Every column inside the logical extent is written (no garbage NaN bytes can reach the
MMA: a masked P of 0 times a NaN would be NaN).

Triton kernel (one launch; host launch cost of Triton ~20-40 us is the price of this first
version) plus a torch reference used by the CPU tests.
"""

from __future__ import annotations

import torch

from sglang_fa4.kernels.fp8_sm90.layout import KEY_PERM, VT_SEQ_SLACK, vt_columns, vt_source_key

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
    out = torch.zeros((hkv, d, padded), dtype=v.dtype, device=v.device)[:, :, :cols]
    for b in range(batch):
        seqlen = cu[b + 1] - cu[b]
        base = cu[b] + VT_SEQ_SLACK * b
        for r in range(seqlen + VT_SEQ_SLACK):
            src = vt_source_key(r)
            if src < seqlen:
                out[:, :, base + r] = v[cu[b] + src].to(out.dtype)
    return out


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
        stride_v_tok,
        stride_v_head,
        stride_vt_head,
        stride_vt_d,
        D: tl.constexpr,
        D_POW2: tl.constexpr,
        SLACK: tl.constexpr,
        BLOCK_R: tl.constexpr,
    ):
        pid_r = tl.program_id(0)
        b = tl.program_id(1)
        h = tl.program_id(2)
        start = tl.load(cu_ptr + b)
        seqlen = tl.load(cu_ptr + b + 1) - start
        if pid_r * BLOCK_R < seqlen + SLACK:
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
            st_mask = (r < seqlen + SLACK)[None, :] & (dd < D)[:, None]
            col = (start + SLACK * b + r).to(tl.int64)
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
    grid = (triton.cdiv(int(max_seqlen_k) + VT_SEQ_SLACK, _BLOCK_R), batch, hkv)
    _pack_vt_kernel[grid](
        v8,
        vt,
        cu_seqlens_k,
        v8.stride(0),
        v8.stride(1),
        vt.stride(0),
        vt.stride(1),
        D=d,
        D_POW2=triton.next_power_of_2(d),
        SLACK=VT_SEQ_SLACK,
        BLOCK_R=_BLOCK_R,
    )
    return vt


assert KEY_PERM[2] == 8  # the Triton formula above and layout.key_perm must agree
