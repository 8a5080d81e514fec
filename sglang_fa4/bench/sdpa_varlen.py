"""Varlen attention through torch's dense SDPA: segments of equal length are batched into one
(n, heads, L, d) call. A run of equal, back-to-back segments is a plain view (no copy); other
groups gather/scatter through index tensors built once per layout, so a call makes no host sync
and can be captured in a CUDA graph. Layouts with every segment equal (8x4096, 700x64) are one
dense batched call: the "sdpa" baseline of the benchmarks."""

from __future__ import annotations

from typing import Sequence


class SdpaVarlen:
    def __init__(self, seqlens: Sequence[int], device):
        import torch

        self.seqlens = [int(n) for n in seqlens]
        starts, pos = [], 0
        for n in self.seqlens:
            starts.append(pos)
            pos += n
        self.total = pos
        by_len: dict[int, list[int]] = {}
        for s, n in zip(starts, self.seqlens):
            if n:
                by_len.setdefault(n, []).append(s)
        # groups: (length, start, count) for contiguous runs, or (length, index tensor) otherwise
        self.groups: list[tuple] = []
        for n, ss in by_len.items():
            if all(b - a == n for a, b in zip(ss[:-1], ss[1:])):
                self.groups.append(("view", n, ss[0], len(ss)))
            else:
                idx = torch.tensor(ss, dtype=torch.long).unsqueeze(1) + torch.arange(n).unsqueeze(0)
                self.groups.append(("gather", n, idx.reshape(-1).to(device), len(ss)))

    @property
    def num_groups(self) -> int:
        return len(self.groups)

    def __call__(self, q, k, v, out=None, scale=None):
        """q, k, v: (total, heads, d). Returns (total, heads, d) (written into `out` if given)."""
        import torch
        import torch.nn.functional as F

        if out is None:
            out = torch.empty_like(q)
        h, d = q.shape[1], q.shape[2]
        for g in self.groups:
            if g[0] == "view":
                _, n, s, cnt = g
                sl = slice(s, s + n * cnt)
                qs, ks, vs = (t[sl].view(cnt, n, h, d).transpose(1, 2) for t in (q, k, v))
                o = F.scaled_dot_product_attention(qs, ks, vs, scale=scale)
                out[sl].view(cnt, n, h, d).copy_(o.transpose(1, 2))
            else:
                _, n, idx, cnt = g
                qs, ks, vs = (t.index_select(0, idx).view(cnt, n, h, d).transpose(1, 2) for t in (q, k, v))
                o = F.scaled_dot_product_attention(qs, ks, vs, scale=scale)
                out.index_copy_(0, idx, o.transpose(1, 2).reshape(cnt * n, h, d))
        return out
