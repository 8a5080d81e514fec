"""One torch.profiler trace of decode steps at a long context, per arm, through SGLang's own
``/start_profile`` (``num_steps``: it stops by itself), and what the trace says: GPU kernel time per
step by kind (attention, GEMM, torch-native elementwise/reduction kernels -- the CUDA-only
stand-ins' work, since SGLang's own fused ops are Triton/JIT --, the rest), attention per layer and
its share of the step, the kernels that took the most time.

With decode CUDA graphs on, the trace holds the graph's kernels (CUPTI reports each node) and one
graph launch per step; the per-step figures divide by the steps requested.

A kernel launched exactly once a step (the LM head, the sampler's softmax) does not grow with the
model's depth; every other kernel runs per layer (or per few layers). :func:`project` scales the
latter to another layer count, for a model served cut to fewer layers than it has (a projection
from one measured depth, labelled so, not a measurement).
"""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from pathlib import Path

KINDS = (
    ("attention", re.compile(r"_fwd_kernel|_fwd_grouped_kernel|fp8_paged|flash|fmha|attn|attention|splitkv|split_kv"
                             r"|decode_combine|FlashAttn", re.I)),
    ("gemm", re.compile(r"gemm|nvjet|cutlass|xmma|wgmma|cublas|sm90_", re.I)),
    ("torch_native", re.compile(r"at::native|elementwise|reduce_kernel|vectorized|unrolled|CatArrayBatched", re.I)),
)
NOT_ATTENTION = re.compile(r"rotary|rope|norm|gemm", re.I)


def kind_of(name: str) -> str:
    for kind, rx in KINDS:
        if rx.search(name) and not (kind == "attention" and NOT_ATTENTION.search(name)):
            return kind
    return "other"


def load_trace(path: Path) -> dict:
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)


def analyse(trace: dict, steps: int, layers: int, top: int = 12) -> dict:
    """Per-step GPU kernel time by kind, attention per layer and share, top kernels."""
    if steps < 1 or layers < 1:
        raise ValueError(f"steps and layers must be >= 1, got {steps}, {layers}")
    by_kind: dict[str, float] = defaultdict(float)
    by_name: dict[str, list] = defaultdict(lambda: [0.0, 0])
    launches = 0
    for ev in trace.get("traceEvents", []):
        if ev.get("ph") != "X":
            continue
        cat = ev.get("cat", "")
        if cat == "kernel":
            dur = float(ev.get("dur", 0.0))
            name = ev.get("name", "?")
            by_kind[kind_of(name)] += dur
            rec = by_name[name]
            rec[0] += dur
            rec[1] += 1
        elif cat == "cuda_runtime" and "GraphLaunch" in ev.get("name", ""):
            launches += 1
    total = sum(by_kind.values())
    if total == 0:
        return {"ok": False, "error": "no GPU kernel events in the trace"}
    once = sum(t for t, c in by_name.values() if c == steps)
    per_step = {k: round(v / steps, 2) for k, v in sorted(by_kind.items())}
    att = by_kind.get("attention", 0.0)
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]
    return {"ok": True, "steps": steps, "graph_launches": launches, "gpu_us_per_step": round(total / steps, 2),
            "us_per_step_by_kind": per_step, "attention_us_per_layer": round(att / steps / layers, 3),
            "attention_share": round(att / total, 4), "us_per_step_once": round(once / steps, 2),
            "top_kernels": [{"name": n[:160], "kind": kind_of(n), "us_per_step": round(t / steps, 2), "calls": c,
                             "share": round(t / total, 4)} for n, (t, c) in ranked]}


def project(profile: dict, layers: int, to_layers: int) -> float:
    """The step's GPU time at ``to_layers`` layers from a profile at ``layers``: the once-a-step
    kernels as measured, everything else scaled by ``to_layers / layers`` (the layer mix kept: a
    Gemma-4 cut keeps its 5:1 sliding:full pattern)."""
    if layers < 1 or to_layers < 1:
        raise ValueError(f"layer counts must be >= 1, got {layers}, {to_layers}")
    once = profile["us_per_step_once"]
    return round(once + (profile["gpu_us_per_step"] - once) * to_layers / layers, 2)


def newest_trace(folder: Path) -> Path | None:
    found = sorted((p for p in folder.rglob("*") if p.name.endswith((".trace.json.gz", ".trace.json", ".json.gz"))),
                   key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None
