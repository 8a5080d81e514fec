"""What a loaded model will compile, read from the model itself: the one list the startup warmup
hands the warmup registry (:mod:`sglang_fa4.kernels.warmup`), as (kernel family, variant) pairs.

* :func:`vit_warmup_list` -- a vision tower with fa4 attention: its FA4 configurations
  (:func:`enumerate_variants`, below), the Triton rotary and short-window kernels it launches, and
  with FP8 ViT attention the FP8 forward's variants and its quantize shapes;
* :func:`llm_fp8_kv_warmup_list` -- SGLang's LLM attention on an fp8_e4m3 pool routed to our
  kernels (:class:`LlmAttentionShape`, read off the backend by ``integration/llm_fp8_kv``): the FP8
  forward's variants, the page gather and the split-KV decode kernel.

The FA4 variants:

A sweep over image sizes is mostly wasted work: max_seqlen reaches the compiled kernel only
through a few thresholds (none at all on SM80/SM90/SM120, where the kernel cache folds it into one
class), while what does matter (head dim, dtype, heads ratio, window/sink kinds, more than 256
segments) is in the model:

* every SGLang ``VisionAttention`` whose ``qkv_backend_name == "fa4"`` contributes its head dim,
  heads ratio and dtype (read by :mod:`sglang_fa4.sglang_model`);
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

Each variant's configuration comes from :func:`sglang_fa4.kernels.fa4.config_for`, the key
logic of the kernel cache itself, and variants that map to the same configuration are compiled
once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple, Optional

from sglang_fa4 import sglang_model
from sglang_fa4.kernels import fa4, fp8_paged_kv, fp8_sm90, vit
from sglang_fa4.kernels.fa4 import MANY_SEGMENTS
from sglang_fa4.kernels.fp8_sm90 import SUPPORTED_HEAD_DIMS as FP8_HEAD_DIMS
from sglang_fa4.kernels.inputs import FA4InputError, window_bounds
from sglang_fa4.kernels.settings import RoutingSettings
from sglang_fa4.kernels.vit import VitShape

#: max_seqlen thresholds of FA4's SM100/SM110 key (tile_m 128: q_stage, static scheduler)
_SEQLEN_PROBES = (1, 16, 64, 128, 129, 256, 257, 1024)

LAYOUT_FULL = "full"
LAYOUT_WINDOWED = "windowed"  # Qwen2.5-VL: cu_seqlens of <= 64-token windows
LAYOUT_SLIDING = "sliding+sinks"  # MiMo-VL: whole images, sliding window and attention sinks


@dataclass(frozen=True)
class Variant:
    """One FA4 configuration to compile, with the inputs that produce it."""

    config: "fa4.FA4Config"
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


def _bounded_window(window) -> bool:
    try:
        return window_bounds(window) != (None, None)
    except FA4InputError:
        return False


def _ancestors(name: str) -> list[str]:
    """'a.b.c' -> ['a.b', 'a', ''] (nearest first)."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(len(parts) - 1, -1, -1)]


def _seqlen_reps(arch: int, lo: int, hi: Optional[int], qpk: int = 1) -> list[int]:
    """One representative max_seqlen per seqlen class reachable in [lo, hi] (smallest first);
    the class thresholds are in packed rows (max_seqlen * q heads per kv head)."""
    thresholds = {p // qpk + d for p in _SEQLEN_PROBES for d in (0, 1)} if qpk > 1 else set(_SEQLEN_PROBES)
    probes = sorted({lo, *(p for p in thresholds if p >= lo and (hi is None or p <= hi))}
                    | ({hi} if hi is not None else set()))
    seen, reps = set(), []
    for p in probes:
        cls = fa4.config_for(arch, "bfloat16", 64, 64, qpk, p, p).seqlen_class
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
    modules = sglang_model.find_fa4_attention(model)
    if not modules:
        return []
    windowed = sglang_model.windowed_towers(model)
    sinked = {name for name, m in modules if sglang_model.attention_sinks(m) is not None}
    many_classes = [False] if max_segments is not None and max_segments <= MANY_SEGMENTS else [False, True]

    def tower_of(name: str):
        best = None
        for tname, tower in windowed:
            if tname == "" or name.startswith(tname + "."):
                if best is None or len(tname) > len(best[0]):
                    best = (tname, tower)
        return best

    variants: dict = {}
    users: dict[Any, list[str]] = {}
    by_name = dict(model.named_modules())

    def fixed_seqlen(name: str) -> Optional[int]:
        for anc in _ancestors(name):
            if anc in by_name:
                fixed = sglang_model.own_fixed_seqlen(by_name[anc])
                if fixed:
                    return fixed
        return None

    def add(name, layout, nh, nkv, d, dt, lo, hi, window, sink_dtype):
        for max_seqlen in _seqlen_reps(arch, lo, hi, nh // nkv):
            for many in many_classes:
                num_segments = MANY_SEGMENTS + 1 if many else 1
                total = max_seqlen + num_segments - 1
                config = fa4.config_for(arch, dt, d, d, nh // nkv, max_seqlen, total, window, sink_dtype, num_segments)
                if config not in variants:
                    variants[config] = Variant(config, layout, nh, nkv, d, dt, max_seqlen, num_segments, window, sink_dtype)
                    users[config] = []
                users[config].append(name)

    for name, m in modules:
        d, nh, nkv = sglang_model.attention_shape(m)
        dt = dtype or sglang_model.module_dtype(m)
        fixed = fixed_seqlen(name)
        full_lo, full_hi = (fixed, fixed) if fixed else (1, None)
        window = sglang_model.attention_window(m)
        if name in sinked and _bounded_window(window):
            add(name, LAYOUT_SLIDING, nh, nkv, d, dt, full_lo, full_hi, window_bounds(window),
                sglang_model.sink_dtype(m))
            continue
        layouts = [LAYOUT_FULL]
        tower = tower_of(name)
        if tower is not None:
            tname, tmod = tower
            prefix = f"{tname}." if tname else ""
            if not any(s.startswith(prefix) for s in sinked):  # sinks: MiMo-style, no window layout
                layouts = [LAYOUT_WINDOWED, LAYOUT_FULL]
                index = sglang_model.block_index(tmod, tname, name)
                if index is not None:
                    in_full = index in sglang_model.full_attention_blocks(tmod)
                    layouts = [LAYOUT_FULL] if in_full else [LAYOUT_WINDOWED]
                wtok = sglang_model.window_tokens(tmod)
        for layout in layouts:
            if layout == LAYOUT_WINDOWED:
                add(name, layout, nh, nkv, d, dt, 1, wtok, (None, None), None)
            else:
                add(name, layout, nh, nkv, d, dt, full_lo, full_hi, (None, None), None)

    return [
        Variant(**{**v.__dict__, "modules": tuple(users[c])}) for c, v in variants.items()
    ]


def enumerate_fp8_vit_shapes(model, head_dims) -> list[VitShape]:
    """What the FP8 ViT path can hit in ``model``: its fa4 attention modules without sinks whose
    head dim is in ``head_dims`` (the dims the measured table routes to FP8; the others never run
    FP8), 16-bit dtypes only."""
    shapes = set()
    for _name, m in sglang_model.find_fa4_attention(model):
        d, nh, nkv = sglang_model.attention_shape(m)
        dt = sglang_model.module_dtype(m)
        if sglang_model.attention_sinks(m) is None and d in head_dims and d <= FP8_HEAD_DIMS[-1] \
                and dt in ("bfloat16", "float16"):
            shapes.add(VitShape(d, nh, nkv, dt))
    return sorted(shapes)


def vit_shapes(model) -> list[VitShape]:
    """Distinct (head_dim, heads, kv_heads, dtype) of the model's fa4 attention modules."""
    seen = []
    for _, m in sglang_model.find_fa4_attention(model):
        s = VitShape(*sglang_model.attention_shape(m), sglang_model.module_dtype(m))
        if s not in seen:
            seen.append(s)
    return seen


def has_rotary_tower(model) -> bool:
    """A tower with a rotary position embedding (Qwen2.5-VL, Qwen3-VL: ``rotary_pos_emb``)."""
    return any(sglang_model.is_rotary_tower(m) for m in model.modules())


def has_windowed_tower(model) -> bool:
    return any(sglang_model.full_attention_blocks(m) for m in model.modules())


class WarmItem(NamedTuple):
    """One variant of one kernel family (:mod:`sglang_fa4.kernels.warmup`) to compile at startup."""

    family: str
    variant: Any

    def describe(self) -> str:
        return f"{self.family} {self.variant.describe()}"

    def as_dict(self) -> dict[str, Any]:
        return {"family": self.family, **self.variant.as_dict()}


def triton_shapes(model, arch: Optional[int], settings: RoutingSettings) -> list[WarmItem]:
    """The Triton kernels the ViT launches: the fused rotary in every rotary tower's layers (ViT
    graph mode), the short-window kernel on SM90 where a windowed tower's layouts take that route
    (head dims the Triton kernel serves; the others run FA2, nothing to compile)."""
    shapes = vit_shapes(model)
    items = [WarmItem("vit_rotary", s) for s in shapes] if has_rotary_tower(model) else []
    if arch in vit.ROUTED_ARCHS and has_windowed_tower(model) and settings.short_route_max_seqlen > 0:
        items += [WarmItem("vit_short_window", s) for s in shapes if s.head_dim in vit.TRITON_HEAD_DIMS]
    return items


def vit_warmup_list(model, arch: int, settings: RoutingSettings, *, on_gpu: bool, fp8: Optional[bool] = None,
                    max_segments: Optional[int] = None) -> list[WarmItem]:
    """Everything the fa4 ViT of ``model`` compiles on ``arch``: its FA4 configurations; on a GPU
    (``on_gpu``) the Triton kernels it launches; with FP8 ViT attention the FP8 forward's variants
    and, on a GPU, one FP8 call per shape (the quantize kernels). ``fp8`` None: as the settings and
    the GPU say, for the shapes the measured table routes to FP8; True: every shape the FP8
    forward can take (head dims up to 128, no sinks); False: none."""
    items = [WarmItem("fa4", v) for v in enumerate_variants(model, arch, max_segments=max_segments)]
    if on_gpu:
        items += triton_shapes(model, arch, settings)
    every_shape = fp8 is True
    if fp8 is None:
        fp8 = vit.fp8_enabled(arch, settings.vit_fp8)
    if fp8:
        dims = range(1, FP8_HEAD_DIMS[-1] + 1) if every_shape else vit.min_segment_table()
        shapes = enumerate_fp8_vit_shapes(model, dims)
        items += [WarmItem("fp8_forward", v) for v in sorted({s.fp8_kernel for s in shapes})]
        if on_gpu:
            items += [WarmItem("fp8_vit", s) for s in shapes]
    return items


@dataclass(frozen=True)
class LlmAttentionShape:
    """What the LLM FP8 KV route's kernels compile per: one attention backend's layer shape."""

    head_dim: int
    q_heads: int
    kv_heads: int
    page_size: int
    sliding_window: Optional[int] = None  # the SWA layers' window (tokens), None without
    q_dtype: str = "float8_e4m3fn"  # the q SGLang hands the route (bfloat16 at head dim 512)
    images: bool = False  # a multimodal model: image prefills (Gemma-4's image mask) on the split-KV kernel


def fp8_variants_for(head_dim: int, sliding_window: Optional[int], gqa: bool = False) -> list:
    """The FP8 forward's variants the route's gather path launches: causal (extend and decode,
    bottom-right aligned), the non-causal one for GQA decode (the group packed into the tile:
    ``fp8_paged_kv.extend.decode_gqa_pack``; only when decode takes the gather, i.e.
    SGLANG_FA4_FP8_KV_SPLIT_KV_MAX_Q=0), and the local one for sliding-window layers."""
    if head_dim not in FP8_HEAD_DIMS:
        return []
    variants = [fp8_sm90.variant_for(head_dim, True)]
    if gqa:
        variants.append(fp8_sm90.variant_for(head_dim, False))
    if sliding_window is not None and sliding_window > -1:
        variants.append(fp8_sm90.variant_for(head_dim, True, (sliding_window, 0)))
    return variants


def llm_fp8_kv_warmup_list(shape: LlmAttentionShape, settings: RoutingSettings) -> list[WarmItem]:
    """Everything a FlashAttentionBackend on the FP8 KV route compiles: the split-KV decode kernel
    (unless SGLANG_FA4_FP8_KV_SPLIT_KV_MAX_Q=0), the FP8 forward's variants and the page gather of
    the extend route; for a layer the split-KV kernel runs at every call size (head dim 512, bf16
    q) that kernel alone, decode and prefill row blocks; for a multimodal model also its image
    prefill variants. Nothing for a head dim the FP8 kernels do not run."""
    hq, hkv, limit = shape.q_heads, shape.kv_heads, settings.split_kv_max_q
    split = fp8_paged_kv.SplitKvShape(shape.head_dim, hq, hkv, shape.page_size, limit, shape.q_dtype, shape.images)
    if split.every_call():
        runs = shape.head_dim in fp8_paged_kv.HEAD_DIMS and hkv > 0 and hq >= hkv and hq % hkv == 0
        return [WarmItem("fp8_paged_decode", split)] if runs else []
    variants = fp8_variants_for(shape.head_dim, shape.sliding_window, gqa=hq > hkv > 0 and limit == 0)
    if not variants:
        return []
    items = []
    if hkv > 0 and hq >= hkv and (limit > 0 or shape.images):
        items.append(WarmItem("fp8_paged_decode", split))
    items += [WarmItem("fp8_forward", v) for v in variants]
    if hkv > 0:
        items.append(WarmItem("fp8_paged_gather", fp8_paged_kv.GatherShape(shape.head_dim, hkv, shape.page_size)))
    return items
