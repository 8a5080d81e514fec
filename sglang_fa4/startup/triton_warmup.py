"""Compile, at the startup warmup, the Triton kernels a loaded vision model will launch.

Two of our kernels are Triton: the short-window attention kernel (SM90, windowed layouts at head
dims 64/80/128: Qwen2.5-VL's window blocks) and the fused ViT rotary (every rotary tower's layers in
ViT graph mode). Each compiles per specialization the first time it launches; :func:`warm_triton`
launches each one the model will hit on small random inputs, inside the warmup's
``expected_compiles`` block, so its compile (or its load from Triton's disk cache, ~/.triton/cache
or TRITON_CACHE_DIR, which makes a restart compile-free) is startup work and any later one is
flagged by the JIT monitor (:mod:`sglang_fa4.kernels.triton_handles` events).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Optional

from sglang_fa4 import sglang_model

logger = logging.getLogger("sglang_fa4")


def _shapes(modules) -> list[tuple[int, int, int, str]]:
    """Distinct (head_dim, heads, kv_heads, dtype) of the fa4 attention modules."""
    seen = []
    for _, m in modules:
        s = (*sglang_model.attention_shape(m), sglang_model.module_dtype(m))
        if s not in seen:
            seen.append(s)
    return seen


def has_rotary_tower(model) -> bool:
    """A tower with a rotary position embedding (Qwen2.5-VL, Qwen3-VL: ``rotary_pos_emb``)."""
    return any(sglang_model.is_rotary_tower(m) for m in model.modules())


def has_windowed_tower(model) -> bool:
    return any(sglang_model.full_attention_blocks(m) for m in model.modules())


def warm_triton(model, arch: Optional[int], device) -> dict[str, Any]:
    """Resolve the model's Triton kernels now (call inside the warmup's expected-compiles block).
    Returns what was warmed: kernel -> [shape, seconds, newly resolved] rows, and failures."""
    from sglang_fa4.kernels import short_segments, short_window_kernel, vit_rotary

    modules = sglang_model.find_fa4_attention(model)
    report: dict[str, Any] = {"vit_rotary": [], "short_window_attention": [], "failures": []}
    if not modules or getattr(device, "type", "cuda") != "cuda":
        return report
    shapes = _shapes(modules)
    jobs = []
    if has_rotary_tower(model):
        jobs += [("vit_rotary", s, lambda s=s: vit_rotary.warm(s[0], s[1], s[2], s[3], device=device)) for s in shapes]
    if arch in short_segments.ROUTED_ARCHS and has_windowed_tower(model) and short_segments.route_max_seqlen() > 0:
        jobs += [("short_window_attention", s,
                  lambda s=s: short_window_kernel.warm(s[0], s[1], s[2], s[3], device=device))
                 for s in shapes if s[0] in short_segments.TRITON_HEAD_DIMS]
    for name, shape, job in jobs:
        t0 = time.perf_counter()
        try:
            new = job()
        except Exception as exc:  # noqa: BLE001 - one kernel must not stop the server; logged, reported
            report["failures"].append([name, list(shape), f"{type(exc).__name__}: {exc}"])
            logger.warning("sglang-fa4 warmup: Triton %s %s failed: %s: %s", name, shape, type(exc).__name__, exc)
            continue
        seconds = time.perf_counter() - t0
        report[name].append({"head_dim": shape[0], "heads": shape[1], "kv_heads": shape[2], "dtype": shape[3],
                             "seconds": round(seconds, 3), "resolved": new})
        logger.info("sglang-fa4 warmup: Triton %s d=%d heads=%d/%d %s: %.3f s (%d resolved)",
                    name, *shape, seconds, new)
    return report
