"""Host time per layer of the paged FP8 KV route's decode call, on a CPU, kernel launches stubbed.

What a decode step costs on the host before the GPU does anything: SGLang's flash_attn_with_kvcache
call, once bound (the hook's ``llm_fp8_kv.route_fp8``, the same function in every version of the
route), through the route to the split-KV kernel's launch -- which is replaced by a no-op, so the
figure is argument checks, routing, planning, allocations and the launch argument list. One step is
``--layers`` calls with one batch's metadata (page table, lengths, query offsets: SGLang hands every
layer the same tensors) and each layer's own pool tensors and descale views; the first call of the
run (the route's modules already imported) is reported apart: it plans. Median of ``--rounds``
rounds of ``--steps`` steps, one thread.

The same script runs against any checkout of the package (PYTHONPATH), which is how the before /
after of issue #43 was measured::

    PYTHONPATH=. python benchmark/perf/paged_kv_host_time.py --out benchmark/results/cpu/paged_kv_host_time.json

Allocations are CPU mallocs here (torch's caching allocator on a GPU): both versions allocate the
same buffers, so the difference is the route's own host work.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import time
from pathlib import Path

import torch

FP8 = torch.float8_e4m3fn


def stub_launches() -> str:
    """Replace the split-KV kernel's two launches with no-ops, wherever this checkout keeps them;
    returns the module name."""
    try:
        from sglang_fa4.kernels.fp8_paged_kv import decode as module
        from sglang_fa4.kernels import fp8_paged_kv

        fp8_paged_kv.install_kernels(None)  # the launch path (no CPU model)
    except ImportError:  # the layout before issue #43
        from sglang_fa4.kernels import fp8_paged_decode as module

        module.interpreting = lambda: True  # take the launch path, not its CPU branch
    for handles in (module.SPLIT, module.COMBINE):
        handles.launch = lambda *args, **kwargs: None
    return module.__name__


def make_step(batch: int, hq: int, hkv: int, d: int, page: int, context: int, layers: int, pools: int):
    g = torch.Generator().manual_seed(0)
    width = -(-context // page)
    pages = batch * width + 1
    caches = [((torch.randn(pages, page, hkv, d, generator=g)).to(FP8),
               (torch.randn(pages, page, hkv, d, generator=g)).to(FP8)) for _ in range(pools)]
    table = torch.arange(1, 1 + batch * width, dtype=torch.int32).view(batch, width)
    seqlens = torch.full((batch,), context, dtype=torch.int32)
    cu_q = torch.arange(batch + 1, dtype=torch.int32)
    q = torch.randn(batch, hq, d, generator=g).to(FP8)
    scales = [torch.tensor([0.5 + i / 100]) for i in range(layers)]
    calls = []
    for i in range(layers):
        k_cache, v_cache = caches[i % pools]
        calls.append(dict(q=q, k_cache=k_cache, v_cache=v_cache, page_table=table, cache_seqlens=seqlens,
                          cu_seqlens_q=cu_q, max_seqlen_q=1, softmax_scale=d ** -0.5, causal=True,
                          window_size=(-1, -1), k_descale=scales[i].expand(batch, hkv),
                          v_descale=scales[i].expand(batch, hkv), ver=4, return_softmax_lse=False, out=None))
    return calls


def measure(args) -> dict:
    from sglang_fa4.integration import llm_fp8_kv

    where = stub_launches()
    import importlib

    for name in ("sglang_fa4.kernels.fp8_paged_kv", "sglang_fa4.kernels.dispatch"):  # imported before timing
        try:
            importlib.import_module(name)
        except ImportError:  # dispatch: the layout before issue #43
            pass
    calls = make_step(args.batch, args.hq, args.hkv, args.d, args.page, args.context, args.layers, args.pools)
    t0 = time.perf_counter()
    llm_fp8_kv.route_fp8(dict(calls[0]))
    first_us = (time.perf_counter() - t0) * 1e6
    for _ in range(args.warmup):
        for call in calls:
            llm_fp8_kv.route_fp8(dict(call))
    per_layer = []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        for _ in range(args.steps):
            for call in calls:
                llm_fp8_kv.route_fp8(dict(call))
        per_layer.append((time.perf_counter() - t0) * 1e6 / (args.steps * len(calls)))
    return {"launch_module": where, "first_call_us": round(first_us, 1),
            "per_layer_us": {"median": round(statistics.median(per_layer), 2), "min": round(min(per_layer), 2),
                             "max": round(max(per_layer), 2), "rounds": [round(x, 2) for x in per_layer]}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--hq", type=int, default=28)
    ap.add_argument("--hkv", type=int, default=4)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--page", type=int, default=16)
    ap.add_argument("--context", type=int, default=4096, help="tokens per sequence (the page table's width)")
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--pools", type=int, default=4, help="distinct pool tensors the layers cycle over")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--label", default="", help="what this checkout is (before / after)")
    ap.add_argument("--out", help="append the result to this JSON list")
    args = ap.parse_args()
    torch.set_num_threads(1)
    result = {"label": args.label, **measure(args), "shape": {k: getattr(args, k) for k in (
        "batch", "hq", "hkv", "d", "page", "context", "layers", "pools", "steps", "rounds")},
        "python": platform.python_version(), "torch": torch.__version__, "cpu": platform.processor() or platform.machine()}
    try:
        import sglang_fa4

        root = Path(sglang_fa4.__file__).resolve().parents[1]
        result["commit"] = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                                          text=True).stdout.strip()
    except OSError:
        pass
    print(json.dumps(result))
    if args.out:
        path = Path(args.out)
        rows = json.loads(path.read_text()) if path.exists() else []
        path.write_text(json.dumps(rows + [result], indent=1) + "\n")


if __name__ == "__main__":
    main()
