"""Lab: where ``quantize_qkv``'s packed V^T differs from ``quantize_qkv_reference`` on a GPU.

On an H100 under DSL 4.6.2 (2026-12-08) ``tests/test_fp8_gpu.py::test_quantize_and_pack_match_references``
failed on ``torch.equal(got.vt, ref.vt)`` while q and k matched bit for bit and the descales matched
(``benchmark/results/h100/fp8_gpu_tests-dsl462.md``). This prints, for the test's inputs, how many
V^T bytes differ (fresh output and output poisoned with E4M3 NaN first, then rewritten), in which
columns and head-dim rows, by how many E4M3 codes, and whether the reference's ``x / ds`` against
the kernel's ``x * (1 / ds)`` accounts for them. Triton's CPU interpreter converts fp32 to E4M3
differently from the GPU (k differs there too): only a GPU's answer counts.

    python benchmark/lab/vt_pack_diff.py
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from sglang_fa4.kernels.vit import fp8_quantize as Q  # noqa: E402

E4M3 = torch.float8_e4m3fn


def main() -> None:
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    lens = [5, 0, 300, 1, 77]
    c = torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32, device=dev)
    q, k, v = (torch.randn(sum(lens), h, 80, device=dev).bfloat16() for h in (8, 2, 2))
    ref = Q.quantize_qkv_reference(q, k, v, c, c)
    for poisoned in (False, True):
        got = Q.quantize_qkv(q, k, v, c)
        if poisoned:
            for x in (got.q, got.k, got.vt):
                x.view(torch.uint8).fill_(0x7F)
            got = Q.quantize_qkv(q, k, v, c, out=got)
        gu, ru = got.vt.view(torch.uint8), ref.vt.view(torch.uint8)
        ne = gu != ru
        print(f"{'poisoned' if poisoned else 'fresh'}: vt {tuple(gu.shape)}, {int(ne.sum())} bytes differ; descales "
              f"equal {torch.equal(got.descale, ref.descale)}; k equal "
              f"{torch.equal(got.k.view(torch.uint8), ref.k.view(torch.uint8))}")
        if ne.any():
            idx = ne.nonzero()
            print("  columns:", sorted(set(idx[:, 2].tolist()))[:64])
            print("  head-dim rows:", sorted(set(idx[:, 1].tolist()))[:64])
            steps, counts = torch.unique((gu[ne].int() - ru[ne].int()).abs(), return_counts=True)
            print("  |code difference|:", dict(zip(steps.tolist(), counts.tolist())))
            print("  got / ref:", torch.unique(gu[ne].view(E4M3).float() / ru[ne].view(E4M3).float()).tolist()[:16])
    # the reference's division against the kernel's multiplication by the rounded inverse
    dp = ref.vt.shape[1]
    vf = torch.nn.functional.pad(v.float(), (0, dp - v.shape[2]))
    cq, differ = c.tolist(), 0
    for b in range(len(lens)):
        for h in range(v.shape[1]):
            x = vf[cq[b]:cq[b + 1], h]
            if x.numel():
                ds = x.abs().max() / 448.0
                by_inverse = (x * (1.0 / ds)).clamp(-448, 448).to(E4M3).view(torch.uint8)
                by_division = (x / ds).clamp(-448, 448).to(E4M3).view(torch.uint8)
                differ += int((by_inverse != by_division).sum())
    print(f"x * (1 / ds) against x / ds (torch, {dev}): {differ} elements differ")


if __name__ == "__main__":
    main()
