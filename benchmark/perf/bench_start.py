"""GPU benchmark of what FA4 adds to a server start (issue #18 item 6): an SGLang-like start with and
without the background import of flash_attn.cute (sglang_fa4/startup/fa4_preload.py).

Each variant is its own process, doing what an SGLang scheduler process does around
``ModelRunner.load_model``: import torch, create the CUDA context, then

  baseline     the weight load stand-in only (a server whose ViT does not run FA4);
  preload      fa4_preload.start() (what the plugin's BEFORE load_model hook calls), the load, then
               warmup.warm_model() (the AFTER hook: waits for the import, resolves the FA4 and
               Triton variants from the kernel caches, arms the JIT monitor);
  no_preload   the load, then warm_model(), which imports flash_attn.cute itself
               (SGLANG_FA4_PRELOAD=0);
  first_start  preload on an empty kernel cache (every variant compiled): run first when the
               cache dir holds nothing, which fills it for the others (a restart).

FA4's added start time = (load + warmup) of a variant minus the baseline's load. The weight load
stand-in moves the bytes of Qwen2.5-VL-7B (16.6 GB of bf16 in 729 tensors, --load-gb / --tensors)
as SGLang's loader does from a page-cache-resident checkpoint: per tensor, a host copy (the
safetensors read, GIL released) then a blocking copy into a new CUDA tensor. The stand-in tower is
Qwen2.5-VL's (bench_warmup.py: d=80, windows + full blocks), so the warmup covers FA4's two variants,
the short-window Triton kernel and the fused rotary. After the warmup the restart variants count
kernels resolved (must be 0 compiled) and run 20 attention calls of random layouts through
``varlen.fa4_varlen_attention`` (must resolve nothing).

Usage (repo root; torch, flash-attn-4 and this package):
    python3 benchmark/perf/bench_start.py --out $OUT/start.json [--cache-dir DIR] [--variants ...]
Writes the JSON and a markdown table beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

T_PROCESS = time.perf_counter()  # as early as this process can take it: before torch

ROOT = Path(__file__).resolve().parents[2]

QWEN2_5_VL_7B_GB = 16.6  # 8.29e9 bf16 parameters
QWEN2_5_VL_7B_TENSORS = 729
VARIANTS = ("first_start", "baseline", "preload", "no_preload")


def load_weights(gb: float, tensors: int, source) -> int:
    """The weight load stand-in: ``tensors`` tensors of ``gb`` GB in all, each copied from the host
    source (the page-cache read) and then into a fresh CUDA tensor. Returns the bytes moved."""
    import torch

    total = int(gb * 1e9) // 2  # bf16 elements
    per = total // tensors
    src_n = source.numel()
    moved = 0
    weights = []
    for i in range(tensors):
        n = per if i < tensors - 1 else total - per * (tensors - 1)
        off = (i * 7919 * 4096) % max(1, src_n - min(n, src_n))
        host = source[off: off + min(n, src_n)].clone()  # the read (a tensor over 1 GiB repeats the source)
        dst = torch.empty(n, dtype=torch.bfloat16, device="cuda")
        done = 0
        while done < n:
            m = min(host.numel(), n - done)
            dst[done: done + m].copy_(host[:m])
            done += m
        weights.append(dst)
        moved += 2 * n
    torch.cuda.synchronize()
    return moved


def random_calls(n: int, seed: int) -> dict:
    """n attention calls of random Qwen2.5-VL layouts (windowed and full) through the production
    entry; how many FA4 configurations and Triton specializations they resolved."""
    import random

    import torch

    from sglang_fa4.kernels import compile_events
    from sglang_fa4.kernels import fa4, varlen
    from benchmark.perf.bench_warmup import HEADS, _cu, _windows

    rng = random.Random(seed)
    fa4_before, triton_before = fa4.kernel_cache().compile_count(), compile_events.count("triton")
    for _ in range(n):
        gh, gw = 2 * rng.randint(2, 60), 2 * rng.randint(2, 60)
        for lens in (_windows(gh, gw), [gh * gw]):
            q, k, v = (torch.randn(sum(lens), HEADS, 80, dtype=torch.bfloat16, device="cuda") for _ in range(3))
            varlen.fa4_varlen_attention(q, k, v, _cu(lens, "cuda"), max(lens))
    torch.cuda.synchronize()
    return {"calls": 2 * n, "fa4_resolved": fa4.kernel_cache().compile_count() - fa4_before,
            "triton_resolved": compile_events.count("triton") - triton_before}


def child(args) -> dict:
    import torch

    marks = {"python_to_torch_s": time.perf_counter() - T_PROCESS}
    torch.cuda.init()
    torch.zeros(1, device="cuda")  # the CUDA context, made before load_model in SGLang
    source = torch.empty(2**29, dtype=torch.bfloat16).uniform_(-1, 1)  # 1 GiB page-cache stand-in
    marks["cuda_context_s"] = time.perf_counter() - T_PROCESS
    variant = args.child
    result: dict = {"variant": variant}
    fa4 = variant != "baseline"
    model = None
    if fa4:
        from benchmark.perf.bench_warmup import towers

        from sglang_fa4.startup import fa4_preload

        model = towers()["qwen2.5-vl"]
    t0 = time.perf_counter()
    if fa4 and variant != "no_preload":
        result["preload_started"] = fa4_preload.start()
    result["load_bytes"] = load_weights(args.load_gb, args.tensors, source)
    t1 = time.perf_counter()
    result["load_s"] = t1 - t0
    if fa4:
        import logging

        logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
        from sglang_fa4.kernels import compile_events
        from sglang_fa4.startup import fa4_preload, jit_monitor, warmup

        preload_done = fa4_preload._seconds is not None  # noqa: SLF001 - finished before the warmup asked?
        report = warmup.warm_model(model)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        result["warmup_s"] = t2 - t1
        result["import_in_background_s"] = fa4_preload._seconds  # noqa: SLF001
        result["import_done_before_warmup"] = preload_done
        events = compile_events.events("triton")
        result["fa4"] = {"resolved": report.resolved, "compiled": report.compiled,
                         "seconds": [round(s, 4) for s in report.seconds], "failures": len(report.failures)}
        result["triton"] = {"resolved": len(events), "compiled": sum(e.cache_hit is False for e in events),
                            "loaded_from_disk": sum(e.cache_hit is True for e in events)}
        result["jit_monitor_armed"] = jit_monitor.compiles_after_warmup() == 0
        if variant != "first_start":
            result["after_warmup"] = random_calls(20, 0)
            result["after_warmup"]["monitor_compiles"] = jit_monitor.compiles_after_warmup()
    else:
        result["warmup_s"] = 0.0
    result["start_s"] = result["load_s"] + result["warmup_s"]  # load_model + the plugin's hooks
    result["marks"] = marks
    result["flash_attn_imported"] = "flash_attn.cute" in sys.modules
    return result


def run_variant(variant: str, cache_dir: Path, args) -> dict:
    env = dict(os.environ)
    for name in ("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"):
        env.pop(name, None)
    env.update(SGLANG_FA4_KERNEL_CACHE="1", SGLANG_FA4_KERNEL_CACHE_DIR=str(cache_dir), SGLANG_FA4_JIT_MONITOR="warn",
               TRITON_CACHE_DIR=str(cache_dir / "triton"), SGLANG_FA4_PRELOAD="0" if variant == "no_preload" else "1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "benchmark" / "perf"), *filter(None, [env.get("PYTHONPATH")])])
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        result_path = Path(f.name)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", variant, "--result", str(result_path),
           "--load-gb", str(args.load_gb), "--tensors", str(args.tensors)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=str(ROOT), capture_output=True, text=True, timeout=args.timeout)
    wall = time.perf_counter() - t0
    sys.stderr.write(proc.stderr[-3000:])
    if proc.returncode != 0:
        return {"variant": variant, "error": f"rc {proc.returncode}: {proc.stderr[-2000:]}", "process_wall_s": wall}
    result = json.loads(result_path.read_text())
    result_path.unlink()
    result["process_wall_s"] = wall
    print(f"[start] {variant}: load {result['load_s']:.2f} s, warmup {result['warmup_s']:.2f} s, "
          f"process {wall:.1f} s", flush=True)
    return result


def summarize(runs: dict) -> dict:
    base = runs.get("baseline", {})
    out = {}
    for name, r in runs.items():
        if "error" in r or name == "baseline" or "start_s" not in base:
            continue
        out[name] = {"added_s": round(r["start_s"] - base["start_s"], 3),
                     "added_process_s": round(r["process_wall_s"] - base["process_wall_s"], 3)}
    pre = runs.get("preload", {})
    out["bar_added_le_1s"] = "preload" in out and out["preload"]["added_s"] <= 1.0
    out["restart_compiles_nothing"] = all(
        runs[v].get("fa4", {}).get("compiled") == 0 and runs[v].get("triton", {}).get("compiled") == 0
        and runs[v].get("after_warmup", {}).get("fa4_resolved") == 0
        and runs[v].get("after_warmup", {}).get("triton_resolved") == 0
        for v in ("preload", "no_preload") if v in runs and "error" not in runs[v])
    out["import_in_background_s"] = pre.get("import_in_background_s")
    return out


def markdown(res: dict) -> str:
    s = res["summary"]
    lines = ["# What FA4 adds to a server start (NVIDIA H200)", "", f"Command: `{res['meta']['command']}`", "",
             "Versions: " + ", ".join(f"{k} {v}" for k, v in res["meta"]["versions"].items() if v), "",
             f"Weight load stand-in: {res['meta']['load_gb']} GB in {res['meta']['tensors']} tensors (host read + "
             "blocking copy into new CUDA tensors, per tensor). `start` = load + the plugin's warmup hook; "
             "`added` = start minus the baseline's (a server whose ViT does not run FA4). One process per variant.", "",
             "| variant | load s | warmup s | start s | added s | process wall s | FA4 compiled / resolved | "
             "Triton compiled / from disk | after warmup: calls, resolved |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, r in res["runs"].items():
        if "error" in r:
            lines.append(f"| {name} | error: {r['error'][:200]} |")
            continue
        fa4, tri, aw = r.get("fa4"), r.get("triton"), r.get("after_warmup")
        lines.append("| " + " | ".join([
            name, f"{r['load_s']:.2f}", f"{r['warmup_s']:.2f}", f"{r['start_s']:.2f}",
            f"{s[name]['added_s']:+.2f}" if name in s else "—", f"{r['process_wall_s']:.1f}",
            f"{fa4['compiled']} / {fa4['resolved']}" if fa4 else "—",
            f"{tri['compiled']} / {tri['loaded_from_disk']}" if tri else "—",
            f"{aw['calls']}, {aw['fa4_resolved'] + aw['triton_resolved']}" if aw else "—"]) + " |")
    lines += ["", f"flash_attn.cute imported in the background in {s.get('import_in_background_s')} s (preload). "
              f"Bar (FA4 adds <= 1 s with the preload, restart): {'met' if s['bar_added_le_1s'] else 'NOT met'}. "
              f"Restarts compile nothing: {s['restart_compiles_nothing']}.", ""]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path("start.json"))
    p.add_argument("--cache-dir", type=Path, default=None,
                   help="FA4 + Triton kernel cache (e.g. bench_warmup.py --keep-cache); empty or none: "
                        "the first_start variant fills a fresh one")
    p.add_argument("--variants", nargs="+", default=["baseline", "preload", "no_preload"], choices=VARIANTS)
    p.add_argument("--load-gb", type=float, default=QWEN2_5_VL_7B_GB)
    p.add_argument("--tensors", type=int, default=QWEN2_5_VL_7B_TENSORS)
    p.add_argument("--timeout", type=int, default=180, help="seconds per variant")
    p.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    p.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        args.result.write_text(json.dumps(child(args), default=str))
        return 0

    cache_dir = args.cache_dir or Path(tempfile.mkdtemp(prefix="sglang-fa4-start-"))
    cache_dir.mkdir(parents=True, exist_ok=True)
    variants = list(args.variants)
    if not any(cache_dir.rglob("*")) and "first_start" not in variants:
        variants.insert(0, "first_start")  # a restart needs a filled cache
    runs = {v: run_variant(v, cache_dir, args) for v in variants}
    from sglang_fa4.bench.meta import base_meta

    meta = base_meta("start")
    meta["command"] = "python3 benchmark/perf/bench_start.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    meta.update(load_gb=args.load_gb, tensors=args.tensors, cache_dir=str(cache_dir))
    res = {"meta": meta, "runs": runs, "summary": summarize(runs)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1, default=str))
    args.out.with_suffix(".md").write_text(markdown(res))
    print(markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
