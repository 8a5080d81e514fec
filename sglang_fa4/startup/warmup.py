"""Compile, at startup, exactly the FA4 kernel variants a loaded vision model will hit.

FA4 JIT-compiles each kernel configuration the first time it sees it (2-4 s on an H200), so
without a warmup the first user image after a restart, and the first image of each new shape
class, waits seconds. :func:`warm_model` enumerates the model's variants
(:mod:`sglang_fa4.startup.variants`), and :func:`run_warmup` calls the kernel cache eagerly on
small random inputs of each, logs one line per variant with its time, and returns a report.

With FA4's persistent cache (``SGLANG_FA4_KERNEL_CACHE``, applied by
:func:`sglang_fa4.startup.fa4_env.configure_fa4_disk_cache` before flash_attn.cute is imported) a
restart loads every variant from disk in milliseconds. After the warmup,
:mod:`sglang_fa4.startup.jit_monitor` flags any further configuration resolved in the process.

The SM90 FP8 forward (:mod:`sglang_fa4.kernels.fp8_sm90`) compiles one kernel per head dim x
causal/local: :func:`warm_fp8_variants` compiles a list of them with the same bookkeeping (a log
line per variant, counted as warmup by the JIT monitor). With ``SGLANG_FA4_VIT_ATTN_DTYPE=fp8`` on
SM90 (or ``warm_model(..., fp8=True)``), :func:`warm_fp8_vit` adds the FP8 ViT path's work: the
forward variants of the shapes the measured table routes to FP8
(:func:`sglang_fa4.startup.variants.enumerate_fp8_vit_shapes`) and one small FP8 call per shape
(the Triton quantize kernels compile there), all before any graph capture.

Importing this module imports neither flash_attn nor cutlass (nor SGLang).
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, Optional

from sglang_fa4.environ import envs
from sglang_fa4.kernels import fa4
from sglang_fa4.kernels.fa4_config import FA4Config
from sglang_fa4 import sglang_model
from sglang_fa4.startup import fa4_env, fa4_preload, jit_monitor, triton_warmup
from sglang_fa4.startup.variants import Variant, enumerate_variants

logger = logging.getLogger("sglang_fa4")


@dataclass
class WarmupReport:
    variants: list = field(default_factory=list)  # Variant (FA4) or Fp8Variant
    seconds: list[float] = field(default_factory=list)  # per variant, host time incl. sync
    resolved: int = 0  # new configurations resolved in this process (compile_count delta)
    compiled: int = 0  # of those, compiled by FA4 now (not loaded from its memory/disk cache)
    from_shared_library: int = 0  # of those, loaded from fa4_shared_libs' store (no FA4 import)
    failures: list[tuple[Any, str]] = field(default_factory=list)
    mismatches: list[tuple[Variant, FA4Config]] = field(default_factory=list)  # predicted != resolved
    total_seconds: float = 0.0
    fp8: Optional["WarmupReport"] = None  # warm_model(fp8=True): the FP8 forward's variants
    triton: Optional[dict] = None  # our Triton kernels warmed by warm_model (startup/triton_warmup.py)

    def as_dict(self) -> dict[str, Any]:
        return {
            "variants": [dict(v.as_dict(), seconds=s) for v, s in zip(self.variants, self.seconds)],
            "resolved": self.resolved,
            "compiled": self.compiled,
            "from_shared_library": self.from_shared_library,
            "failures": [[v.describe(), msg] for v, msg in self.failures],
            "mismatches": [[v.describe(), c.as_dict()] for v, c in self.mismatches],
            "total_seconds": self.total_seconds,
            **({"fp8": self.fp8.as_dict()} if self.fp8 is not None else {}),
            **({"triton": self.triton} if self.triton is not None else {}),
        }


def _inputs(variant: Variant, device):
    import torch

    dtype = getattr(torch, variant.dtype)
    total = variant.max_seqlen + variant.num_segments - 1
    lens = [variant.max_seqlen] + [1] * (variant.num_segments - 1)
    cu = torch.tensor(list(accumulate(lens, initial=0)), dtype=torch.int32, device=device)
    g = torch.Generator(device="cpu").manual_seed(0)
    q = torch.randn(total, variant.num_heads, variant.head_dim, generator=g).to(device=device, dtype=dtype)
    k = torch.randn(total, variant.num_kv_heads, variant.head_dim, generator=g).to(device=device, dtype=dtype)
    v = torch.randn(total, variant.num_kv_heads, variant.head_dim, generator=g).to(device=device, dtype=dtype)
    sinks = None
    if variant.sink_dtype:
        sinks = torch.zeros(variant.num_heads, dtype=getattr(torch, variant.sink_dtype), device=device)
    return q, k, v, cu, sinks


def _warm_each(report: WarmupReport, variants: list, warm_one) -> WarmupReport:
    """The warmup loop: ``warm_one(variant)`` (returns how: "compiled", "cached"...) for each
    variant inside :func:`jit_monitor.expected_compiles`, timed, one log line each; a failure is
    logged and reported, not raised (one bad variant must not stop the server)."""
    t_start = time.perf_counter()
    with jit_monitor.expected_compiles(finishes_warmup=True):
        n = len(variants)
        for i, variant in enumerate(variants, 1):
            t0 = time.perf_counter()
            try:
                how = warm_one(variant)
            except Exception as exc:  # noqa: BLE001
                seconds = time.perf_counter() - t0
                report.failures.append((variant, f"{type(exc).__name__}: {exc}"))
                logger.warning("sglang-fa4 warmup [%d/%d] %s: failed after %.2f s: %s: %s",
                               i, n, variant.describe(), seconds, type(exc).__name__, exc)
            else:
                seconds = time.perf_counter() - t0
                logger.info("sglang-fa4 warmup [%d/%d] %s: %.3f s (%s)", i, n, variant.describe(), seconds, how)
            report.variants.append(variant)
            report.seconds.append(seconds)
    report.total_seconds = time.perf_counter() - t_start
    return report


def run_warmup(variants: list[Variant], device=None) -> WarmupReport:
    """Resolve (compile, or load from FA4's caches) every variant through FA4's kernel cache
    (:func:`sglang_fa4.kernels.dispatch.kernel_cache`), eagerly: call it before any CUDA-graph
    capture. Logs one line per variant with its time."""
    import torch

    from sglang_fa4.kernels import dispatch

    report = WarmupReport()
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(device)

    def warm_one(variant: Variant) -> str:
        before = dispatch.compile_count()
        q, k, v, cu, sinks = _inputs(variant, device)
        with torch.no_grad():
            # the kernel cache itself, not fa4_varlen_attention: small warmup layouts would be
            # routed to FA2 (short_segments) and leave the FA4 variant uncompiled
            dispatch.kernel_cache()(q, k, v, cu, variant.max_seqlen, None, variant.window, sinks, None)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        events = dispatch.compile_events()[before:]
        report.resolved += len(events)
        report.compiled += sum(1 for e in events if e.fa4_compiled)
        report.from_shared_library += sum(1 for e in events if e.from_shared_library)
        for e in events:
            if e.config != variant.config:
                report.mismatches.append((variant, e.config))
                logger.warning("sglang-fa4 warmup: predicted configuration %s but FA4 resolved %s",
                               variant.config, e.config)
        if not events:
            return "cached"
        if any(e.fa4_compiled for e in events):
            return "compiled"
        return "loaded from a stored shared library" if all(e.from_shared_library for e in events) else "loaded from FA4's cache"

    _warm_each(report, variants, warm_one)
    logger.info(
        "sglang-fa4 warmup: %d FA4 variant(s) in %.2f s (%d compiled, %d loaded from cache, %d of them from "
        "stored shared libraries, %d failed; flash_attn.cute imported: %s)", len(variants), report.total_seconds,
        report.compiled, report.resolved - report.compiled, report.from_shared_library, len(report.failures),
        "flash_attn.cute" in sys.modules,
    )
    return report


def warm_fp8_variants(variants: list) -> WarmupReport:
    """Compile the SM90 FP8 forward's ``variants`` (``Fp8Variant``: head dim x causal/local) into
    its compile cache now, as startup work for the JIT monitor; one log line per variant with its
    time. A compile needs no GPU tensors (CuTe DSL on fake tensors); the first call then only loads
    the module. A variant already in the cache costs nothing ("cached")."""
    from sglang_fa4.kernels.fp8_sm90 import launch as fp8_launch

    report = WarmupReport()

    def warm_one(variant) -> str:
        before = fp8_launch.compile_count()
        fp8_launch.compiled_kernel(variant)
        new = fp8_launch.compile_count() - before
        report.resolved += new
        report.compiled += new
        return "compiled" if new else "cached"

    _warm_each(report, variants, warm_one)
    logger.info("sglang-fa4 warmup: %d FP8 variant(s) in %.2f s (%d compiled, %d failed)",
                len(variants), report.total_seconds, report.compiled, len(report.failures))
    return report


def warm_fp8_kv_route(variants: list, gather_shapes: list, device) -> WarmupReport:
    """The LLM FP8 KV route's startup work (``integration/llm_fp8_kv``, a FlashAttentionBackend on an
    fp8_e4m3 pool on SM90): the FP8 forward's ``variants``, then the page gather's Triton kernel
    (``kernels/fp8_paged_gather``, one specialization per ``GatherShape``: head dim, kv heads, page
    size) with one small call each on ``device``, all counted as warmup; then the FP8 forward's and
    our Triton kernels' compile monitors are armed, so a later compile (on the request path or in a
    decode-graph capture) is flagged (``SGLANG_FA4_JIT_MONITOR``) also in a process with no fa4 ViT."""
    from sglang_fa4.kernels import fp8_paged_gather

    report = warm_fp8_variants(variants)
    gather = WarmupReport()

    def warm_one(shape) -> str:
        new = fp8_paged_gather.warm(shape, device)
        gather.resolved += new
        gather.compiled += new
        return f"{new} resolved" if new else "cached"

    _warm_each(gather, gather_shapes, warm_one)
    report.triton = gather.as_dict()
    if envs.SGLANG_FA4_JIT_MONITOR.get() != "off":
        jit_monitor.arm_fp8_monitor()
        jit_monitor.arm_triton_monitor()
    return report


def warm_fp8_vit(model, device=None, *, every_shape: bool = False) -> WarmupReport:
    """The FP8 ViT path's startup work (``SGLANG_FA4_VIT_ATTN_DTYPE=fp8`` on SM90): the FP8
    forward variants of the model's shapes that the measured table can route to FP8
    (:mod:`sglang_fa4.kernels.vit_attn_dtype`), then per shape one small FP8 attention call on the
    GPU, which compiles the Triton quantize kernels and loads the forward's module, so neither
    happens on the request path or inside a graph capture. Without CUDA only the variants.
    ``every_shape``: every shape the FP8 forward can take (head dims up to 128, no sinks), not
    only those the table routes."""
    import torch

    from sglang_fa4.kernels import vit_attn_dtype
    from sglang_fa4.kernels.fp8_sm90.layout import SUPPORTED_HEAD_DIMS
    from sglang_fa4.startup.variants import Fp8VitShape, enumerate_fp8_vit_shapes

    dims = range(1, SUPPORTED_HEAD_DIMS[-1] + 1) if every_shape else vit_attn_dtype.min_segment_table()
    shapes = enumerate_fp8_vit_shapes(model, dims)
    kernels = sorted({s.kernel for s in shapes})
    report = warm_fp8_variants(kernels)
    device = torch.device(device) if device is not None else None
    if not shapes or device is None or device.type != "cuda":
        return report

    def warm_one(shape: Fp8VitShape) -> str:
        # two segments (one over a quantize chunk) of random data: a real call, checked finite
        lens = (300, 45)
        cu = torch.tensor([0, lens[0], sum(lens)], dtype=torch.int32, device=device)
        g = torch.Generator(device="cpu").manual_seed(0)
        dt = getattr(torch, shape.dtype)
        q, k, v = (torch.randn(sum(lens), h, shape.head_dim, generator=g).to(device=device, dtype=dt)
                   for h in (shape.num_heads, shape.num_kv_heads, shape.num_kv_heads))
        with torch.no_grad():
            out = vit_attn_dtype.fp8_attention(q, k, v, cu, max(lens))
        if not bool(torch.isfinite(out).all()):
            raise RuntimeError("FP8 ViT attention returned non-finite values on random input")
        return "compiled/loaded"

    _warm_each(report, shapes, warm_one)
    return report


def warm_model(model, *, arch: Optional[int] = None, fp8: Optional[bool] = None) -> Optional[WarmupReport]:
    """The plugin's startup warmup: enumerate and compile ``model``'s FA4 variants, then arm the
    JIT monitor. Nothing (and no FA4 import) when ``SGLANG_FA4_WARMUP`` is off or the model has no
    fa4 ViT attention. ``fp8``: the ViT will run FP8 attention (issue #16's opt-in), so also
    compile its SM90 FP8 variants and quantize kernels for every FP8-capable shape (report.fp8);
    None (the plugin's hook): ``SGLANG_FA4_VIT_ATTN_DTYPE=fp8`` on an SM90 GPU (elsewhere that
    setting logs one line), for the shapes the measured table routes to FP8."""
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
    from sglang_fa4.kernels import dispatch

    if arch is None:
        arch = dispatch.kernel_cache().arch
    variants = enumerate_variants(model, arch)
    device = sglang_model.module_device(modules[0][1])
    report = run_warmup(variants, device)
    with jit_monitor.expected_compiles():  # the short-window attention and ViT rotary Triton kernels
        report.triton = triton_warmup.warm_triton(model, arch, device)
    every_shape = fp8 is True
    if fp8 is None:
        from sglang_fa4.kernels import vit_attn_dtype

        fp8 = vit_attn_dtype.fp8_enabled(arch)
    if fp8:
        report.fp8 = warm_fp8_vit(model, device, every_shape=every_shape)
    jit_monitor.arm_jit_monitor()
    return report
