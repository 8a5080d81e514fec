"""InternVL ViT graphs captured at startup, checked on the GPU through SGLang's real InternViT (issue #18 item 5).

SGLang's InternVisionModel (InternViT-300M config, random bf16 weights; patch/position embeddings +
InternVisionEncoder with its InternViTCudaGraphRunner), fa4, sglang_fa4 loaded by SGLang's plugin
loader (benchmark/sglang_on_gpu/sglang_towers.py), SGLANG_VIT_ENABLE_CUDA_GRAPH=1,
SGLANG_FA4_VIT_GRAPH_INTERNVL_STARTUP=1, SGLANG_FA4_JIT_MONITOR=raise.

Startup as a server runs it: SGLang's own hook wrapper (``hook_registry._wrap_fn``) builds
``ModelRunner.load_model``'s chain from the hooks the plugin registered on it (the BEFORE FA4
preload, then the AFTER hooks in registration order: the FA4 warmup, then the InternVL startup
capture) around a load that builds the model (an InternVL-chat-shaped module: ``config`` with
``vision_config``, ``max_dynamic_patch`` 12, ``use_thumbnail``; ``vision_model``), each hook timed
with the GPU memory it took. Recorded: the graphs captured at startup (tile counts), seconds, memory.

Then >= 100 requests in random order: single images of 1..12 tiles (+ the thumbnail SGLang's
processor adds to a multi-tile image) and batches of 2-3 images (their tiles concatenated, as
InternVLChatModel.get_image_feature does; above the largest startup graph the plugin runs the
encoder eagerly). Per request, through ``vision_model`` as the chat model calls it: the graph-mode
output against the same model run eagerly (SGLang's eager encoder path, graphs off) on the same
pixels (bitwise equal expected; max |diff| reported), and against the encoder's layers run eagerly
with the runner's own seqlens layout (a diagnostic), finite. After startup: graphs captured (the
runner's graph count and the plugin's capture guard) and FA4 compiles (varlen.compile_count, the
JIT monitor) must all be 0.

usage (GPU machine, SGLang importable; see benchmark/sglang_on_gpu/README.md):
  python3 benchmark/release/check_internvl_graphs.py --out DIR [--requests 120] [--seed 0]
Writes DIR/internvl_graphs.json and .md (the latest supported SGLang; others: internvl_graphs-<version>.*);
exit code 1 when the verdict is not ok.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

ENV = {"SGLANG_VIT_ENABLE_CUDA_GRAPH": "1", "SGLANG_FA4_VIT_GRAPH_INTERNVL_STARTUP": "1",
       "SGLANG_FA4_JIT_MONITOR": "raise"}
LOAD_MODEL = "sglang.srt.model_executor.model_runner.ModelRunner.load_model"


# ----------------------------------------------------------------------------------------- requests

def image_tiles(n: int, thumbnail: bool) -> int:
    """Tiles SGLang's InternVL processor hands the encoder for an image cut into ``n`` tiles."""
    return n + (1 if thumbnail and n > 1 else 0)


def make_requests(rng: random.Random, count: int, max_tiles: int, thumbnail: bool, batch_share: float = 0.4,
                  max_images: int = 3) -> list[list[int]]:
    """``count`` requests in random order, each the tile counts of its images (thumbnail included):
    every single-image tile count 1..max_tiles at least once, the rest random singles and, a share
    ``batch_share``, batches of 2..max_images images."""
    reqs = [[image_tiles(n, thumbnail)] for n in range(1, max_tiles + 1)]
    while len(reqs) < count:
        k = rng.randint(2, max_images) if rng.random() < batch_share else 1
        reqs.append([image_tiles(rng.randint(1, max_tiles), thumbnail) for _ in range(k)])
    rng.shuffle(reqs)
    return reqs


# ----------------------------------------------------------------------------------- startup chain

class ServerModelRunner:
    """What the plugin's load_model hooks read from SGLang's ModelRunner: the model it loaded, the
    model config (multimodal) and the server args (the ViT attention backend). No
    --enable-deterministic-inference: SGLang's batch-invariant switch is a no-op."""

    def __init__(self, mm_attention_backend: str = "fa4"):
        from types import SimpleNamespace

        self.model = None
        self.model_config = SimpleNamespace(is_multimodal=True)
        self.server_args = SimpleNamespace(mm_attention_backend=mm_attention_backend)

    def maybe_enable_batch_invariant_mode(self):
        return None


def hook_name(hook) -> str:
    return f"{getattr(hook, '__module__', '?')}.{getattr(hook, '__qualname__', repr(hook))}"


def load_model_chain(load, sync=None):
    """``load`` wrapped as SGLang wraps ModelRunner.load_model: the hooks registered on it, sorted
    and wrapped by SGLang's own code (REPLACE first, then registration order), each timed (seconds,
    allocated / reserved GPU memory it added). Returns (the wrapped function, the timing rows, the
    depth of the __wrapped__ chain on the real ModelRunner.load_model: the number of hooks applied)."""
    import pkgutil

    import torch
    from sglang.srt.plugins import hook_registry as hr

    cuda = torch.cuda.is_available()
    hooks = list(hr.HookRegistry._hooks.get(LOAD_MODEL, []))
    rows: list[dict] = []

    def timed(hook, hook_type):
        def run(*args, **kwargs):
            if cuda:
                torch.cuda.synchronize()
            alloc0 = torch.cuda.memory_allocated() if cuda else 0
            res0 = torch.cuda.memory_reserved() if cuda else 0
            t0 = time.perf_counter()
            out = hook(*args, **kwargs)
            if cuda:
                torch.cuda.synchronize()
            rows.append({"hook": hook_name(hook), "type": hook_type.value,
                         "seconds": round(time.perf_counter() - t0, 3),
                         "allocated_mib": round(((torch.cuda.memory_allocated() if cuda else 0) - alloc0) / 2**20, 1),
                         "reserved_mib": round(((torch.cuda.memory_reserved() if cuda else 0) - res0) / 2**20, 1)})
            return out
        return run

    wrapped = load
    for hook_type, hook, _src in sorted(hooks, key=lambda h: 0 if h[0] == hr.HookType.REPLACE else 1):
        wrapped = hr._wrap_fn(wrapped, timed(hook, hook_type), hook_type)
    depth, fn = 0, None
    try:
        owner, attr = LOAD_MODEL.rsplit(".", 1)
        fn = getattr(pkgutil.resolve_name(owner), attr)
    except Exception:  # noqa: BLE001 - ModelRunner not importable here: no depth
        pass
    while fn is not None and hasattr(fn, "__wrapped__"):
        depth, fn = depth + 1, fn.__wrapped__
    return wrapped, rows, depth


def build_internvl_chat(seed: int, device: str, config=None, dtype=None):
    """An InternVL-chat-shaped model as the plugin's startup hook finds it: ``config`` (vision_config,
    max_dynamic_patch, use_thumbnail) and ``vision_model`` (SGLang's InternVisionModel)."""
    import torch

    from benchmark.sglang_on_gpu.sglang_towers import build_internvit, internvl_config

    model = torch.nn.Module()
    model.config = config or internvl_config()
    model.vision_model = build_internvit(seed, device, model.config, part="model", dtype=dtype)
    return model


def startup(seed: int, device: str, config=None, dtype=None) -> tuple[object, dict]:
    """Runs ModelRunner.load_model's hook chain around a load that builds the model; returns the
    model runner stand-in (``.model``) and the startup report."""
    import torch

    from sglang_fa4.integration import internvl_graphs as ig

    mr = ServerModelRunner()

    def load(self, *args, **kwargs):
        self.model = build_internvl_chat(seed, device, config, dtype)
        return None

    chain, rows, depth = load_model_chain(load)
    t0 = time.perf_counter()
    chain(mr)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    rep: dict = {"load_model_hooks": rows, "server_load_model_hook_depth": depth,
                 "hooks_seconds": round(time.perf_counter() - t0, 3)}
    found = ig.find_runners(mr.model)
    rep["runners"] = len(found)
    if len(found) != 1:
        return mr, rep
    runner = found[0][0]
    state = ig.startup_state(runner)
    rep.update(runner=type(runner).__name__, attn_backend=runner._attn_backend,
               graphs=len(runner.graphs), graph_keys=sorted([list(k) for k in runner.graphs]),
               startup_state=state is not None, sealed=bool(state and state.sealed))
    if state is not None:
        est = ig.estimate_graph_bytes(state.shapes, torch.empty((), dtype=runner.dtype).element_size())
        rep.update(tile_batches=list(state.shapes.batches), tokens_per_tile=state.shapes.tokens,
                   graph_mib=None if state.graph_bytes is None else round(state.graph_bytes / 2**20, 1),
                   estimate_mib=round(est / 2**20, 1))
    capture = [r for r in rows if r["hook"].endswith("internvl_graphs.capture_after_load_model")]
    warm = [r for r in rows if r["hook"].endswith("hooks.warm_fa4_after_load_model")]
    rep["capture_s"] = capture[0]["seconds"] if capture else None
    rep["capture_reserved_mib"] = capture[0]["reserved_mib"] if capture else None
    rep["warmup_s"] = warm[0]["seconds"] if warm else None
    names = [r["hook"] for r in rows]
    rep["warmup_before_capture"] = bool(capture and warm and names.index(warm[0]["hook"]) < names.index(capture[0]["hook"]))
    return mr, rep


# ---------------------------------------------------------------------------------------- requests

def runner_layout_eager(runner, embeds):
    """The encoder's layers run eagerly with the layout the runner's graphs were captured with."""
    import torch

    batch, tokens, _ = embeds.shape
    cu = runner._build_cu(batch, tokens, device=embeds.device)
    layout = [cu, cu[1:] - cu[:-1], tokens] if runner._attn_backend == "triton_attn" else [cu, tokens]
    y = embeds
    with torch.no_grad():
        for layer in runner.encoder.layers:
            y = layer(y, cu_seqlens=layout)
    return y


def diff(a, b) -> dict:
    if a.shape != b.shape:
        return {"bitwise": False, "max_abs_diff": None, "rel_err": None}
    a32, b32 = a.float(), b.float()
    return {"bitwise": bool(a.dtype == b.dtype and a.equal(b)), "max_abs_diff": float((a32 - b32).abs().max()),
            "rel_err": float((a32 - b32).norm() / b32.norm().clamp_min(1e-12))}


def serve(model, requests: list[list[int]], seed: int, device: str) -> dict:
    """Every request through ``model.vision_model`` in graph mode and eagerly; counters after."""
    import torch

    from sglang_fa4.integration import internvl_graphs as ig
    from sglang_fa4.kernels import fa4
    from sglang_fa4.startup import jit_monitor

    vm = model.vision_model
    enc = vm.encoder
    (runner, _owner), = ig.find_runners(model)
    state = ig.startup_state(runner)
    size = vm.embeddings.image_size
    dtype = next(vm.parameters()).dtype
    graphs0, compiles0, jit0 = len(runner.graphs), fa4.kernel_cache().compile_count(), jit_monitor.compiles_after_warmup()
    guard0 = state.captures_after_startup if state else 0
    gen = torch.Generator(device=device).manual_seed(seed)
    rows, failures = [], []
    t0 = time.perf_counter()
    for i, tiles in enumerate(requests):
        batch = sum(tiles)
        pixels = torch.randn(batch, 3, size, size, device=device, generator=gen).to(dtype)
        eager_runs0 = state.eager_runs if state else 0
        try:
            with torch.no_grad():
                enc.enable_cg = True
                out = vm(pixel_values=pixels, output_hidden_states=False, return_dict=True).last_hidden_state.clone()
                enc.enable_cg = False
                ref = vm(pixel_values=pixels, output_hidden_states=False, return_dict=True).last_hidden_state.clone()
                layout = runner_layout_eager(runner, vm.embeddings(pixels))
        except Exception as exc:  # noqa: BLE001 - recorded; the verdict fails
            failures.append(f"request {i} tiles {tiles}: {type(exc).__name__}: {exc}")
            continue
        finally:
            enc.enable_cg = True
        path = "eager" if state and state.eager_runs > eager_runs0 else "replay"
        d, dl = diff(out, ref), diff(out, layout)
        rows.append({"tiles": tiles, "batch": batch, "path": path, "finite": bool(torch.isfinite(out).all()),
                     **d, "layout_bitwise": dl["bitwise"], "layout_max_abs_diff": dl["max_abs_diff"]})
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return {"requests": rows, "failures": failures, "seconds": round(time.perf_counter() - t0, 2),
            "graphs_captured_after_startup": len(runner.graphs) - graphs0,
            "capture_guard_count": (state.captures_after_startup if state else 0) - guard0,
            "fa4_compiles_after_startup": fa4.kernel_cache().compile_count() - compiles0,
            "jit_monitor_compiles_after_warmup": jit_monitor.compiles_after_warmup() - jit0,
            "graphs_at_end": len(runner.graphs)}


# ----------------------------------------------------------------------------------------- verdict

def verdict(result: dict, min_requests: int = 100, tolerance: float = 0.0) -> dict:
    """What must hold: the startup chain ran the FA4 warmup before the InternVL capture, which
    captured one graph per tile count the config allows (1..max tiles + thumbnail) and sealed the
    runner; every request ran (>= min_requests, single images and batches, every tile count, some
    replays), finite, the graph output within ``tolerance`` (0: bitwise) of the eager model on the
    same pixels; after startup 0 graphs captured and 0 FA4 compiles."""
    s, r = result["startup"], result["serving"]
    rows = r["requests"]
    expected = list(range(1, image_tiles(result["max_tiles"], result["thumbnail"]) + 1))
    diffs = [row["max_abs_diff"] for row in rows if row["max_abs_diff"] is not None]
    v = {"startup_graphs": s.get("graphs", 0),
         "startup_graphs_expected": len(expected),
         "startup_shapes_ok": s.get("tile_batches") == expected and s.get("graph_keys") == [[b, s.get("tokens_per_tile")]
                                                                                              for b in expected],
         "sealed": bool(s.get("sealed")),
         "warmup_before_capture": bool(s.get("warmup_before_capture")),
         "requests": len(rows), "failures": len(r["failures"]),
         "single_image": sum(len(row["tiles"]) == 1 for row in rows),
         "multi_image": sum(len(row["tiles"]) > 1 for row in rows),
         "single_tile_counts_seen": sorted({row["batch"] for row in rows if len(row["tiles"]) == 1}),
         "replays": sum(row["path"] == "replay" for row in rows),
         "eager_above_graphs": sum(row["path"] == "eager" for row in rows),
         "all_finite": all(row["finite"] for row in rows),
         "bitwise_equal": sum(row["bitwise"] for row in rows),
         "max_abs_diff": max(diffs) if diffs else None,
         "layout_bitwise_equal": sum(bool(row["layout_bitwise"]) for row in rows),
         "captures_after_startup": r["graphs_captured_after_startup"] + r["capture_guard_count"],
         "compiles_after_startup": r["fa4_compiles_after_startup"] + r["jit_monitor_compiles_after_warmup"],
         "tolerance": tolerance}
    singles = sorted({image_tiles(n, result["thumbnail"]) for n in range(1, result["max_tiles"] + 1)})
    v["ok"] = (v["startup_graphs"] == len(expected) and v["startup_shapes_ok"] and v["sealed"]
               and v["warmup_before_capture"] and v["requests"] >= min_requests and v["failures"] == 0
               and v["multi_image"] > 0 and v["single_tile_counts_seen"] == singles and v["replays"] > 0
               and v["all_finite"] and len(diffs) == len(rows) and (max(diffs) if diffs else 1.0) <= tolerance
               and (tolerance > 0 or v["bitwise_equal"] == len(rows))
               and v["captures_after_startup"] == 0 and v["compiles_after_startup"] == 0)
    return v


def markdown(result: dict) -> str:
    meta, s, r, v = result["meta"], result["startup"], result["serving"], result["verdict"]
    sg = meta.get("sglang", {})
    lines = [f"# InternVL ViT graphs captured at startup (SGLang {sg.get('sglang_version', '?')}, "
             f"{meta.get('gpu', {}).get('name', '?')})", "", f"Command: `{meta['command']}`", "",
             f"SGLang's InternVisionModel, InternViT-300M config (random bf16 weights), {sg.get('mm_attention_backend')}; "
             f"env {result['env']}; plugin features: {', '.join(sg.get('plugin_hooked') or [])}.", "",
             f"Images of 1..{result['max_tiles']} tiles (config {result.get('config_max_tiles')}, SGLang's "
             f"processor {result.get('processor_max_tiles')}), thumbnail {result['thumbnail']}.", "",
             f"- verdict: **{'ok' if v['ok'] else 'FAILED'}**",
             f"- startup (SGLang's wrapper chain of ModelRunner.load_model's {len(s['load_model_hooks'])} hooks; "
             f"{s['server_load_model_hook_depth']} applied on the real method): "
             + "; ".join(f"{h['hook'].rsplit('.', 1)[-1]} {h['seconds']} s, +{h['allocated_mib']} MiB allocated, "
                         f"+{h['reserved_mib']} MiB reserved" for h in s["load_model_hooks"]),
             f"- graphs captured at startup: **{v['startup_graphs']}** (expected {v['startup_graphs_expected']}: tiles "
             f"{s.get('tile_batches')} of {s.get('tokens_per_tile')} tokens), in {s.get('capture_s')} s, "
             f"{s.get('graph_mib')} MiB allocated (estimate {s.get('estimate_mib')} MiB), "
             f"{s.get('capture_reserved_mib')} MiB reserved; FA4 warmup {s.get('warmup_s')} s, before the capture: "
             f"{v['warmup_before_capture']}; runner sealed: {v['sealed']}",
             f"- requests: {v['requests']} ({v['single_image']} single images, {v['multi_image']} batches of 2+ images; "
             f"{v['replays']} replayed a startup graph, {v['eager_above_graphs']} above the largest ran eagerly); "
             f"failures {v['failures']}; all finite {v['all_finite']}; {r['seconds']} s",
             f"- graph output vs the eager model on the same pixels: bitwise equal **{v['bitwise_equal']} of "
             f"{v['requests']}**, max |diff| {v['max_abs_diff']} (tolerance {v['tolerance']}); vs the layers run "
             f"eagerly with the runner's layout: bitwise {v['layout_bitwise_equal']} of {v['requests']}",
             f"- after startup: graphs captured **{v['captures_after_startup']}** (runner "
             f"{r['graphs_captured_after_startup']}, capture guard {r['capture_guard_count']}), FA4 compiles "
             f"**{v['compiles_after_startup']}** (dispatch {r['fa4_compiles_after_startup']}, JIT monitor "
             f"{r['jit_monitor_compiles_after_warmup']})", ""]
    if r["failures"]:
        lines += ["Failures:", "", *[f"- `{f}`" for f in r["failures"][:10]], ""]
    lines += ["| encoder batch (tiles) | requests | path | bitwise | max abs diff |", "|---|---|---|---|---|"]
    by: dict = {}
    for row in r["requests"]:
        by.setdefault((row["batch"], row["path"]), []).append(row)
    for (batch, path), rs in sorted(by.items()):
        d = [x["max_abs_diff"] for x in rs if x["max_abs_diff"] is not None]
        lines.append(f"| {batch} | {len(rs)} | {path} | {sum(x['bitwise'] for x in rs)}/{len(rs)} | "
                     f"{max(d) if d else '-'} |")
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="output folder")
    ap.add_argument("--requests", type=int, default=120, help="requests (>= 100 for an ok verdict)")
    ap.add_argument("--max-tiles", type=int, default=12, help="the config's max_dynamic_patch")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tolerance", type=float, default=0.0,
                    help="max |graph - eager| allowed (default 0: bitwise equal required)")
    ap.add_argument("--tag", default="", help="suffix of the output file names")
    return ap


def processor_max_tiles():
    """SGLang's InternVL processor's default tile count (it applies it whatever the config says), or
    None when the processor cannot be imported here."""
    try:
        from sglang.srt.multimodal.processors.internvl import InternVLProcessor
    except Exception:  # noqa: BLE001 - then the config alone decides
        return None
    return int(InternVLProcessor.IMAGE_MAX_NUM)


def run_check(args, device: str = "cuda", config=None, dtype=None, meta: dict | None = None) -> dict:
    """Startup then the requests (SGLang prepared, plugins loaded); the result with its verdict."""
    from benchmark.sglang_on_gpu.sglang_towers import internvl_config

    config = config or internvl_config(max_dynamic_patch=args.max_tiles)
    mr, start = startup(args.seed, device, config, dtype)
    proc = processor_max_tiles()
    # the tiles per image a server sees: the config's, raised to the processor's default
    result = {"meta": meta or {}, "env": ENV, "config_max_tiles": int(config.max_dynamic_patch),
              "processor_max_tiles": proc, "max_tiles": max(int(config.max_dynamic_patch), proc or 0),
              "thumbnail": bool(config.use_thumbnail), "startup": start}
    print(f"[internvl_graphs] startup: {json.dumps({k: v for k, v in start.items() if k != 'graph_keys'})}", flush=True)
    if start.get("runners") != 1:
        result["serving"] = {"requests": [], "failures": [f"{start.get('runners')} InternVL runners found, expected 1"],
                             "seconds": 0, "graphs_captured_after_startup": 0, "capture_guard_count": 0,
                             "fa4_compiles_after_startup": 0, "jit_monitor_compiles_after_warmup": 0}
    else:
        reqs = make_requests(random.Random(args.seed), args.requests, result["max_tiles"], result["thumbnail"])
        result["serving"] = serve(mr.model, reqs, args.seed + 1, device)
    result["verdict"] = verdict(result, tolerance=args.tolerance)
    return result


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from benchmark.sglang_on_gpu.sglang_towers import prepare_sglang

    info = prepare_sglang("fa4", ENV)
    from sglang_fa4.bench.meta import base_meta

    meta = base_meta("internvl_graphs", sys.argv if argv is None else ["check_internvl_graphs.py", *argv])
    meta.update(sglang=info)
    result = run_check(args, "cuda", meta=meta)
    from benchmark.sglang_on_gpu.sglang_towers import result_stem

    stem = result_stem("internvl_graphs", info["sglang_version"], args.tag)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.json").write_text(json.dumps(result, default=str, separators=(",", ":")))
    (args.out / f"{stem}.md").write_text(markdown(result))
    print(markdown(result))
    return 0 if result["verdict"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
