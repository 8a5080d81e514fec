"""The paged FP8 decode kernel's contract (:mod:`sglang_fa4.kernels.fp8_paged_decode`) in fp32 torch:
what a call on CPU tensors outside Triton's interpreter runs (the SGLang CPU harnesses).  Host loops
over the sequences (``.tolist()``): CPU only, never inside a CUDA-graph capture."""

from __future__ import annotations

import torch


def paged_decode_torch(q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, k_descale, v_descale, scale: float,
                left: int, right: int, out, lse) -> None:
    """Fill ``out`` (total_q, Hq, d) and ``lse`` (Hq, total_q, natural log; None: not asked) as the
    kernel does: bottom-right positions, keys ``pos - left .. pos + right``, descales per (batch, kv
    head) or scalar."""
    from sglang_fa4.kernels.fp8_paged_decode import _descale as descale

    page_size, hkv, d = k_cache.shape[1:]
    hq = q.shape[1]
    kd = [descale(x, n, page_table.shape[0], hkv, q.device)[0] for x, n in ((k_descale, "k_descale"),
                                                                             (v_descale, "v_descale"))]
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
        s = s.masked_fill((j < pos - left) | (j > pos + right), float("-inf"))
        row_lse = torch.logsumexp(s, -1)
        p = torch.exp(s - torch.where(row_lse.isinf(), 0.0, row_lse)[..., None])
        out[cu[b]:cu[b + 1]] = torch.einsum("hqk,khd->qhd", p, vf).to(out.dtype)
        if lse is not None:
            lse[:, cu[b]:cu[b + 1]] = row_lse
