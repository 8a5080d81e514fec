"""Issue 7 experiment: which kernel wins on short-window (64-token) ViT layouts on this GPU?

Candidates, side by side in one run, graph-timed, paired rounds with alternating order:
  fa4          sglang_fa4.fa4_call (FA4's SM90 kernel, one 128/192-row tile per 64-token window)
  fa2_varlen   torch's bundled FlashAttention-2 varlen forward (aten._flash_attention_forward),
               which tiles 64-token segments with far less per-tile pipeline latency
  triton_attn  SGLang's context_attention_fwd (the bar)
Every output is checked against an fp32 reference on fresh random data, output poisoned first.

usage: python3 benchmark/exp_short_windows.py --out results.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def fa2_varlen_runner(p):
    import torch

    q, k, v, cu, ms = p.q, p.k, p.v, p.cu_seqlens, p.max_seqlen
    scale = q.shape[-1] ** -0.5

    def run():
        return torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, ms, ms, 0.0, False, False, scale=scale)[0]

    return run


def main(argv=None) -> int:
    import torch

    from sglang_fa4.bench.backends import make_problem, make_runner, reference_fp32, rel_err
    from sglang_fa4.bench.layouts import kernel_layout
    from sglang_fa4.bench.timing import GraphedCalls, measure_copy_gbps

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--layouts", default="700x64,180x64,win448,win720p,win1080p,win4k,8x4096,64x1024")
    ap.add_argument("--head-dims", default="64,72,80,128")
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args(argv)

    copy = measure_copy_gbps()
    gbps = copy["gbps"] if "gbps" in copy else next(v for k, v in copy.items() if "gb" in k.lower())
    rows = []
    backends = ("fa4", "fa2_varlen", "triton_attn")
    for name in args.layouts.split(","):
        layout = kernel_layout(name)
        for d in map(int, args.head_dims.split(",")):
            g = torch.Generator(device="cuda").manual_seed(hash((name, d)) & 0xFFFF)
            p = make_problem(layout.seqlens, 16, d, generator=g)
            runners = {b: (fa2_varlen_runner(p) if b == "fa2_varlen" else make_runner(b, p)) for b in backends}
            ref = reference_fp32(p)
            errs = {}
            for b, fn in runners.items():
                p.out.fill_(float("nan"))
                out = fn()
                torch.cuda.synchronize()
                errs[b] = rel_err(out, ref)
            graphs = {b: GraphedCalls([fn], 10) for b, fn in runners.items()}
            times = {b: [] for b in backends}
            for r in range(args.rounds):
                order = backends if r % 2 == 0 else backends[::-1]
                for b in order:
                    times[b].append(graphs[b].ms_per_call(10) * 1000)
            for gr in graphs.values():
                gr.release()
            tokens = sum(layout.seqlens)
            floor_us = 4 * tokens * 16 * d * 2 / (gbps * 1e9) * 1e6
            row = {"layout": name, "head_dim": d, "floor_us": floor_us}
            for b in backends:
                row[f"{b}_us"] = statistics.median(times[b])
                row[f"{b}_rel_err"] = errs[b]
            ratio = [t / f for t, f in zip(times["triton_attn"], times["fa2_varlen"])]
            row["fa2_vs_triton"] = statistics.median(ratio)
            row["fa2_vs_fa4"] = statistics.median([a / b for a, b in zip(times["fa4"], times["fa2_varlen"])])
            rows.append(row)
            print(f"{name:>9} d{d:<3} fa4 {row['fa4_us']:8.1f}  fa2 {row['fa2_varlen_us']:8.1f}  triton "
                  f"{row['triton_attn_us']:8.1f}  floor {floor_us:6.1f}  fa2/triton x{row['fa2_vs_triton']:.2f} "
                  f"err {max(errs.values()):.1e}", flush=True)
            with open(args.out, "w") as f:
                json.dump({"meta": {"command": " ".join(sys.argv), "gpu": torch.cuda.get_device_name(),
                                    "torch": torch.__version__, "copy": copy, "time": time.time()},
                           "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
