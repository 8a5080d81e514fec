"""GPU benchmark of what FA4 adds to a server start when its kernels come from the shared-library
store (issue #18 item 6: sglang_fa4/kernels/fa4/shared_libs.py) instead of ``import flash_attn.cute``.

The SGLang-like start of benchmark/perf/bench_start.py (torch + CUDA context + triton, which SGLang's
scheduler imports before load_model; then the 16.6 GB weight load stand-in and the plugin's
warmup hook for Qwen2.5-VL's stand-in tower: FA4's d80 full and > 256-segment variants, the
short-window Triton kernel, the fused rotary), one process per run:

  fill         a fresh cache dir: FA4 imported and compiling, Triton compiling, the store filled;
  baseline     the weight load only (a server whose ViT does not run FA4);
  lazy         a restart with the store (the default): must import neither flash_attn nor cutlass;
  fa4_disk     a restart without it (SGLANG_FA4_SHARED_LIBS=0): today's path, FA4 imported (the
               background preload) to load its own disk cache;
  breakdown    once: python -X importtime of flash_attn.cute after torch, torch._dynamo and triton,
               self time grouped by top-level package, beside importing tvm_ffi and loading the
               stored libraries.

baseline / lazy / fa4_disk run in --rounds interleaved rounds; FA4's added start time is the median
over rounds of (load + warmup) minus the same round's baseline. The first lazy run also checks
the first FA4 ViT attention calls after its warmup -- Qwen2.5-VL layouts (full attention of two
images, 300 windows) on fresh random data, outputs poisoned with NaN -- against FA4's own public
call on the same inputs (imported only then), bitwise, eagerly and as a CUDA-graph replay on a
side stream, with the fp32 reference error beside; and every lazy run times the host cost of a
stored kernel's launch.

Usage (repo root, FA4 on PYTHONPATH):
    python3 benchmark/perf/bench_start_lazy.py --out $OUT/start-lazy.json [--rounds 3]
Writes start-lazy.json and start-lazy.md; prints the table last. ~2.5 minutes on the H200.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

T_PROCESS = time.perf_counter()

ROOT = Path(__file__).resolve().parents[2]

from benchmark.perf.bench_start import QWEN2_5_VL_7B_GB, QWEN2_5_VL_7B_TENSORS, load_weights  # noqa: E402

VARIANTS = ("fill", "baseline", "lazy", "fa4_disk", "breakdown")
HEAVY = ("flash_attn", "cutlass", "quack")
MARK = "sglang-fa4-breakdown-mark"


def _heavy() -> list[str]:
    return sorted({m.split(".")[0] for m in sys.modules if m.split(".")[0] in HEAVY})


def _attention_inputs(torch, lens, gen):
    q, k, v = (torch.randn(sum(lens), 16, 80, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(3))
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    return q, k, v, cu


def _reference(torch, q, k, v, lens):
    out, start = torch.empty(q.shape, dtype=torch.float32, device=q.device), 0
    for n in lens:
        qs, ks, vs = (t[start:start + n].float().transpose(0, 1) for t in (q, k, v))
        p = torch.softmax(qs @ ks.transpose(1, 2) * q.shape[-1] ** -0.5, dim=-1)
        out[start:start + n] = (p @ vs).transpose(0, 1)
        start += n
    return out


def first_calls_bitwise(torch) -> dict:
    """The first FA4 calls after the warmup (stored kernels) vs FA4's own public call."""
    import random

    from sglang_fa4.kernels import fa4

    cache, rng = fa4.kernel_cache(), random.Random(1)
    gen = torch.Generator(device="cuda").manual_seed(1)
    layouts = {"full_2_images": [2 * 38 * 2 * 52, 2 * 22 * 2 * 30],
               "windows_300": [rng.choice((16, 32, 48, 64)) for _ in range(300)]}
    ours, inputs = {}, {}
    before = fa4.kernel_cache().compile_count()
    for name, lens in layouts.items():
        q, k, v, cu = inputs[name] = _attention_inputs(torch, lens, gen)
        out = torch.full_like(q, float("nan"))
        cache(q, k, v, cu, max(lens), None, (None, None), None, out)
        ours[name] = out
    # a CUDA graph of the same launches on a side stream, replayed on new data
    stream, graph = torch.cuda.Stream(), torch.cuda.CUDAGraph()
    static = {n: (*_attention_inputs(torch, lens, gen), torch.full_like(inputs[n][0], float("nan")))
              for n, lens in layouts.items()}
    torch.cuda.synchronize()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        for n, lens in layouts.items():
            q, k, v, cu, out = static[n]
            cache(q, k, v, cu, max(lens), None, (None, None), None, out)
    fresh = {n: _attention_inputs(torch, lens, gen) for n, lens in layouts.items()}
    for n in layouts:
        for dst, src in zip(static[n][:3], fresh[n][:3]):
            dst.copy_(src)
        static[n][4].fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    resolved_by_first_calls = fa4.kernel_cache().compile_count() - before
    heavy_before = _heavy()
    t0 = time.perf_counter()
    from flash_attn.cute import flash_attn_varlen_func  # FA4 itself, only now

    import_s = time.perf_counter() - t0
    rows = {}
    for name, lens in layouts.items():
        def fa4(q, k, v, cu):
            r = flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(lens),
                                       max_seqlen_k=max(lens))
            return r[0] if isinstance(r, tuple) else r

        q, k, v, cu = inputs[name]
        theirs = fa4(q, k, v, cu)
        ref = _reference(torch, q, k, v, lens)
        graph_theirs = fa4(*static[name][:3], static[name][3])
        rows[name] = {"segments": len(lens), "tokens": sum(lens),
                      "eager_bitwise": bool(torch.equal(ours[name], theirs)),
                      "graph_replay_bitwise": bool(torch.equal(static[name][4], graph_theirs)),
                      "rel_err_vs_fp32": float((ours[name].float() - ref).norm() / ref.norm()),
                      "fa4_rel_err_vs_fp32": float((theirs.float() - ref).norm() / ref.norm())}
    return {"layouts": rows, "heavy_before_fa4_import": heavy_before, "fa4_import_s": import_s,
            "resolved_by_these_calls": resolved_by_first_calls,
            "all_bitwise": all(r["eager_bitwise"] and r["graph_replay_bitwise"] for r in rows.values())}


def host_us(torch, n: int = 2000) -> float:
    """Median host time of one direct launch of a resolved configuration (the d80 full one)."""
    from sglang_fa4.kernels import fa4

    cache = fa4.kernel_cache()
    q, k, v, cu = _attention_inputs(torch, [1024], torch.Generator(device="cuda").manual_seed(2))
    out = torch.empty_like(q)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        cache(q, k, v, cu, 1024, None, (None, None), None, out)
        times.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return statistics.median(times) * 1e6


def breakdown_child(args) -> dict:
    import ctypes

    import torch
    import torch._dynamo  # noqa: F401 - imported by SGLang before load_model, as triton is
    import triton  # noqa: F401

    out = {}
    sys.stderr.write(MARK + "\n")
    sys.stderr.flush()
    t0 = time.perf_counter()
    import tvm_ffi

    out["import_tvm_ffi_s"] = time.perf_counter() - t0
    metas = sorted(Path(args.cache_dir).rglob("meta.json"))
    if metas:
        meta = json.loads(metas[0].read_text())
        t0 = time.perf_counter()
        for lib in meta["runtime_libraries"]:
            ctypes.CDLL(lib["path"], mode=ctypes.RTLD_GLOBAL)
        out["dlopen_runtime_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        tvm_ffi.load_module(str(metas[0].parent / meta["libraries"]["forward"]["file"]))
        out["load_one_library_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    import flash_attn.cute  # noqa: F401

    out["import_flash_attn_cute_s"] = time.perf_counter() - t0
    out["torch"] = torch.__version__
    return out


def child(args) -> dict:
    import torch

    marks = {"python_to_torch_s": time.perf_counter() - T_PROCESS}
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    import triton  # noqa: F401 - SGLang's scheduler has it imported before load_model

    source = torch.empty(2**29, dtype=torch.bfloat16).uniform_(-1, 1)
    marks["ready_s"] = time.perf_counter() - T_PROCESS
    variant, fa4 = args.child, args.child != "baseline"
    result: dict = {"variant": variant, "round": args.round}
    if fa4:
        from benchmark.perf.bench_warmup import towers

        from sglang_fa4.startup import fa4_preload

        model = towers()["qwen2.5-vl"]
    t0 = time.perf_counter()
    if fa4:
        result["preload_started"] = fa4_preload.start()
    load_weights(args.load_gb, args.tensors, source)
    t1 = time.perf_counter()
    result["load_s"], result["warmup_s"] = t1 - t0, 0.0
    if fa4:
        import logging

        logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
        from sglang_fa4.kernels import compile_events
        from sglang_fa4.startup import warmup

        report = warmup.warm_model(model)
        torch.cuda.synchronize()
        result["warmup_s"] = time.perf_counter() - t1
        events = compile_events.events("triton")
        result["fa4"] = {k: report.as_dict()[k] for k in ("resolved", "compiled", "from_shared_library")}
        result["fa4"]["failures"] = len(report.failures)
        result["triton"] = {"resolved": len(events), "compiled": sum(e.cache_hit is False for e in events)}
    result["start_s"] = result["load_s"] + result["warmup_s"]
    result["heavy_after_start"] = _heavy()
    if variant == "lazy" and args.bitwise:  # the first attention calls after the warmup
        result["bitwise"] = first_calls_bitwise(torch)
    if variant in ("lazy", "fa4_disk"):
        result["host_us_per_launch"] = host_us(torch)
    if variant == "fill":
        from sglang_fa4.kernels.fa4 import shared_libs as fa4_shared_libs

        result["stored_entries"] = len(list(Path(args.cache_dir).rglob("meta.json")))
        result["compiler"] = fa4_shared_libs.find_compiler()
    result["marks"] = marks
    return result


def run(variant: str, cache_dir: Path, args, round_: int = 0) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED",
                                                             "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR")}
    env.update(SGLANG_FA4_KERNEL_CACHE="1", SGLANG_FA4_KERNEL_CACHE_DIR=str(cache_dir), SGLANG_FA4_JIT_MONITOR="warn",
               TRITON_CACHE_DIR=str(cache_dir / "triton"), SGLANG_FA4_PRELOAD="1",
               SGLANG_FA4_SHARED_LIBS="0" if variant == "fa4_disk" else "1",
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "benchmark" / "perf"), *filter(None, [os.environ.get("PYTHONPATH")])]))
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        result_path = Path(f.name)
    cmd = [sys.executable, *(["-X", "importtime"] if variant == "breakdown" else []), str(Path(__file__).resolve()),
           "--child", variant, "--result", str(result_path), "--cache-dir", str(cache_dir), "--round", str(round_),
           "--load-gb", str(args.load_gb), "--tensors", str(args.tensors)]
    if variant == "lazy" and round_ == 0:
        cmd.append("--bitwise")
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, cwd=str(ROOT), capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"variant": variant, "round": round_, "error": f"timed out after {args.timeout} s"}
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        return {"variant": variant, "round": round_, "error": f"rc {proc.returncode}: {proc.stderr[-2000:]}"}
    result = json.loads(result_path.read_text())
    result_path.unlink()
    result.update(variant=variant, round=round_)  # the breakdown child's result holds neither
    result["process_wall_s"] = wall
    if variant == "breakdown":
        result["import_self_s_by_package"] = importtime_groups(proc.stderr)
    else:
        sys.stderr.write(proc.stderr[-1500:])
    print(f"[start-lazy] {variant} round {round_}: " + (f"load {result['load_s']:.2f} s, warmup {result['warmup_s']:.2f} s, "
          if "load_s" in result else "") + f"process {wall:.1f} s", flush=True)
    return result


def importtime_groups(stderr: str) -> dict:
    """Self time of each top-level package imported after MARK (``-X importtime`` lines)."""
    lines = stderr.split(MARK, 1)[-1].splitlines()
    groups: dict = defaultdict(float)
    for line in lines:
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|\s*(\S+)", line)
        if m:
            groups[m.group(3).split(".")[0]] += int(m.group(1)) / 1e6
    return dict(sorted(((k, round(v, 3)) for k, v in groups.items() if v >= 0.005), key=lambda kv: -kv[1]))


def summarize(runs: list[dict]) -> dict:
    by = defaultdict(list)
    for r in runs:
        if "error" not in r:
            by[r["variant"]].append(r)
    base = {r["round"]: r for r in by["baseline"]}
    out: dict = {}
    for name in ("lazy", "fa4_disk"):
        added = [r["start_s"] - base[r["round"]]["start_s"] for r in by[name] if r["round"] in base]
        out[name] = {"runs": len(by[name]), "added_s": round(statistics.median(added), 3) if added else None,
                     "added_s_each": [round(a, 3) for a in added],
                     "warmup_s": round(statistics.median(r["warmup_s"] for r in by[name]), 3) if by[name] else None,
                     "host_us_per_launch": round(statistics.median(r["host_us_per_launch"] for r in by[name]), 2)
                     if by[name] else None}
    lazy = by["lazy"]
    out["bar_lazy_added_le_1s"] = out["lazy"]["added_s"] is not None and out["lazy"]["added_s"] <= 1.0
    out["lazy_imports_no_fa4"] = bool(lazy) and all(r["heavy_after_start"] == [] for r in lazy)
    out["lazy_all_from_shared_libraries"] = bool(lazy) and all(
        r["fa4"]["from_shared_library"] == r["fa4"]["resolved"] > 0 and r["fa4"]["compiled"] == 0 for r in lazy)
    bitwise = [r["bitwise"] for r in lazy if "bitwise" in r]
    out["first_calls_bitwise_equal_fa4"] = bool(bitwise) and all(b["all_bitwise"] and b["heavy_before_fa4_import"] == []
                                                                 and b["resolved_by_these_calls"] == 0 for b in bitwise)
    out["restarts_compile_nothing"] = all(r["fa4"]["compiled"] == 0 and r["triton"]["compiled"] == 0
                                          for r in by["lazy"] + by["fa4_disk"])
    out["errors"] = [f"{r['variant']} round {r['round']}: {r['error'][:300]}" for r in runs if "error" in r]
    return out


def markdown(res: dict) -> str:
    s, runs = res["summary"], [r for r in res["runs"] if "error" not in r and r["variant"] != "breakdown"]
    lines = ["# What FA4 adds to a server start with the shared-library store (NVIDIA H200)", "",
             f"Command: `{res['meta']['command']}`", "",
             "Versions: " + ", ".join(f"{k} {v}" for k, v in res["meta"]["versions"].items() if v), "",
             f"Weight load stand-in: {res['meta']['load_gb']} GB in {res['meta']['tensors']} tensors; torch, CUDA and "
             "triton ready before it (as in SGLang's scheduler). `start` = load + the plugin's warmup hook; `added` = "
             "start minus the same round's baseline; one process per run.", "",
             "| variant | round | load s | warmup s | start s | FA4 resolved / from shared libs / compiled | "
             "imported at start | host us per launch | process s |", "|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        fa4 = r.get("fa4")
        lines.append("| " + " | ".join([
            r["variant"], str(r["round"]), f"{r['load_s']:.2f}", f"{r['warmup_s']:.2f}", f"{r['start_s']:.2f}",
            f"{fa4['resolved']} / {fa4['from_shared_library']} / {fa4['compiled']}" if fa4 else "—",
            ", ".join(r["heavy_after_start"]) or "none",
            f"{r['host_us_per_launch']:.1f}" if "host_us_per_launch" in r else "—", f"{r['process_wall_s']:.1f}"]) + " |")
    fill = next((r for r in runs if r["variant"] == "fill"), None)
    if fill:
        lines += ["", f"The fill run stored {fill.get('stored_entries')} kernel(s) as shared libraries "
                  f"(linked with {fill.get('compiler')})."]
    lines += ["", "| restart | FA4 adds (median) s | each round s |", "|---|---|---|"]
    for name in ("lazy", "fa4_disk"):
        lines.append(f"| {name} | {s[name]['added_s']} | {s[name]['added_s_each']} |")
    bitwise = next((r["bitwise"] for r in runs if "bitwise" in r), None)
    if bitwise:
        lines += ["", "First FA4 calls after the lazy warmup vs FA4's own call (imported after them, "
                  f"in {bitwise['fa4_import_s']:.2f} s):", "",
                  "| layout | segments | eager bitwise | graph replay bitwise | rel err vs fp32 | FA4's |", "|---|---|---|---|---|---|"]
        for name, b in bitwise["layouts"].items():
            lines.append(f"| {name} | {b['segments']} | {b['eager_bitwise']} | {b['graph_replay_bitwise']} | "
                         f"{b['rel_err_vs_fp32']:.2e} | {b['fa4_rel_err_vs_fp32']:.2e} |")
    brk = next((r for r in res["runs"] if r["variant"] == "breakdown" and "error" not in r), None)
    if brk:
        lines += ["", "Import breakdown after torch + torch._dynamo + triton (`-X importtime` self time by package): "
                  + ", ".join(f"{k} {v} s" for k, v in list(brk["import_self_s_by_package"].items())[:8])
                  + f"; import flash_attn.cute {brk['import_flash_attn_cute_s']:.2f} s, import tvm_ffi "
                  f"{brk['import_tvm_ffi_s']:.3f} s, DSL runtime dlopen {brk.get('dlopen_runtime_s', float('nan')):.3f} s, "
                  f"one stored library {brk.get('load_one_library_s', float('nan')):.4f} s."]
    lines += ["", f"Bar (FA4 adds <= 1 s, restart with the store): {'met' if s['bar_lazy_added_le_1s'] else 'NOT met'}. "
              f"No FA4/CUTLASS import: {s['lazy_imports_no_fa4']}. Every variant from a stored library: "
              f"{s['lazy_all_from_shared_libraries']}. First calls bitwise = FA4: {s['first_calls_bitwise_equal_fa4']}. "
              f"Restarts compile nothing: {s['restarts_compile_nothing']}." + (f" Errors: {s['errors']}" if s["errors"] else ""), ""]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path("start-lazy.json"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--cache-dir", type=Path, default=None, help="default: a fresh one, filled by the fill run")
    p.add_argument("--load-gb", type=float, default=QWEN2_5_VL_7B_GB)
    p.add_argument("--tensors", type=int, default=QWEN2_5_VL_7B_TENSORS)
    p.add_argument("--timeout", type=int, default=150, help="seconds per run")
    p.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    p.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--round", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--bitwise", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        fn = breakdown_child if args.child == "breakdown" else child
        args.result.write_text(json.dumps(fn(args), default=str))
        return 0
    cache_dir = args.cache_dir or Path(tempfile.mkdtemp(prefix="sglang-fa4-start-lazy-"))
    cache_dir.mkdir(parents=True, exist_ok=True)
    runs = [run("fill", cache_dir, args)]
    for i in range(args.rounds):
        runs += [run(v, cache_dir, args, i) for v in ("baseline", "lazy", "fa4_disk")]
    runs.append(run("breakdown", cache_dir, args))
    from sglang_fa4.bench.meta import base_meta

    meta = base_meta("start-lazy")
    meta["command"] = "python3 benchmark/perf/bench_start_lazy.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    meta.update(load_gb=args.load_gb, tensors=args.tensors, rounds=args.rounds, cache_dir=str(cache_dir))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "runs": runs}, default=str, separators=(",", ":")))  # kept if the summary fails
    res = {"meta": meta, "runs": runs, "summary": summarize(runs)}
    args.out.write_text(json.dumps(res, default=str, separators=(",", ":")))
    args.out.with_suffix(".md").write_text(markdown(res))
    print(markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
