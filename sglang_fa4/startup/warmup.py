"""Compile, at startup, exactly what a loaded model will launch: one loop over the warmup registry.

Without a warmup the first request after a restart, and the first of each new shape class, waits
for compiles: 2-4 s per FA4 configuration on an H200, 10-20 s per SM90 FP8 forward variant, a
second or so per Triton specialization. :mod:`sglang_fa4.startup.variants` lists what a model will
compile as (kernel family, variant) pairs; :func:`warm` hands each to the warmup registry
(:mod:`sglang_fa4.kernels.warmup`), inside :func:`jit_monitor.expected_compiles`, logs one line per
variant with its time, and reports what the one compile counter
(:mod:`sglang_fa4.kernels.compile_events`) saw: resolved, compiled now (not loaded from a cache),
FA4 configurations loaded from stored shared libraries, failures (logged and reported, never
raised: one bad variant must not stop the server), and FA4 configurations resolved other than
predicted.

Two entries, one per startup hook:

* :func:`warm_model` -- a vision model with fa4 ViT attention, after its load
  (:func:`~sglang_fa4.startup.variants.vit_warmup_list`); then the JIT monitor is armed;
* :func:`warm_llm_fp8_kv` -- SGLang's LLM attention on the FP8 KV route, after its backend's init
  (:func:`~sglang_fa4.startup.variants.llm_fp8_kv_warmup_list`); then the FP8 forward's and
  Triton's compile monitors are armed (also in a process without an fa4 ViT).

With FA4's persistent cache (``SGLANG_FA4_KERNEL_CACHE``, applied by
:func:`sglang_fa4.startup.fa4_env.configure_fa4_disk_cache` before flash_attn.cute is imported) and
Triton's, a restart loads every variant from disk in milliseconds. Importing this module imports
neither flash_attn nor cutlass (nor SGLang).
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from sglang_fa4 import sglang_model
from sglang_fa4.environ import envs
from sglang_fa4.kernels import compile_events, fa4
from sglang_fa4.kernels import warmup as registry
from sglang_fa4.kernels.settings import settings
from sglang_fa4.startup import fa4_env, fa4_preload, jit_monitor
from sglang_fa4.startup.variants import LlmAttentionShape, WarmItem, llm_fp8_kv_warmup_list, vit_warmup_list

logger = logging.getLogger("sglang_fa4")


def _compiled_now(source: str, event) -> bool:
    """A resolve that compiled (not a load from FA4's, Triton's or our store's cache)."""
    if source == "fa4":
        return bool(event.fa4_compiled)
    if source == "triton":
        return event.cache_hit is not True
    return True  # the FP8 forward and the quantize keep no disk cache of their own


@dataclass
class WarmupReport:
    items: list = field(default_factory=list)  # WarmItem, in the order warmed
    seconds: list[float] = field(default_factory=list)  # per item, host time incl. sync
    hows: list[str] = field(default_factory=list)  # per item: "compiled", "cached", "failed"...
    resolved: int = 0  # kernels newly resolved in this process (the compile events of the warmup)
    compiled: int = 0  # of those, compiled now (not loaded from a memory or disk cache)
    from_shared_library: int = 0  # FA4 configurations loaded from the store (no FA4 import)
    failures: list[tuple[Any, str]] = field(default_factory=list)  # (WarmItem, error)
    mismatches: list[tuple[Any, Any]] = field(default_factory=list)  # (FA4 Variant, FA4Config resolved)
    total_seconds: float = 0.0
    by_family: dict = field(default_factory=dict)  # family -> {"variants", "resolved", "compiled", "failed"}

    def family(self, name: str) -> dict:
        return self.by_family.get(name, {"variants": 0, "resolved": 0, "compiled": 0, "failed": 0})

    def variants(self, name: str) -> list:
        return [item.variant for item in self.items if item.family == name]

    def as_dict(self) -> dict[str, Any]:
        return {
            "variants": [dict(item.as_dict(), seconds=s, how=h) for item, s, h in zip(self.items, self.seconds,
                                                                                     self.hows)],
            "resolved": self.resolved,
            "compiled": self.compiled,
            "from_shared_library": self.from_shared_library,
            "failures": [[item.describe(), msg] for item, msg in self.failures],
            "mismatches": [[v.describe(), c.as_dict()] for v, c in self.mismatches],
            "total_seconds": self.total_seconds,
            "by_family": self.by_family,
        }


def warm(items: list[WarmItem], device) -> WarmupReport:
    """Warm every item through the registry, as startup work (one expected-compiles block that
    finishes the warmup); one log line per item."""
    report = WarmupReport()
    t_start = time.perf_counter()
    with jit_monitor.expected_compiles(finishes_warmup=True):
        n = len(items)
        for i, item in enumerate(items, 1):
            counts = report.by_family.setdefault(item.family, {"variants": 0, "resolved": 0, "compiled": 0,
                                                               "failed": 0})
            before = compile_events.count()
            t0 = time.perf_counter()
            try:
                how, _ = registry.warm(item.family, item.variant, device)
            except Exception as exc:  # noqa: BLE001 - one bad variant must not stop the server
                how = "failed"
                report.failures.append((item, f"{type(exc).__name__}: {exc}"))
                counts["failed"] += 1
                logger.warning("sglang-fa4 warmup [%d/%d] %s: failed after %.2f s: %s: %s",
                               i, n, item.describe(), time.perf_counter() - t0, type(exc).__name__, exc)
            seconds = time.perf_counter() - t0
            events = compile_events.events()[before:]
            compiled = sum(_compiled_now(source, e) for source, e in events)
            counts["variants"] += 1
            counts["resolved"] += len(events)
            counts["compiled"] += compiled
            report.resolved += len(events)
            report.compiled += compiled
            for source, e in events:
                if source != "fa4":
                    continue
                report.from_shared_library += bool(e.from_shared_library)
                predicted = getattr(item.variant, "config", None)
                if item.family == "fa4" and predicted is not None and e.config != predicted:
                    report.mismatches.append((item.variant, e.config))
                    logger.warning("sglang-fa4 warmup: predicted configuration %s but FA4 resolved %s",
                                   predicted, e.config)
            if how != "failed":
                logger.info("sglang-fa4 warmup [%d/%d] %s: %.3f s (%s)", i, n, item.describe(), seconds, how)
            report.items.append(item)
            report.seconds.append(seconds)
            report.hows.append(how)
    report.total_seconds = time.perf_counter() - t_start
    return report


def _summary(report: WarmupReport) -> str:
    return ", ".join(f"{name} {c['variants']} ({c['compiled']} compiled, {c['resolved'] - c['compiled']} loaded, "
                     f"{c['failed']} failed)" for name, c in report.by_family.items()) or "nothing"


def warm_model(model, *, arch: Optional[int] = None, fp8: Optional[bool] = None) -> Optional[WarmupReport]:
    """The plugin's ViT startup warmup: compile what ``model``'s fa4 ViT attention will launch
    (:func:`~sglang_fa4.startup.variants.vit_warmup_list`), then arm the JIT monitor. Nothing (and
    no FA4 import) when ``SGLANG_FA4_WARMUP`` is off or the model has no fa4 ViT attention.
    ``fp8``: True -- the ViT will run FP8 attention, every FP8-capable shape; None (the plugin's
    hook) -- ``SGLANG_FA4_VIT_ATTN_DTYPE=fp8`` on an SM90 GPU, the shapes the measured table routes
    to FP8; False -- none."""
    if not envs.SGLANG_FA4_WARMUP.get():
        return None
    modules = sglang_model.find_fa4_attention(model)
    if not modules:
        return None
    if not fa4.available():
        logger.warning("sglang-fa4 warmup: the model uses fa4 ViT attention but flash_attn.cute "
                       "(flash-attn-4) is not installed; nothing warmed")
        return None
    fa4_env.configure_fa4_disk_cache()
    fa4_preload.wait()  # the background import started when load_model began, if any
    if arch is None:
        arch = fa4.kernel_cache().arch
    device = sglang_model.module_device(modules[0][1])
    on_gpu = getattr(device, "type", "cuda") == "cuda"
    report = warm(vit_warmup_list(model, arch, settings(), on_gpu=on_gpu, fp8=fp8), device)
    fa = report.family("fa4")
    # the FA4 line's format is read by the server check (benchmark/serve_check/logcheck.py)
    logger.info(
        "sglang-fa4 warmup: %d FA4 variant(s) in %.2f s (%d compiled, %d loaded from cache, %d of them from "
        "stored shared libraries, %d failed; flash_attn.cute imported: %s)", fa["variants"], report.total_seconds,
        fa["compiled"], fa["resolved"] - fa["compiled"], report.from_shared_library, fa["failed"],
        "flash_attn.cute" in sys.modules)
    if set(report.by_family) - {"fa4"}:
        logger.info("sglang-fa4 warmup: %s", _summary(report))
    jit_monitor.arm_jit_monitor()
    return report


def warm_llm_fp8_kv(shape: LlmAttentionShape, device) -> Optional[WarmupReport]:
    """The LLM FP8 KV route's startup work (``integration/llm_fp8_kv``, a FlashAttentionBackend on
    an fp8_e4m3 pool on SM90): what :func:`~sglang_fa4.startup.variants.llm_fp8_kv_warmup_list`
    lists for ``shape``, counted as warmup; then the FP8 forward's and our Triton kernels' compile
    monitors are armed, so a later compile (on the request path or in a decode-graph capture) is
    flagged (``SGLANG_FA4_JIT_MONITOR``). None when there is nothing to compile."""
    items = llm_fp8_kv_warmup_list(shape, settings())
    if not items:
        return None
    report = warm(items, device)
    logger.info("sglang-fa4 warmup (LLM FP8 KV route): %s in %.2f s", _summary(report), report.total_seconds)
    if envs.SGLANG_FA4_JIT_MONITOR.get() != "off":
        jit_monitor.arm_fp8_monitor()
        jit_monitor.arm_triton_monitor()
    return report
