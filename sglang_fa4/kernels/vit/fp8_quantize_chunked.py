"""bf16/fp16 q, k, v -> E4M3 + per-(sequence, kv head) descales, spread over token chunks.

Same outputs as :func:`.fp8_quantize.quantize_qkv` (bitwise: the same
amax, the same ``x * (1 / descale)`` rounding), but that kernel runs one program per
(sequence, kv head, tensor): a single 4K image (one sequence, 16 heads) is 48 programs on a
132-SM GPU, each streaming 40k tokens twice. Here the grid spans chunks of ``CHUNK`` tokens, so
the work is bandwidth-bound whatever the layout:

1. ``_amax_pass``: grid (chunks, 3 x kv heads): each program writes its chunk's amax to a
   (3, kv heads, chunks) float32 buffer (every slot written: no memset, no atomics);
2. ``_quant_pass``: same grid: each program reduces its (tensor, sequence, head)'s chunk amaxes,
   writes the descale (the sequence's chunk 0), and quantizes its chunk (v straight into the
   permuted V^T buffer, zero columns past the keys).

The chunks form ONE list over all sequences (:func:`chunk_grid`): sequence b owns
``ceil(len_b / CHUNK) + 1`` consecutive chunks (the extra one: its V^T region is up to 31 columns
longer than its keys, and an empty sequence still owns 16 V^T columns to zero), and a program finds
its (sequence, chunk) by a prefix sum over cu_seqlens (``_locate``). So the grid grows with the
tokens and the sequence count, ``ceil(T / CHUNK) + 2 * batch`` at most, not with
``batch * max_seqlen``: a ViT budget graph's full-attention layout (vit_budget_layouts: ~70 segment
slots, max_seqlen = the budget) used to launch 70 x 48 x 165 programs per pass at a 4K picture's
42196-token budget, nearly all of them empty (the 4K Qwen2.5-VL graph row of
benchmark/results/h200/vit_fp8-run1.md, 0.891x). The host sizes the grid from ``max_seqlen``,
the tensors' row counts and the cu_seqlens length only: no device read, no sync, CUDA-graph
capturable. ``max_seqlen`` below the longest sequence leaves its tail unquantized: the caller's
contract, as for the attention kernels. Integer arguments and the cu_seqlens pointers are not
specialized by Triton (``do_not_specialize``): one compile per (dtype, head dim), whatever the
layout, so a startup warmup covers every call.
"""

from __future__ import annotations

import time
from typing import Optional

import torch

from sglang_fa4.kernels import compile_events
from sglang_fa4.kernels.fp8_sm90 import VT_ALIGN, padded_head_dim, pow2_at_least
from sglang_fa4.kernels.vit.fp8_quantize import Fp8QKV, check_qkv, outputs

#: Tokens (q/k rows, V^T columns) per program; BLOCK_T rows per loaded tile.
CHUNK = 256
BLOCK_T = 64
#: cu_seqlens entries a program reads per step of its prefix sum
BLOCK_B = 128

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only environments without triton: the module still imports
    triton = None


def chunks_of(seqlen: int) -> int:
    """Chunks sequence of ``seqlen`` tokens owns in the linear chunk list (``_locate``)."""
    return -(-int(seqlen) // CHUNK) + 1


def chunk_grid(max_seqlen: int, rows: int, batch: int) -> int:
    """Programs per (tensor, kv head): a bound on sum(chunks_of(len_b)) from host ints only --
    ``batch`` sequences none longer than ``max_seqlen``, together at most ``rows`` tokens."""
    return max(1, min(batch * chunks_of(max_seqlen), -(-int(rows) // CHUNK) + 2 * batch))


def locate(cu: list, i: int) -> tuple[int, int, int, int]:
    """Python twin of ``_locate`` (tests): chunk ``i`` of the list -> (sequence, chunk within it,
    the sequence's first chunk, its chunk count); sequence == batch past the last chunk."""
    first = 0
    for b in range(len(cu) - 1):
        n = chunks_of(cu[b + 1] - cu[b])
        if i < first + n:
            return b, i - first, first, n
        first += n
    return len(cu) - 1, i - first, first, 0


if triton is not None:
    from sglang_fa4.kernels.vit.fp8_quantize import descale_and_inverse

    # cu_seqlens too: callers pass views at any int32 offset (the Qwen2.5-VL host layouts are split
    # from one upload), and a pointer's 16-byte alignment is otherwise part of Triton's cache key
    # (a new compile after the warmup, seen on the H200); q/k/v keep it (vectorized loads)
    _INTS = ["cuq", "cuk", "sq_t", "sq_h", "sk_t", "sk_h", "sv_t", "sv_h", "batch", "hkv", "group", "nlin"]

    @triton.jit
    def _locate(cu, nbatch, i, CHUNK: tl.constexpr, BLOCK_B: tl.constexpr):
        """(sequence, chunk within it, its first chunk, its chunk count) of chunk ``i``; the
        sequence is ``nbatch`` (and the count 0) past the last chunk. See :func:`locate`."""
        jj = tl.arange(0, BLOCK_B)
        zero = i * 0
        base = zero
        b_out = zero + nbatch
        first = zero
        count = zero
        for j0 in range(0, nbatch, BLOCK_B):
            j = j0 + jj
            m = j < nbatch
            lo = tl.load(cu + j, mask=m, other=0)
            hi = tl.load(cu + j + 1, mask=m, other=0)
            n = tl.where(m, (hi - lo + CHUNK - 1) // CHUNK + 1, 0)
            incl = tl.cumsum(n, 0) + base
            excl = incl - n
            hit = m & (excl <= i) & (i < incl)
            found = tl.sum(hit.to(tl.int32), 0) > 0
            b_out = tl.where(found, tl.sum(tl.where(hit, j, 0), 0), b_out)
            first = tl.where(found, tl.sum(tl.where(hit, excl, 0), 0), first)
            count = tl.where(found, tl.sum(tl.where(hit, n, 0), 0), count)
            base += tl.sum(n, 0)
        return b_out, i - first, first, count

    @triton.jit
    def _chunk_amax(src, start, lo, hi, h0, nh, s_t, s_h, D: tl.constexpr, DP2: tl.constexpr,
                    BLOCK_T: tl.constexpr):
        dd = tl.arange(0, DP2)
        tt = tl.arange(0, BLOCK_T)
        acc = tl.zeros((BLOCK_T, DP2), dtype=tl.float32)
        for hh in range(0, nh):
            for t0 in range(lo, hi, BLOCK_T):
                t = t0 + tt
                x = tl.load(src + (start + t).to(tl.int64)[:, None] * s_t + (h0 + hh) * s_h + dd[None, :],
                            mask=(t < hi)[:, None] & (dd < D)[None, :], other=0.0).to(tl.float32)
                acc = tl.maximum(acc, tl.abs(x))
        return tl.max(tl.max(acc, axis=1), axis=0)

    @triton.jit(do_not_specialize=_INTS)
    def _amax_pass(q, k, v, part, cuq, cuk, sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, batch, hkv, group, nlin,
                   D: tl.constexpr, DP2: tl.constexpr, CHUNK: tl.constexpr, BLOCK_T: tl.constexpr,
                   BLOCK_B: tl.constexpr):
        i = tl.program_id(0)
        which = tl.program_id(1) // hkv  # 0: q, 1: k, 2: v
        h = tl.program_id(1) % hkv
        a = (i * 0).to(tl.float32)
        if which == 0:
            b, c, first, count = _locate(cuq, batch, i, CHUNK, BLOCK_B)
            if b < batch:
                start = tl.load(cuq + b)
                hi = tl.minimum(tl.load(cuq + b + 1) - start, (c + 1) * CHUNK)
                a = _chunk_amax(q, start, c * CHUNK, hi, h * group, group, sq_t, sq_h, D, DP2, BLOCK_T)
        else:
            b, c, first, count = _locate(cuk, batch, i, CHUNK, BLOCK_B)
            if b < batch:
                start = tl.load(cuk + b)
                hi = tl.minimum(tl.load(cuk + b + 1) - start, (c + 1) * CHUNK)
                if which == 1:
                    a = _chunk_amax(k, start, c * CHUNK, hi, h, 1, sk_t, sk_h, D, DP2, BLOCK_T)
                else:
                    a = _chunk_amax(v, start, c * CHUNK, hi, h, 1, sv_t, sv_h, D, DP2, BLOCK_T)
        tl.store(part + (which * hkv + h).to(tl.int64) * nlin + i, a)

    @triton.jit
    def _reduce_amax(part, row, first, count):
        """Max of ``count`` chunk amaxes from ``first`` in row ``row`` of the (3 * hkv, nlin) buffer."""
        jj = tl.arange(0, 128)
        acc = tl.zeros((128,), dtype=tl.float32)
        for j0 in range(0, count, 128):
            acc = tl.maximum(acc, tl.load(part + row + first + j0 + jj, mask=j0 + jj < count, other=0.0))
        return tl.max(acc, axis=0)

    @triton.jit
    def _chunk_quant(src, dst, start, lo, hi, h0, nh, s_t, s_h, d_t, d_h, inv, D: tl.constexpr,
                     DP: tl.constexpr, DP2: tl.constexpr, BLOCK_T: tl.constexpr):
        dd = tl.arange(0, DP2)
        tt = tl.arange(0, BLOCK_T)
        for hh in range(0, nh):
            for t0 in range(lo, hi, BLOCK_T):
                t = t0 + tt
                row = (start + t).to(tl.int64)[:, None]
                x = tl.load(src + row * s_t + (h0 + hh) * s_h + dd[None, :],
                            mask=(t < hi)[:, None] & (dd < D)[None, :], other=0.0).to(tl.float32)
                y = tl.clamp(x * inv, -448.0, 448.0).to(tl.float8e4nv)
                tl.store(dst + row * d_t + (h0 + hh) * d_h + dd[None, :], y,
                         mask=(t < hi)[:, None] & (dd < DP)[None, :])

    @triton.jit(do_not_specialize=_INTS + ["s8q_t", "s8q_h", "s8k_t", "s8k_h", "svt_h", "svt_d", "cols"])
    def _quant_pass(q, k, v, q8, k8, vt, desc, part, cuq, cuk, sq_t, sq_h, sk_t, sk_h, sv_t, sv_h,
                    s8q_t, s8q_h, s8k_t, s8k_h, svt_h, svt_d, batch, hkv, group, nlin, cols,
                    D: tl.constexpr, DP: tl.constexpr, DP2: tl.constexpr, ALIGN: tl.constexpr,
                    CHUNK: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_B: tl.constexpr):
        i = tl.program_id(0)
        which = tl.program_id(1) // hkv
        h = tl.program_id(1) % hkv
        row = (which * hkv + h).to(tl.int64) * nlin
        if which == 0:
            b, c, first, count = _locate(cuq, batch, i, CHUNK, BLOCK_B)
        else:
            b, c, first, count = _locate(cuk, batch, i, CHUNK, BLOCK_B)
        if b < batch:
            a = _reduce_amax(part, row, first, count)
            ds, inv = descale_and_inverse(a)
            if c == 0:
                tl.store(desc + (which * batch + b) * hkv + h, ds)
            if which == 0:
                start = tl.load(cuq + b)
                hi = tl.minimum(tl.load(cuq + b + 1) - start, (c + 1) * CHUNK)
                _chunk_quant(q, q8, start, c * CHUNK, hi, h * group, group, sq_t, sq_h, s8q_t, s8q_h, inv,
                             D, DP, DP2, BLOCK_T)
            elif which == 1:
                start = tl.load(cuk + b)
                hi = tl.minimum(tl.load(cuk + b + 1) - start, (c + 1) * CHUNK)
                _chunk_quant(k, k8, start, c * CHUNK, hi, h, 1, sk_t, sk_h, s8k_t, s8k_h, inv, D, DP, DP2, BLOCK_T)
            else:
                start = tl.load(cuk + b)
                nxt = tl.load(cuk + b + 1)
                seqlen = nxt - start
                base = (start + ALIGN - 1) // ALIGN * ALIGN + ALIGN * b  # layout.vt_column_offset
                end = tl.where(b == batch - 1, cols, (nxt + ALIGN - 1) // ALIGN * ALIGN + ALIGN * (b + 1))
                # chunk c: V^T columns [c*CHUNK, (c+1)*CHUNK) of this region; the sequence's last
                # chunk also takes the rest (up to 31 columns; for the last sequence, the columns of
                # k's rows past cu_seqlens[-1], zeros)
                hi = tl.where(c == count - 1, end - base, tl.minimum(end - base, (c + 1) * CHUNK))
                dd = tl.arange(0, DP2)
                tt = tl.arange(0, BLOCK_T)
                for r0 in range(c * CHUNK, hi, BLOCK_T):
                    r = r0 + tt
                    lane = r % 16
                    # layout.key_perm: slot 4q+i holds key 8*(i//2) + 2q + i%2
                    src = (r // 16) * 16 + 8 * ((lane % 4) // 2) + 2 * (lane // 4) + (lane % 2)
                    x = tl.load(v + (start + src).to(tl.int64)[:, None] * sv_t + h * sv_h + dd[None, :],
                                mask=(src < seqlen)[:, None] & (dd < D)[None, :], other=0.0).to(tl.float32)
                    y = tl.clamp(x * inv, -448.0, 448.0).to(tl.float8e4nv).to(tl.uint8, bitcast=True)
                    tl.store(vt + h * svt_h + dd[:, None] * svt_d + (base + r).to(tl.int64)[None, :],
                             tl.trans(y), mask=(r < hi)[None, :] & (dd < DP)[:, None])


def quantize_qkv_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: Optional[torch.Tensor],
    max_seqlen: int,
    out: Optional[Fp8QKV] = None,
) -> Fp8QKV:
    """:func:`~sglang_fa4.kernels.vit.fp8_quantize.quantize_qkv`'s result in two bandwidth-bound
    launches; ``max_seqlen`` (host int, at least the longest q and k sequence) bounds the grid."""
    if cu_seqlens_k is None:
        cu_seqlens_k = cu_seqlens_q
    check_qkv(q, k, v, cu_seqlens_q, cu_seqlens_k)
    if triton is None:
        raise RuntimeError("quantize_qkv_chunked needs triton")
    if not isinstance(max_seqlen, int) or isinstance(max_seqlen, bool) or max_seqlen < 0:
        raise TypeError(f"max_seqlen must be a non-negative Python int (it sizes the grid), got {max_seqlen!r}")
    d = q.shape[2]
    dp = padded_head_dim(d)
    batch = cu_seqlens_q.shape[0] - 1
    hq, hkv = q.shape[1], k.shape[1]
    q8, k8, vt, descale = outputs(q, k, batch, out)
    nlin = chunk_grid(max_seqlen, max(q.shape[0], k.shape[0]), batch)
    part = torch.empty((3, hkv, nlin), dtype=torch.float32, device=q.device)
    strides = (q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1))
    dp2 = pow2_at_least(dp)
    t0 = time.perf_counter()
    kernel = _amax_pass[(nlin, 3 * hkv)](
        q, k, v, part, cu_seqlens_q, cu_seqlens_k, *strides, batch, hkv, hq // hkv, nlin,
        D=d, DP2=dp2, CHUNK=CHUNK, BLOCK_T=BLOCK_T, BLOCK_B=BLOCK_B,
    )
    _note_launch(kernel, "quantize amax", d, q.dtype, t0)
    t0 = time.perf_counter()
    kernel = _quant_pass[(nlin, 3 * hkv)](
        q, k, v, q8, k8, vt, descale, part, cu_seqlens_q, cu_seqlens_k, *strides,
        q8.stride(0), q8.stride(1), k8.stride(0), k8.stride(1), vt.stride(0), vt.stride(1),
        batch, hkv, hq // hkv, nlin, vt.shape[2],
        D=d, DP=dp, DP2=dp2, ALIGN=VT_ALIGN, CHUNK=CHUNK, BLOCK_T=BLOCK_T, BLOCK_B=BLOCK_B,
    )
    _note_launch(kernel, "quantize", d, q.dtype, t0)
    return Fp8QKV(q8, k8, vt, descale, d)


# Compile bookkeeping for the JIT monitor: a Triton launch returns its compiled kernel, a new
# object the first time a specialization is compiled (or loaded from Triton's disk cache).
_seen: dict[int, object] = {}  # id -> kernel (kept alive, so ids are not reused)


def _note_launch(kernel, name: str, head_dim: int, dtype, t0: float) -> None:
    if kernel is None or id(kernel) in _seen:  # None: Triton's interpreter
        return
    _seen[id(kernel)] = kernel
    event = {"kernel": name, "head_dim": head_dim, "dtype": str(dtype).replace("torch.", ""),
             "seconds": time.perf_counter() - t0,
             "capturing": torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()}
    compile_events.record("fp8_quantize", event)

