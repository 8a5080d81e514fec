"""GPU benchmark of the startup warmup (sglang_fa4/startup/warmup.py) and FA4's persistent kernel cache.

For the attention configurations of two ViT towers -- Qwen2.5-VL (head_dim 80, 64-token windows +
full blocks) and Qwen3-VL (head_dim 72, full attention), 16 heads, bf16 -- stand-in models with
the attributes of SGLang's VisionAttention go through ``sglang_fa4.startup.variants.enumerate_variants`` and
``warmup.warm`` (the FA4 variants, then the Triton kernels), each phase in its own process:

  cold   a fresh, empty FA4 cache dir: every variant is compiled (FA4 writes it to disk);
  warm   a second process on the same dir: every variant is loaded from disk, nothing compiles;
         then a trace of N random image sizes (Qwen2.5-VL windowed + full layouts and Qwen3-VL
         full, 1-3 images per batch, 56 px to 2240 px) through ``varlen.fa4_varlen_attention``
         counting configurations resolved after the warmup (must be 0), and a bitwise check
         that the one-kernel-per-class launches equal FA4's public API called with each call's
         exact max_seqlen (the max_seqlen normalisation changes no output).

Our Triton kernels (short-window attention, ViT rotary) go through the same two phases with their
own fresh TRITON_CACHE_DIR (startup/variants.triton_shapes): cold compiles them, warm loads them from
disk; the warm trace also runs the fused rotary on every batch's token counts and counts Triton
specializations resolved after the warmup (must be 0).

Usage (repo root; needs torch, flash-attn-4 and this package, nothing else):
    python3 benchmark/perf/bench_warmup.py --out $OUT/warmup.json [--sizes 60] [--seed 0]
Prints a short summary; the JSON holds per-variant times, compile counts and the trace.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

HEADS = 16
PATCH = 14
WINDOW_PATCHES = 8  # Qwen2.5-VL: window 112 px / patch 14 px
FULLATT = [7, 15, 23, 31]
DEVICE = "cuda"  # a CPU dry run with a fake FA4 backend patches this


# ---- stand-in towers (only what the warmup reads from SGLang's VisionAttention) -------------


def towers():
    import torch
    from torch import nn

    class Attn(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.head_size = d
            self.num_attention_heads_per_partition = HEADS
            self.num_attention_kv_heads_per_partition = HEADS
            self.qkv_backend_name = "fa4"
            self.qkv_proj = nn.Linear(8, 8).to(torch.bfloat16)
            self.window_size = (-1, -1)
            self.sinks = None

    class Block(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.attn = Attn(d)

    class Tower(nn.Module):
        def __init__(self, d, depth, fullatt=None):
            super().__init__()
            if fullatt is not None:
                self.fullatt_block_indexes = fullatt
                self.window_size = WINDOW_PATCHES * PATCH
            self.patch_size = PATCH
            self.rotary_pos_emb = nn.Identity()  # a rotary tower: the warmup resolves the fused rotary
            self.blocks = nn.ModuleList(Block(d) for _ in range(depth))

    class VLM(nn.Module):
        def __init__(self, visual):
            super().__init__()
            self.visual = visual

    return {
        "qwen2.5-vl": VLM(Tower(80, 32, FULLATT)).to(DEVICE),
        "qwen3-vl": VLM(Tower(72, 27)).to(DEVICE),
    }


# ---- child: one process, one phase ----------------------------------------------------------


def _windows(gh: int, gw: int) -> list[int]:
    """Token counts of Qwen2.5-VL's windows over a gh x gw patch grid (8 x 8 patch windows;
    edge windows are smaller)."""
    out = []
    for i in range(0, gh, WINDOW_PATCHES):
        for j in range(0, gw, WINDOW_PATCHES):
            out.append(min(WINDOW_PATCHES, gh - i) * min(WINDOW_PATCHES, gw - j))
    return out


def _sizes(n: int, seed: int) -> list[list[tuple[int, int]]]:
    """n batches of 1-3 images (h, w in px, multiples of 28), with the class edges forced in."""
    rng = random.Random(seed)
    fixed = [[(56, 56)], [(112, 112)], [(196, 196)], [(224, 252)], [(2240, 2240)], [(1792, 1820)],
             [(448, 448)] * 3, [(2016, 1344), (56, 84)]]
    batches = list(fixed)
    while len(batches) < n:
        batches.append([(28 * rng.randint(2, 80), 28 * rng.randint(2, 80)) for _ in range(rng.choice((1, 1, 2, 3)))])
    return batches[:n]


def _cu(lens, device):
    import torch

    acc, out = 0, [0]
    for n in lens:
        acc += n
        out.append(acc)
    return torch.tensor(out, dtype=torch.int32, device=device)


def child(args) -> dict:
    import torch

    result: dict = {"phase": args.child}
    t0 = time.perf_counter()
    from sglang_fa4.startup import fa4_env, warmup
    from sglang_fa4.startup.variants import enumerate_variants

    cache_dir = fa4_env.configure_fa4_disk_cache()  # before flash_attn.cute is imported
    import flash_attn.cute  # noqa: F401

    from sglang_fa4.kernels import fa4
    from sglang_fa4.kernels.settings import settings
    from sglang_fa4.startup.variants import WarmItem, triton_shapes

    result["cache_dir"] = cache_dir
    result["import_fa4_s"] = time.perf_counter() - t0
    arch = fa4.kernel_cache().arch
    result["arch"] = arch
    models = towers()
    variants = []
    for name, model in models.items():
        for v in enumerate_variants(model, arch):
            variants.append((name, v))
    report = warmup.warm([WarmItem("fa4", v) for _, v in variants], torch.device(DEVICE))
    result["warmup"] = {
        "total_s": report.total_seconds,
        "resolved": report.resolved,
        "compiled": report.compiled,
        "failures": [[item.describe(), m] for item, m in report.failures],
        "mismatches": len(report.mismatches),
        "variants": [
            {"tower": name, "describe": v.describe(), "seconds": s, **v.as_dict()}
            for (name, v), s in zip(variants, report.seconds)
        ],
    }
    from sglang_fa4.kernels import compile_events

    t1 = time.perf_counter()
    tri = {name: warmup.warm(triton_shapes(model, arch, settings()), torch.device(DEVICE)).as_dict()
           for name, model in models.items()}
    torch.cuda.synchronize()
    events = compile_events.events("triton")
    result["triton_warmup"] = {
        "total_s": time.perf_counter() - t1,
        "towers": tri,
        "resolved": len(events),
        "compiled": sum(1 for e in events if e.cache_hit is False),
        "loaded_from_disk": sum(1 for e in events if e.cache_hit is True),
        "events": [{"kernel": e.kernel, "seconds": e.seconds, "how": e.how} for e in events],
    }
    if args.child == "warm":
        result["trace"] = trace(args)
    return result


def trace(args) -> dict:
    import torch

    from flash_attn.cute import flash_attn_varlen_func

    from sglang_fa4.kernels import compile_events
    from sglang_fa4.kernels import fa4, varlen
    from sglang_fa4.kernels.vit import short_windows as short_segments
    from sglang_fa4.kernels.vit import rotary as vit_rotary
    from sglang_fa4.startup import jit_monitor

    jit_monitor.arm_jit_monitor()
    dev = torch.device(DEVICE)
    start_count = fa4.kernel_cache().compile_count()
    start_triton = compile_events.count("triton")
    start_after = jit_monitor.compiles_after_warmup()
    calls = many = routed_calls = 0
    checks = []
    rows = []
    t0 = time.perf_counter()
    for b, batch in enumerate(_sizes(args.sizes, args.seed)):
        grids = [(h // PATCH, w // PATCH) for h, w in batch]
        full = [gh * gw for gh, gw in grids]
        windows = [n for gh, gw in grids for n in _windows(gh, gw)]
        layouts = [
            ("qwen2.5-vl windowed", 80, windows),
            ("qwen2.5-vl full", 80, [0] + full),  # Qwen2.5-VL's full cu_seqlens starts with an empty segment
            ("qwen3-vl full", 72, full),
        ]
        for name, d, lens in layouts:
            total = sum(lens)
            q, k, v = (torch.randn(total, HEADS, d, dtype=torch.bfloat16, device=dev) for _ in range(3))
            cu = _cu(lens, dev)
            max_len = max(lens)
            out = varlen.fa4_varlen_attention(q, k, v, cu, max_len)
            calls += 1
            if name != "qwen2.5-vl full":  # the fused rotary on this batch's tokens (bf16 tables)
                ang = torch.rand(total, d, device=dev)
                vit_rotary.apply_rotary(q, k, ang.cos().bfloat16(), ang.sin().bfloat16())
            many += len(lens) > 256
            # short-window layouts run on FA2 on SM90 (sglang_fa4.kernels.vit.short_windows), not on FA4
            routed = short_segments.should_route(fa4.kernel_cache().arch, q, max_len, (None, None), None)
            routed_calls += routed
            # the normalisation proof: FA4's own public call, with this call's exact max_seqlen
            if b % 4 == 0 and not routed:
                ref = flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu,
                                             max_seqlen_q=max_len, max_seqlen_k=max_len)
                ref = ref[0] if isinstance(ref, tuple) else ref
                checks.append({"layout": name, "sizes": batch, "max_seqlen": max_len, "segments": len(lens),
                               "bitwise_equal": bool(torch.equal(out, ref))})
        rows.append({"images": batch, "tokens": sum(full), "windows": len(windows), "max_window": max(windows),
                     "max_image": max(full)})
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return {
        "batches": len(rows),
        "calls": calls,
        "calls_over_256_segments": many,
        "calls_routed_to_fa2": routed_calls,
        "seconds": time.perf_counter() - t0,
        "resolved_after_warmup": fa4.kernel_cache().compile_count() - start_count,
        "triton_resolved_after_warmup": compile_events.count("triton") - start_triton,
        "monitor_compiles_after_warmup": jit_monitor.compiles_after_warmup() - start_after,
        "bitwise_checks": len(checks),
        "bitwise_all_equal": all(c["bitwise_equal"] for c in checks),
        "checks": checks,
        "batches_detail": rows,
    }


# ---- parent ---------------------------------------------------------------------------------


def run_phase(phase: str, cache_dir: Path, args) -> dict:
    env = dict(os.environ)
    for name in ("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"):
        env.pop(name, None)
    env["SGLANG_FA4_KERNEL_CACHE"] = "1"
    env["SGLANG_FA4_KERNEL_CACHE_DIR"] = str(cache_dir)
    env["SGLANG_FA4_JIT_MONITOR"] = "warn"
    env["TRITON_CACHE_DIR"] = str(cache_dir / "triton")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        result_path = Path(f.name)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", phase, "--result", str(result_path),
           "--sizes", str(args.sizes), "--seed", str(args.seed)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=str(ROOT), capture_output=True, text=True, timeout=args.timeout)
    wall = time.perf_counter() - t0
    sys.stderr.write(proc.stderr[-4000:])
    if proc.returncode != 0:
        raise SystemExit(f"{phase} phase failed (rc {proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    result = json.loads(result_path.read_text())
    result_path.unlink()
    result["process_wall_s"] = wall
    return result


def meta() -> dict:
    import torch

    from importlib.metadata import PackageNotFoundError, version

    def ver(dist):
        try:
            return version(dist)
        except PackageNotFoundError:
            return None

    return {
        "gpu": torch.cuda.get_device_name(0),
        "capability": list(torch.cuda.get_device_capability(0)),
        "torch": torch.__version__,
        "flash-attn-4": ver("flash-attn-4"),
        "nvidia-cutlass-dsl": ver("nvidia-cutlass-dsl"),
        "python": platform.python_version(),
        "command": "python3 benchmark/perf/bench_warmup.py " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=None, help="JSON result path")
    p.add_argument("--sizes", type=int, default=60, help="random image batches in the trace (>= 50)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=int, default=200, help="seconds per phase")
    p.add_argument("--keep-cache", type=Path, default=None,
                   help="use this (empty) directory as the kernel cache and keep it (bench_start.py --cache-dir)")
    p.add_argument("--child", choices=("cold", "warm"), help=argparse.SUPPRESS)
    p.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()

    import logging

    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    if args.child:
        args.result.write_text(json.dumps(child(args), default=str))
        return 0

    import torch

    if not torch.cuda.is_available():
        print("bench_warmup: needs a CUDA GPU", file=sys.stderr)
        return 2
    out = args.out or Path("warmup.json")
    result = {"meta": meta()}
    if args.keep_cache:
        args.keep_cache.mkdir(parents=True, exist_ok=True)
        if any(args.keep_cache.iterdir()):
            raise SystemExit(f"--keep-cache {args.keep_cache} is not empty: the cold phase needs an empty cache")
    with (contextlib.nullcontext(str(args.keep_cache)) if args.keep_cache
          else tempfile.TemporaryDirectory(prefix="sglang-fa4-kernels-")) as cache_dir:
        result["cold"] = run_phase("cold", Path(cache_dir), args)
        result["warm"] = run_phase("warm", Path(cache_dir), args)
        files = [f for f in Path(cache_dir).rglob("*") if f.is_file()]
        result["cache_files"] = len(files)
        result["cache_bytes"] = sum(f.stat().st_size for f in files)
    cold, warm, tr = result["cold"]["warmup"], result["warm"]["warmup"], result["warm"]["trace"]
    result["summary"] = {
        "arch": result["cold"]["arch"],
        "variants": len(cold["variants"]),
        "cold_warmup_s": cold["total_s"],
        "cold_compiled": cold["compiled"],
        "warm_warmup_s": warm["total_s"],
        "warm_compiled": warm["compiled"],
        "import_fa4_s": result["warm"]["import_fa4_s"],
        "trace_batches": tr["batches"],
        "trace_calls": tr["calls"],
        "trace_calls_over_256_segments": tr["calls_over_256_segments"],
        "trace_resolved_after_warmup": tr["resolved_after_warmup"],
        "bitwise_all_equal": tr["bitwise_all_equal"],
        "triton_cold_s": result["cold"]["triton_warmup"]["total_s"],
        "triton_cold_compiled": result["cold"]["triton_warmup"]["compiled"],
        "triton_warm_s": result["warm"]["triton_warmup"]["total_s"],
        "triton_warm_compiled": result["warm"]["triton_warmup"]["compiled"],
        "triton_warm_loaded_from_disk": result["warm"]["triton_warmup"]["loaded_from_disk"],
        "trace_triton_resolved_after_warmup": tr["triton_resolved_after_warmup"],
        "ok": (
            warm["compiled"] == 0 and tr["resolved_after_warmup"] == 0 and tr["bitwise_all_equal"]
            and result["warm"]["triton_warmup"]["compiled"] == 0 and tr["triton_resolved_after_warmup"] == 0
            and result["cold"]["triton_warmup"]["resolved"] > 0
            and not cold["failures"] and not cold["mismatches"] and tr["batches"] >= 50
        ),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str))
    s = result["summary"]
    print(f"GPU {result['meta']['gpu']} (sm_{s['arch']}), flash-attn-4 {result['meta']['flash-attn-4']}")
    for v, w in zip(cold["variants"], warm["variants"]):
        print(f"  {v['tower']:<11} {v['describe']:<70} cold {v['seconds']:7.3f} s   warm {w['seconds'] * 1e3:8.1f} ms")
    print(f"warmup: {s['variants']} variants, cold {s['cold_warmup_s']:.2f} s ({s['cold_compiled']} compiled), "
          f"warm {s['warm_warmup_s'] * 1e3:.1f} ms ({s['warm_compiled']} compiled); import flash_attn.cute "
          f"{s['import_fa4_s']:.1f} s")
    print(f"trace: {s['trace_batches']} image batches, {s['trace_calls']} calls "
          f"({s['trace_calls_over_256_segments']} with > 256 segments): {s['trace_resolved_after_warmup']} "
          f"compiles after warmup; bitwise vs FA4 public API: {'equal' if s['bitwise_all_equal'] else 'DIFFERENT'}")
    print(f"Triton (short-window attention, ViT rotary): cold {s['triton_cold_s']:.2f} s "
          f"({s['triton_cold_compiled']} compiled), warm {s['triton_warm_s'] * 1e3:.1f} ms "
          f"({s['triton_warm_compiled']} compiled, {s['triton_warm_loaded_from_disk']} loaded from disk); "
          f"trace: {s['trace_triton_resolved_after_warmup']} resolved after warmup")
    print(f"{'OK' if s['ok'] else 'FAIL'} -> {out}")
    return 0 if s["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
