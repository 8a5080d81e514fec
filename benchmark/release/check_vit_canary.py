"""Canary stress of the ViT graph path through SGLang's REAL towers (issue #19 items 2 and 3).

The ViT-graph bugs users report show only under load (SGLang 29216: a shared rotary sin/cos buffer
freed and reused corrupted 485 of 500 canary replies with graphs on; vLLM 57136: NaN embeddings from
padded replays). Per model (Qwen2.5-VL-7B, Qwen3-VL-8B vision configs; random weights drawn so that
every projection keeps unit variance, i.e. activations of a trained tower's scale, not the tiny ones
of N(0, 0.02)), with sglang_fa4 loaded by SGLang's plugin loader (fa4, budgets on, JIT monitor and
capture guard set to ``raise``):

  * startup as a server does it: FA4 warmup, one graph per token budget;
  * N interleaved forwards (default 500) of random requests -- small images, large images (some
    above the largest budget: eager with the request's own layout), video-like multi-frame grids,
    batches of several images -- each run through the graph path (SGLANG_VIT_ENABLE_CUDA_GRAPH=1
    semantics: budget replay, or eager above the budgets) and eagerly on the same input;
  * the graph output is held uncloned (as SGLang's embedding cache holds it), with every reference it
    was compared against, until the end of its pass (100 forwards); then every held output is
    checked again: bitwise unchanged since it was returned, and still agreeing with its references;
  * counted: outputs beyond bf16 rounding of their reference (Qwen2.5-VL: the tower's eager forward,
    bitwise equal so far; Qwen3-VL: the same blocks run eagerly on the graph path's own inputs --
    bitwise -- and, looser, the tower's eager forward, which SGLang prepares differently), non-finite
    values, FA4 compiles and graph captures after startup, forwards that raised; GPU memory
    (allocated / reserved) after each pass, once its held outputs are released: flat after the first.

Optionally (``--exact-forwards``) a first pass through SGLang's own exact-layout graphs (before the
budgets are captured; a small pool of layouts so that each graph replays for other images).

usage (GPU machine, SGLang importable; see benchmark/sglang_on_gpu/README.md):
  python3 benchmark/release/check_vit_canary.py --out DIR [--forwards 500] [--time-limit-s 0]
Writes DIR/vit_canary[-<version>].json and .md.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: one unit in the last place of bf16 (8 significant bits) relative to a value: an element agrees
#: "to bf16 rounding" when |out - ref| <= BF16_ULP * (|ref| + rms(ref)) (the rms term: values near 0)
BF16_ULP = 2.0 ** -7
#: allocated memory after a pass may differ from the first pass's by this much and still be flat
FLAT_MIB = 4.0
PASS_SIZE = 100
KINDS = ("small", "large", "video", "batch")


@dataclass
class Request:
    index: int
    kind: str
    grids: list  # [(t, h, w)] patch grids, one per image / video
    seed: int

    @property
    def tokens(self) -> int:
        return sum(t * h * w for t, h, w in self.grids)


def random_request(rng: random.Random, index: int, grid_of, max_tokens: int) -> Request:
    """One request of a random kind, at most ``max_tokens`` patches. ``grid_of(w, h, frames)`` is the
    model's processor geometry."""
    kind = KINDS[index % len(KINDS)] if index < len(KINDS) else rng.choice(KINDS)
    for _ in range(1000):
        if kind == "small":
            grids = [grid_of(rng.randint(112, 512), rng.randint(112, 512), 1)]
        elif kind == "large":
            grids = [grid_of(rng.randint(960, 1600), rng.randint(720, 1200), 1)]
        elif kind == "video":
            grids = [grid_of(rng.choice((320, 448, 640)), rng.choice((240, 336, 480)), rng.choice((4, 8, 12, 16)))]
        else:
            grids = [grid_of(rng.randint(160, 800), rng.randint(160, 800), 1) for _ in range(rng.randint(2, 6))]
        req = Request(index, kind, [tuple(int(v) for v in g) for g in grids], seed=100_000 + index)
        if req.tokens <= max_tokens:
            return req
    raise ValueError(f"no {kind!r} request of at most {max_tokens} tokens in 1000 draws: max_tokens too small")


def _bits(t):
    """The tensor's bytes as integers: a bitwise comparison that also holds for NaN."""
    flat = t.detach().contiguous().reshape(-1)
    import torch

    return flat.view({2: torch.int16, 4: torch.int32, 8: torch.int64}.get(flat.element_size(), torch.uint8))


def compare(out, ref, rel_tol=None) -> dict:
    """``out`` against ``ref``: bitwise equality, elements beyond bf16 rounding, rel. error (norm),
    finiteness. ``ok``: finite and (no element beyond bf16 rounding, or rel. error <= rel_tol)."""
    if tuple(out.shape) != tuple(ref.shape):
        return {"ok": False, "shape": [list(out.shape), list(ref.shape)], "finite": None}
    import torch

    a, b = out.float(), ref.float()
    diff = (a - b).abs()
    rms = b.pow(2).mean().sqrt() if b.numel() else b.new_zeros(())
    beyond = int((diff > BF16_ULP * (b.abs() + rms)).sum()) + int((~torch.isfinite(diff)).sum())
    finite = bool(torch.isfinite(a).all()) and bool(torch.isfinite(b).all())
    rel = float(diff.norm() / b.norm().clamp_min(1e-30)) if b.numel() else 0.0
    ok = finite and (beyond == 0 if rel_tol is None else rel <= rel_tol)
    return {"ok": ok, "bitwise": bool(torch.equal(_bits(out), _bits(ref))), "beyond_bf16": beyond,
            "rel_err": rel, "max_abs_diff": float(diff.max()) if diff.numel() else 0.0, "finite": finite}


def _hold(req, forward, raised: list, paths: dict):
    """One forward: (request, graph output as returned, its copy, {name: (ref, tol, copy)}, first
    comparisons); None when it raised (recorded in ``raised``)."""
    try:
        res = forward(req)
    except Exception as exc:  # noqa: BLE001 - counted; a canary keeps going
        raised.append(f"#{req.index} {req.kind} {req.grids}: {type(exc).__name__}: {exc}"[:400])
        return None
    g = res["graph"]
    refs = {name: (t, tol, t.clone()) for name, (t, tol) in res["refs"].items()}
    first = {name: compare(g, t, tol) for name, (t, tol, _) in refs.items()}
    paths[res.get("path", "?")] = paths.get(res.get("path", "?"), 0) + 1
    return req, g, g.clone(), refs, first


def _recheck(item) -> dict:
    req, g, snap, refs, first = item
    moved = not bool((_bits(g) == _bits(snap)).all())
    moved_refs = [n for n, (t, _, s) in refs.items() if not bool((_bits(t) == _bits(s)).all())]
    again = {name: compare(g, t, tol) for name, (t, tol, _) in refs.items()}
    return {"index": req.index, "kind": req.kind, "tokens": req.tokens, "grids": req.grids, "changed_after_return": moved,
            "refs_changed": moved_refs, "first": first, "recheck_ok": all(v["ok"] for v in again.values())}


def run_pass(requests, forward, *, counters=None, memory=None, sync=None) -> dict:
    """Run ``forward`` over ``requests``, holding every output and reference to the end of the pass.

    ``forward(request)`` returns ``{"graph": tensor, "refs": {name: (tensor, rel_tol or None)},
    "path": str}``; the graph tensor is held exactly as returned. After the pass every held tensor is
    compared bitwise with the copy taken when it was returned, and the graph output again with each
    reference. ``counters()`` (dict of monotonic counts) is read before and after; ``memory()`` after
    the held tensors are released."""
    raised, paths = [], {}
    c0 = counters() if counters else {}
    held = [h for h in (_hold(req, forward, raised, paths) for req in requests) if h is not None]
    if sync:
        sync()
    rows = [_recheck(h) for h in held]
    del held  # nothing else refers to the outputs: the memory below is the pass's residue
    gc.collect()
    if sync:
        sync()
    changed = sum(r["changed_after_return"] or bool(r["refs_changed"]) for r in rows)
    recheck_bad = sum(not r["recheck_ok"] for r in rows)
    c1 = counters() if counters else {}
    result = {
        "forwards": len(requests), "completed": len(rows), "raised": raised, "paths": paths,
        "mismatches": sum(any(not v["ok"] for v in r["first"].values()) for r in rows),
        "non_finite": sum(any(v.get("finite") is False for v in r["first"].values()) for r in rows),
        "changed_after_return": changed, "recheck_mismatches": recheck_bad,
        "mismatches_by_ref": {name: sum(not r["first"][name]["ok"] for r in rows)
                              for name in (rows[0]["first"] if rows else {})},
        "bitwise_equal": {name: sum(r["first"][name].get("bitwise", False) for r in rows)
                          for name in (rows[0]["first"] if rows else {})},
        "max_rel_err": {name: max(r["first"][name].get("rel_err", math.inf) for r in rows)
                        for name in (rows[0]["first"] if rows else {})},
        "counters": {k: c1[k] - c0.get(k, 0) for k in c1},
        "memory": memory() if memory else None,
        "bad_rows": [r for r in rows if r["changed_after_return"] or r["refs_changed"] or not r["recheck_ok"]
                     or any(not v["ok"] for v in r["first"].values())][:8],
    }
    return result


def stress(requests, forward, *, pass_size=PASS_SIZE, deadline=None, **kw) -> dict:
    """``run_pass`` over consecutive slices of ``requests`` (a pass = ``pass_size`` forwards), until
    done or past ``deadline`` (time.monotonic()); then the totals and the memory-flatness verdict."""
    passes = []
    for start in range(0, len(requests), pass_size):
        if deadline is not None and passes and time.monotonic() > deadline:
            break
        passes.append(run_pass(requests[start:start + pass_size], forward, **kw))
    return summarize(passes, len(requests))


def summarize(passes: list, planned: int) -> dict:
    total = {k: sum(p[k] for p in passes) for k in ("completed", "mismatches", "non_finite",
                                                     "changed_after_return", "recheck_mismatches")}
    total["raised"] = sum(len(p["raised"]) for p in passes)
    by_ref: dict = {}
    for p in passes:
        for k, v in p.get("mismatches_by_ref", {}).items():
            by_ref[k] = by_ref.get(k, 0) + v
    total["mismatches_by_ref"] = by_ref
    counters: dict = {}
    for p in passes:
        for k, v in p["counters"].items():
            counters[k] = counters.get(k, 0) + v
    mem = [p["memory"] for p in passes if p["memory"]]
    drift = [m["allocated_mib"] - mem[0]["allocated_mib"] for m in mem[1:]]
    flat = all(abs(d) <= FLAT_MIB for d in drift)
    ok = (not any(total[k] for k in ("mismatches", "non_finite", "changed_after_return", "recheck_mismatches",
                                     "raised")) and not any(counters.values()) and flat)
    return {"planned": planned, "forwards": sum(p["forwards"] for p in passes), **total,
            "after_startup": counters, "memory_per_pass": mem, "allocated_drift_mib": drift,
            "memory_flat": flat, "ok": ok, "passes": passes}


# ---------------------------------------------------------------------------------------------
# On the GPU: SGLang's towers
# ---------------------------------------------------------------------------------------------


def init_trained_scale_(module, seed: int) -> None:
    """Random weights with a trained tower's activation scale: every matrix N(0, 1/fan_in) (each
    projection keeps unit variance, attention logits ~N(0, 1)), embedding tables N(0, 0.5), biases
    N(0, 0.02), norms weight 1 / bias 0."""
    import torch

    gen = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if "norm" in name or ".ln_" in name or name.startswith("ln_"):
                p.fill_(1.0 if leaf == "weight" else 0.0)
                continue
            if leaf == "bias" or p.dim() < 2:
                std = 0.02
            elif "embed" in name and "patch_embed" not in name:
                std = 0.5
            else:
                std = 1.0 / math.sqrt(p[0].numel())
            p.copy_((torch.randn(p.shape, generator=gen) * std).to(p.dtype))


def check_model(model: str, args, seed: int) -> dict:
    import torch

    from sglang_fa4.integration import vit_budgets
    from sglang_fa4.kernels import fa4
    from sglang_fa4.startup import jit_monitor, warmup
    from benchmark.sglang_on_gpu.sglang_towers import build_tower, grid_of, pixels, set_graph_mode

    jit_monitor.reset_state()  # each model stands for its own server process
    set_graph_mode(None, True)
    tower = build_tower(model, seed=seed)
    init_trained_scale_(tower, seed)
    holder = torch.nn.Module()
    holder.visual = tower
    res: dict = {"model": model}
    t0 = time.perf_counter()
    x, grid = pixels(tower, [grid_of(model, 448, 448)], seed=1)
    set_graph_mode(tower, False)
    with torch.no_grad():
        tower(x, grid)  # SGLang's nvcc-JIT elementwise kernels, before the startup is timed
    set_graph_mode(tower, True)
    warmup.warm_model(holder)
    runner = vit_budgets.find_runners(holder)[0]
    recorded: dict = {}
    hooked_run = runner.run

    def recording_run(**kwargs):  # what the graph path hands the runner, for the same-input reference
        recorded.clear()
        recorded.update(kwargs, x=kwargs["x"].clone())  # SGLang's blocks overwrite their input
        return hooked_run(**kwargs)

    runner.run = recording_run
    state = None

    def forward(req: Request) -> dict:
        x, grid = pixels(tower, req.grids, seed=req.seed)
        with torch.no_grad():
            set_graph_mode(tower, True)
            recorded.clear()
            n0 = (state.replays, state.eager_runs) if state else None
            g = tower(x, grid)
            inputs = {k: v for k, v in recorded.items() if k != "attention_layout_key"}
            set_graph_mode(tower, False)
            e = tower(x, grid)
            # the runner's blocks run eagerly on the graph's own inputs (attributes a difference to the
            # graph vs to SGLang's graph-mode input preparation), and the plain eager tower; both strict
            # since vit_graph_eager_pos_embed gives Qwen3-VL's graph path eager's position embeddings
            same = vit_budgets.eager_run(runner, **inputs) if inputs else e
            refs = {"same_input_eager": (same, None), "tower_eager": (e, None)}
            recorded.clear()  # the runner inputs of this request must not outlive it
        path = "exact_graph" if state is None else ("replay" if state.replays > n0[0] else "eager")
        return {"graph": g, "refs": refs, "path": path}

    def memory():
        return {"allocated_mib": round(torch.cuda.memory_allocated() / 2**20, 2),
                "reserved_mib": round(torch.cuda.memory_reserved() / 2**20, 1)}

    rng = random.Random(seed)
    if args.exact_forwards:  # SGLang's own per-layout graphs: a pool, so each graph replays often
        g_of = lambda w, h, f: grid_of(model, w, h, f)  # noqa: E731
        pool = [random_request(rng, i, g_of, 4096) for i in range(args.exact_pool)]
        reqs = [Request(i, pool[i % len(pool)].kind, pool[i % len(pool)].grids, 50_000 + i)
                for i in range(args.exact_forwards)]
        graphs0 = len(runner.block_graphs)
        res["exact_layout"] = stress(reqs, forward, memory=memory, sync=torch.cuda.synchronize)
        res["exact_layout"]["graphs_captured"] = len(runner.block_graphs) - graphs0
    t1 = time.perf_counter()
    states = vit_budgets.capture_model_budgets(holder)
    state = states[0]
    torch.cuda.synchronize()
    res["startup_s"] = round(time.perf_counter() - t0, 2)
    res["capture_s"] = round(time.perf_counter() - t1, 2)
    res["budgets"] = list(state.budgets)
    graphs0, compiles0 = len(runner.block_graphs), fa4.kernel_cache().compile_count()

    def counters():
        return {"fa4_compiles": fa4.kernel_cache().compile_count() - compiles0,
                "jit_monitor_compiles": jit_monitor.compiles_after_warmup(),
                "graph_captures": len(runner.block_graphs) - graphs0 + state.captures_after_startup}

    g_of = lambda w, h, f: grid_of(model, w, h, f)  # noqa: E731
    reqs = [random_request(rng, i, g_of, max(state.budgets) * 5 // 4) for i in range(args.forwards)]
    t2 = time.perf_counter()
    deadline = time.monotonic() + args.time_limit_s if args.time_limit_s else None
    res["stress"] = stress(reqs, forward, counters=counters, memory=memory, sync=torch.cuda.synchronize,
                           deadline=deadline)
    res["stress"]["seconds"] = round(time.perf_counter() - t2, 1)
    res["stress"]["kinds"] = {k: sum(r.kind == k for r in reqs[:res["stress"]["forwards"]]) for k in KINDS}
    res["stress"]["tokens"] = {"min": min(r.tokens for r in reqs), "max": max(r.tokens for r in reqs),
                               "mean": round(sum(r.tokens for r in reqs) / len(reqs))}
    del runner.run
    set_graph_mode(tower, False)
    del tower, holder, states, state, runner
    gc.collect()
    torch.cuda.empty_cache()
    return res


def markdown(result: dict) -> str:
    lines = [f"# ViT graph canary through SGLang {result['sglang']['sglang_version']}'s real towers ({result['gpu']})",
             "", f"`{result['command']}`", "",
             f"SGLang's batch-invariant kernels: {'on' if result.get('batch_invariant') else 'off'}.", "",
             "Graph path (budget replay, or eager above the budgets) vs eager on the same input; every output "
             "held uncloned to the end of its 100-forward pass, then re-checked. Mismatch: any element beyond "
             f"bf16 rounding (|d| > 2^-7 (|ref| + rms)) of its reference: the same blocks run eagerly on the graph's inputs, and the plain eager tower.", "",
             "| model | forwards (of planned) | replay / eager | mismatches | non-finite | changed after return "
             "| re-check mismatches | raised | FA4 compiles / captures after startup | bitwise equal | memory flat |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for m in result["models"]:
        s = m["stress"]
        paths: dict = {}
        for p in s["passes"]:
            for k, v in p["paths"].items():
                paths[k] = paths.get(k, 0) + v
        bitwise = {}
        for p in s["passes"]:
            for k, v in p["bitwise_equal"].items():
                bitwise[k] = bitwise.get(k, 0) + v
        a = s["after_startup"]
        by_ref = ", ".join(f"{k} {v}" for k, v in s.get("mismatches_by_ref", {}).items())
        lines.append(f"| {m['model']} | {s['forwards']} ({s['planned']}) | {paths.get('replay', 0)} / {paths.get('eager', 0)} "
                     f"| **{s['mismatches']}**{f' ({by_ref})' if by_ref else ''} | **{s['non_finite']}** | **{s['changed_after_return']}** "
                     f"| {s['recheck_mismatches']} | {s['raised']} | {a.get('fa4_compiles', 0) + a.get('jit_monitor_compiles', 0)}"
                     f" / {a.get('graph_captures', 0)} | " + ", ".join(f"{k} {v}/{s['completed']}" for k, v in bitwise.items())
                     + f" | {s['memory_flat']} |")
    lines += ["", "GPU memory after each pass of 100 forwards (held outputs released), MiB allocated / reserved:", ""]
    for m in result["models"]:
        mem = " → ".join(f"{x['allocated_mib']:.0f} / {x['reserved_mib']:.0f}" for x in m["stress"]["memory_per_pass"])
        lines.append(f"- {m['model']}: {mem} (allocated drift after pass 1: {m['stress']['allocated_drift_mib']})")
        if "exact_layout" in m:
            e = m["exact_layout"]
            lines.append(f"- {m['model']}, SGLang's exact-layout graphs first ({m['exact_layout']['graphs_captured']} "
                         f"layouts): {e['completed']} forwards, {e['mismatches']} mismatches, {e['non_finite']} "
                         f"non-finite, {e['changed_after_return']} changed after return")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--models", nargs="+", default=["qwen2_5_vl", "qwen3_vl"])
    ap.add_argument("--forwards", type=int, default=500)
    ap.add_argument("--exact-forwards", type=int, default=0)
    ap.add_argument("--exact-pool", type=int, default=5)
    ap.add_argument("--time-limit-s", type=float, default=0,
                    help="per model: start no new pass after this many seconds of stress (0: none)")
    ap.add_argument("--tag", default="", help="suffix of the output file names")
    ap.add_argument("--batch-invariant", action="store_true",
                    help="SGLang's batch-invariant GEMM kernels on before the startup (a server with "
                         "--enable-deterministic-inference): a budget graph's padded GEMMs then round as the "
                         "unpadded eager ones do, so graph == eager is expected bitwise")
    args = ap.parse_args(argv)
    import torch

    from benchmark.sglang_on_gpu.sglang_towers import prepare_sglang

    env = {"SGLANG_VIT_ENABLE_CUDA_GRAPH": "1", "SGLANG_FA4_VIT_GRAPH_BUDGETS_ENABLE": "1",
           "SGLANG_FA4_JIT_MONITOR": "raise"}
    info = prepare_sglang("fa4", env, batch_invariant=args.batch_invariant)
    result = {"batch_invariant": args.batch_invariant, "command": "python3 " + " ".join(["benchmark/release/check_vit_canary.py"] + list(argv or sys.argv[1:])),
              "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "sglang": info, "env": env,
              "models": []}
    args.out.mkdir(parents=True, exist_ok=True)
    from benchmark.sglang_on_gpu.sglang_towers import result_stem

    stem = result_stem("vit_canary", info["sglang_version"], args.tag)
    for i, model in enumerate(args.models):
        t0 = time.perf_counter()
        try:
            r = check_model(model, args, seed=i)
        except Exception:  # noqa: BLE001 - recorded; the other model still runs
            import traceback

            result.setdefault("failed_models", []).append({"model": model, "error": traceback.format_exc()[-3000:]})
            print(result["failed_models"][-1]["error"], flush=True)
            (args.out / f"{stem}.json").write_text(json.dumps(result, indent=1, default=str))
            continue
        r["seconds"] = round(time.perf_counter() - t0, 1)
        result["models"].append(r)
        s = r["stress"]
        print(f"[canary] {model}: ok={s['ok']} forwards={s['forwards']} mismatches={s['mismatches']} "
              f"non_finite={s['non_finite']} changed={s['changed_after_return']} raised={s['raised']} "
              f"after_startup={s['after_startup']} mem={[m['allocated_mib'] for m in s['memory_per_pass']]} "
              f"({r['seconds']} s)", flush=True)
        (args.out / f"{stem}.json").write_text(json.dumps(result, indent=1, default=str))
    (args.out / f"{stem}.md").write_text(markdown(result))
    print(markdown(result))
    return 0 if result["models"] and not result.get("failed_models") and all(
        m["stress"]["ok"] for m in result["models"]) else 1


if __name__ == "__main__":
    sys.exit(main())
