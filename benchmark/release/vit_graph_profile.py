"""Where a ViT graph's GPU time goes (``check_vit_graphs.py --profile``): each path run once under
torch.profiler, its device kernels summed by name, next to the call's CUDA-event time, so a budget
graph's excess over the exact-layout graph reads as kernel time (which kernels) or idle GPU (host
work between the events)."""

from __future__ import annotations

from collections import defaultdict
from typing import Callable


def kernel_times_us(fn: Callable[[], object]) -> dict:
    """Run ``fn`` once (after a warm call) under torch.profiler: {"event_us": wall between CUDA
    events around the call, "kernel_us": the sum of its device kernels, "kernels": {name: us},
    "count": kernels launched}."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from sglang_fa4.bench.timing import event_time_ms

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        event_ms = event_time_ms(fn, 1)
    per_name: dict = defaultdict(float)
    count = 0
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA and ev.device_time > 0:
            per_name[ev.name] += ev.device_time
            count += 1
    return {"event_us": round(event_ms * 1e3, 1), "kernel_us": round(sum(per_name.values()), 1),
            "count": count, "kernels": {k: round(v, 1) for k, v in sorted(per_name.items(), key=lambda kv: -kv[1])}}


def compare(paths: dict, top: int = 12) -> dict:
    """kernel_times_us for each path; the ``top`` kernel names of the first path with every path's
    time for them (the difference to read)."""
    res = {name: kernel_times_us(fn) for name, fn in paths.items()}
    first = next(iter(res.values()))
    names = list(first["kernels"])[:top]
    others = set()
    for r in res.values():
        others.update(list(r["kernels"])[:top])
    names += sorted(others - set(names))
    table = [{"kernel": n[:120], **{p: r["kernels"].get(n, 0.0) for p, r in res.items()}} for n in names]
    return {"paths": {p: {k: v for k, v in r.items() if k != "kernels"} for p, r in res.items()}, "top": table}


def markdown(model: str, image: str, prof: dict) -> list[str]:
    paths = list(prof["paths"])
    lines = [f"Profile, {model} {image} (one call each under torch.profiler; us):", "",
             "| | " + " | ".join(paths) + " |", "|---|" + "---|" * len(paths)]
    for key in ("event_us", "kernel_us", "count"):
        lines.append(f"| {key} | " + " | ".join(str(prof["paths"][p][key]) for p in paths) + " |")
    for row in prof["top"]:
        lines.append(f"| `{row['kernel'][:70]}` | " + " | ".join(f"{row[p]:.1f}" for p in paths) + " |")
    return lines + [""]
