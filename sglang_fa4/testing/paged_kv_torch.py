"""The paged FP8 KV kernels' contracts in fp32 torch: what the CPU harnesses run instead of the
kernels, and what the tests read the pool back with.

* :func:`paged_decode_torch` -- the split-KV decode kernel's contract (bottom-right positions, the
  window, descales per (batch, kv head) or scalar, the LSE); :func:`split_kv` runs it for a plan;
* :func:`gather` -- the page gather's torch path (``fp8_paged_kv.gather_paged_kv``) with the torch
  V^T pack: identical to the fused kernel wherever the FP8 forward reads;
* :func:`fp8_forward_model` -- the SM90 FP8 forward's contract, for a harness to put in its place;
* :func:`install` -- the first two for CPU tensors outside Triton's interpreter (a CUDA tensor, or any
  tensor under TRITON_INTERPRET, still takes the kernel), as the route's kernels
  (``fp8_paged_kv.install_kernels``): the SGLang CPU harnesses call it first;
* :func:`gather_paged_kv_reference`, :func:`dequantized_paged_kv` -- the pool read back per
  sequence, built from SGLang's page arithmetic directly; :func:`paged_attention_fp32` -- the fp32
  reference attention over it.

Host loops over the sequences (``.tolist()``): CPU only, never inside a CUDA-graph capture.
"""

from __future__ import annotations

import torch

from sglang_fa4.kernels import fp8_paged_kv, fp8_sm90
from sglang_fa4.kernels.triton_handles import interpreting
from sglang_fa4.testing.reference import attention_fp32, offsets

FP8 = torch.float8_e4m3fn


def _descale(x, batch: int, hkv: int, device):
    if x is None:
        return torch.ones(1, dtype=torch.float32, device=device)
    return x.float().reshape(1) if x.numel() == 1 else x.float()


def paged_decode_torch(q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, k_descale, v_descale, scale: float,
                       left: int, right: int, out, lse, image_ranges=None) -> None:
    """Fill ``out`` (total_q, Hq, d) and ``lse`` (Hq, total_q, natural log; None: not asked) as the
    kernel does: bottom-right positions, keys ``pos - left .. pos + right``, descales per (batch, kv
    head) or scalar; with ``image_ranges`` ((total_q, 2), inclusive) a row also sees its image's
    keys at or above ``pos - left``."""
    page_size, hkv, d = k_cache.shape[1:]
    hq = q.shape[1]
    kd = [_descale(x, page_table.shape[0], hkv, q.device) for x in (k_descale, v_descale)]
    cu = cu_seqlens_q.tolist()
    for b, n in enumerate(cache_seqlens.tolist()):
        nq = cu[b + 1] - cu[b]
        if nq == 0:
            continue
        t = torch.arange(n, device=q.device)
        slots = page_table[b].long()[t // page_size] * page_size + t % page_size
        kf, vf = (c.view(-1, hkv, d)[slots].float() * (x.reshape(1).expand(hkv) if x.numel() == 1 else x[b])[None, :, None]
                  for c, x in ((k_cache, kd[0]), (v_cache, kd[1])))
        kf, vf = kf.repeat_interleave(hq // hkv, 1), vf.repeat_interleave(hq // hkv, 1)
        s = torch.einsum("qhd,khd->hqk", q[cu[b]:cu[b + 1]].float(), kf) * scale
        pos = torch.arange(nq, device=q.device)[:, None] + n - nq
        j = torch.arange(n, device=q.device)[None, :]
        hidden = j > pos + right
        if image_ranges is not None:
            img = image_ranges[cu[b]:cu[b + 1]].long()
            hidden &= ~((j >= img[:, :1]) & (j <= img[:, 1:]))
        s = s.masked_fill((j < pos - left) | hidden, float("-inf"))
        row_lse = torch.logsumexp(s, -1)
        p = torch.exp(s - torch.where(row_lse.isinf(), 0.0, row_lse)[..., None])
        out[cu[b]:cu[b + 1]] = torch.einsum("hqk,khd->qhd", p, vf).to(out.dtype)
        if lse is not None:
            lse[:, cu[b]:cu[b + 1]] = row_lse


def split_kv(plan, q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, k_descale, v_descale,
             softmax_scale, out, image_ranges=None):
    """The split-KV kernel's launch (``fp8_paged_kv.Kernels.split_kv``) in torch, for a plan."""
    total_q, hq, d = q.shape
    scale = d ** -0.5 if softmax_scale is None else float(softmax_scale)
    o = out if plan.out_direct else torch.empty((total_q, hq, d), dtype=torch.bfloat16, device=q.device)
    lse = torch.full((hq, total_q), float("-inf"), device=q.device) if plan.return_lse else None
    if total_q and plan.batch and plan.max_seqlen_q != 0:
        paged_decode_torch(q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, k_descale, v_descale, scale,
                           plan.left, plan.right, o, lse, image_ranges)
    if out is not None and not plan.out_direct:
        out.copy_(o.view(out.shape))
        o = out
    return (o, lse) if plan.return_lse else o


def gather(k_cache, v_cache, page_table, cache_seqlens, sizes=None):
    """The page gather's output (``fp8_paged_kv.Kernels.gather``) from its torch path and the torch
    V^T pack."""
    k, v, cu_k, per_seq = fp8_paged_kv.gather_paged_kv(k_cache, v_cache, page_table, cache_seqlens, sizes)
    return k, fp8_sm90.pack_vt_reference(v, cu_k), cu_k, per_seq


def _off_gpu(t) -> bool:
    return not (t.is_cuda or interpreting())


def install() -> fp8_paged_kv.Kernels:
    """The route's kernels from now on: the torch contracts above for CPU tensors outside Triton's
    interpreter, the kernels (those installed before) for the rest. Returns the previous ones
    (``fp8_paged_kv.install_kernels(previous)`` restores them)."""
    kernels = fp8_paged_kv.installed_kernels()

    def split(plan, q, *args, **kwargs):
        return (split_kv if _off_gpu(q) else kernels.split_kv)(plan, q, *args, **kwargs)

    def gathered(k_cache, *args):
        return (gather if _off_gpu(k_cache) else kernels.gather)(k_cache, *args)

    return fp8_paged_kv.install_kernels(fp8_paged_kv.Kernels(split, gathered))


def gather_paged_kv_reference(k_cache, v_cache, page_table, cache_seqlens):
    """Per-sequence reference of ``fp8_paged_kv.gather_paged_kv`` (tests): the valid rows only,
    built from SGLang's page arithmetic directly (no cumulative offsets, no search)."""
    _, page_size, hkv, d = k_cache.shape
    k_flat = k_cache.view(torch.uint8).reshape(-1, hkv, d)
    v_flat = v_cache.view(torch.uint8).reshape(-1, hkv, d)
    ks, vs = [], []
    for b, n in enumerate(cache_seqlens.tolist()):
        t = torch.arange(n, device=k_cache.device)
        slots = page_table[b].to(torch.int64)[t // page_size] * page_size + t % page_size
        ks.append(k_flat[slots])
        vs.append(v_flat[slots])
    if not ks:
        empty = torch.empty((0, hkv, d), dtype=torch.uint8, device=k_cache.device)
        return empty, empty.clone()
    return torch.cat(ks), torch.cat(vs)


def dequantized_paged_kv(k_cache, v_cache, page_table, cache_seqlens, *, k_descale=None, v_descale=None,
                         device=None):
    """Every sequence's cached K and V, gathered from the paged E4M3 pool and dequantized to float32
    (one descale, or one per (sequence, kv head)), packed by sequence: ``(sum(cache_seqlens), hkv, d)``
    each. What the fp32 reference (``sglang_fa4.testing.paged_attention_fp32``) attends over."""

    def descaled(x, scale, b):
        if scale is None:
            return x
        return x * scale.reshape(-1)[0].float() if scale.numel() == 1 else x * scale[b].float()[None, :, None]

    ks, vs = [], []
    for b in range(cache_seqlens.shape[0]):
        kb, vb = gather_paged_kv_reference(k_cache, v_cache, page_table[b:b + 1], cache_seqlens[b:b + 1])
        ks.append(descaled(kb.view(FP8).float().to(device), k_descale, b))
        vs.append(descaled(vb.view(FP8).float().to(device), v_descale, b))
    return torch.cat(ks), torch.cat(vs)


def fp8_forward_model(calls: list):
    """A torch model of ``fp8_sm90.fp8_varlen_attention``'s contract (what the CUDA kernel computes),
    recording each call's host facts in ``calls``: what the CPU harnesses put in the forward's place."""

    def fake(q, k, v, cu_q, cu_k, max_q, max_k, *, descale, softmax_scale, causal, window_size=(None, None), out=None,
             vt=None, q_descale=None, k_descale=None, v_descale=None):
        assert q_descale is k_descale is v_descale is None  # the route hands one (3, batch, Hkv) descale
        calls.append(dict(max_q=max_q, max_k=max_k, causal=causal, window=window_size, out=out, vt=vt is not None))
        if v is None:  # the route hands the kernel the permuted V^T: read V back through its layout
            assert vt.dtype == torch.uint8 and vt.shape[:2] == k.shape[1:] and vt.stride(1) % 16 == 0
            v = fp8_sm90.unpack_vt_reference(vt, cu_k).view(FP8)
        assert q.dtype == k.dtype == v.dtype == FP8 and descale.shape == (3, cu_q.shape[0] - 1, k.shape[1])
        hq, d = q.shape[1], q.shape[2]
        qf, kf, vf = q.float(), k.float(), v.float()  # dequantized per (sequence, kv head) below
        for b in range(cu_q.shape[0] - 1):
            qs, qe, ks, ke = int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b]), int(cu_k[b + 1])
            assert ke - ks <= max_k
            qf[qs:qe] *= descale[0, b].repeat_interleave(hq // k.shape[1])[None, :, None]
            kf[ks:ke] *= descale[1, b][None, :, None]
            vf[ks:ke] *= descale[2, b][None, :, None]
        # the window as the kernel applies it (bottom-right aligned, -1/None unbounded): Gemma-4's
        # sliding layers take this path for long extends
        res = attention_fp32(qf, kf, vf, cu_q, cu_k, scale=softmax_scale or d ** -0.5, causal=causal,
                             window=tuple(window_size) if window_size is not None else (None, None))
        result = res.to(torch.bfloat16)
        if out is not None:
            out.copy_(result)
            return out
        return result

    return fake


def paged_attention_fp32(q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, *,
                         k_descale=None, v_descale=None, softmax_scale=None, causal=True) -> torch.Tensor:
    """:func:`attention_fp32` of ``q`` over a paged E4M3 KV pool (SGLang's ``(pages, page_size, hkv,
    d)`` layout), dequantized by :func:`dequantized_paged_kv`: one segment per sequence,
    bottom-right causal unless told otherwise."""
    k, v = dequantized_paged_kv(k_cache, v_cache, page_table, cache_seqlens, k_descale=k_descale,
                                v_descale=v_descale, device=q.device)
    return attention_fp32(q, k, v, cu_seqlens_q, offsets(cache_seqlens.tolist()), scale=softmax_scale,
                          causal=causal)
