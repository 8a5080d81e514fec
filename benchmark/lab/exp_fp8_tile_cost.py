"""Experiment (H200): where the d=128 non-causal FP8 forward's time goes between key blocks and q
tiles.  The persistent kernel gives each CTA a list of (q tile, head) slots; a CTA's time is about
tiles x c + key blocks x a (a: one 192-key block of a 128-row q tile, c: what a q tile costs beyond
its key blocks -- first and last tile steps, epilogue, the pipeline's turn at a tile boundary).
Timing shapes whose q and key lengths differ (varlen, seqlen_q != seqlen_k) separates the two: a
least-squares fit of the measured times on the busiest CTA's (tiles, key blocks) from the
schedule's Python twin.  Each variant is fitted on its own; 16 heads, CUDA-graph replay medians,
rounds outermost with the shapes and variants rotated inside each.

    python3 benchmark/lab/exp_fp8_tile_cost.py --out $OUT/fp8_tile_cost.json   # the default; key blocks counted
    as it runs them (narrow first tiles), so other variants' fits are rougher
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path


#: (sequences, q tokens each, keys each)
SHAPES = [(8, 4096, 4096), (8, 4096, 4032), (8, 4096, 4224), (8, 4096, 2048), (8, 4096, 8192), (8, 4096, 16384),
          (2, 16384, 4096), (1, 16384, 16384), (4, 8192, 8192), (16, 2048, 2048), (32, 1024, 1024)]
KEY_TILE = 192


def key_blocks(sk: int) -> float:
    """192-key blocks of work in a q tile's keys with the default's narrow first tile: the whole
    blocks, plus the partial one at the least narrow width that holds it (64 or 96 of 192), whole
    if none does (layout.narrow_widths)."""
    from sglang_fa4.kernels.fp8_sm90.layout import narrow_widths

    whole, rest = divmod(sk, KEY_TILE)
    if rest == 0:
        return float(whole)
    width = next((w for w in narrow_widths(KEY_TILE) if w >= rest), KEY_TILE)
    return whole + width / KEY_TILE


def busiest_cta(batch: int, sq: int, sk: int, heads: int, num_sms: int) -> tuple[int, float]:
    """(valid tiles, key blocks) of the CTA with the most key blocks (the schedule's twin)."""
    from sglang_fa4.kernels.fp8_sm90.schedule import cta_work

    cq = [i * sq for i in range(batch + 1)]
    ck = [i * sk for i in range(batch + 1)]
    best = (0, 0.0)
    for work in cta_work(cq, ck, heads, 1, num_sms):
        tiles = sum(1 for t in work if t.valid)
        best = max(best, (tiles, tiles * key_blocks(sk)), key=lambda x: x[1])
    return best


def fit(rows: list[dict], name: str) -> dict:
    """Least squares t = tiles x c + blocks x a over the shapes (us), on relative residuals."""
    import torch

    x = torch.tensor([[r["tiles"], r["blocks"]] for r in rows], dtype=torch.float64)
    y = torch.tensor([r["us"][name] for r in rows], dtype=torch.float64)
    sol = torch.linalg.lstsq(x / y[:, None], torch.ones_like(y)[:, None]).solution[:, 0]
    pred = x @ sol
    return {"c_us_per_q_tile": float(sol[0]), "a_us_per_key_block": float(sol[1]),
            "max_rel_residual": float(((pred - y).abs() / y).max())}


def main() -> None:
    import torch

    from sglang_fa4.bench.stats import median
    from sglang_fa4.bench.timing import graph_replay_ms
    from sglang_fa4.kernels.fp8_sm90 import launch

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--variants", default="default=", help="name=changes;name=changes (kernel config changes of the "
                                                           "d=128 non-causal kernel, FIELD=VALUE,...)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--shapes", default="", help="BxQxK,... (sequences x q tokens x keys each; default: SHAPES)")
    args = ap.parse_args()
    variants = [tuple(v.split("=", 1)) for v in args.variants.split(";") if v]
    shapes = [tuple(int(x) for x in sh.split("x")) for sh in args.shapes.split(",") if sh] or SHAPES
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    h, d = args.heads, 128
    data = []
    for batch, sq, sk in shapes:
        cq = torch.arange(batch + 1, dtype=torch.int32, device="cuda") * sq
        ck = torch.arange(batch + 1, dtype=torch.int32, device="cuda") * sk
        q = (torch.randn(batch * sq, h, d, device="cuda") * 2).to(torch.float8_e4m3fn)
        k = (torch.randn(batch * sk, h, d, device="cuda") * 2).to(torch.float8_e4m3fn)
        v = torch.randn(batch * sk, h, d, device="cuda").to(torch.float8_e4m3fn)
        out = torch.empty(batch * sq, h, d, dtype=torch.bfloat16, device="cuda")
        data.append((batch, sq, sk, cq, ck, q, k, v, out))
    # rounds outermost, shapes and variants rotated within a round: the GPU's drift within a
    # process (10-15%) lands on every shape alike instead of on the shapes timed last
    times = [{n: [] for n, _ in variants} for _ in shapes]
    from benchmark.lab.fp8_kernel_configs import config_for
    from sglang_fa4.kernels.fp8_sm90.layout import Fp8Variant

    configs = {name: config_for(Fp8Variant(d, False, False), flags) for name, flags in variants}
    for rnd in range(args.rounds):
        order = list(range(len(shapes)))
        for si in order[rnd % len(order):] + order[:rnd % len(order)]:
            batch, sq, sk, cq, ck, q, k, v, out = data[si]
            for name, flags in variants[rnd % len(variants):] + variants[:rnd % len(variants)]:
                config = configs[name]  # (launch compiles each (variant, config) once)
                us = graph_replay_ms(lambda: launch.fp8_varlen_attention(q, k, v, cq, ck, sq, sk, out=out,
                                                                         kernel_config=config),
                                     replays=20) * 1000
                times[si][name].append(us)
    rows = []
    for (batch, sq, sk), t in zip(shapes, times):
        tiles, blocks = busiest_cta(batch, sq, sk, h, num_sms)
        row = {"shape": f"{batch}x{sq}q x {sk}k", "tiles": tiles, "blocks": blocks,
               "us": {n: median(x) for n, x in t.items()}, "rounds_us": t}
        row["tflops"] = {n: 4 * batch * sq * sk * h * d / us / 1e6 for n, us in row["us"].items()}
        rows.append(row)
        print(json.dumps({k_: row[k_] for k_ in ("shape", "tiles", "blocks", "us")}), flush=True)
    result = {"command": "python3 " + " ".join(shlex.quote(a) for a in sys.argv), "gpu": torch.cuda.get_device_name(),
              "heads": h, "head_dim": d, "key_tile": KEY_TILE, "rows": rows,
              "fit": {n: fit(rows, n) for n, _ in variants}}
    print(json.dumps(result["fit"]), flush=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    md = [f"# FP8 forward: cost per q tile and per key block (d={d}, {h} heads, non-causal)", "",
          f"GPU: {result['gpu']}; command: `{result['command']}`", "",
          "| shape | busiest CTA: tiles | key blocks | " + " | ".join(f"{n} us (TFLOP/s)" for n, _ in variants) + " |",
          "|---|---|---|" + "---|" * len(variants)]
    for r in rows:
        md.append(f"| {r['shape']} | {r['tiles']} | {r['blocks']:.2f} | "
                  + " | ".join(f"{r['us'][n]:.1f} ({r['tflops'][n]:.0f})" for n, _ in variants) + " |")
    md += ["", "Fit t = tiles x c + key blocks x a (least squares over the shapes):", "",
           "| variant | c (us per q tile) | a (us per 192-key block) | c in key blocks | worst residual |",
           "|---|---|---|---|---|"]
    for n, _ in variants:
        f = result["fit"][n]
        md.append(f"| {n} | {f['c_us_per_q_tile']:.2f} | {f['a_us_per_key_block']:.3f} | "
                  f"{f['c_us_per_q_tile'] / f['a_us_per_key_block']:.2f} | {100 * f['max_rel_residual']:.1f}% |")
    Path(args.out).with_suffix(".md").write_text("\n".join(md) + "\n")


if __name__ == "__main__":
    main()
