"""Lab: one decode call of a backend under Nsight Compute (the split-KV FP8 kernel against FA3-FP8),
for the stall reasons and achieved occupancy behind the decode matrix's ratios (issue #42, item 3).

    python benchmark/lab/ncu_decode.py --case llama3-8b:32:8192:64 --backend fa4_fp8_split_kv   # GPU
    bash benchmark/lab/ncu_decode.sh                                                           # all, under ncu
    python benchmark/lab/ncu_decode.py --summarize DIR OUT.md "COMMAND"                        # any machine

The workload is the decode benchmark's (``sglang_fa4.bench.decode``: ragged lengths, shuffled pages,
one layer); the backend runs twice to warm up, then once between cudaProfilerStart/Stop, so
``ncu --profile-from-start off`` sees only that call's kernels.
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from pathlib import Path

#: the details-page metrics the summary tabulates per kernel
KEYS = ("Duration", "DRAM Throughput", "Achieved Occupancy", "Theoretical Occupancy", "Registers Per Thread",
        "Block Limit Registers", "Waves Per SM", "Warp Cycles Per Issued Instruction", "Issued Warp Per Scheduler",
        "Eligible Warps Per Scheduler", "No Eligible")


def summarize(src: Path, out: Path, command: str) -> str:
    """A markdown of the --csv details pages under ``src``: the KEYS per kernel, and ncu's own notes
    on stalls, occupancy and waves."""
    lines = ["# Nsight Compute: one decode call, the split-KV FP8 kernel against FA3-FP8", "",
             f"Command: `{command}`, summed up by `python benchmark/lab/ncu_decode.py --summarize {src.name} "
             f"{out.name}`", ""]
    for f in sorted(src.glob("*.csv")):
        rows = list(csv.reader(line for line in f.read_text().splitlines() if line.startswith('"')))
        metrics: dict = {}
        notes: dict = {}
        for r in rows[1:]:
            d = dict(zip(rows[0], r))
            name = d["Kernel Name"]
            if "FlashAttn" in name or "prepare_varlen" in name:
                name = "FA3 " + ("combine" if "Combine" in name else "scheduler" if "prepare" in name else "main")
            if d.get("Metric Name"):
                metrics.setdefault(name, {})[d["Metric Name"]] = f"{d['Metric Value']} {d['Metric Unit']}".strip()
            text = re.sub(r"\s+", " ", d.get("Rule Description") or "")
            if any(w in text.lower() for w in ("stall", "occupancy", "wave")):
                notes.setdefault(name, []).append(text[:300])
        lines += [f"## {f.stem}", "", "| kernel | " + " | ".join(KEYS) + " |", "|---" * (len(KEYS) + 1) + "|"]
        for name, m in metrics.items():
            lines.append(f"| {name} | " + " | ".join(m.get(k, "-") for k in KEYS) + " |")
        lines.append("")
        for name, ns in notes.items():
            lines += [f"- {name}: {n}" for n in ns]
        lines.append("")
    text = "\n".join(lines)
    out.write_text(text)
    return text


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--summarize":  # DIR OUT COMMAND
        print(summarize(Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]))
        return
    import torch

    from sglang_fa4.bench import decode

    ap = argparse.ArgumentParser()
    ap.add_argument("--case", required=True, help="MODEL:BATCH:CONTEXT:PAGE")
    ap.add_argument("--backend", required=True, choices=decode.BACKENDS)
    args = ap.parse_args()
    model, batch, context, page = args.case.split(":")
    hq, hkv, d = decode.MODELS[model]
    case = decode.Case(model, int(batch), int(context), int(page), d, hq, hkv)
    x = decode.make_inputs(case, "cuda", seed=7, bf16=args.backend.endswith("bf16"))
    calls, _, errors, splits = decode.runners(case, x, [args.backend])
    if args.backend in errors:
        raise SystemExit(errors[args.backend])
    fn = calls[args.backend]
    fn()
    fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print(case.name, args.backend, splits.get(args.backend))


if __name__ == "__main__":
    main()
