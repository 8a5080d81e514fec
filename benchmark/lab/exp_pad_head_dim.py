"""Experiment (H200): FA4 at head dim 72 (Qwen3-VL's ViT) against the same attention run at head
dim 80 on zero-padded q/k/v (the padding copies and the output slice included), on Qwen3-VL picture
layouts, 16 heads, CUDA-graph replay medians, the two paths interleaved.  Zero columns add nothing to
q.k and give zero output columns, so the padded result is the same attention (checked here against
the d72 call).  Why: in kernels.md FA4's d=72 kernel takes 7-10% longer than its d=80 one on large
layouts (8x4096: 1356.7 vs 1230.3 us).

    python3 benchmark/lab/exp_pad_head_dim.py --out $OUT/pad_head_dim.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


#: Qwen3-VL pictures as one segment of tokens (patch 16): 720p, 1080p, 4K; and a 4-picture batch
LAYOUTS = {"720p": [3520], "1080p": [8160], "4k": [32640], "4x1080p": [8160] * 4}


def main() -> None:
    import torch
    import torch.nn.functional as F

    from sglang_fa4.bench.stats import median
    from sglang_fa4.bench.timing import GraphedCalls, event_time_ms
    from sglang_fa4.kernels.varlen import fa4_varlen_attention

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--heads", type=int, default=16)
    args = ap.parse_args()
    torch.manual_seed(0)
    rows = []
    for name, lens in LAYOUTS.items():
        total = sum(lens)
        cu = torch.tensor([0] + [sum(lens[:i + 1]) for i in range(len(lens))], dtype=torch.int32, device="cuda")
        q, k, v = (torch.randn(total, args.heads, 72, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        scale = 72 ** -0.5

        def d72():
            return fa4_varlen_attention(q, k, v, cu, max(lens), softmax_scale=scale)

        def d80():
            qp, kp, vp = (F.pad(t, (0, 8)) for t in (q, k, v))
            o = fa4_varlen_attention(qp, kp, vp, cu, max(lens), softmax_scale=scale)
            return o[..., :72].contiguous()

        ref, got = d72(), d80()
        torch.cuda.synchronize()
        err = float((got.float() - ref.float()).norm() / ref.float().norm())
        graphs = {"d72": GraphedCalls([d72], 1), "d80_padded": GraphedCalls([d80], 1)}
        times = {k_: [] for k_ in graphs}
        for r in range(args.rounds):
            for k_ in (list(graphs) if r % 2 == 0 else list(graphs)[::-1]):
                times[k_].append(event_time_ms(graphs[k_].replay, 3) * 1e3)
        for g in graphs.values():
            g.release()
        row = {"layout": name, "lens": lens, "d72_us": round(median(times["d72"]), 1),
               "d80_padded_us": round(median(times["d80_padded"]), 1),
               "ratio_d72_over_padded": round(median([a / b for a, b in zip(times["d72"], times["d80_padded"])]), 3),
               "rel_diff_vs_d72": err}
        print(row, flush=True)
        rows.append(row)
    meta = {"command": " ".join(["python3"] + sys.argv), "gpu": torch.cuda.get_device_name(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "heads": args.heads,
            "rounds": args.rounds, "timing": "CUDA-graph replays of 3 calls between two events, medians of "
            "interleaved rounds (order alternating); ratio = median of per-round d72 / padded"}
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, separators=(",", ":")))


if __name__ == "__main__":
    main()
