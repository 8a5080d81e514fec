"""Lab: one decode call of a backend under Nsight Compute (the split-KV FP8 kernel against FA3-FP8),
for the stall reasons and achieved occupancy behind the decode matrix's ratios (issue #42, item 3).

    python benchmark/lab/ncu_decode.py --case llama3-8b:32:8192:64 --backend fa4_fp8_split_kv   # GPU
    bash benchmark/lab/ncu_decode.sh                                                           # all, under ncu

The workload is the decode benchmark's (``sglang_fa4.bench.decode``: ragged lengths, shuffled pages,
one layer); the backend runs twice to warm up, then once between cudaProfilerStart/Stop, so
``ncu --profile-from-start off`` sees only that call's kernels.
"""

from __future__ import annotations

import argparse

import torch

from sglang_fa4.bench import decode


def main() -> None:
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
