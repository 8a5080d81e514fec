"""Lab: where short extends should leave the split-KV decode kernel for the page gather + FP8 WGMMA
forward (SGLANG_FA4_FP8_KV_SPLIT_KV_MAX_Q, issue #42 item 4).

The FP8 KV route sends a call with at most SGLANG_FA4_FP8_KV_SPLIT_KV_MAX_Q new tokens per sequence
to the split-KV kernel (the pool read in place) and longer ones to the gather + WGMMA kernel.  Here
both routes run the same extends -- n new tokens per sequence over a cached context, bottom-right
causal, on an E4M3 pool with shuffled pages -- checked against the fp32 contract, then timed against
each other as CUDA graphs in interleaved rounds in one process.  The crossover is the smallest n at
which the gather route is faster on every context.

    python benchmark/lab/extend_crossover.py --out $OUT --budget-s 200      # GPU with the FA4 bundle
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import time
from pathlib import Path

import torch

FP8 = torch.float8_e4m3fn
NEW = (1, 2, 4, 8, 16, 32, 64)
CONTEXTS = (1024, 4096, 16384, 32768)
BATCHES = (1, 8)
HQ, HKV, D, PAGE = 32, 8, 128, 16


def inputs(batch, context, new, device, g):
    need = -(-context // PAGE)
    n_pages = batch * need + 1
    order = torch.randperm(n_pages - 1, generator=g) + 1
    table = order.view(batch, need).to(torch.int32).to(device)
    k = (torch.randn(n_pages, PAGE, HKV, D, generator=g) * 2).to(FP8).to(device)
    v = torch.randn(n_pages, PAGE, HKV, D, generator=g).to(FP8).to(device)
    q = torch.randn(batch * new, HQ, D, generator=g).to(FP8).to(device)
    seqlens = torch.full((batch,), context, dtype=torch.int32, device=device)
    cu_q = torch.arange(0, (batch + 1) * new, new, dtype=torch.int32, device=device)
    kd = torch.full((batch, HKV), 0.05, device=device)
    vd = torch.full((batch, HKV), 0.04, device=device)
    return q, k, v, table, seqlens, cu_q, kd, vd


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument("--budget-s", type=float, default=200)
    args = ap.parse_args()
    from sglang_fa4.bench.meta import base_meta
    from sglang_fa4.bench.timing import interleaved_ms
    from sglang_fa4.kernels import fp8_paged_kv
    from sglang_fa4.kernels.fp8_paged_kv import paged_decode_attention
    from sglang_fa4.testing import paged_attention_fp32, rel_err

    device = "cuda"
    t0 = time.monotonic()
    meta = base_meta("extend_crossover")
    rows = []
    for i, (batch, context, new) in enumerate(itertools.product(BATCHES, CONTEXTS, NEW)):
        if time.monotonic() - t0 > args.budget_s:
            meta["truncated"] = f"budget reached after {i} shapes"
            break
        g = torch.Generator().manual_seed(i)
        q, k, v, table, seqlens, cu_q, kd, vd = inputs(batch, context, new, device, g)
        outs = {n: torch.empty(batch * new, HQ, D, dtype=torch.bfloat16, device=device) for n in ("split_kv", "gather")}

        def split_kv():
            paged_decode_attention(q, k, v, table, seqlens, cu_q, new, k_descale=kd, v_descale=vd, causal=True,
                                   out=outs["split_kv"])

        def gather():  # the route's choice forced to the gather + WGMMA kernel
            plan = fp8_paged_kv.plan(q, k, v, table, seqlens, cu_q, new, k_descale=kd, v_descale=vd, causal=True,
                                     out=outs["gather"], backend=fp8_paged_kv.GATHER)
            fp8_paged_kv.run(plan, q, k, v, table, seqlens, cu_q, k_descale=kd, v_descale=vd, out=outs["gather"])

        ref = paged_attention_fp32(q, k, v, table, seqlens, cu_q, k_descale=kd[0, :1], v_descale=vd[0, :1],
                                   causal=True)
        row = {"batch": batch, "context": context, "new": new}
        calls = {}
        for name, fn in (("split_kv", split_kv), ("gather", gather)):
            try:
                outs[name].fill_(float("nan"))
                fn()
                torch.cuda.synchronize()
                row[f"{name}_err"] = rel_err(outs[name], ref)
                if row[f"{name}_err"] < 3e-2:
                    calls[name] = fn
            except Exception as exc:  # noqa: BLE001
                row[f"{name}_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        timed = interleaved_ms(calls, rounds=args.rounds, replays=args.replays)
        for name, t in timed.items():
            if t.get("ms"):
                row[f"{name}_us"] = t["ms"] * 1e3
                row[f"{name}_rounds_us"] = [r * 1e3 for r in t["rounds"]]
            else:
                row[f"{name}_error"] = t.get("error") or t.get("graph_error")
        if row.get("split_kv_us") and row.get("gather_us"):
            row["gather_vs_split"] = row["split_kv_us"] / row["gather_us"]
        rows.append(row)
        print(f"b{batch} ctx{context} new{new}: split {row.get('split_kv_us', float('nan')):.1f}us "
              f"gather {row.get('gather_us', float('nan')):.1f}us", flush=True)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "extend_crossover.json.gz").write_bytes(gzip.compress(json.dumps({"meta": meta, "rows": rows},
                                                                                indent=1).encode(), mtime=0))
    crossover = {}
    for batch in BATCHES:
        for new in NEW:
            rs = [r for r in rows if r["batch"] == batch and r["new"] == new and r.get("gather_vs_split")]
            if rs and len(rs) == len(CONTEXTS) and all(r["gather_vs_split"] > 1 for r in rs):
                crossover[batch] = new
                break
    print("gather faster on every context from new =", crossover)


if __name__ == "__main__":
    main()
