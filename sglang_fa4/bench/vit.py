"""`sglang-fa4 bench vit`: a transformers vision tower end to end, attention per backend.

Towers (random weights, bf16, configs built in code, no hub access):
  qwen2_5_vl  Qwen2.5-VL-7B's vision config: 32 blocks, hidden 1280, 16 heads (d=80), windowed
              blocks (112 px windows) with full attention in blocks 7/15/23/31
  qwen3_vl    Qwen3-VL-8B's vision config: 27 blocks, hidden 1152, 16 heads (d=72), all full
Inputs: PICTURES (448², 720p, 1080p, 4K, a 32-frame 640x360 video) resized as the processors do.
The grid-dependent metadata (position ids, cu_seqlens, window index, max lengths) is computed once
with transformers' own vision_utils helpers and passed in, as transformers intends for graph
capture, so the forward makes no host sync. Our window partition (layouts.py) is checked against
transformers' for every input. Modes: eager (the forward as is) and graph (the whole forward
captured in one CUDA graph and replayed). Output compared across backends and with an fp32 tower.
"""

from __future__ import annotations

import copy
import time

from . import report
from .layouts import PICTURES, QWEN3_VL, QWEN25_VL, seqlens_from_cu
from .stats import all_pairs, median, round_order
from .timing import GraphedCalls, event_time_ms, iters_for, sync

VIT_BACKENDS = ("fa4", "triton_attn", "sdpa")
MODELS = ("qwen2_5_vl", "qwen3_vl")
MODES = ("eager", "graph")

QWEN25_7B_VISION = dict(
    depth=32, hidden_size=1280, hidden_act="silu", intermediate_size=3420, num_heads=16, in_channels=3,
    patch_size=14, spatial_merge_size=2, temporal_patch_size=2, tokens_per_second=2, window_size=112,
    out_hidden_size=3584, fullatt_block_indexes=[7, 15, 23, 31],
)
QWEN3_8B_VISION = dict(
    depth=27, hidden_size=1152, hidden_act="gelu_pytorch_tanh", intermediate_size=4304, num_heads=16,
    in_channels=3, patch_size=16, spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=4096,
    num_position_embeddings=2304, deepstack_visual_indexes=[8, 16, 24],
)
GEOMETRY = {"qwen2_5_vl": QWEN25_VL, "qwen3_vl": QWEN3_VL}


def build_tower(model: str, overrides: dict | None = None, device="cuda", dtype=None, seed: int = 0):
    """The vision tower with random weights (transformers' own init), in eval mode."""
    import torch

    torch.manual_seed(seed)
    dtype = dtype or torch.bfloat16
    if model == "qwen2_5_vl":
        from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel as M

        cfg = Qwen2_5_VLVisionConfig(**{**QWEN25_7B_VISION, **(overrides or {})})
    elif model == "qwen3_vl":
        from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLVisionConfig
        from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel as M

        cfg = Qwen3VLVisionConfig(**{**QWEN3_8B_VISION, **(overrides or {})})
    else:
        raise ValueError(f"unknown model {model!r}; known: {MODELS}")
    cfg._attn_implementation = "sdpa"
    with torch.device(device):
        tower = M(cfg)
    return tower.to(dtype=dtype).eval()


def tower_inputs(model: str, tower, picture: str, device="cuda", seed: int = 0) -> dict:
    """pixel values, grid_thw and the precomputed metadata kwargs for one picture."""
    import torch
    from transformers import vision_utils as vu

    width, height, frames = PICTURES[picture]
    geo = GEOMETRY[model]
    grid = geo.grid_thw(width, height, frames)
    cfg = tower.config
    grid_t = torch.tensor([grid], dtype=torch.long, device=device)
    tokens = grid[0] * grid[1] * grid[2]
    gen = torch.Generator(device=device).manual_seed(seed)
    patch_dim = cfg.in_channels * cfg.temporal_patch_size * cfg.patch_size**2
    pixels = torch.randn(tokens, patch_dim, device=device, dtype=next(tower.parameters()).dtype, generator=gen)

    kw = {"position_ids": vu.get_vision_position_ids(grid_t, cfg.spatial_merge_size)}
    cu = vu.get_vision_cu_seqlens(grid_t)
    kw["cu_seqlens"] = cu
    kw["max_seqlen"] = max(seqlens_from_cu(cu.tolist()))
    info = {"grid_thw": list(grid), "tokens": tokens, "full_segments": len(seqlens_from_cu(cu.tolist()))}
    if model == "qwen2_5_vl":
        widx, cuw = vu.get_vision_window_index(grid_t, cfg.spatial_merge_size, cfg.window_size, cfg.patch_size)
        kw["window_index"] = widx.to(device)
        kw["cu_window_seqlens"] = cuw
        wl = seqlens_from_cu(cuw.tolist())
        kw["max_window_seqlen"] = max(wl)
        info["window_segments"] = len(wl)
        info["window_partition_matches_ours"] = wl == geo.window_seqlens([grid])
    else:
        idx, wts = vu.get_vision_interpolation_indices_and_weights(
            grid_t, num_grid_per_side=tower.num_grid_per_side, mode=tower.interpolation_mode,
            align_corners=tower.interpolation_align_corners, spatial_merge_size=cfg.spatial_merge_size,
        )
        kw["interp_indices"], kw["interp_weights"] = idx, wts
    return {"pixels": pixels, "grid": grid_t, "kwargs": kw, "info": info}


def forward_fn(tower, inp: dict):
    """A zero-argument call of the whole tower returning its output to the LLM (pooler_output)."""
    import torch

    pixels, grid, kw = inp["pixels"], inp["grid"], inp["kwargs"]

    def call():
        with torch.no_grad():  # not inference_mode: the graph's static output is poisoned in place later
            return tower(pixels, grid_thw=grid, **kw).pooler_output

    return call


def _register_layouts(inp: dict) -> None:
    from .hf_attention import register_layout

    for name in ("cu_seqlens", "cu_window_seqlens"):
        if name in inp["kwargs"]:
            register_layout(inp["kwargs"][name])


def _rel(a, b) -> float:
    from .backends import rel_err

    return rel_err(a, b)


def bench_model_picture(model, tower, tower32, picture, backends, modes, rounds, target_ms, ref_max_tokens, seed):
    import torch

    from .hf_attention import use_backend

    inp = tower_inputs(model, tower, picture, seed=seed)
    _register_layouts(inp)
    info = inp["info"]
    base = {"model": model, "image": picture, **info}
    call = forward_fn(tower, inp)

    ref, ref_kind = None, "sdpa_bf16"
    if tower32 is not None and info["tokens"] <= ref_max_tokens:
        inp32 = {**inp, "pixels": inp["pixels"].float()}
        use_backend(tower32, "sdpa")
        tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        try:
            ref = forward_fn(tower32, inp32)().clone()
            ref_kind = "fp32"
        finally:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32

    outs, errors, eager_ms_est = {}, {}, {}
    for b in backends:
        try:
            use_backend(tower, b)
            call()  # compile / warm
            sync()
            t0 = time.perf_counter()
            outs[b] = call().clone()
            sync()
            eager_ms_est[b] = (time.perf_counter() - t0) * 1e3
        except Exception as exc:
            errors[b] = f"{type(exc).__name__}: {exc}"
    if ref is None and "sdpa" in outs:
        ref = outs["sdpa"]
    live = [b for b in backends if b in outs]
    rel = {b: (_rel(outs[b], ref) if ref is not None else None) for b in live}
    rel_sdpa = {b: (_rel(outs[b], outs["sdpa"]) if "sdpa" in outs else None) for b in live}

    rows, pairs = [], []

    def add(mode, times, extra=None, failed=None):
        failed = {**errors, **(failed or {})}
        for b in backends:
            row = {"backend": b, "mode": mode, **base}
            if b in failed:
                row.update(median_ms=None, rel_err=None, error=failed[b])
            elif times.get(b):
                row.update(median_ms=median(times[b]), rel_err=rel.get(b), ref=ref_kind,
                           rel_err_vs_sdpa=rel_sdpa.get(b), per_round_ms=times[b])
                row["ms_per_1k_tokens"] = row["median_ms"] / info["tokens"] * 1000
                row.update((extra or {}).get(b, {}))
            else:
                continue
            rows.append(row)
        for p in all_pairs({b: times.get(b, []) for b in live}):
            pairs.append({"model": model, "image": picture, "mode": mode, **p})

    if "eager" in modes and live:
        iters = {b: iters_for(eager_ms_est[b], target_ms, 1, 10) for b in live}
        times = {b: [] for b in live}
        for r in range(rounds):
            for b in round_order(live, r):
                use_backend(tower, b)
                times[b].append(event_time_ms(call, iters[b]))
        add("eager", times, {b: {"iters": iters[b]} for b in live})

    if "graph" in modes and live:
        times, failed, extra = {b: [] for b in live}, {}, {}
        for b in live:
            try:
                use_backend(tower, b)
                g = GraphedCalls([call], 1, warmup=1)
                gout = g.outputs[0]
                gout.fill_(float("nan"))
                g.replay()
                sync()
                extra[b] = {"graph_vs_eager_rel_err": _rel(gout, outs[b]),
                            "graph_rel_err": _rel(gout, ref) if ref is not None else None}
                reps = iters_for(g.ms_per_call(1), target_ms, 1, 10)
                extra[b]["replays"] = reps
                # rounds interleave backends, so each keeps its graph until the end
                times[b] = ("graph", g, reps)
            except Exception as exc:
                failed[b] = f"graph: {type(exc).__name__}: {exc}"
        glive = [b for b in live if b not in failed]
        graphs = {b: times[b] for b in glive}
        times = {b: [] for b in glive}
        for r in range(rounds):
            for b in round_order(glive, r):
                _, g, reps = graphs[b]
                times[b].append(g.ms_per_call(reps))
        for _, g, _ in graphs.values():
            g.release()
        del graphs
        add("graph", times, extra, failed)

    del inp, outs, ref
    torch.cuda.empty_cache()
    return rows, pairs


def run(args) -> dict:
    import torch

    from .meta import base_meta, ceilings

    if not torch.cuda.is_available():
        raise SystemExit("bench vit needs a CUDA GPU")
    t_start = time.monotonic()
    out_dir = report.resolve_out_dir(args.out_dir)
    meta = base_meta("vit")
    meta["ceilings"] = ceilings() if args.ceilings else None
    meta["settings"] = {"models": args.models, "images": args.images, "backends": args.backends,
                        "modes": args.modes, "rounds": args.rounds, "target_ms": args.target_ms,
                        "ref_max_tokens": args.ref_max_tokens, "dtype": "bfloat16", "weights": "random"}
    meta["configs"] = {"qwen2_5_vl": QWEN25_7B_VISION, "qwen3_vl": QWEN3_8B_VISION}
    result = {"meta": meta, "rows": [], "pairs": []}
    for mi, model in enumerate(args.models):
        tower = build_tower(model, seed=mi)
        tower32 = None
        if args.ref_max_tokens > 0:
            tower32 = copy.deepcopy(tower).float()
        for pi, picture in enumerate(args.images):
            if args.time_budget_s and time.monotonic() - t_start > args.time_budget_s:
                meta["truncated"] = f"time budget {args.time_budget_s}s reached before {model} {picture}"
                break
            t0 = time.monotonic()
            rows, pairs = bench_model_picture(model, tower, tower32, picture, args.backends, args.modes,
                                              args.rounds, args.target_ms, args.ref_max_tokens, seed=100 * mi + pi)
            result["rows"] += rows
            result["pairs"] += pairs
            print(f"[vit] {model} {picture}: {time.monotonic() - t0:.1f}s  "
                  + "  ".join(f"{r['backend']}:{r['mode'][0]}={r['median_ms']:.2f}ms" for r in rows if r.get("median_ms")),
                  flush=True)
            meta["elapsed_s"] = round(time.monotonic() - t_start, 1)
            report.write_json(result, out_dir / "vit.json", partial=True)
        del tower, tower32
        torch.cuda.empty_cache()
        if meta.get("truncated"):
            break
    meta["elapsed_s"] = round(time.monotonic() - t_start, 1)
    report.write_json(result, out_dir / "vit.json")
    report.write_vit_markdown(result, out_dir / "vit.md")
    if not args.no_plot:
        report.plot_vit(result, out_dir / "vit.png")
    return result


def add_arguments(p) -> None:
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--images", nargs="+", default=list(PICTURES), choices=list(PICTURES))
    p.add_argument("--backends", nargs="+", default=list(VIT_BACKENDS), choices=VIT_BACKENDS)
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--rounds", type=int, default=5, help="paired rounds per case")
    p.add_argument("--target-ms", type=float, default=150.0, help="GPU time per timed sample")
    p.add_argument("--ref-max-tokens", type=int, default=12000,
                   help="compare with an fp32 tower up to this many tokens (0: never; larger: vs bf16 sdpa)")
    p.add_argument("--no-ceilings", dest="ceilings", action="store_false", help="skip the matmul/copy ceilings")
