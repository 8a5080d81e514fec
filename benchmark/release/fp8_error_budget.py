"""Where the FP8 ViT attention's error comes from, and what would remove it (CPU emulation).

The SM90 FP8 forward quantizes q, k, v to E4M3 with one scale per (sequence, head), and P to
E4M3 (exp2(s - max + 8), the kernel's offset). On the H200 (benchmark/results/h200/vit_fp8-run1.md)
that gives attention outputs ~0.1 rel. error from FA4 bf16 at logit std ~4, and a random-weight
Qwen tower with every full-attention layer in FP8 ends at cosine 0.6-0.77. This script emulates
each quantization step in fp32 on the CPU (round-to-nearest E4M3 through torch.float8_e4m3fn,
INT8 by rounding) and measures the rel. error of the attention output against fp32 attention of
the same bf16 inputs, one step at a time, for:

* the kernel as built (q/k/v/P in E4M3, per-(sequence, head) scales);
* per-block (128 tokens) E4M3 scales instead (does a finer scale help? E4M3's error is its 3-bit
  mantissa, relative to each value, so a finer scale barely moves it);
* q/k kept in bf16, v and P in E4M3 (the QK^T GEMM in bf16);
* q/k in INT8 (per-token q, per-64-token-block k, k smoothed by its per-channel mean first,
  SageAttention's recipe), v and P in E4M3.

Inputs: q, k ~ N(0, sigma) (logit std ~ sigma^2), v ~ N(0, 1), 1024 tokens, 16 heads, d=80; with and
without outlier channels (4 of every head's q/k channels x3, as the GPU check's towers).

usage: python3 benchmark/release/fp8_error_budget.py --out DIR   (writes DIR/fp8_error_budget.json and .md)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

E4M3_MAX = 448.0
P_OFFSET = 8.0  # layout.P_LOG2_OFFSET


def e4m3(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x quantized to E4M3 with ``scale`` (broadcast), dequantized."""
    return (x / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float() * scale


def amax_scale(x: torch.Tensor, dims) -> torch.Tensor:
    a = x.abs().amax(dim=dims, keepdim=True)
    return torch.where(a > 0, a / E4M3_MAX, torch.ones_like(a))


def per_head(x):  # x: (heads, tokens, d): one scale per head (the kernel's, one sequence)
    return e4m3(x, amax_scale(x, (1, 2)))


def per_block(x, block=128):
    h, n, d = x.shape
    xb = x.reshape(h, n // block, block, d)
    return e4m3(xb, amax_scale(xb, (2, 3))).reshape(h, n, d)


def int8(x, dims):
    s = x.abs().amax(dim=dims, keepdim=True).clamp_min(1e-12) / 127.0
    return (x / s).round().clamp(-127, 127) * s


def int8_q_per_token(q):
    return int8(q, (2,))


def int8_k_smoothed(k, block=64):
    mean = k.mean(dim=1, keepdim=True)  # subtracting a per-channel constant from k leaves softmax unchanged
    h, n, d = k.shape
    kb = (k - mean).reshape(h, n // block, block, d)
    return int8(kb, (2, 3)).reshape(h, n, d) + mean


def attention(q, k, v, scale, p_e4m3: bool):
    s = (q @ k.transpose(1, 2)) * scale * 1.4426950408889634  # log2 domain, as the kernel
    s = s - s.amax(dim=-1, keepdim=True)
    if p_e4m3:
        p = torch.exp2(s + P_OFFSET).to(torch.float8_e4m3fn).float()
    else:
        p = torch.exp2(s)
    return (p @ v) / p.sum(dim=-1, keepdim=True)


VARIANTS = {
    "kernel: q/k/v/P E4M3, per-(seq, head) scales": (per_head, per_head, per_head, True),
    "q/k/v/P E4M3, per-128-token-block scales": (per_block, per_block, per_block, True),
    "q/k E4M3 only (v, P exact)": (per_head, per_head, None, False),
    "v and P E4M3 only (q/k bf16)": (None, None, per_head, True),
    "P E4M3 only": (None, None, None, True),
    "v E4M3 only": (None, None, per_head, False),
    "q/k INT8 (per-token q, smoothed per-64-block k), v/P E4M3": (int8_q_per_token, int8_k_smoothed, per_head, True),
}


def run(seed: int = 0, tokens: int = 1024, heads: int = 16, d: int = 80) -> list[dict]:
    rows = []
    for sigma in (1.0, 2.0):
        for outliers in (False, True):
            g = torch.Generator().manual_seed(seed)
            q, k = (torch.randn(heads, tokens, d, generator=g) * sigma for _ in range(2))
            if outliers:
                for t in (q, k):
                    t[:, :, [0, 1, d // 2, d // 2 + 1]] *= 3.0
            v = torch.randn(heads, tokens, d, generator=g)
            q, k, v = (t.bfloat16().float() for t in (q, k, v))  # the ViT's bf16 activations
            scale = d ** -0.5
            ref = attention(q, k, v, scale, False)
            logit_std = float(((q @ k.transpose(1, 2)) * scale).std())
            for name, (fq, fk, fv, pq) in VARIANTS.items():
                out = attention(fq(q) if fq else q, fk(k) if fk else k, fv(v) if fv else v, scale, pq)
                err = float((out - ref).norm() / ref.norm())
                rows.append({"sigma": sigma, "outlier_channels": outliers, "logit_std": round(logit_std, 2),
                             "variant": name, "rel_err": round(err, 5)})
    return rows


def markdown(rows: list[dict], command: str) -> str:
    lines = ["# FP8 attention error budget (CPU emulation)", "", f"Command: `{command}`", "",
             "Rel. error of the attention output vs fp32 attention on the same bf16 inputs "
             "(1024 tokens, 16 heads, d=80).", "",
             "| q/k std | outlier channels | logit std | variant | rel. error |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['sigma']} | {r['outlier_channels']} | {r['logit_std']} | {r['variant']} | {r['rel_err']:.2e} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    rows = run()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = " ".join(["python3", *(sys.argv if argv is None else ["benchmark/release/fp8_error_budget.py", *argv])])
    (out / "fp8_error_budget.json").write_text(json.dumps({"command": command, "rows": rows}, indent=1))
    (out / "fp8_error_budget.md").write_text(markdown(rows, command))
    print(markdown(rows, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
