"""Tower-level GPU validation of the startup ViT graph budgets (issue #4), through the REAL SGLang.

SGLang's own Qwen2.5-VL (7B vision config: windowed + full blocks) and Qwen3-VL (8B vision config:
full blocks + deepstack mergers) towers, random bf16 weights, fa4 backend, sglang_fa4 loaded by
SGLang's plugin loader (benchmark/sglang_on_gpu/sglang_towers.py). Startup as the plugin does it
after ModelRunner.load_model: the FA4 variant warmup, then one graph per token budget
(SGLANG_FA4_VIT_GRAPH_BUDGETS); the JIT monitor set to raise. Then, per model:

  * >= 20 random mixes of images (and short videos): the tower's CUDA-graph forward (budget replay,
    or eager above the largest budget) against its eager forward on the same input -- relative
    error and max abs difference, finite output;
  * FA4 configurations resolved and ViT graphs captured after startup (must both be 0);
  * per-image latency, graph vs eager, for 448x448, 720p, 1080p and 4K: wall time of the whole
    tower call (host preparation included) with a device sync after each call, rounds that
    interleave the two modes (order alternating); eager / graph is the median of the per-round
    ratios, their range beside it;
  * startup cost: warmup and capture seconds, graph memory (allocator delta, per budget).

usage (GPU machine, SGLang importable; see benchmark/sglang_on_gpu/README.md):
  python3 benchmark/release/check_vit_graphs.py --out DIR [--models qwen2_5_vl qwen3_vl] [--mixes 20]
Writes DIR/vit_graphs.json and .md (the latest supported SGLang; others: vit_graphs-<version>.*).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PICTURES = ("448", "720p", "1080p", "4k")
# bf16 towers, same weights and input; graph and eager differ in GEMM row counts (padding) and
# Qwen3-VL's position-embedding path, so agreement is to bf16 rounding, not bitwise
REL_TOL = 2e-2


def random_mix(rng: random.Random, model: str, max_tokens: int) -> list[tuple[int, int, int]]:
    from benchmark.sglang_on_gpu.sglang_towers import grid_of

    while True:
        grids = []
        for _ in range(rng.randint(1, 4)):
            if rng.random() < 0.15:
                grids.append(grid_of(model, rng.choice((320, 480, 640)), rng.choice((240, 360)), rng.choice((2, 4, 8))))
            else:
                grids.append(grid_of(model, rng.randint(160, 1920), rng.randint(160, 1440)))
        if sum(t * h * w for t, h, w in grids) <= max_tokens:
            return grids


def rel_err(a, b) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def call_ms(tower, x, grid, graph: bool) -> float:
    import torch

    from benchmark.sglang_on_gpu.sglang_towers import set_graph_mode

    set_graph_mode(tower, graph)
    with torch.no_grad():
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        tower(x, grid)
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


def tower_profile(tower, x, grid) -> dict:
    """vit_graph_profile.compare of one whole tower call in eager and in graph mode (what
    ``call_ms`` times): which kernels make up a difference between the two columns."""
    import torch

    from benchmark.sglang_on_gpu.sglang_towers import set_graph_mode
    from benchmark.release.vit_graph_profile import compare

    def call(graph: bool):
        set_graph_mode(tower, graph)
        with torch.no_grad():
            return tower(x, grid)

    return compare({"tower_eager": lambda: call(False), "tower_graph": lambda: call(True)}, top=16)


def blocks_ms(tower, runner, state, hooked_run, recorded, x, grid, rounds: int, profile: bool = False) -> dict:
    """GPU time (CUDA events, medians of interleaved rounds) of the runner's part alone -- the
    blocks and mergers, on the inputs the tower's graph forward prepared: the budget graph replay,
    SGLang's own graph for this exact layout (captured here, once: budgets unsealed), and the same
    blocks run eagerly. Separates the cost of budget padding from the tower's input preparation."""
    import torch

    from sglang_fa4.integration import vit_budgets
    from sglang_fa4.bench.timing import event_time_ms, host_submit_us

    recorded.clear()
    with torch.no_grad():  # the graph path's preparation: records this picture's runner inputs
        tower.forward_with_cuda_graph(x, grid)
    kwargs = dict(recorded)
    eager_kwargs = {k: v for k, v in kwargs.items() if k != "attention_layout_key"}

    def exact():
        state.sealed = False
        try:
            return hooked_run(**dict(kwargs, x=x0.clone()))
        finally:
            state.sealed = True

    # every call gets a fresh copy of x: SGLang's blocks overwrite their input in place (fused
    # residual-add RMSNorm), which the eager paths would otherwise feed back to the next call
    x0 = kwargs["x"]
    paths = {"budget_graph": lambda: hooked_run(**dict(kwargs, x=x0.clone())), "sglang_exact_graph": exact,
             "eager_blocks": lambda: vit_budgets.eager_run(runner, **dict(eager_kwargs, x=x0.clone()))}
    times = {k: [] for k in paths}
    with torch.no_grad():
        for fn in paths.values():  # warm (and capture the exact-layout graph)
            fn()
        for r in range(rounds):
            for k in (list(paths) if r % 2 == 0 else list(paths)[::-1]):
                times[k].append(event_time_ms(paths[k], 1))
    out = {k: round(statistics.median(v), 3) for k, v in times.items()}
    # where a single call's time goes, for the two graph paths: the host's time per call (the clock
    # stopped when the 4th call returns, before the GPU is waited for) and the GPU's time per call
    # of 4 calls back to back (the host runs ahead of the GPU, so launch gaps between calls vanish)
    graphs = ("budget_graph", "sglang_exact_graph")
    with torch.no_grad():
        out["host_us"] = {k: round(statistics.median(host_submit_us(paths[k], 4)[0] for _ in range(3)), 1)
                          for k in graphs}
        out["back_to_back_ms"] = {k: round(statistics.median(event_time_ms(paths[k], 4) for _ in range(3)), 3)
                                  for k in graphs}
    if profile:
        from benchmark.release.vit_graph_profile import compare

        with torch.no_grad():
            out["profile"] = compare(paths)
    return out


#: fixed mixes of the batch-invariance check (pictures of sglang_fa4.bench.layouts.PICTURES): one
#: inside a budget, two whose sum is above the largest budget although each image fits one alone
INVARIANCE_MIXES = (("448", "720p"), ("1080p", "1080p"), ("1080p", "448", "720p"))


def batch_invariance(tower, model: str, state, rng: random.Random, n_random: int, grids_given=(),
                     max_tokens: int = 0) -> list[dict]:
    """Each image's rows of a batched tower call against the same image sent alone, in graph mode
    and in eager mode: what a server gives a request must not depend on the requests it was
    batched with (the server check compares greedy outputs; this finds which path differs).
    Returns per mix and mode: the paths taken (budget replay / eager) and the largest |difference|
    of any image's rows (0 = bitwise). ``grids_given``: more mixes as [[t, h, w], ...] (e.g. a server's
    ViT calls, from its log); ``max_tokens``: the random mixes' size cap (default twice the largest
    budget)."""
    import torch

    from sglang_fa4.bench.layouts import PICTURES as SIZES
    from benchmark.sglang_on_gpu.sglang_towers import grid_of, pixels, set_graph_mode

    mixes = [[grid_of(model, *SIZES[name]) for name in names] for names in INVARIANCE_MIXES]
    mixes += [[tuple(int(v) for v in g) for g in mix] for mix in grids_given]
    fixed = len(mixes)
    while len(mixes) < fixed + n_random:
        grids = random_mix(rng, model, max_tokens or max(state.budgets) * 2)
        if len(grids) >= 2:
            mixes.append(grids)
    rows_out = []
    for i, grids in enumerate(mixes):
        x, grid = pixels(tower, grids, seed=5000 + i)
        sizes = [t * h * w for t, h, w in grids]
        starts = [sum(sizes[:j]) for j in range(len(sizes))]
        row = {"grids": [list(g) for g in grids], "tokens": sum(sizes)}
        for graph in (True, False):
            set_graph_mode(tower, graph)
            with torch.no_grad():
                r0 = state.replays
                batched = tower(x, grid).clone()
                path = "replay" if state.replays > r0 else "eager"
                merge = sum(sizes) // batched.shape[0]
                diffs, alone_paths = [], []
                for start, size, g in zip(starts, sizes, grids):
                    r0 = state.replays
                    alone = tower(x[start:start + size].clone(), torch.tensor([g], dtype=torch.int64))
                    alone_paths.append("replay" if state.replays > r0 else "eager")
                    mine = batched[start // merge:(start + size) // merge]
                    diffs.append(float((mine.float() - alone.float()).abs().max()))
            row["graph" if graph else "eager"] = {"batched_path": path, "alone_paths": alone_paths,
                                                  "max_abs_diff": max(diffs)}
        rows_out.append(row)
    set_graph_mode(tower, False)
    return rows_out


def startup_capture(holder, res: dict, name: str):
    """What the plugin does after ModelRunner.load_model: the FA4 variant warmup, then the budget
    graphs; seconds, the warmup report, the budgets and the allocator's growth into ``res``.
    Returns the budget state and the runner of the one budget-captured runner of ``holder``."""
    import torch

    from sglang_fa4.integration import vit_budgets
    from sglang_fa4.startup import warmup

    t0 = time.perf_counter()
    wrep = warmup.warm_model(holder)
    torch.cuda.synchronize()
    res["warmup_s"] = round(time.perf_counter() - t0, 2)
    res["warmup"] = wrep.as_dict() if wrep is not None else None
    reserved0 = torch.cuda.memory_reserved()
    t0 = time.perf_counter()
    states = vit_budgets.capture_model_budgets(holder)
    torch.cuda.synchronize()
    res["capture_s"] = round(time.perf_counter() - t0, 2)
    if len(states) != 1:
        raise RuntimeError(f"{name}: expected one budget-captured runner, got {len(states)}")
    res["budgets"] = states[0].report()
    res["reserved_delta_mib"] = round((torch.cuda.memory_reserved() - reserved0) / 2**20, 1)
    return states[0], vit_budgets.find_runners(holder)[0]


def record_runner_inputs(runner):
    """Wrap ``runner.run`` to keep what the graph path hands it, so the same blocks can run eagerly
    on exactly those inputs (vit_budgets.eager_run): isolates the budget graphs from the tower's own
    input preparation, which differs between SGLang's eager and graph forwards (Qwen3-VL). Returns
    (the recorded kwargs, cleared per call; the wrapped run)."""
    recorded: dict = {}
    hooked_run = runner.run

    def recording_run(**kwargs):
        recorded.clear()
        recorded.update(kwargs, x=kwargs["x"].clone())  # SGLang's blocks overwrite their input
        return hooked_run(**kwargs)

    runner.run = recording_run
    return recorded, hooked_run


def graph_eager_same(tower, runner, recorded: dict, x, grid):
    """The tower's graph forward, its eager forward, and the runner's blocks run eagerly on the
    inputs the graph path prepared (the tower's eager output where the graph path was left before
    the runner: Qwen2.5-VL above the budgets)."""
    import torch

    from sglang_fa4.integration import vit_budgets
    from benchmark.sglang_on_gpu.sglang_towers import set_graph_mode

    with torch.no_grad():
        set_graph_mode(tower, True)
        recorded.clear()
        out_g = tower(x, grid).clone()
        set_graph_mode(tower, False)
        out_e = tower(x, grid).clone()
        if recorded:
            inputs = {k: v for k, v in recorded.items() if k != "attention_layout_key"}
            out_same = vit_budgets.eager_run(runner, **inputs).clone()
        else:
            out_same = out_e
    return out_g, out_e, out_same


def check_model(model: str, args, seed: int) -> dict:
    import torch

    from sglang_fa4.kernels import fa4
    from sglang_fa4.startup import jit_monitor
    from benchmark.sglang_on_gpu.sglang_towers import build_tower, grid_of, pixels, set_graph_mode

    jit_monitor.reset_state()  # each model stands for its own server process (JIT monitor state)
    set_graph_mode(None, True)  # Qwen2.5-VL builds its runner only when the flag is on at __init__
    tower = build_tower(model, seed=seed)
    holder = torch.nn.Module()
    holder.visual = tower  # what the plugin's startup hooks scan (model.modules())
    res: dict = {"model": model}

    # SGLang JIT-compiles its elementwise kernels (nvcc) at first use: one eager forward first, so
    # the startup numbers below are ours (in a server the LLM's warmup has compiled most of them)
    x, grid = pixels(tower, [grid_of(model, 448, 448)], seed=1)
    t0 = time.perf_counter()
    set_graph_mode(tower, False)
    with torch.no_grad():
        tower(x, grid)
    torch.cuda.synchronize()
    res["first_eager_forward_s"] = round(time.perf_counter() - t0, 2)
    set_graph_mode(tower, True)
    state, runner = startup_capture(holder, res, model)
    graphs0 = len(runner.block_graphs)
    compiles0 = fa4.kernel_cache().compile_count()
    recorded, hooked_run = record_runner_inputs(runner)
    rng = random.Random(seed)
    mixes, failures, kept = [], [], []
    for i in range(args.mixes):
        # up to 1.25x the largest budget: some mixes take the eager path above it
        grids = random_mix(rng, model, max(state.budgets) * 5 // 4)
        x, grid = pixels(tower, grids, seed=1000 + i)
        replays0, eager0 = state.replays, state.eager_runs
        try:
            out_g, out_e, out_same = graph_eager_same(tower, runner, recorded, x, grid)
        except Exception as exc:  # noqa: BLE001 - recorded, the check fails below
            failures.append(f"mix {i} {grids}: {type(exc).__name__}: {exc}")
            continue
        tokens = sum(t * h * w for t, h, w in grids)
        row = {"grids": [list(g) for g in grids], "tokens": tokens,
               "budget": state.last_budget if state.replays > replays0 else None,
               "path": "replay" if state.replays > replays0 else ("eager" if state.eager_runs > eager0 else "?"),
               "shape_equal": list(out_g.shape) == list(out_e.shape),
               "finite": bool(torch.isfinite(out_g).all()),
               "rel_err": rel_err(out_g, out_e) if out_g.shape == out_e.shape else None,
               "max_abs_diff": float((out_g.float() - out_e.float()).abs().max()) if out_g.shape == out_e.shape else None,
               "same_input_rel_err": rel_err(out_g, out_same) if out_g.shape == out_same.shape else None,
               "same_input_max_abs_diff": (float((out_g.float() - out_same.float()).abs().max())
                                           if out_g.shape == out_same.shape else None)}
        if len(kept) < args.upstream_mixes:
            kept.append((x, grid, out_g, out_e))
        row["ok"] = (row["shape_equal"] and row["finite"] and row["same_input_rel_err"] is not None
                     and row["same_input_rel_err"] <= REL_TOL)
        mixes.append(row)
    res["mixes"] = mixes
    res["mix_failures"] = failures
    res["fa4_compiles_after_startup"] = fa4.kernel_cache().compile_count() - compiles0
    res["jit_monitor_compiles_after_warmup"] = jit_monitor.compiles_after_warmup()
    res["graphs_captured_after_startup"] = len(runner.block_graphs) - graphs0
    res["capture_guard_count"] = state.captures_after_startup

    latency = []
    for name in args.pictures:
        from sglang_fa4.bench.layouts import PICTURES as SIZES

        w, h, f = SIZES[name]
        grids = [grid_of(model, w, h, f)]
        x, grid = pixels(tower, grids, seed=7)
        n = args.rounds
        for graph in (False, True):  # warm both paths (allocator, caches)
            call_ms(tower, x, grid, graph)
        times = {"eager": [], "graph": []}
        state.last_budget = None  # the rounds' graph calls leave the budget this picture replays in
        for r in range(n):
            for graph in ((False, True) if r % 2 == 0 else (True, False)):
                times["graph" if graph else "eager"].append(call_ms(tower, x, grid, graph))
        tokens = sum(t * hh * ww for t, hh, ww in grids)
        e, g = statistics.median(times["eager"]), statistics.median(times["graph"])
        per_round = [a / b for a, b in zip(times["eager"], times["graph"])]  # same round, adjacent calls
        latency.append({"image": name, "grid_thw": list(grids[0]), "tokens": tokens,
                        "budget": state.last_budget,
                        "eager_ms": round(e, 3), "graph_ms": round(g, 3),
                        "eager_over_graph": round(statistics.median(per_round), 3),
                        "eager_over_graph_range": [round(min(per_round), 3), round(max(per_round), 3)],
                        "rounds": n, "eager_all_ms": [round(v, 3) for v in times["eager"]],
                        "graph_all_ms": [round(v, 3) for v in times["graph"]],
                        "blocks_ms": blocks_ms(tower, runner, state, hooked_run, recorded, x, grid, n,
                                               profile=name in args.profile)})
        if name in args.profile:  # the whole tower call, eager and graph mode, kernel time by name
            latency[-1]["tower_profile"] = tower_profile(tower, x, grid)
    res["latency"] = latency
    res["batch_invariance"] = batch_invariance(tower, model, state, random.Random(seed + 1), args.invariance_mixes,
                                               grids_given=args.invariance_grids.get(model, ()),
                                               max_tokens=args.invariance_max_tokens)

    # SGLang's own per-layout graph (budgets unsealed: upstream's run captures one for this layout)
    # on a few mixes: how far upstream's graph forward is from its eager one, against ours
    state.sealed = False
    upstream = []
    for x, grid, out_g, out_e in kept:
        with torch.no_grad():
            set_graph_mode(tower, True)
            out_u = tower(x, grid).clone()
        upstream.append({"tokens": int(x.shape[0]), "upstream_graph_vs_eager_rel_err": rel_err(out_u, out_e),
                         "budget_graph_vs_upstream_graph_rel_err": rel_err(out_g, out_u),
                         "budget_graph_vs_eager_rel_err": rel_err(out_g, out_e)})
    state.sealed = True
    res["upstream_graph_comparison"] = upstream
    res["ok"] = (not failures and len(mixes) >= args.mixes and all(m["ok"] for m in mixes)
                 and res["fa4_compiles_after_startup"] == 0 and res["graphs_captured_after_startup"] == 0
                 and all(u["budget_graph_vs_upstream_graph_rel_err"] <= REL_TOL for u in upstream))
    del runner.run
    set_graph_mode(tower, False)
    del tower, holder, state, runner
    torch.cuda.empty_cache()
    return res


def markdown(result: dict) -> str:
    meta = result["meta"]
    lines = [f"# ViT CUDA-graph budgets through SGLang {meta['sglang']['sglang_version']}'s real towers "
             f"({meta['gpu']['name']})", "", f"Command: `{meta['command']}`", "",
             f"Budgets `{meta['budgets']}`, fa4, random bf16 weights; SGLang's plugin loader applied: "
             f"{', '.join(meta['sglang']['plugin_hooked'] or [])}. Stubbed (not on the machine): "
             f"{', '.join(meta['sglang']['stubbed_packages']) or 'nothing'}.", ""]
    for m in result["models"]:
        rep = m["budgets"]
        errs = [r["rel_err"] for r in m["mixes"] if r["rel_err"] is not None]
        same = [r["same_input_rel_err"] for r in m["mixes"] if r["same_input_rel_err"] is not None]
        ups = m["upstream_graph_comparison"]
        paths = [r["path"] for r in m["mixes"]]
        lines += [f"## {m['model']}: {'PASS' if m['ok'] else 'FAIL'}", "",
                  f"- {len(m['mixes'])} random mixes ({paths.count('replay')} replayed a budget graph, "
                  f"{paths.count('eager')} eager); failures: {len(m['mix_failures'])}; all finite: "
                  f"{all(r['finite'] for r in m['mixes'])}",
                  f"- budget graph vs the same blocks run eagerly on the same inputs: rel. error max "
                  f"{max(same):.2e}, median {statistics.median(same):.2e} (bar {REL_TOL})",
                  f"- tower graph forward vs tower eager forward (SGLang prepares their inputs "
                  f"differently): rel. error max {max(errs):.2e}, median {statistics.median(errs):.2e}",
                  f"- SGLang's own per-layout graph on {len(ups)} of the mixes: vs eager "
                  + ", ".join(f"{u['upstream_graph_vs_eager_rel_err']:.2e}" for u in ups)
                  + "; budget graph vs it " + ", ".join(f"{u['budget_graph_vs_upstream_graph_rel_err']:.2e}" for u in ups),
                  f"- after startup: {m['fa4_compiles_after_startup']} FA4 compiles, "
                  f"{m['graphs_captured_after_startup']} graph captures",
                  f"- startup: warmup {m['warmup_s']} s, capture of {rep['graphs']} budget graphs "
                  f"{m['capture_s']} s; graph memory {rep['graph_bytes_total'] / 2**20:.0f} MiB allocated "
                  f"({m['reserved_delta_mib']:.0f} MiB reserved)", "",
                  "Per image: the whole tower call (host preparation included, synced), eager vs graph; "
                  "then the runner's part alone (GPU time): budget graph, SGLang's own graph for the "
                  "exact layout, the same blocks eagerly.", "",
                  "Tower times are medians of the rounds; eager / graph is the median of the per-round ratios "
                  "(the two calls of a round are adjacent), with the range of the rounds.", "",
                  "| image | tokens | budget | tower eager ms | tower graph ms | eager / graph (range) "
                  "| budget graph ms | exact-layout graph ms | budget / exact | eager blocks ms |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in m["latency"]:
            b = r["blocks_ms"]
            span = r.get("eager_over_graph_range")
            span = f" ({span[0]:.2f}-{span[1]:.2f})" if span else ""
            ratio = (f"{b['budget_graph'] / b['sglang_exact_graph']:.2f}x" if r["budget"] and b.get("sglang_exact_graph")
                     else "-")
            lines.append(f"| {r['image']} | {r['tokens']} | {r['budget']} | {r['eager_ms']:.2f} | "
                         f"{r['graph_ms']:.2f} | {r['eager_over_graph']:.3f}x{span} | {b['budget_graph']:.2f} | "
                         f"{b['sglang_exact_graph']:.2f} | {ratio} | {b['eager_blocks']:.2f} |")
        lines.append("")
        if any("host_us" in r["blocks_ms"] for r in m["latency"]):
            lines += ["Where a call's time goes (graph paths): host us per call (4 calls issued back to back, "
                      "the clock stopped before the GPU is waited for) and GPU ms per call of 4 back-to-back calls "
                      "(the host runs ahead, so the GPU time without launch gaps); medians of 3.", "",
                      "| image | host us budget / exact | back-to-back ms budget / exact | budget / exact |",
                      "|---|---|---|---|"]
            for r in m["latency"]:
                b = r["blocks_ms"]
                if "host_us" not in b or not r["budget"]:
                    continue
                h, g = b["host_us"], b["back_to_back_ms"]
                lines.append(f"| {r['image']} | {h['budget_graph']:.0f} / {h['sglang_exact_graph']:.0f} | "
                             f"{g['budget_graph']:.2f} / {g['sglang_exact_graph']:.2f} | "
                             f"{g['budget_graph'] / g['sglang_exact_graph']:.2f}x |")
            lines.append("")
        for r in m["latency"]:
            if r["blocks_ms"].get("profile"):
                from benchmark.release.vit_graph_profile import markdown as profile_markdown

                lines += profile_markdown(m["model"], r["image"], r["blocks_ms"]["profile"])
            if r.get("tower_profile"):
                from benchmark.release.vit_graph_profile import markdown as profile_markdown

                lines += profile_markdown(m["model"], f"{r['image']} (whole tower)", r["tower_profile"])
        if m.get("batch_invariance"):
            lines += ["Batch invariance: each image's rows of a batched call vs the image alone "
                      "(max |difference|; 0 = bitwise), paths batched / alone.", "",
                      "| mix (t,h,w) | tokens | graph mode | paths | eager mode | paths |", "|---|---|---|---|---|---|"]
            for r in m["batch_invariance"]:
                g, e = r["graph"], r["eager"]
                lines.append(f"| {r['grids']} | {r['tokens']} | {g['max_abs_diff']:.3g} | {g['batched_path']} / "
                             f"{','.join(g['alone_paths'])} | {e['max_abs_diff']:.3g} | {e['batched_path']} / "
                             f"{','.join(e['alone_paths'])} |")
            lines.append("")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    from sglang_fa4.environ import envs

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--models", nargs="+", default=["qwen2_5_vl", "qwen3_vl"])
    ap.add_argument("--mixes", type=int, default=20)
    ap.add_argument("--pictures", nargs="+", default=list(PICTURES))
    ap.add_argument("--rounds", type=int, default=10)
    budgets_var = envs.SGLANG_FA4_VIT_GRAPH_BUDGETS
    # the env var's own text form (its default is a typed tuple)
    ap.add_argument("--budgets", default=budgets_var.format(budgets_var.default),
                    help="token budgets, or 'dense' (vit_budget_layouts.dense_ladder) (default: "
                         "SGLANG_FA4_VIT_GRAPH_BUDGETS's default)")
    ap.add_argument("--tag", default="", help="suffix of the output file names")
    ap.add_argument("--profile", nargs="*", default=[],
                    help="pictures whose runner paths and whole tower calls (eager, graph mode) also run once "
                         "under torch.profiler (kernel time by name)")
    ap.add_argument("--shared-pool", action="store_true",
                    help="capture the budget graphs into one memory pool (SGLANG_FA4_VIT_GRAPH_SHARED_POOL=1)")
    ap.add_argument("--budget-route", choices=("smallest", "fastest"), default="smallest",
                    help="which holding budget a batch replays in (SGLANG_FA4_VIT_GRAPH_BUDGET_ROUTE): fastest = "
                         "timed at startup, vit_budget_routing")
    ap.add_argument("--invariance-grids", type=json.loads, default={},
                    help='JSON {model: [[[t, h, w], ...], ...]}: more batch-invariance mixes, e.g. the ViT calls '
                         'of a server log (serve-check "vit call" lines)')
    ap.add_argument("--invariance-max-tokens", type=int, default=0,
                    help="size cap of the random batch-invariance mixes (default: twice the largest budget; the "
                         "H200 servers' multi-image calls reached 45k tokens)")
    ap.add_argument("--invariance-mixes", type=int, default=3,
                    help="random multi-image mixes of the batch-invariance check (besides the fixed ones)")
    ap.add_argument("--batch-invariant", action="store_true",
                    help="turn SGLang's batch-invariant kernels on before the startup (what a server with "
                         "--enable-deterministic-inference runs)")
    ap.add_argument("--upstream-mixes", type=int, default=3,
                    help="mixes also run through SGLang's own per-layout graph, for comparison")
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.budgets == "dense":  # vit_budget_layouts.dense_ladder(): steps of <= 7% (issue #18)
        from sglang_fa4.integration.vit_budget_layouts import dense_ladder

        args.budgets = ",".join(map(str, dense_ladder()))

    from benchmark.sglang_on_gpu.sglang_towers import prepare_sglang

    env = {"SGLANG_VIT_ENABLE_CUDA_GRAPH": "1", "SGLANG_FA4_VIT_GRAPH_BUDGETS_ENABLE": "1",
           "SGLANG_FA4_VIT_GRAPH_BUDGETS": args.budgets, "SGLANG_FA4_JIT_MONITOR": "raise",
           "SGLANG_FA4_VIT_GRAPH_SHARED_POOL": "1" if args.shared_pool else "0",
           "SGLANG_FA4_VIT_GRAPH_BUDGET_ROUTE": args.budget_route}
    info = prepare_sglang("fa4", env, batch_invariant=args.batch_invariant)
    from sglang_fa4.bench.meta import base_meta

    meta = base_meta("vit_graphs", sys.argv if argv is None else ["check_vit_graphs.py", *argv])
    meta.update(sglang=info, budgets=args.budgets, env=env, rel_tol=REL_TOL, batch_invariant=args.batch_invariant)
    result = {"meta": meta, "models": []}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from benchmark.sglang_on_gpu.sglang_towers import result_stem

    stem = result_stem("vit_graphs", info["sglang_version"], args.tag)
    for i, model in enumerate(args.models):
        t0 = time.perf_counter()
        result["models"].append(check_model(model, args, seed=i))
        print(f"[vit_graphs] {model}: ok={result['models'][-1]['ok']} ({time.perf_counter() - t0:.0f} s)", flush=True)
        (out / f"{stem}.json").write_text(json.dumps(result, default=str, separators=(",", ":")))
    (out / f"{stem}.md").write_text(markdown(result))
    print(markdown(result))
    return 0 if all(m["ok"] for m in result["models"]) else 1


if __name__ == "__main__":
    sys.exit(main())
