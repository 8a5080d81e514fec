"""InternVL ViT CUDA graphs captured at startup (``SGLANG_FA4_VIT_GRAPH_INTERNVL_STARTUP``, on by
default; acts only with ``SGLANG_VIT_ENABLE_CUDA_GRAPH=1``).

SGLang's ``InternViTCudaGraphRunner`` (0.5.20 and 0.5.23; InternVL, InternS1) captures one graph per
``[B, S, H]`` input shape, lazily: the first request that brings a tile count captures on the request
path. Those shapes are few and known from the model's config: SGLang's InternVL processor cuts an
image into ``n`` tiles of ``image_size`` px, ``n <= max_dynamic_patch``, and adds a thumbnail tile when
``n > 1``; each tile is ``(image_size / patch_size)^2`` patches plus the class token (448/14: 1025). So
after ``ModelRunner.load_model`` (AFTER hook, registered after the FA4 startup warmup), every such
runner whose backend it supports captures ``B = 1 .. max_tiles (+1 thumbnail)`` graphs of ``S``
tokens, then is sealed: a later capture (a shape outside the config, e.g. two multi-tile images in
one batch) is counted and warned about or raised per ``SGLANG_FA4_JIT_MONITOR``
(:mod:`sglang_fa4.integration.vit_capture_guard`, the budgets' guard).

Capturing at load also puts the graphs' memory before SGLang sizes its KV cache (it measures free
memory after load_model), where lazy capture takes it from a server already sized. The estimate
logged before capture (:func:`estimate_graph_bytes`) is an upper-bound guess from the shapes; the
memory actually taken is measured and logged on CUDA.

Shapes read from the config (``model.config``):

* tiles: ``max_dynamic_patch``, raised to SGLang's processor default (``InternVLProcessor.IMAGE_MAX_NUM``,
  12, which SGLang applies whatever the config says unless a request asks for another count);
* thumbnail: ``use_thumbnail``; SGLang's processor adds one for every multi-tile image, so it is
  counted when that processor is found;
* ``S``: ``force_image_size`` or ``vision_config.image_size`` over ``vision_config.patch_size``, + 1;
* ``H``: ``vision_config.hidden_size``; dtype and device: the encoder's.

A runner whose encoder is not an InternVL vision model's (RADIO: register tokens, dynamic
resolution) or whose config lacks a field gets one warning and keeps upstream's lazy capture.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Optional

from sglang_fa4.environ import envs
from sglang_fa4.integration.vit_capture_guard import enable_batch_invariant_first, flag_capture_after_startup
from sglang_fa4.startup import jit_monitor

logger = logging.getLogger("sglang_fa4")

RUNNER_MODULE = "sglang.srt.multimodal.internvl_vit_cuda_graph_runner"
STATE_ATTR = "_sglang_fa4_internvl_startup"
#: the backends the runner builds a seqlens layout for (0.5.20's fa4: through vit_graph_runners_fa4)
SUPPORTED_BACKENDS = ("fa3", "fa4", "triton_attn")


class ShapesUnknown(ValueError):
    """The model's config does not say which shapes its InternVL runner will see."""


@dataclass(frozen=True)
class TileShapes:
    batches: tuple[int, ...]  # tile counts B, one graph each
    tokens: int  # S: tokens per tile, class token included
    hidden: int  # H
    intermediate: int  # the MLP width (memory estimate only)

    @property
    def keys(self) -> list[tuple[int, int]]:
        return [(b, self.tokens) for b in self.batches]


@dataclass
class StartupState:
    shapes: TileShapes
    keys: list = field(default_factory=list)
    graph_bytes: Optional[int] = None  # measured on CUDA
    sealed: bool = False
    captures_after_startup: int = 0
    eager_runs: int = 0  # batches of a shape the startup graphs do not hold


def enabled() -> bool:
    return bool(envs.SGLANG_FA4_VIT_GRAPH_INTERNVL_STARTUP.get())


def startup_state(runner) -> Optional[StartupState]:
    return getattr(runner, STATE_ATTR, None)


def _first(value):
    return value[0] if isinstance(value, (list, tuple)) else value


def _processor_defaults() -> tuple[Optional[int], bool]:
    """(SGLang's default tile count for InternVL images, whether its processor adds thumbnails);
    (None, False) when the processor cannot be imported."""
    try:
        from sglang.srt.multimodal.processors.internvl import InternVLProcessor
    except Exception:  # noqa: BLE001 - optional: the config alone then decides
        return None, False
    return int(InternVLProcessor.IMAGE_MAX_NUM), True


def tile_shapes(config, processor_defaults: Optional[tuple[Optional[int], bool]] = None) -> TileShapes:
    """The ``[B, S, H]`` shapes an InternVL / InternS1 ``config`` brings to the vision encoder.
    Raises :class:`ShapesUnknown` when a field is missing."""
    vision = getattr(config, "vision_config", None)
    if vision is None:
        raise ShapesUnknown("the config has no vision_config")
    missing = [n for n in ("image_size", "patch_size", "hidden_size") if getattr(vision, n, None) is None]
    if missing:
        raise ShapesUnknown(f"vision_config lacks {', '.join(missing)}")
    image = int(_first(getattr(config, "force_image_size", None) or vision.image_size))
    patch = int(_first(vision.patch_size))
    if patch <= 0 or image % patch:
        raise ShapesUnknown(f"image_size {image} is not a multiple of patch_size {patch}")
    proc_tiles, proc_thumbnail = processor_defaults if processor_defaults is not None else _processor_defaults()
    tiles = getattr(config, "max_dynamic_patch", None)
    if tiles is None and proc_tiles is None:
        raise ShapesUnknown("the config has no max_dynamic_patch")
    tiles = max(int(t) for t in (tiles, proc_tiles) if t is not None)
    thumbnail = bool(getattr(config, "use_thumbnail", False)) or proc_thumbnail
    hidden = int(vision.hidden_size)
    batches = tuple(range(1, tiles + (2 if thumbnail and tiles > 1 else 1)))
    return TileShapes(batches, (image // patch) ** 2 + 1, hidden,
                      int(getattr(vision, "intermediate_size", None) or 4 * hidden))


def estimate_graph_bytes(shapes: TileShapes, element_size: int) -> int:
    """A rough upper bound of the graphs' memory: per graph the static input, attention workspace
    and output (3 x B*S*H) plus one layer's peak activations (qkv 3 x B*S*H, MLP B*S*I), each
    graph in its own memory pool (the runner captures without a shared pool)."""
    per_token = 6 * shapes.hidden + shapes.intermediate
    return sum(b * shapes.tokens * per_token * element_size for b in shapes.batches)


def find_runners(model) -> list[tuple[Any, Any]]:
    """``(runner, owner)`` for every InternViTCudaGraphRunner in ``model``: ``owner`` is the module
    whose ``encoder`` the runner drives (InternVisionModel for InternVL / InternS1), or None."""
    from sglang.srt.multimodal.internvl_vit_cuda_graph_runner import InternViTCudaGraphRunner

    found, seen = [], set()
    modules = list(model.modules()) if hasattr(model, "modules") else []
    owners = {id(getattr(m, "encoder", None)): m for m in modules if getattr(m, "encoder", None) is not None}
    for module in modules:
        runner = getattr(module, "cuda_graph_runner", None)
        if isinstance(runner, InternViTCudaGraphRunner) and id(runner) not in seen:
            seen.add(id(runner))
            found.append((runner, owners.get(id(runner.encoder))))
    return found


def capture_runner(runner, shapes: TileShapes) -> StartupState:
    """Capture one graph per shape on ``runner`` (through its own ``create_graph``: eager warmup,
    then capture) and seal it."""
    import torch

    state = StartupState(shapes)
    setattr(runner, STATE_ATTR, state)
    device, dtype = runner.device, runner.dtype
    cuda = torch.device(device).type == "cuda"
    estimate = estimate_graph_bytes(shapes, torch.empty((), dtype=dtype).element_size())
    logger.info("sglang-fa4: capturing %d InternVL ViT graphs at startup (tiles %d..%d of %d tokens, "
                "hidden %d, %s); estimated graph memory <= %.0f MiB", len(shapes.batches),
                shapes.batches[0], shapes.batches[-1], shapes.tokens, shapes.hidden, dtype, estimate / 2**20)
    before = torch.cuda.memory_allocated(device) if cuda else None
    with jit_monitor.expected_compiles(), torch.no_grad():
        for b in shapes.batches:
            x = torch.zeros(b, shapes.tokens, shapes.hidden, dtype=dtype, device=device)
            state.keys.append(runner.create_graph(x))
    if cuda:
        torch.cuda.synchronize(device)
        state.graph_bytes = torch.cuda.memory_allocated(device) - before
    state.sealed = True
    logger.info("sglang-fa4: %d InternVL ViT graphs captured at startup; graph memory %s",
                len(state.keys), "not measured (CPU)" if state.graph_bytes is None
                else f"{state.graph_bytes / 2**20:.1f} MiB")
    return state


def capture_model(model) -> list[StartupState]:
    """Startup: capture the config's shapes on every supported InternVL runner of ``model``; a runner
    whose shapes cannot be read, or whose capture fails, keeps upstream's lazy capture (one warning)."""
    states = []
    for runner, owner in find_runners(model):
        if runner._attn_backend not in SUPPORTED_BACKENDS:
            continue
        try:
            if owner is None or getattr(owner, "embeddings", None) is None:
                raise ShapesUnknown("its encoder is not an InternVL vision model's (RADIO?)")
            states.append(capture_runner(runner, tile_shapes(getattr(model, "config", None))))
        except Exception as exc:  # noqa: BLE001 - the server still runs, upstream's way
            if hasattr(runner, STATE_ATTR):
                delattr(runner, STATE_ATTR)
            logger.warning("sglang-fa4: InternVL ViT graphs not captured at startup (%s: %s); the runner "
                           "captures each tile count when a request first brings it, as upstream does",
                           type(exc).__name__, exc)
    return states


def capture_after_load_model(result, self, *args, **kwargs):
    """AFTER ModelRunner.load_model (after the FA4 startup warmup hook): capture the InternVL ViT
    graphs before serving. Returns None: SGLang keeps load_model's own result."""
    if enabled() and envs.SGLANG_VIT_ENABLE_CUDA_GRAPH.get():
        enable_batch_invariant_first(self)
        capture_model(getattr(self, "model", None))
    return None


def create_graph_around(original, self, x):
    """AROUND InternViTCudaGraphRunner.create_graph: the capture guard. On a sealed runner a new
    shape's capture is counted and warned about or raised per SGLANG_FA4_JIT_MONITOR."""
    state = startup_state(self)
    if state is not None and state.sealed and self._graph_key(x) not in self.graphs:
        state.captures_after_startup += 1
        flag_capture_after_startup(
            f"sglang-fa4: InternVL ViT CUDA graph captured after startup for {tuple(x.shape[:2])} "
            f"(#{state.captures_after_startup}); startup tiles {list(state.shapes.batches)} of "
            f"{state.shapes.tokens} tokens")
    return original(self, x)


def run_eagerly(runner, state: StartupState, x):
    """A batch of a shape the startup graphs do not hold (e.g. two 12-tile images in one encoder
    call), on a sealed runner: the encoder's layers run eagerly with the runner's own seqlens layout,
    so serving never captures (a capture on the request path costs a graph's memory for good, and
    raises under SGLANG_FA4_JIT_MONITOR=raise)."""
    import torch

    x = x.contiguous()
    batch, tokens, _ = x.shape
    if state.eager_runs == 0:
        logger.info("sglang-fa4: InternVL ViT batch of shape %s is outside the startup graphs %s: "
                    "it runs eagerly (no capture while serving)", (batch, tokens), list(state.shapes.batches))
    state.eager_runs += 1
    cu = runner._build_cu(batch, tokens, device=x.device)
    if runner._attn_backend == "triton_attn":
        layout = [cu, cu[1:] - cu[:-1], tokens]
    else:  # fa3 / fa4: [cu_seqlens, max_seqlen]
        layout = [cu, tokens]
    with torch.no_grad():
        y = x
        for layer in runner.encoder.layers:
            y = layer(y, cu_seqlens=layout)
    return y
