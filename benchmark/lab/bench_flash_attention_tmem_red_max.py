#!/usr/bin/env python3
"""Off/on paired benchmark for SGLANG_FA4_TMEM_LOAD_RED_MAX (FA4 forward, varlen, non-causal,
no LSE, 16 heads, bf16; 8x4096, 64x1024, 1x32768 at d=64/72/80).

The flag only changes the kernel on sm_103 (B300): there the softmax row max of unmasked S tiles
comes from tcgen05.ld.red. On any other GPU (or none) this script prints one line saying why and
exits 0 without numbers.

The flag is read when a kernel compiles, so the two settings run in two worker processes (same
GPU, one at a time); each round asks both for the same shape, alternating which goes first, and
the report is the median per-round ratio off/on with the rounds each wins.

    python benchmark/lab/bench_flash_attention_tmem_red_max.py [--rounds 10] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path


from sglang_fa4.bench.layouts import kernel_layout  # noqa: E402
from sglang_fa4.bench.stats import median, paired, round_order  # noqa: E402
from sglang_fa4.environ import envs  # noqa: E402

LAYOUTS = ("8x4096", "64x1024", "1x32768")
HEAD_DIMS = (64, 72, 80)
HEADS = 16
FLAG = envs.SGLANG_FA4_TMEM_LOAD_RED_MAX


def skip_reason() -> str | None:
    """Why this benchmark measures nothing here (None: an sm_103 GPU is present)."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU; SGLANG_FA4_TMEM_LOAD_RED_MAX only changes the FA4 kernel on sm_103"
    major, minor = torch.cuda.get_device_capability(0)
    if (major, minor) != (10, 3):
        return (f"{torch.cuda.get_device_name(0)} is sm_{major}{minor}; SGLANG_FA4_TMEM_LOAD_RED_MAX only "
                "changes the FA4 kernel on sm_103, so there is nothing to compare")
    return None


def worker() -> int:
    """Serve timing requests on stdin: {"layout", "head_dim", "iters"} -> {"ms"} (one JSON a line)."""
    import torch

    from sglang_fa4.bench.backends import make_problem
    from sglang_fa4.bench.timing import event_time_ms
    from sglang_fa4.kernels.varlen import fa4_varlen_attention

    problems = {}
    for line in sys.stdin:
        req = json.loads(line)
        key = (req["layout"], req["head_dim"])
        if key not in problems:
            problems[key] = make_problem(kernel_layout(req["layout"]).seqlens, HEADS, req["head_dim"])
            p = problems[key]
            for _ in range(3):
                fa4_varlen_attention(p.q, p.k, p.v, p.cu_seqlens, p.max_seqlen, out=p.out)
            torch.cuda.synchronize()
        p = problems[key]
        ms = event_time_ms(lambda: fa4_varlen_attention(p.q, p.k, p.v, p.cu_seqlens, p.max_seqlen, out=p.out),
                           req.get("iters", 20))
        print(json.dumps({"ms": ms}), flush=True)
    return 0


class Worker:
    def __init__(self, flag: bool):
        env = dict(os.environ)
        env[FLAG.name] = FLAG.format(flag)
        self.proc = subprocess.Popen([sys.executable, __file__, "--worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)

    def time(self, layout: str, head_dim: int, iters: int) -> float:
        self.proc.stdin.write(json.dumps({"layout": layout, "head_dim": head_dim, "iters": iters}) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())["ms"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--iters", type=int, default=20, help="calls per timed sample")
    ap.add_argument("--layouts", nargs="+", default=list(LAYOUTS))
    ap.add_argument("--head-dims", nargs="+", type=int, default=list(HEAD_DIMS))
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker()
    reason = skip_reason()
    if reason:
        print(f"skipped: {reason}")
        return 0
    workers = {"off": Worker(False), "on": Worker(True)}
    rows = []
    try:
        for layout in args.layouts:
            for hd in args.head_dims:
                times = {"off": [], "on": []}
                for name in workers:  # compile + warm both before timing
                    workers[name].time(layout, hd, 2)
                for r in range(args.rounds):
                    for name in round_order(list(workers), r):
                        times[name].append(workers[name].time(layout, hd, args.iters))
                s = paired(times["on"], times["off"])  # ratio = off / on: > 1 means the flag helps
                rows.append({"layout": layout, "head_dim": hd, "off_us": median(times["off"]) * 1e3,
                             "on_us": median(times["on"]) * 1e3, "speedup_on": s["median_ratio"],
                             "wins_on": s["wins_a"], "wins_off": s["wins_b"], "rounds": s["rounds"]})
                row = rows[-1]
                print(f"{layout:9} d={hd:<4} off {row['off_us']:9.1f} us  on {row['on_us']:9.1f} us  "
                      f"on/off speed-up {row['speedup_on']:.3f} (on wins {row['wins_on']}/{row['rounds']})", flush=True)
    finally:
        for w in workers.values():
            w.close()
    if args.out:
        Path(args.out).write_text(json.dumps({"command": " ".join([sys.argv[0]] + (argv or sys.argv[1:])),
                                              "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
