"""Nsight Compute view of the SM90 FP8 attention forward next to FA4 bf16 (d128 non-causal, 16 heads,
8x4096 unless ``--shape BxN``): where the FP8 kernel's time goes.

Two modes:

* ``workload --which fp8|bf16 [--flags FIELD=VALUE,...]`` (kernel config changes): the launch to profile.  Builds fresh random inputs,
  runs the kernel a few times (compile, warmup), then once more between
  ``torch.cuda.profiler.start()/stop()``, so ``ncu --profile-from-start off -c 1`` sees exactly one
  warm launch.  Run on the GPU machine under ncu (benchmark/lab/ncu_fp8_attention.sh).
* ``summarize --raw DIR --out PREFIX``: reads the ``--csv`` pages ncu printed (details, raw, source
  per kernel) and writes PREFIX.json + PREFIX.md: tensor-pipe utilisation, issue-slot use, the top
  stall reasons, shared-memory traffic, and the SASS opcodes warps stall on.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SHAPE = {"batch": 8, "seqlen": 4096, "heads": 16, "head_dim": 128, "causal": False}


def shape_of(spec: str) -> dict:
    """SHAPE with ``spec`` = "BxN" (sequences x tokens each; "" keeps 8x4096)."""
    if not spec:
        return dict(SHAPE)
    try:
        b, n = (int(x) for x in spec.lower().split("x"))
    except ValueError:
        raise SystemExit(f"--shape: expected BxN (sequences x tokens), got {spec!r}") from None
    return {**SHAPE, "batch": b, "seqlen": n}


# ----------------------------------------------------------------------------------------------
# workload (GPU)
# ----------------------------------------------------------------------------------------------


def workload(which: str, flags: str, warmup: int, shape: dict = SHAPE) -> None:
    import torch

    b, n, h, d = shape["batch"], shape["seqlen"], shape["heads"], shape["head_dim"]
    cu = torch.arange(0, (b + 1) * n, n, dtype=torch.int32, device="cuda")
    q, k, v = (torch.randn(b * n, h, d, device="cuda").bfloat16() for _ in range(3))
    if which == "fp8":
        from sglang_fa4.kernels.fp8_sm90 import launch
        from sglang_fa4.kernels.vit import fp8_quantize as quantize
        from benchmark.lab.fp8_kernel_configs import config_for
        from sglang_fa4.kernels.fp8_sm90.layout import Fp8Variant

        config = config_for(Fp8Variant(d, False, False), flags)
        res = quantize.quantize_qkv(q, k, v, cu)
        out = torch.empty_like(q)

        def fn():
            launch.fp8_varlen_attention(res.q, res.k, None, cu, cu, n, n, descale=res.descale, out=out, vt=res.vt,
                                        kernel_config=config)
    else:
        from flash_attn.cute import flash_attn_varlen_func

        def fn():
            flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=n, max_seqlen_k=n)

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print(f"workload {which} flags={flags or '-'} done", flush=True)


def time_variants(variants: str, out: str) -> None:
    """Quick side-by-side timing (CUDA-graph replay medians) of FP8 kernel variants at d128
    non-causal 8x4096 and 1x16384 (16 heads) against FA4 bf16, one process."""
    import torch
    from flash_attn.cute import flash_attn_varlen_func

    from sglang_fa4.bench.timing import graph_replay_ms
    from sglang_fa4.kernels.fp8_sm90 import launch
    from sglang_fa4.kernels.vit import fp8_quantize as quantize
    from benchmark.lab.fp8_kernel_configs import config_for
    from sglang_fa4.kernels.fp8_sm90.layout import Fp8Variant

    rows = []
    shapes = [("8x4096", 8, 4096), ("1x16384", 1, 16384)]
    data = {}
    for name, b, n in shapes:
        cu = torch.arange(0, (b + 1) * n, n, dtype=torch.int32, device="cuda")
        q, k, v = (torch.randn(b * n, 16, 128, device="cuda").bfloat16() for _ in range(3))
        data[name] = (cu, n, q, k, v, quantize.quantize_qkv(q, k, v, cu), torch.empty_like(q), 4 * b * n * n * 16 * 128)
    for vname, flags in [tuple(x.split("=", 1)) for x in variants.split(";") if x]:
        config = config_for(Fp8Variant(128, False, False), flags)
        for name, (cu, n, q, k, v, res, out8, flops) in data.items():
            us = graph_replay_ms(lambda: launch.fp8_varlen_attention(
                res.q, res.k, None, cu, cu, n, n, descale=res.descale, out=out8, vt=res.vt, kernel_config=config),
                replays=30) * 1000
            rows.append({"variant": vname, "flags": flags, "shape": name, "us": us, "tflops": flops / us / 1e6})
            print(rows[-1], flush=True)
    for name, (cu, n, q, k, v, res, out8, flops) in data.items():
        us = graph_replay_ms(lambda: flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=n,
                                                            max_seqlen_k=n), replays=30) * 1000
        rows.append({"variant": "fa4_bf16", "flags": "", "shape": name, "us": us, "tflops": flops / us / 1e6})
        print(rows[-1], flush=True)
    Path(out).write_text(json.dumps(rows, indent=1))


# ----------------------------------------------------------------------------------------------
# summarize (CPU)
# ----------------------------------------------------------------------------------------------


def _rows(path: Path) -> list[dict]:
    """ncu --csv output: skip the '==PROF==' chatter before the header line."""
    lines = path.read_text(errors="replace").splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"') and not ln.startswith('"Kernel Name"')), None)
    if start is None:
        return []
    return list(csv.DictReader(io.StringIO("\n".join(lines[start:]))))


def _num(s):
    try:
        return float(str(s).replace(",", ""))
    except (TypeError, ValueError):
        return s


def details(path: Path) -> dict:
    """{section: {metric: (value, unit)}} of the one profiled kernel (plus its name)."""
    out: dict = defaultdict(dict)
    name = None
    for r in _rows(path):
        name = name or r.get("Kernel Name")
        if r.get("Metric Name"):
            out[r.get("Section Name", "?")][r["Metric Name"]] = (_num(r.get("Metric Value")), r.get("Metric Unit", ""))
    return {"kernel": name, "sections": dict(out)}


def raw(path: Path) -> dict:
    """The raw page: one row per kernel, one column per metric (first row of units)."""
    rows = _rows(path)
    if len(rows) < 2:
        return {}
    units, vals = rows[0], rows[1]
    return {k: (_num(v), units.get(k, "")) for k, v in vals.items()}


STALL_RE = re.compile(r"smsp__average_warp(?:s_issue_stalled|_latency_issue_stalled)_(\w+?)_per_issue_active\.ratio$")
PIPE_RE = re.compile(r"^sm__(?:inst_executed_)?pipe_(\w+?)(?:_cycles_active)?\.avg\.pct_of_peak_sustained_active$")


def source(path: Path) -> dict:
    """Per-SASS-instruction stall samples, grouped by opcode, plus the top instructions."""
    rows = _rows(path)
    if not rows:
        return {}
    keys = list(rows[0].keys())
    samp = next((k for k in keys if k.startswith("Warp Stall Sampling (All")), None)
    noti = next((k for k in keys if k.startswith("Warp Stall Sampling (Not")), None)
    exe = next((k for k in keys if k.startswith("Instructions Executed")), None)
    src = next((k for k in keys if k == "Source"), None)
    if not (samp and src):
        return {"columns": keys[:40]}
    by_op: dict = defaultdict(lambda: [0.0, 0.0, 0.0])
    reasons = [k for k in keys if k and k.startswith("stall_") and "(Not Issued)" not in k]
    op_reasons: dict = defaultdict(lambda: defaultdict(float))
    items = []
    total = 0.0
    for r in rows:
        s = _num(r.get(samp)) or 0.0
        s = s if isinstance(s, float) else 0.0
        ni = _num(r.get(noti)) if noti else 0.0
        ni = ni if isinstance(ni, float) else 0.0
        ex = _num(r.get(exe)) if exe else 0.0
        ex = ex if isinstance(ex, float) else 0.0
        text = r.get(src, "").strip()
        op = re.sub(r"^@!?U?P\w+\s+", "", text).split(" ")[0]
        why = {}
        for k_ in reasons:
            x = _num(r.get(k_))
            if isinstance(x, float) and x:
                op_reasons[op][k_[6:]] += x
                why[k_[6:]] = x
        by_op[op][0] += s
        by_op[op][1] += ni
        by_op[op][2] += ex
        total += s
        top_why = ", ".join(f"{k_} {v:.0f}" for k_, v in sorted(why.items(), key=lambda kv: -kv[1])[:3])
        items.append((s, ni, next((v for k_, v in r.items() if k_ and "Address" in k_), ""), text, top_why))
    order = list(items)
    items.sort(key=lambda t: -t[0])
    ops = sorted(by_op.items(), key=lambda kv: -kv[1][0])
    all_reasons: dict = defaultdict(float)
    for d_ in op_reasons.values():
        for k_, v in d_.items():
            all_reasons[k_] += v
    return {
        "total_samples": total,
        "stall_samples_by_reason": dict(sorted(all_reasons.items(), key=lambda kv: -kv[1])),
        "by_opcode": [{"op": op, "samples": v[0], "share": v[0] / total if total else 0.0, "not_issued": v[1],
                       "executed": v[2], "reasons": ", ".join(f"{k_} {x / v[0]:.0%}" for k_, x in sorted(
                           op_reasons[op].items(), key=lambda kv: -kv[1])[:3]) if v[0] else ""} for op, v in ops[:25]],
        "top_instructions": [{"samples": s, "not_issued": ni, "address": a, "sass": t, "why": w,
                              "index": order.index((s, ni, a, t, w))} for s, ni, a, t, w in items[:30]],
        "sass_instructions": len(rows),
    }


def pick(det: dict, raw_m: dict) -> dict:
    """The handful of numbers the markdown reports (absent ones are left out)."""
    flat = {}
    for sec in det.get("sections", {}).values():
        for k, v in sec.items():
            flat[k] = v
    want = ["Duration", "SM Frequency", "Elapsed Cycles", "Compute (SM) Throughput", "Memory Throughput",
            "L1/TEX Cache Throughput", "L2 Cache Throughput", "DRAM Throughput", "Executed Ipc Active",
            "Issue Slots Busy", "Issued Ipc Active", "SM Busy", "No Eligible", "One or More Eligible",
            "Active Warps Per Scheduler", "Eligible Warps Per Scheduler", "Warp Cycles Per Issued Instruction",
            "Executed Instructions", "Registers Per Thread", "Shared Memory Configuration Size",
            "Dynamic Shared Memory Per Block", "Achieved Occupancy", "Mem Busy", "Max Bandwidth",
            "L1/TEX Hit Rate", "L2 Hit Rate", "Mem Pipes Busy"]
    out = {k: flat[k] for k in want if k in flat}
    stalls = {}
    pipes = {}
    smem = {}
    for k, (v, unit) in raw_m.items():
        m = STALL_RE.match(k)
        if m and isinstance(v, float):
            stalls[m.group(1)] = v
        m = PIPE_RE.match(k)
        if m and isinstance(v, float):
            pipes[("cycles " if "cycles_active" in k else "inst ") + m.group(1)] = v
        if ("mem_shared" in k or "shared" in k and "l1tex__data" in k) and isinstance(v, float) and (
                "pct" in k or k.endswith(".sum")):
            smem[k] = v
    return {"headline": out, "stalls_per_issue": dict(sorted(stalls.items(), key=lambda kv: -kv[1])),
            "pipes_pct_of_peak_active": dict(sorted(pipes.items(), key=lambda kv: -kv[1])), "shared_memory": smem}


NUM_SMS = 132  # H200


def summarize(raw_dir: Path, out_prefix: Path, command: str, notes: list[str], timing: str = "",
              shape: dict = SHAPE) -> None:
    result = {"command": command, "shape": shape, "kernels": {}}
    for which in ("fp8", "bf16"):
        det_p = raw_dir / f"{which}_details.csv"
        if not det_p.exists():
            continue
        det = details(det_p)
        raw_m = raw(raw_dir / f"{which}_raw.csv") if (raw_dir / f"{which}_raw.csv").exists() else {}
        src = source(raw_dir / f"{which}_source.csv") if (raw_dir / f"{which}_source.csv").exists() else {}
        result["kernels"][which] = {"kernel": det.get("kernel"), **pick(det, raw_m), "sass": src,
                                    "details": det.get("sections")}
    # per 128x128 tile of one CTA (both consumer warpgroups): elapsed, tensor-pipe and XU (MUFU)
    # busy cycles per SM; the grid is (seqlen/128 m-blocks, heads, batch), 128-key tiles, 132 SMs
    tiles_per_sm = shape["batch"] * shape["heads"] * (shape["seqlen"] // 128) ** 2 / NUM_SMS
    for k in result["kernels"].values():
        cyc = (k["headline"].get("Elapsed Cycles") or (None,))[0]
        pipes = k["pipes_pct_of_peak_active"]
        if isinstance(cyc, float):
            per = cyc / tiles_per_sm
            k["per_tile_cycles"] = {
                "elapsed": per,
                "tensor_busy": per * pipes.get("cycles tensor", float("nan")) / 100,
                "xu_busy": per * pipes.get("inst xu", float("nan")) / 100,
                "issue_busy": per * (k["headline"].get("Issue Slots Busy") or (float("nan"),))[0] / 100,
            }
    if timing:
        result["timing_same_call"] = json.loads(Path(timing).read_text())
    result["notes"] = notes
    out_prefix.with_suffix(".json").write_text(json.dumps(result, indent=1, default=str))
    out_prefix.with_suffix(".md").write_text(markdown(result))


def _fmt(v):
    if isinstance(v, tuple):
        val, unit = v
        return f"{val:.4g} {unit}".strip() if isinstance(val, float) else f"{val} {unit}".strip()
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def markdown(r: dict) -> str:
    k = r["kernels"]
    names = [w for w in ("fp8", "bf16") if w in k]
    lines = ["# Nsight Compute: SM90 FP8 attention forward vs FA4 bf16 (H200)", "",
             f"Shape: {r['shape']}; command: `{r['command']}`", ""]
    lines += [f"> {n}" for n in r.get("notes", [])]
    if r.get("notes"):
        lines.append("")
    lines += ["## Headline (Nsight Compute details page)", "", "| metric | " + " | ".join(names) + " |",
              "|---|" + "---|" * len(names)]
    keys = []
    for w in names:
        keys += [x for x in k[w]["headline"] if x not in keys]
    for m in keys:
        lines.append(f"| {m} | " + " | ".join(_fmt(k[w]["headline"].get(m, "-")) for w in names) + " |")
    if all("per_tile_cycles" in k[w] for w in names):
        lines += ["", "## Per 128x128 tile of a CTA (SM cycles; elapsed / tiles per SM, busy = elapsed x pipe %)", "",
                  "| cycles per tile | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
        for m in ("elapsed", "tensor_busy", "xu_busy", "issue_busy"):
            lines.append(f"| {m} | " + " | ".join(f"{k[w]['per_tile_cycles'][m]:.0f}" for w in names) + " |")
    if r.get("timing_same_call"):
        lines += ["", "## Timing in the same call (CUDA-graph replay medians, us; d128 non-causal, 16 heads)", "",
                  "| variant | flags | shape | us | TFLOP/s |", "|---|---|---|---|---|"]
        for t in r["timing_same_call"]:
            lines.append(f"| {t['variant']} | `{t['flags'] or '-'}` | {t['shape']} | {t['us']:.1f} | {t['tflops']:.0f} |")
    lines += ["", "## Pipe utilisation (% of peak, active cycles; raw page)", "",
              "| pipe | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    pk = []
    for w in names:
        pk += [x for x in k[w]["pipes_pct_of_peak_active"] if x not in pk]
    for p in pk:
        lines.append(f"| {p} | " + " | ".join(_fmt(k[w]["pipes_pct_of_peak_active"].get(p, "-")) for w in names) + " |")
    lines += ["", "## Warp stall reasons (cycles per issued instruction; raw page)", "",
              "| reason | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    sk = []
    for w in names:
        sk += [x for x in list(k[w]["stalls_per_issue"])[:14] if x not in sk]
    for s in sk:
        lines.append(f"| {s} | " + " | ".join(_fmt(k[w]["stalls_per_issue"].get(s, "-")) for w in names) + " |")
    lines += ["", "## Shared memory (raw page)", "", "| metric | " + " | ".join(names) + " |",
              "|---|" + "---|" * len(names)]
    mk = []
    for w in names:
        mk += [x for x in k[w]["shared_memory"] if x not in mk]
    for m in mk:
        lines.append(f"| {m} | " + " | ".join(_fmt(k[w]["shared_memory"].get(m, "-")) for w in names) + " |")
    for w in names:
        s = k[w].get("sass") or {}
        if not s.get("by_opcode"):
            continue
        lines += ["", f"## {w}: warp stall samples by SASS opcode (source page, {s['sass_instructions']} instructions)", "",
                  "| opcode | samples | share | not issued | executed | main stall reasons |", "|---|---|---|---|---|---|"]
        for o in s["by_opcode"][:18]:
            lines.append(f"| {o['op']} | {o['samples']:.0f} | {o['share']:.1%} | {o['not_issued']:.0f} | "
                         f"{o['executed']:.0f} | {o['reasons']} |")
        tot = s["total_samples"] or 1.0
        lines += ["", f"{w}: all stall samples by reason: " + ", ".join(
            f"{k_} {v / tot:.1%}" for k_, v in list(s["stall_samples_by_reason"].items())[:10]), ""]
        lines += ["", f"Top {w} instructions by stall samples:", "", "| samples | not issued | # | SASS | top reasons |",
                  "|---|---|---|---|---|"]
        for t in s["top_instructions"][:15]:
            lines.append(f"| {t['samples']:.0f} | {t['not_issued']:.0f} | {t['index']} | `{t['sass'][:80]}` | {t['why']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="mode", required=True)
    w = sub.add_parser("workload")
    w.add_argument("--which", choices=["fp8", "bf16"], required=True)
    w.add_argument("--flags", default="")
    w.add_argument("--warmup", type=int, default=3)
    w.add_argument("--shape", default="", help="BxN: sequences x tokens each (default 8x4096)")
    t = sub.add_parser("time")
    t.add_argument("--variants", required=True)
    t.add_argument("--out", required=True)
    s = sub.add_parser("summarize")
    s.add_argument("--raw", required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--command", default="")
    s.add_argument("--note", action="append", default=[])
    s.add_argument("--timing", default="", help="a 'time' mode JSON from the same call, embedded")
    s.add_argument("--shape", default="", help="the workload's BxN (default 8x4096)")
    a = ap.parse_args()
    if a.mode == "workload":
        workload(a.which, a.flags, a.warmup, shape_of(a.shape))
    elif a.mode == "time":
        time_variants(a.variants, a.out)
    else:
        summarize(Path(a.raw), Path(a.out), a.command, a.note, a.timing, shape_of(a.shape))


if __name__ == "__main__":
    main()
