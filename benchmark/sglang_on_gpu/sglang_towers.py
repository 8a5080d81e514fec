"""The REAL SGLang vision towers (Qwen2.5-VL, Qwen3-VL) on one GPU, outside a server.

What a server process does before the ViT runs, done by hand: CUDA-only binaries replaced where
they are absent (cuda_only_stubs), the server args published (mm_attention_backend), TP=1 model
parallel groups, and SGLang's own plugin loader (``load_plugins``), which finds sglang_fa4 through
its ``sglang.srt.plugins`` entry point and applies its hooks. The towers are SGLang's classes built
from the configs of the benchmark (``sglang_fa4.bench.vit``: Qwen2.5-VL-7B, Qwen3-VL-8B), random
weights.

Used by benchmark/release/check_vit_graphs.py (and any check that needs SGLang's towers on the GPU).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

MODELS = ("qwen2_5_vl", "qwen3_vl")

# InternViT-300M (InternVL2.5/3 1B-8B): 24 layers, 1024 wide, 16 heads of 64, 448x448 tiles of 14 px
# patches: (448/14)^2 + 1 class token = 1025 tokens per tile
INTERNVIT_300M = dict(hidden_size=1024, num_attention_heads=16, intermediate_size=4096, num_hidden_layers=24,
                      norm_type="layer_norm", layer_norm_eps=1e-6, initializer_factor=0.1, drop_path_rate=0.0,
                      dropout=0.0, qkv_bias=True, qk_normalization=False, hidden_act="gelu",
                      image_size=448, patch_size=14)
TILE_TOKENS = 1025


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_sglang(mm_attention_backend: str, *, tp_size: int = 1, rank: int = 0, port: int | None = None,
                dist_backend: str | None = None) -> None:
    """Server args published and the model-parallel groups built, as a server process does for TP
    rank ``rank`` of ``tp_size``. 0.5.20: ``set_server_args`` and the sizes passed; 0.5.23: the
    args published with the rank, the groups built from the published topology. ``dist_backend``:
    torch.distributed's (nccl on a GPU, gloo on a CPU, where the groups also skip PyNccl and the
    custom all-reduce, which want a CUDA device). Every rank must pass the same ``port``."""
    import torch
    from sglang.srt import runtime_context as rc
    from sglang.srt.distributed import parallel_state as ps
    from sglang.srt.server_args import ServerArgs

    cuda = torch.cuda.is_available()
    backend = dist_backend or ("nccl" if cuda else "gloo")
    if not cuda and tp_size > 1:
        make_group = ps.init_model_parallel_group
        ps.init_model_parallel_group = lambda *a, **k: make_group(
            *a, **{**k, "use_pynccl": False, "use_custom_allreduce": False})
    ps.init_distributed_environment(world_size=tp_size, rank=rank, local_rank=rank, backend=backend,
                                    distributed_init_method=f"tcp://127.0.0.1:{port or _free_port()}")
    args = ServerArgs(model_path="dummy", mm_attention_backend=mm_attention_backend, tp_size=tp_size)
    if hasattr(rc, "SpawnRanks"):  # 0.5.23: the groups are built from the published topology
        rc.reset_context()
        rc.publish(args, role="scheduler", ranks=rc.SpawnRanks(world_rank=rank))
        rc.get_parallel().override_permanently(world_group=ps._WORLD)
        ps.initialize_model_parallel(backend=backend)
    else:  # 0.5.20
        rc.get_context().set_server_args(args)
        ps.initialize_model_parallel(tp_size, 1)


def prepare_sglang(mm_attention_backend: str = "fa4", env: dict | None = None, batch_invariant: bool = False,
                   *, tp_size: int = 1, rank: int = 0, port: int | None = None) -> dict:
    """Stubs (only for what is missing), environment, server args, model-parallel groups (TP rank
    ``rank`` of ``tp_size``, see init_sglang), plugins; with ``batch_invariant`` SGLang's
    batch-invariant kernels on (a server with --enable-deterministic-inference), before any tower
    is built or captured. Call once per process. Returns what was done, for the report."""
    for key, value in (env or {}).items():
        os.environ[key] = str(value)
    from benchmark.sglang_on_gpu import cuda_only_stubs

    stubbed = cuda_only_stubs.install_missing()
    import sglang

    init_sglang(mm_attention_backend, tp_size=tp_size, rank=rank, port=port)

    import sglang.srt.plugins as plugins
    from sglang.srt.plugins.hook_registry import HookRegistry

    plugins.load_plugins()
    from sglang_fa4 import plugin
    plan = plugin._registered_plan
    if batch_invariant:
        from sglang.srt.batch_invariant_ops import enable_batch_invariant_mode

        enable_batch_invariant_mode()
    return {
        "sglang_version": sglang.__version__,
        "stubbed_packages": stubbed,
        "mm_attention_backend": mm_attention_backend,
        "plugin_hooked": plan.hooked if plan else None,
        "plugin_upstream": plan.upstream if plan else None,
        "hooks_applied": sorted(HookRegistry._patched),
    }


def init_random_(module, seed: int) -> None:
    """SGLang allocates parameters uninitialised: norms get weight 1 / bias 0, everything else
    N(0, 0.02) (biases 0), like transformers' init."""
    import torch

    gen = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if "norm" in name or ".ln_" in name or name.startswith("ln_"):
                p.fill_(1.0 if leaf == "weight" else 0.0)
            elif leaf == "bias":
                p.zero_()
            else:
                p.copy_((torch.randn(p.shape, generator=gen) * 0.02).to(p.dtype))


def build_random(make, seed: int, device: str, dtype=None):
    """``make()`` run with ``dtype`` (default bf16) as torch's default dtype and ``device`` as the
    default device, where SGLang's modules allocate their parameters; then the parameters cast,
    eval mode and random weights (init_random_).

    Buffers keep the dtype the module gave them, as in a server (SGLang's loader builds the model
    under the default dtype and never casts it whole): SGLang's rotary cache is fp32 on CUDA, and a
    whole-module ``.to(bf16)`` here had made it bf16, so the tower checks never saw the fp32 cos/sin
    a server's Qwen3-VL tower hands its graph runner (issue #14)."""
    import torch

    dtype = dtype or torch.bfloat16
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            module = make()
    finally:
        torch.set_default_dtype(default)
    buffer_dtypes = {name: b.dtype for name, b in module.named_buffers()}
    module = module.to(device=device, dtype=dtype).eval()
    for name, b in module.named_buffers():
        if b.dtype != buffer_dtypes[name]:
            owner, _, leaf = name.rpartition(".")
            module.get_submodule(owner)._buffers[leaf] = b.to(buffer_dtypes[name])  # persistence kept
    init_random_(module, seed)
    return module


def build_tower(model: str, seed: int = 0, device: str = "cuda"):
    """SGLang's vision tower for ``model`` (bf16, eval, random weights) on ``device``."""
    from sglang_fa4.bench.vit import QWEN3_8B_VISION, QWEN25_7B_VISION

    if model == "qwen2_5_vl":
        from sglang.srt.models.qwen2_5_vl import Qwen2_5_VisionTransformer
        from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig

        return build_random(lambda: Qwen2_5_VisionTransformer(Qwen2_5_VLVisionConfig(**QWEN25_7B_VISION)), seed, device)
    if model == "qwen3_vl":
        from sglang.srt.configs.qwen3_vl import Qwen3VLVisionConfig
        from sglang.srt.models.qwen3_vl import Qwen3VLMoeVisionModel

        return build_random(lambda: Qwen3VLMoeVisionModel(Qwen3VLVisionConfig(**QWEN3_8B_VISION)), seed, device)
    raise ValueError(f"unknown model {model!r}; known: {MODELS}")


def result_stem(kind: str, sglang_version: str, tag: str = "") -> str:
    """A GPU check's result file name: ``kind`` for the latest supported SGLang (the headline
    file), ``kind-<version>`` for the others, ``-<tag>`` appended when given."""
    from sglang_fa4.features import SUPPORTED_SGLANG_VERSIONS

    latest = sglang_version == SUPPORTED_SGLANG_VERSIONS[-1]
    return kind + ("" if latest else f"-{sglang_version}") + (f"-{tag}" if tag else "")


def internvl_config(vision: dict | None = None, max_dynamic_patch: int = 12, use_thumbnail: bool = True):
    """What an InternVL / InternS1 chat model's config says about its vision tower (the fields the
    plugin's InternVL startup capture reads): ``vision_config`` (InternViT-300M by default),
    ``max_dynamic_patch`` tiles per image, a thumbnail tile for multi-tile images."""
    from types import SimpleNamespace

    from transformers import PretrainedConfig

    vision_config = PretrainedConfig(**(vision or INTERNVIT_300M))
    return SimpleNamespace(vision_config=vision_config, max_dynamic_patch=max_dynamic_patch,
                           use_thumbnail=use_thumbnail, force_image_size=vision_config.image_size)


def build_internvit(seed: int = 0, device: str = "cuda", config=None, part: str = "model", dtype=None):
    """SGLang's InternViT (eval, random weights) on ``device``, built from ``config`` (an
    internvl_config(); default InternViT-300M): ``part`` "model" = InternVisionModel (patch and
    position embeddings + encoder, what InternVLChatModel.vision_model is), "encoder" =
    InternVisionEncoder alone. The encoder builds its InternVL graph runner when
    SGLANG_VIT_ENABLE_CUDA_GRAPH=1 at construction (and SGLang runs on CUDA)."""
    from sglang.srt.models.internvl import InternVisionEncoder, InternVisionModel

    vision_config = (config or internvl_config()).vision_config
    cls = InternVisionModel if part == "model" else InternVisionEncoder
    return build_random(lambda: cls(vision_config), seed, device, dtype)


def grid_of(model: str, width: int, height: int, frames: int = 1) -> tuple[int, int, int]:
    """(t, h, w) patch grid the model's processor gives a picture (sglang_fa4.bench.layouts)."""
    from sglang_fa4.bench.vit import GEOMETRY

    return tuple(GEOMETRY[model].grid_thw(width, height, frames))


def pixels(tower, grids, seed: int, device: str = "cuda"):
    """Random patch rows for ``grids`` (what the processor hands the tower), and grid_thw on the
    host, as SGLang passes it."""
    import torch

    pe = tower.patch_embed
    patch_dim = pe.proj.weight[0].numel() if hasattr(pe, "proj") else None
    tokens = sum(t * h * w for t, h, w in grids)
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(tokens, patch_dim, device=device, generator=gen).to(torch.bfloat16)
    return x, torch.tensor(grids, dtype=torch.int64)


def set_graph_mode(tower, on: bool) -> None:
    """Eager or CUDA-graph forward: Qwen2.5-VL reads ``enable_cg`` (set in __init__), Qwen3-VL reads
    SGLANG_VIT_ENABLE_CUDA_GRAPH at each call."""
    if hasattr(tower, "enable_cg"):
        tower.enable_cg = on
    os.environ["SGLANG_VIT_ENABLE_CUDA_GRAPH"] = "1" if on else "0"
