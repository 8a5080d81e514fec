"""Issue 7 experiment: which kernel wins on short-window (64-token) ViT layouts on this GPU?

Candidates, side by side in one run, graph-timed, paired rounds with alternating order:
  fa4          sglang_fa4.kernels.varlen (FA4's SM90 kernel, one 128/192-row tile per 64-token window)
  fa2_varlen   torch's bundled FlashAttention-2 varlen forward (aten._flash_attention_forward),
               which tiles 64-token segments with far less per-tile pipeline latency
  triton_attn  SGLang's context_attention_fwd (the bar)
Every output is checked against an fp32 reference on fresh random data, output poisoned first.

  triton_short_wN  sglang_fa4.kernels.vit.short_window_kernel (one program per segment and head, N warps)

usage: python3 benchmark/lab/exp_short_windows.py --out results.json [--backends ...] [--layouts ...]
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


def triton_short_runner(p, num_warps):
    from sglang_fa4.kernels.vit.short_window_kernel import short_window_attention

    q, k, v, cu, ms, out = p.q, p.k, p.v, p.cu_seqlens, p.max_seqlen, p.out
    return lambda: short_window_attention(q, k, v, cu, ms, out=out, num_warps=num_warps)


def make(b, p, make_runner):
    if b == "fa2_varlen":
        return fa2_varlen_runner(p)
    if b.startswith("triton_short"):
        return triton_short_runner(p, int(b.rsplit("_w", 1)[1]))
    return make_runner(b, p)


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
    ap.add_argument("--backends", default="fa4,fa2_varlen,triton_attn")
    args = ap.parse_args(argv)

    copy = measure_copy_gbps()
    gbps = copy["gbps"] if "gbps" in copy else next(v for k, v in copy.items() if "gb" in k.lower())
    rows = []
    backends = tuple(args.backends.split(","))
    for name in args.layouts.split(","):
        layout = kernel_layout(name)
        for d in map(int, args.head_dims.split(",")):
            g = torch.Generator(device="cuda").manual_seed(hash((name, d)) & 0xFFFF)
            p = make_problem(layout.seqlens, 16, d, generator=g)
            runners = {b: make(b, p, make_runner) for b in backends}
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
            for b in backends:  # paired per-round speed-up over triton_attn
                if b != "triton_attn" and "triton_attn" in times:
                    row[f"{b}_vs_triton"] = statistics.median([t / f for t, f in zip(times["triton_attn"], times[b])])
            rows.append(row)
            print(f"{name:>9} d{d:<3} " + "  ".join(f"{b} {row[b + '_us']:7.1f}" for b in backends)
                  + f"  floor {floor_us:6.1f}  err {max(errs.values()):.1e}", flush=True)
            with open(args.out, "w") as f:
                json.dump({"meta": {"command": " ".join(sys.argv), "gpu": torch.cuda.get_device_name(),
                                    "torch": torch.__version__, "copy": copy, "time": time.time()},
                           "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
