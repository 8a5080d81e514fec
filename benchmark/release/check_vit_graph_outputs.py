"""ViT CUDA-graph outputs own their memory, on the GPU, through the REAL SGLang towers (issue #12).

SGLang keeps what a vision tower returns (the multimodal embedding cache, chunked prefill), so an
output that is a view of a graph's static buffer is silently rewritten by the next replay of the same
graph. Per tower, in graph mode with sglang_fa4 loaded by SGLang's plugin loader (fa4):

  * Qwen2.5-VL-7B and Qwen3-VL-8B towers (random weights): >= 200 interleaved forwards of random
    image/video mixes through the startup budget graphs (SGLANG_FA4_VIT_GRAPH_BUDGETS_ENABLE=1), and
    through SGLang's own exact-layout graphs (budgets off; a small pool of layouts so every graph
    replays for other images);
  * the InternViT-300M encoder (InternVL, InternS1): >= 200 forwards of 1..7 448x448 tiles through
    SGLang's InternVL runner;

every output is held, uncloned, next to a copy taken when it was returned; after the pass, each held
output is compared with its copy (0 may differ). Also: what the copy that makes an output its own
costs per image size (CUDA events, median), against the tower's graph forward.

usage (GPU machine, SGLang importable; see benchmark/sglang_on_gpu/README.md):
  python3 benchmark/release/check_vit_graph_outputs.py --out DIR [--forwards 200]
Writes DIR/vit_graph_outputs[-<version>].json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]



def hold_pass(forward, inputs) -> dict:
    """Run ``forward`` over ``inputs`` holding every output; count those that changed afterwards."""
    import torch

    held = []
    with torch.no_grad():
        for x in inputs:
            out = forward(*x)
            held.append((out, out.clone()))
    torch.cuda.synchronize()
    changed = [i for i, (out, snap) in enumerate(held) if not torch.equal(out, snap)]
    finite = all(bool(torch.isfinite(snap).all()) for _, snap in held)
    return {"forwards": len(held), "held_outputs_changed": len(changed), "first_changed": changed[:8],
            "all_finite": finite}


def copy_cost_ms(shape, dtype, rounds: int = 50) -> float:
    """GPU time of one clone of a tensor of ``shape`` (CUDA events around each, median)."""
    import torch

    from sglang_fa4.bench.timing import event_time_ms

    src = torch.randn(shape, device="cuda").to(dtype)
    for _ in range(5):
        src.clone()
    return statistics.median(event_time_ms(src.clone, 1) for _ in range(rounds))


def check_qwen(model: str, args, seed: int) -> dict:
    import torch

    from benchmark.release.check_vit_graphs import random_mix
    from sglang_fa4.integration import vit_budgets
    from sglang_fa4.startup import warmup
    from sglang_fa4.bench.layouts import PICTURES
    from benchmark.sglang_on_gpu.sglang_towers import build_tower, grid_of, pixels, set_graph_mode

    set_graph_mode(None, True)  # Qwen2.5-VL builds its runner only when the flag is on at __init__
    tower = build_tower(model, seed=seed)
    set_graph_mode(tower, True)

    class Holder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.visual = tower

    holder = Holder()
    warmup.warm_model(holder)
    (runner,) = vit_budgets.find_runners(holder)
    res: dict = {"model": model}

    def forward(x, grid):
        return tower(x, grid)

    # SGLang's own exact-layout graphs first (budgets not captured yet): a pool of 6 layouts
    rng = random.Random(seed)
    pool = [random_mix(rng, model, 4096) for _ in range(6)]
    inputs = [pixels(tower, pool[i % len(pool)], seed=10_000 + i) for i in range(args.exact_forwards)]
    graphs0 = len(runner.block_graphs)
    res["exact_layout"] = hold_pass(forward, inputs)
    res["exact_layout"]["graphs_captured"] = len(runner.block_graphs) - graphs0
    del inputs

    # the startup budget graphs, random mixes up to 1.25x the largest budget (some run eagerly)
    with torch.no_grad():
        state = vit_budgets.capture_budgets(runner, **vit_budgets.infer_capture_dims(tower))
    rng = random.Random(seed + 1)
    inputs = [pixels(tower, random_mix(rng, model, max(state.budgets) * 5 // 4), seed=20_000 + i)
              for i in range(args.forwards)]
    replays0, eager0 = state.replays, state.eager_runs
    res["budgets"] = hold_pass(forward, inputs)
    res["budgets"].update(replays=state.replays - replays0, eager_runs=state.eager_runs - eager0,
                          captures_after_startup=state.captures_after_startup)
    del inputs

    # what the copy costs per picture (output rows x width, as the runner returns them)
    costs = []
    for name in ("448", "720p", "1080p", "4k"):
        w, h, f = PICTURES[name]
        grids = [grid_of(model, w, h, f)]
        x, grid = pixels(tower, grids, seed=7)
        with torch.no_grad():
            out = tower(x, grid)
            for _ in range(3):
                tower(x, grid)
            torch.cuda.synchronize()
            t = []
            for _ in range(10):
                t0 = time.perf_counter()
                tower(x, grid)
                torch.cuda.synchronize()
                t.append((time.perf_counter() - t0) * 1e3)
        copy = copy_cost_ms(tuple(out.shape), out.dtype)
        tower_ms = statistics.median(t)
        costs.append({"image": name, "tokens": sum(a * b * c for a, b, c in grids), "output_shape": list(out.shape),
                      "output_mib": round(out.numel() * out.element_size() / 2**20, 2),
                      "copy_us": round(copy * 1e3, 1), "tower_graph_ms": round(tower_ms, 2),
                      "copy_share": round(copy / tower_ms, 5)})
    res["copy_cost"] = costs
    set_graph_mode(tower, False)
    del tower, holder, runner
    torch.cuda.empty_cache()
    return res


def check_internvit(args, seed: int) -> dict:
    import torch

    from benchmark.sglang_on_gpu.sglang_towers import INTERNVIT_300M, TILE_TOKENS, build_internvit, set_graph_mode

    set_graph_mode(None, True)  # the encoder builds its runner when the flag is on at __init__
    enc = build_internvit(seed, part="encoder")
    runner = enc.cuda_graph_runner
    gen = torch.Generator(device="cuda").manual_seed(seed)
    rng = random.Random(seed)

    def forward(x):
        out = enc(inputs_embeds=x, return_dict=True)
        return out.last_hidden_state

    inputs = [(torch.randn(rng.randint(1, 7), TILE_TOKENS, INTERNVIT_300M["hidden_size"], device="cuda",
                           generator=gen).to(torch.bfloat16),) for _ in range(args.forwards)]
    res = {"model": "internvit_300m", "runner": type(runner).__name__}
    res["runner_graphs"] = hold_pass(forward, inputs)
    res["runner_graphs"]["graphs_captured"] = len(runner.graphs)
    set_graph_mode(None, False)
    del enc, runner, inputs
    torch.cuda.empty_cache()
    return res


def markdown(result: dict) -> str:
    lines = [f"# ViT graph outputs own their memory (SGLang {result['sglang_version']}, {result['gpu']})", "",
             f"`{result['command']}`", "",
             "Every output of each pass held uncloned, compared after the pass with a copy taken when it was "
             "returned.", "",
             "| tower | graph path | forwards | graphs / replays | held outputs changed | finite |",
             "|---|---|---|---|---|---|"]
    for r in result["towers"]:
        for path in ("exact_layout", "budgets", "runner_graphs"):
            if path in r:
                p = r[path]
                extra = p.get("graphs_captured", p.get("replays"))
                lines.append(f"| {r['model']} | {path} | {p['forwards']} | {extra} | "
                             f"**{p['held_outputs_changed']}** | {p['all_finite']} |")
    lines += ["", "What the copy costs (GPU time of one clone of the tower output, median of 50):", "",
              "| tower | image | tokens | output MiB | copy us | tower graph ms | share |", "|---|---|---|---|---|---|---|"]
    for r in result["towers"]:
        for c in r.get("copy_cost", []):
            lines.append(f"| {r['model']} | {c['image']} | {c['tokens']} | {c['output_mib']} | {c['copy_us']} | "
                         f"{c['tower_graph_ms']} | {c['copy_share'] * 100:.2f}% |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--forwards", type=int, default=200)
    ap.add_argument("--exact-forwards", type=int, default=60)
    ap.add_argument("--towers", nargs="+", default=["qwen2_5_vl", "qwen3_vl", "internvit"])
    args = ap.parse_args(argv)
    import torch

    from benchmark.sglang_on_gpu.sglang_towers import prepare_sglang

    # budgets registered (captured by hand per tower, after its exact-layout pass)
    info = prepare_sglang("fa4", env={"SGLANG_VIT_ENABLE_CUDA_GRAPH": "1", "SGLANG_FA4_VIT_GRAPH_BUDGETS_ENABLE": "1",
                                      "SGLANG_FA4_JIT_MONITOR": "warn"})
    result = {"command": "python3 " + " ".join([os.path.relpath(__file__, ROOT)] + list(argv or sys.argv[1:])),
              "gpu": torch.cuda.get_device_name(), **info, "towers": []}
    for i, tower in enumerate(args.towers):
        t0 = time.perf_counter()
        r = check_internvit(args, seed=i) if tower == "internvit" else check_qwen(tower, args, seed=i)
        r["seconds"] = round(time.perf_counter() - t0, 1)
        result["towers"].append(r)
        print(json.dumps({k: v for k, v in r.items() if k != "copy_cost"}), flush=True)
    changed = sum(r[p]["held_outputs_changed"] for r in result["towers"]
                  for p in ("exact_layout", "budgets", "runner_graphs") if p in r)
    result["held_outputs_changed_total"] = changed
    args.out.mkdir(parents=True, exist_ok=True)
    from benchmark.sglang_on_gpu.sglang_towers import result_stem

    stem = result_stem("vit_graph_outputs", result["sglang_version"])
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=1))
    (args.out / f"{stem}.md").write_text(markdown(result))
    print(markdown(result))
    return 0 if changed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
