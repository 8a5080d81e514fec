"""GPU check of the ViT token-budget layouts (sglang_fa4/integration/vit_budget_layouts.py) at the attention level.

For random Qwen2.5-VL image mixes (16 heads, d=80, bf16) and each budget that holds them, the
fixed-shape budget layouts -- real segments, padding rows as <=64-token segments, then empty
segments up to the budget's capacity; max_seqlen = budget (full blocks) or 64 (windowed blocks) --
go through the production call (sglang_fa4.kernels.varlen: FA4, or FA2 for the short windows) captured in
a CUDA graph, with the budget's static buffers refilled per mix. Checked per mix:
  - the real rows equal the unpadded, exact-layout eager call (max abs diff, rel. error);
  - every padded row is finite (nothing NaN that a later zeroing could miss);
  - graph-replay time of the budget call vs the exact-layout call (the cost of padding);
  - FA4 configurations resolved after the budgets were captured (must be 0).
This is not the tower-level validation (SGLang's runner cannot run on the device machine).

usage: python3 benchmark/release/check_vit_budgets.py --out results.json [--mixes 24]
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

HEADS, D, PATCH, WINDOW = 16, 80, 14, 8


def windows(gh: int, gw: int) -> list[int]:
    return [min(WINDOW, gh - i) * min(WINDOW, gw - j) for i in range(0, gh, WINDOW) for j in range(0, gw, WINDOW)]


def cumsum(lens):
    out, acc = [0], 0
    for n in lens:
        acc += n
        out.append(acc)
    return out


def main(argv=None) -> int:
    import torch

    from sglang_fa4.bench.timing import GraphedCalls
    from sglang_fa4.environ import envs
    from sglang_fa4.integration import vit_budget_layouts as budget_layouts
    from sglang_fa4.kernels import fa4, varlen

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--mixes", type=int, default=24)
    ap.add_argument("--budgets", default="1024,2048,4096,8192,16384")
    args = ap.parse_args(argv)
    budgets = envs.SGLANG_FA4_VIT_GRAPH_BUDGETS.parse(args.budgets)
    dev = torch.device("cuda")
    rng = random.Random(0)

    # static buffers + graphs per (budget, kind), captured once, like the runner does at startup
    static = {}
    for b in budgets:
        cap = budget_layouts.segment_capacity(b, WINDOW * WINDOW)
        for kind, max_len in (("full", b), ("windowed", WINDOW * WINDOW)):
            layout = budget_layouts.capture_layout(b, cap, max_len)
            q, k, v = (torch.randn(b, HEADS, D, device=dev, dtype=torch.bfloat16) for _ in range(3))
            cu = torch.tensor(layout, dtype=torch.int32, device=dev)
            out = torch.empty_like(q)
            call = (lambda q=q, k=k, v=v, cu=cu, m=max_len, out=out: varlen.fa4_varlen_attention(q, k, v, cu, m, out=out))
            static[b, kind] = dict(q=q, k=k, v=v, cu=cu, out=out, max_len=max_len, cap=cap,
                                   graph=GraphedCalls([call], 1, warmup=2))
    # the exact-layout reference calls below use FA4's <=256-segment variant: compile it now, so
    # that any compile counted after this point is the budget path's
    qw = torch.randn(300, HEADS, D, device=dev, dtype=torch.bfloat16)
    varlen.fa4_varlen_attention(qw, qw, qw, torch.tensor([0, 100, 300], dtype=torch.int32, device=dev), 200)
    torch.cuda.synchronize()
    compiles_sealed = fa4.kernel_cache().compile_count()

    rows = []
    for i in range(args.mixes):
        imgs = [(28 * rng.randint(2, 70), 28 * rng.randint(2, 70)) for _ in range(rng.choice((1, 1, 2, 3)))]
        grids = [(h // PATCH, w // PATCH) for h, w in imgs]
        full = [0] + [gh * gw for gh, gw in grids]  # Qwen2.5-VL's full cu_seqlens starts with an empty segment
        win = [n for gh, gw in grids for n in windows(gh, gw)]
        tokens = sum(full)
        budget = budget_layouts.pick_budget(tokens, budgets)
        if budget is None:
            rows.append({"images": imgs, "tokens": tokens, "budget": None, "eager": True})
            continue
        for kind, lens in (("full", full), ("windowed", win)):
            s = static[budget, kind]
            padded = budget_layouts.pad_layout(cumsum(lens), budget, s["cap"], s["max_len"])
            q, k, v = (torch.randn(tokens, HEADS, D, device=dev, dtype=torch.bfloat16) for _ in range(3))
            cu = torch.tensor(cumsum(lens), dtype=torch.int32, device=dev)
            exact = varlen.fa4_varlen_attention(q, k, v, cu, max(lens))
            for name, src in (("q", q), ("k", k), ("v", v)):
                s[name][:tokens].copy_(src)
                s[name][tokens:].zero_()  # the runner zeroes the padding rows of its inputs
            s["cu"].copy_(torch.tensor(padded, dtype=torch.int32, device=dev))
            s["out"].fill_(float("nan"))
            s["graph"].replay()
            torch.cuda.synchronize()
            real = s["out"][:tokens].float()
            diff = (real - exact.float()).abs().max().item()
            rel = ((real - exact.float()).norm() / exact.float().norm()).item()
            pad_finite = bool(torch.isfinite(s["out"][tokens:]).all().item())
            exact_graph = GraphedCalls([lambda q=q, k=k, v=v, cu=cu, m=max(lens): varlen.fa4_varlen_attention(q, k, v, cu, m)], 1)
            t_budget = statistics.median(s["graph"].ms_per_call(10) for _ in range(5)) * 1000
            t_exact = statistics.median(exact_graph.ms_per_call(10) for _ in range(5)) * 1000
            exact_graph.release()
            rows.append({"images": imgs, "tokens": tokens, "budget": budget, "layout": kind,
                         "segments": len(lens), "max_abs_diff": diff, "rel_err": rel, "pad_rows_finite": pad_finite,
                         "budget_us": t_budget, "exact_us": t_exact, "overhead": t_budget / t_exact})
            print(f"mix {i:2d} {kind:8s} tokens {tokens:5d} budget {budget:5d} segs {len(lens):4d} "
                  f"diff {diff:.1e} pad_finite {pad_finite} budget {t_budget:7.1f} us exact {t_exact:7.1f} us", flush=True)

    checked = [r for r in rows if r.get("layout")]
    summary = {
        "mixes": args.mixes,
        "calls_checked": len(checked),
        "max_abs_diff": max(r["max_abs_diff"] for r in checked),
        "max_rel_err": max(r["rel_err"] for r in checked),
        "all_pad_rows_finite": all(r["pad_rows_finite"] for r in checked),
        "fa4_compiles_after_capture": fa4.kernel_cache().compile_count() - compiles_sealed,
        "median_overhead": {kind: statistics.median(r["overhead"] for r in checked if r["layout"] == kind)
                            for kind in ("full", "windowed")},
    }
    meta = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "command": "python3 benchmark/release/check_vit_budgets.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:])),
            "budgets": list(budgets)}
    Path(args.out).write_text(json.dumps({"meta": meta, "summary": summary, "rows": rows}, indent=1))
    print(json.dumps(summary, indent=1))
    ok = summary["all_pad_rows_finite"] and summary["max_rel_err"] < 1e-2 and summary["fa4_compiles_after_capture"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
