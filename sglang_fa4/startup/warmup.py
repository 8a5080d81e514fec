"""Compile, at startup, exactly the FA4 kernel variants a loaded vision model will hit.

FA4 JIT-compiles each kernel configuration the first time it sees it (2-4 s on an H200), so
without a warmup the first user image after a restart, and the first image of each new shape
class, waits seconds. A sweep over image sizes is mostly wasted work: max_seqlen reaches the
compiled kernel only through a few thresholds (none at all on SM80/SM90/SM120, where
:mod:`sglang_fa4.kernels.fa4_kernel_cache` already folds it into one class), while what does matter
(head dim, dtype, heads ratio, window/sink kinds, more than 256 segments) is read here from the
model itself:

* every SGLang ``VisionAttention`` whose ``qkv_backend_name == "fa4"`` (duck-typed: ``head_size``,
  ``num_attention_heads_per_partition``, ``num_attention_kv_heads_per_partition``) contributes
  its head dim, heads ratio and dtype;
* a tower with ``fullatt_block_indexes`` and no attention sinks (Qwen2.5-VL) runs its other
  blocks on 64-token windows (``window_size // patch_size`` squared): layout "windowed", plus
  "full" for the listed blocks; a module with ``sinks`` and a bounded ``window_size`` (MiMo-VL)
  runs sliding-window attention with sinks over whole images; everything else is "full";
* segment lengths: windows are at most the window's token count; full segments are one image or
  frame, fixed for a fixed-resolution tower (``embeddings.num_positions``, or ``image_size`` /
  ``patch_size``), otherwise unbounded; on SM100/SM110 each max_seqlen class the range reaches
  is one variant;
* more than 256 segments (FA4 then adds scheduler kernels): the windows of one large image or a
  batch of images, and the images/frames of one batch, are not bounded by anything in the model,
  so that class is included unless the caller passes ``max_segments <= 256``.

Each variant's configuration comes from :func:`sglang_fa4.kernels.fa4_kernel_cache.config_for`, the key
logic of the kernel cache itself, and variants that map to the same configuration are compiled
once. :func:`run_warmup` calls :func:`sglang_fa4.kernels.dispatch.fa4_varlen_attention` eagerly on small
random inputs of each variant, logs one line per variant with its time, and returns a report.

With FA4's persistent cache (``SGLANG_FA4_KERNEL_CACHE``, applied by
:func:`configure_fa4_disk_cache` before flash_attn.cute is imported) a restart loads every
variant from disk in milliseconds. After the warmup, :func:`arm_jit_monitor` flags any further
configuration resolved in the process (``SGLANG_FA4_JIT_MONITOR``: off / warn / raise).

Importing this module imports neither flash_attn nor cutlass (nor SGLang).
"""

from __future__ import annotations

import importlib.util
import logging
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional

from sglang_fa4.environ import envs
from sglang_fa4.kernels.fa4_kernel_cache import MANY_SEGMENTS, FA4Config, config_for

logger = logging.getLogger("sglang_fa4")

FA4 = "fa4"
#: Qwen2.5-VL: window_size 112 px / patch 14 px -> 8 x 8 patches
DEFAULT_WINDOW_TOKENS = 64
#: max_seqlen thresholds of FA4's SM100/SM110 key (tile_m 128: q_stage, static scheduler)
_SEQLEN_PROBES = (1, 16, 64, 128, 129, 256, 257, 1024)

LAYOUT_FULL = "full"
LAYOUT_WINDOWED = "windowed"  # Qwen2.5-VL: cu_seqlens of <= 64-token windows
LAYOUT_SLIDING = "sliding+sinks"  # MiMo-VL: whole images, sliding window and attention sinks


# --------------------------------------------------------------------------------------------
# FA4 availability without importing anything
# --------------------------------------------------------------------------------------------


def fa4_available() -> bool:
    """Whether ``flash_attn.cute`` (flash-attn-4) is installed, without importing anything.

    ``importlib.util.find_spec("flash_attn")`` is also true for FlashAttention-2 alone, and
    flash-attn-4 alone installs ``flash_attn`` as a namespace package holding only ``cute``
    (no ``flash_attn_interface``), so the answer is whether a ``flash_attn`` search location
    holds the ``cute`` package. ``find_spec("flash_attn.cute")`` would import ``flash_attn``
    itself, which for FA2 loads its CUDA extension.
    """
    if "flash_attn.cute" in sys.modules:
        return True
    try:
        spec = importlib.util.find_spec("flash_attn")
    except (ImportError, ValueError):
        return False
    if spec is None:
        return False
    for location in spec.submodule_search_locations or ():
        if (Path(location) / "cute" / "__init__.py").is_file():
            return True
    return False


# --------------------------------------------------------------------------------------------
# FA4's persistent kernel cache
# --------------------------------------------------------------------------------------------


def configure_fa4_disk_cache() -> Optional[str]:
    """Point FA4's own persistent compile cache at ``SGLANG_FA4_KERNEL_CACHE_DIR`` (when
    ``SGLANG_FA4_KERNEL_CACHE`` is on). Returns the directory in use, or None when off.

    flash-attn-4 b36 reads ``FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED`` (exactly "1" enables it)
    and ``FLASH_ATTENTION_CUTE_DSL_CACHE_DIR`` once, when ``flash_attn.cute.cache_utils`` is
    imported, so this must run before that; the plugin calls it at registration. A user's
    explicit ``FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=0`` or own directory wins; a true value
    FA4 would not recognise ("true", "on") is rewritten to "1".
    """
    if not envs.SGLANG_FA4_KERNEL_CACHE.get():
        return None
    enabled = envs.FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED
    directory = envs.FLASH_ATTENTION_CUTE_DSL_CACHE_DIR
    if enabled.is_set() and not enabled.get():
        logger.info("sglang-fa4: FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=0 set: FA4 kernels are not cached on disk")
        return None
    loaded = sys.modules.get("flash_attn.cute.cache_utils")
    if loaded is not None:
        if getattr(loaded, "CUTE_DSL_CACHE_ENABLED", False):
            return str(loaded.get_cache_path()) if hasattr(loaded, "get_cache_path") else directory.get() or None
        logger.warning(
            "sglang-fa4: flash_attn.cute was imported before the persistent kernel cache was "
            "configured; FA4 kernels of this process are not cached on disk"
        )
        return None
    enabled.set(True)  # "1", the only value FA4 accepts
    if not directory.get():
        directory.set(str(Path(envs.SGLANG_FA4_KERNEL_CACHE_DIR.get()).expanduser()))
    return directory.get()


# --------------------------------------------------------------------------------------------
# Enumeration
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    """One FA4 configuration to compile, with the inputs that produce it."""

    config: FA4Config
    layout: str
    num_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: str  # "bfloat16" / "float16"
    max_seqlen: int  # representative longest segment
    num_segments: int  # representative segment count
    window: tuple = (None, None)
    sink_dtype: Optional[str] = None
    modules: tuple = field(default=(), compare=False)  # attention modules that hit it

    def describe(self) -> str:
        c = self.config
        window = "" if self.window == (None, None) else f" window={self.window}"
        sinks = f" sinks={self.sink_dtype}" if self.sink_dtype else ""
        segs = f">{MANY_SEGMENTS}" if c.many_segments else f"<={MANY_SEGMENTS}"
        return (
            f"{self.layout} {c.dtype} d={c.head_dim} heads={self.num_heads}/{self.num_kv_heads}"
            f"{window}{sinks} seqlen={c.seqlen_class} segments{segs}"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "config": self.config.as_dict(),
            "layout": self.layout,
            "num_heads": self.num_heads,
            "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "dtype": self.dtype,
            "max_seqlen": self.max_seqlen,
            "num_segments": self.num_segments,
            "window": list(self.window),
            "sink_dtype": self.sink_dtype,
            "modules": len(self.modules),
        }


def is_fa4_attention(module) -> bool:
    return (
        getattr(module, "qkv_backend_name", None) == FA4
        and hasattr(module, "head_size")
        and hasattr(module, "num_attention_heads_per_partition")
        and hasattr(module, "num_attention_kv_heads_per_partition")
    )


def find_fa4_attention(model) -> list[tuple[str, Any]]:
    """(name, module) of every fa4 VisionAttention in ``model``."""
    if model is None or not hasattr(model, "named_modules"):
        return []
    return [(name, m) for name, m in model.named_modules() if is_fa4_attention(m)]


def _dtype_name(dtype) -> Optional[str]:
    name = str(dtype).replace("torch.", "")
    return name if name in ("bfloat16", "float16") else None


def module_dtype(module, default: str = "bfloat16") -> str:
    """The activation dtype an attention module runs in: its qkv projection's weight dtype when
    that is fp16/bf16 (quantised weights are not), else any fp16/bf16 parameter, else default."""
    proj = getattr(module, "qkv_proj", None)
    weight = getattr(proj, "weight", None)
    name = _dtype_name(getattr(weight, "dtype", None))
    if name:
        return name
    if hasattr(module, "parameters"):
        for p in module.parameters():
            name = _dtype_name(p.dtype)
            if name:
                return name
    return default


def module_device(module):
    if hasattr(module, "parameters"):
        for p in module.parameters():
            return p.device
    return None


def _bounded_window(window) -> bool:
    if window is None:
        return False
    try:
        left, right = window
    except (TypeError, ValueError):
        return False
    return any(side is not None and side >= 0 for side in (left, right))


def _window_sides(window) -> tuple:
    left, right = window
    return (None if left is None or left < 0 else int(left), None if right is None or right < 0 else int(right))


def _towers(model) -> list[tuple[str, Any]]:
    """Modules that lay their blocks out on windows + full attention (``fullatt_block_indexes``)."""
    out = []
    for name, m in model.named_modules():
        idx = getattr(m, "fullatt_block_indexes", None)
        if idx is not None:
            out.append((name, m))
    return out


def _fullatt_indexes(tower) -> set:
    idx = tower.fullatt_block_indexes
    if hasattr(idx, "tolist"):
        idx = idx.tolist()
    return {int(i) for i in idx}


def _window_tokens(tower) -> int:
    window, patch = getattr(tower, "window_size", None), getattr(tower, "patch_size", None)
    if isinstance(window, int) and isinstance(patch, int) and patch > 0 and window >= patch:
        return (window // patch) ** 2
    return DEFAULT_WINDOW_TOKENS


def _own_fixed_seqlen(m) -> Optional[int]:
    """Tokens per image if ``m`` is a fixed-resolution tower (InternViT, SigLIP...)."""
    emb = getattr(m, "embeddings", None)
    num = getattr(emb, "num_positions", None)
    if isinstance(num, int) and num > 0:
        return num
    config = getattr(m, "config", None)
    size, patch = getattr(config, "image_size", None), getattr(config, "patch_size", None)
    if (
        isinstance(size, int) and isinstance(patch, int) and patch > 0
        and getattr(config, "spatial_merge_size", None) is None
        and getattr(config, "temporal_patch_size", None) is None
    ):
        return (size // patch) ** 2
    return None


def _ancestors(name: str) -> list[str]:
    """'a.b.c' -> ['a.b', 'a', ''] (nearest first)."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(len(parts) - 1, -1, -1)]


def _seqlen_reps(arch: int, lo: int, hi: Optional[int]) -> list[int]:
    """One representative max_seqlen per seqlen class reachable in [lo, hi] (smallest first)."""
    probes = sorted({lo, *(p for p in _SEQLEN_PROBES if p >= lo and (hi is None or p <= hi))}
                    | ({hi} if hi is not None else set()))
    seen, reps = set(), []
    for p in probes:
        cls = config_for(arch, "bfloat16", 64, 64, 1, p, p).seqlen_class
        if cls not in seen:
            seen.add(cls)
            reps.append(p)
    return reps


def enumerate_variants(
    model,
    arch: int,
    *,
    dtype: Optional[str] = None,
    max_segments: Optional[int] = None,
) -> list[Variant]:
    """The distinct FA4 configurations the fa4 VisionAttention modules of ``model`` will hit on
    ``arch`` (e.g. 90, 100, 103). ``dtype`` overrides the modules' activation dtype;
    ``max_segments`` bounds the segments of one attention call (None: unbounded, so the
    >256-segment class is included)."""
    modules = find_fa4_attention(model)
    if not modules:
        return []
    towers = _towers(model)
    sinked = {name for name, m in modules if getattr(m, "sinks", None) is not None}
    many_classes = [False] if max_segments is not None and max_segments <= MANY_SEGMENTS else [False, True]

    def tower_of(name: str):
        best = None
        for tname, tower in towers:
            if tname == "" or name.startswith(tname + "."):
                if best is None or len(tname) > len(best[0]):
                    best = (tname, tower)
        return best

    variants: dict[FA4Config, Variant] = {}
    users: dict[FA4Config, list[str]] = {}
    by_name = dict(model.named_modules())

    def fixed_seqlen(name: str) -> Optional[int]:
        for anc in _ancestors(name):
            if anc in by_name:
                fixed = _own_fixed_seqlen(by_name[anc])
                if fixed:
                    return fixed
        return None

    def add(name, layout, nh, nkv, d, dt, lo, hi, window, sink_dtype):
        for max_seqlen in _seqlen_reps(arch, lo, hi):
            for many in many_classes:
                num_segments = MANY_SEGMENTS + 1 if many else 1
                total = max_seqlen + num_segments - 1
                config = config_for(arch, dt, d, d, nh // nkv, max_seqlen, total, window, sink_dtype, num_segments)
                if config not in variants:
                    variants[config] = Variant(config, layout, nh, nkv, d, dt, max_seqlen, num_segments, window, sink_dtype)
                    users[config] = []
                users[config].append(name)

    for name, m in modules:
        nh = int(m.num_attention_heads_per_partition)
        nkv = int(m.num_attention_kv_heads_per_partition)
        d = int(m.head_size)
        dt = dtype or module_dtype(m)
        fixed = fixed_seqlen(name)
        full_lo, full_hi = (fixed, fixed) if fixed else (1, None)
        if name in sinked and _bounded_window(getattr(m, "window_size", None)):
            sink_dtype = _dtype_name(m.sinks.dtype) or str(m.sinks.dtype).replace("torch.", "")
            add(name, LAYOUT_SLIDING, nh, nkv, d, dt, full_lo, full_hi, _window_sides(m.window_size), sink_dtype)
            continue
        layouts = [LAYOUT_FULL]
        tower = tower_of(name)
        if tower is not None:
            tname, tmod = tower
            prefix = f"{tname}." if tname else ""
            if not any(s.startswith(prefix) for s in sinked):  # sinks: MiMo-style, no window layout
                layouts = [LAYOUT_WINDOWED, LAYOUT_FULL]
                blocks = getattr(tmod, "blocks", None)
                if blocks is not None and name.startswith(prefix + "blocks."):
                    index = name[len(prefix + "blocks."):].split(".", 1)[0]
                    if index.isdigit():
                        in_full = int(index) in _fullatt_indexes(tmod)
                        layouts = [LAYOUT_FULL] if in_full else [LAYOUT_WINDOWED]
                wtok = _window_tokens(tmod)
        for layout in layouts:
            if layout == LAYOUT_WINDOWED:
                add(name, layout, nh, nkv, d, dt, 1, wtok, (None, None), None)
            else:
                add(name, layout, nh, nkv, d, dt, full_lo, full_hi, (None, None), None)

    return [
        Variant(**{**v.__dict__, "modules": tuple(users[c])}) for c, v in variants.items()
    ]


# --------------------------------------------------------------------------------------------
# Running it
# --------------------------------------------------------------------------------------------


@dataclass
class WarmupReport:
    variants: list[Variant] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)  # per variant, host time incl. sync
    resolved: int = 0  # new configurations resolved in this process (compile_count delta)
    compiled: int = 0  # of those, compiled by FA4 now (not loaded from its memory/disk cache)
    failures: list[tuple[Variant, str]] = field(default_factory=list)
    mismatches: list[tuple[Variant, FA4Config]] = field(default_factory=list)  # predicted != resolved
    total_seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "variants": [dict(v.as_dict(), seconds=s) for v, s in zip(self.variants, self.seconds)],
            "resolved": self.resolved,
            "compiled": self.compiled,
            "failures": [[v.describe(), msg] for v, msg in self.failures],
            "mismatches": [[v.describe(), c.as_dict()] for v, c in self.mismatches],
            "total_seconds": self.total_seconds,
        }


_state_lock = threading.Lock()
_warming = 0  # warmups in progress (their compiles are expected)
_finished = False  # a warmup completed in this process
_after = 0  # configurations resolved after a finished warmup
_monitor: Optional[tuple[Any, Any]] = None  # (kernel cache, remover)


def _inputs(variant: Variant, device):
    import torch

    dtype = getattr(torch, variant.dtype)
    total = variant.max_seqlen + variant.num_segments - 1
    lens = [variant.max_seqlen] + [1] * (variant.num_segments - 1)
    cu = torch.tensor([0, *_cumsum(lens)], dtype=torch.int32, device=device)
    g = torch.Generator(device="cpu").manual_seed(0)
    q = torch.randn(total, variant.num_heads, variant.head_dim, generator=g).to(device=device, dtype=dtype)
    k = torch.randn(total, variant.num_kv_heads, variant.head_dim, generator=g).to(device=device, dtype=dtype)
    v = torch.randn(total, variant.num_kv_heads, variant.head_dim, generator=g).to(device=device, dtype=dtype)
    sinks = None
    if variant.sink_dtype:
        sinks = torch.zeros(variant.num_heads, dtype=getattr(torch, variant.sink_dtype), device=device)
    return q, k, v, cu, sinks


def _cumsum(values: Iterable[int]) -> list[int]:
    out, acc = [], 0
    for x in values:
        acc += x
        out.append(acc)
    return out


def run_warmup(variants: list[Variant], device=None) -> WarmupReport:
    """Resolve (compile, or load from FA4's caches) every variant through FA4's kernel cache
    (:func:`sglang_fa4.kernels.dispatch.kernel_cache`), eagerly: call it before any CUDA-graph
    capture. Logs one line per variant with its time."""
    global _warming, _finished
    import torch

    from sglang_fa4.kernels import dispatch
    report = WarmupReport()
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(device)
    cuda = device.type == "cuda"
    with _state_lock:
        _warming += 1
    t_start = time.perf_counter()
    try:
        n = len(variants)
        for i, variant in enumerate(variants, 1):
            before = dispatch.compile_count()
            t0 = time.perf_counter()
            try:
                q, k, v, cu, sinks = _inputs(variant, device)
                with torch.no_grad():
                    # the kernel cache itself, not fa4_varlen_attention: small warmup layouts would be
                    # routed to FA2 (short_segments) and leave the FA4 variant uncompiled
                    dispatch.kernel_cache()(q, k, v, cu, variant.max_seqlen, None, variant.window, sinks, None)
                if cuda:
                    torch.cuda.synchronize(device)
            except Exception as exc:  # noqa: BLE001 - one bad variant must not stop the server
                seconds = time.perf_counter() - t0
                report.variants.append(variant)
                report.seconds.append(seconds)
                report.failures.append((variant, f"{type(exc).__name__}: {exc}"))
                logger.warning("sglang-fa4 warmup [%d/%d] %s: failed after %.2f s: %s: %s",
                               i, n, variant.describe(), seconds, type(exc).__name__, exc)
                continue
            seconds = time.perf_counter() - t0
            events = dispatch.compile_events()[before:]
            report.variants.append(variant)
            report.seconds.append(seconds)
            report.resolved += len(events)
            report.compiled += sum(1 for e in events if e.fa4_compiled)
            how = "cached" if not events else ("compiled" if any(e.fa4_compiled for e in events) else "loaded from FA4's cache")
            for e in events:
                if e.config != variant.config:
                    report.mismatches.append((variant, e.config))
                    logger.warning("sglang-fa4 warmup: predicted configuration %s but FA4 resolved %s",
                                   variant.config, e.config)
            logger.info("sglang-fa4 warmup [%d/%d] %s: %.3f s (%s)", i, n, variant.describe(), seconds, how)
    finally:
        report.total_seconds = time.perf_counter() - t_start
        with _state_lock:
            _warming -= 1
            _finished = True
    logger.info(
        "sglang-fa4 warmup: %d FA4 variant(s) in %.2f s (%d compiled, %d loaded from cache, %d failed)",
        len(variants), report.total_seconds, report.compiled, report.resolved - report.compiled,
        len(report.failures),
    )
    return report


def warm_model(model, *, arch: Optional[int] = None) -> Optional[WarmupReport]:
    """The plugin's startup warmup: enumerate and compile ``model``'s FA4 variants, then arm the
    JIT monitor. Nothing (and no FA4 import) when ``SGLANG_FA4_WARMUP`` is off or the model has no
    fa4 ViT attention."""
    if not envs.SGLANG_FA4_WARMUP.get():
        return None
    modules = find_fa4_attention(model)
    if not modules:
        return None
    if not fa4_available():
        logger.warning("sglang-fa4 warmup: the model uses fa4 ViT attention but flash_attn.cute "
                       "(flash-attn-4) is not installed; nothing warmed")
        return None
    configure_fa4_disk_cache()
    from sglang_fa4.kernels import dispatch
    if arch is None:
        arch = dispatch.kernel_cache().arch
    variants = enumerate_variants(model, arch)
    report = run_warmup(variants, module_device(modules[0][1]))
    arm_jit_monitor()
    return report


# --------------------------------------------------------------------------------------------
# JIT monitor
# --------------------------------------------------------------------------------------------


class FA4CompileAfterWarmup(RuntimeError):
    """SGLANG_FA4_JIT_MONITOR=raise: an FA4 configuration was resolved after the warmup."""


def compiles_after_warmup() -> int:
    """FA4 configurations resolved in this process after a warmup finished."""
    return _after


def warmup_finished() -> bool:
    return _finished


def _on_compile(event) -> None:
    global _after
    with _state_lock:
        if _warming or not _finished:
            return
        _after += 1
        count = _after
    mode = envs.SGLANG_FA4_JIT_MONITOR.get()
    if mode == "off":
        return
    what = "compiled" if event.fa4_compiled else "loaded"
    capture = " during CUDA-graph capture" if event.during_capture else ""
    message = (
        f"sglang-fa4: FA4 {what} a kernel variant after the startup warmup{capture} "
        f"({event.seconds:.2f} s, #{count} after warmup): {event.config}"
    )
    if mode == "raise":
        raise FA4CompileAfterWarmup(message)
    logger.warning(message)


def arm_jit_monitor() -> bool:
    """Listen for FA4 configurations resolved after the warmup (idempotent; follows a replaced
    kernel cache). False when SGLANG_FA4_JIT_MONITOR=off."""
    global _monitor
    if envs.SGLANG_FA4_JIT_MONITOR.get() == "off":
        return False
    from sglang_fa4.kernels import dispatch
    cache = dispatch.kernel_cache()
    with _state_lock:
        if _monitor is not None and _monitor[0] is cache:
            return True
        previous = _monitor
        _monitor = (cache, cache.add_compile_listener(_on_compile))
    if previous is not None:
        previous[1]()
    return True


def reset_state() -> None:
    """Forget warmup/monitor state (tests)."""
    global _finished, _after, _monitor, _warming
    with _state_lock:
        if _monitor is not None:
            _monitor[1]()
        _monitor = None
        _finished = False
        _after = 0
        _warming = 0
