"""Tensor-parallel ViT graphs on several GPUs (issue #19, item 4), through the REAL SGLang.

SGLang's own Qwen2.5-VL tower (7B vision config) sharded over ``--tp`` ranks, one process and one
GPU each, NCCL groups built the way a server's TP workers build them (sglang_towers.init_sglang),
sglang_fa4 loaded by SGLang's plugin loader on every rank. Startup as the plugin does it after
ModelRunner.load_model, on every rank: the FA4 warmup, then the budget graphs, captured by SGLang's
own ``ViTCudaGraphRunner._create_graph`` inside the runner's TP capture context
(``_capture_context``: the custom all-reduce's capture where SGLang has one). JIT monitor: raise.

Every rank gets the same inputs (TP: every rank sees every token) and the same random weights per
shard (seed 0 on every rank: the full weight is a valid model, the replicated parameters agree).
Per mix, on each rank: the tower's graph forward (budget replay, or eager above the budgets)
against its eager forward, and the budget replay against the same blocks run eagerly on the very
inputs the graph path prepared (``vit_budgets.eager_run``). Across ranks: the outputs (after the
final all-reduce) must be identical. After startup: 0 graphs captured and 0 FA4 compiles.

usage (a machine with >= 2 GPUs, SGLang importable; benchmark/sglang_on_gpu/README.md):
  python3 benchmark/release/check_vit_tp.py --out DIR [--tp 2] [--mixes 20]
Writes DIR/vit_tp-<sglang version>.json and .md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

MODEL = "qwen2_5_vl"
# replay vs the same blocks eagerly on the same inputs: bf16 GEMMs over padded row counts may pick
# other kernels (the single-GPU check's tolerance, check_vit_graphs.REL_TOL)
REL_TOL = 2e-2


def digest(t) -> str:
    """A fingerprint of a tensor's bytes (the ranks' outputs compared across processes)."""
    import torch

    raw = t.detach().contiguous().view(-1).view(torch.uint8).cpu().numpy().tobytes()
    return hashlib.sha256(raw).hexdigest()[:16]


def run_rank(rank: int, args, port: int) -> dict:
    import faulthandler

    import torch

    t_start = time.perf_counter()

    def progress(what: str) -> None:  # where a rank is, for a hang's diagnosis
        print(f"[vit_tp rank {rank} +{time.perf_counter() - t_start:.1f}s] {what}", flush=True)

    # a rank stuck (in a collective its peer never enters) dumps every thread's stack
    faulthandler.dump_traceback_later(args.stacks_after_s, repeat=True)
    torch.cuda.set_device(rank)
    from benchmark.sglang_on_gpu.sglang_towers import build_tower, grid_of, pixels, prepare_sglang, set_graph_mode

    env = {"SGLANG_VIT_ENABLE_CUDA_GRAPH": "1", "SGLANG_FA4_VIT_GRAPH_BUDGETS_ENABLE": "1",
           "SGLANG_FA4_JIT_MONITOR": "raise"}
    progress("prepare_sglang")
    info = prepare_sglang("fa4", env, tp_size=args.tp, rank=rank, port=port)
    progress(f"groups built, plugins loaded: {info['plugin_hooked']}")
    from sglang.srt.distributed import parallel_state as ps

    from benchmark.release.check_vit_graphs import graph_eager_same, random_mix, record_runner_inputs, rel_err, startup_capture
    from sglang_fa4.kernels import fa4
    from sglang_fa4.startup import jit_monitor

    tp_group = ps.get_tp_group()
    res: dict = {"rank": rank, "sglang": info, "tp_world_size": tp_group.world_size,
                 "custom_allreduce": type(tp_group.ca_comm).__name__ if tp_group.ca_comm is not None else None,
                 "pynccl": tp_group.pynccl_comm is not None}
    set_graph_mode(None, True)  # Qwen2.5-VL builds its runner only when the flag is on at __init__
    tower = build_tower(MODEL, seed=0)
    attn = tower.blocks[0].attn
    res["heads_per_rank"] = int(getattr(attn, "num_attention_heads_per_partition", 0) or 0)
    res["qkv_weight_rows_per_rank"] = int(attn.qkv_proj.weight.shape[0])
    holder = torch.nn.Module()
    holder.visual = tower

    progress("tower built; first eager forward")
    x, grid = pixels(tower, [grid_of(MODEL, 448, 448)], seed=1)
    set_graph_mode(tower, False)
    with torch.no_grad():  # SGLang's own JIT kernels compile at first use (a server's LLM warmup)
        tower(x, grid)
    torch.cuda.synchronize()
    progress("first eager forward done; warmup and budget capture")
    set_graph_mode(tower, True)
    state, runner = startup_capture(holder, res, f"rank {rank}")
    graphs0, compiles0 = len(runner.block_graphs), fa4.kernel_cache().compile_count()
    recorded, _ = record_runner_inputs(runner)
    progress(f"captured {res['budgets'].get('graphs')} graphs; mixes")
    rng = random.Random(args.seed)  # the same mixes on every rank
    mixes = []
    for i in range(args.mixes):
        grids = random_mix(rng, MODEL, max(state.budgets) * 5 // 4)
        x, grid = pixels(tower, grids, seed=1000 + i)
        replays0, eager0 = state.replays, state.eager_runs
        out_g, out_e, out_same = graph_eager_same(tower, runner, recorded, x, grid)
        torch.cuda.synchronize()
        mixes.append({"grids": [list(g) for g in grids], "tokens": sum(t * h * w for t, h, w in grids),
                      "path": "replay" if state.replays > replays0 else ("eager" if state.eager_runs > eager0 else "?"),
                      "finite": bool(torch.isfinite(out_g).all()),
                      "rel_err": rel_err(out_g, out_e),
                      "same_input_rel_err": rel_err(out_g, out_same),
                      "same_input_max_abs_diff": float((out_g.float() - out_same.float()).abs().max()),
                      "graph_digest": digest(out_g), "eager_digest": digest(out_e)})
    res["mixes"] = mixes
    progress("mixes done; latency")

    latency = []
    from benchmark.release.check_vit_graphs import call_ms
    from sglang_fa4.bench.layouts import PICTURES as SIZES

    for name in args.pictures:  # every rank runs the same calls in lockstep (collectives)
        w, h, f = SIZES[name]
        grids = [grid_of(MODEL, w, h, f)]
        x, grid = pixels(tower, grids, seed=7)
        for graph in (False, True):
            call_ms(tower, x, grid, graph)
        times = {"eager": [], "graph": []}
        for r in range(args.rounds):
            for graph in ((False, True) if r % 2 == 0 else (True, False)):
                times["graph" if graph else "eager"].append(call_ms(tower, x, grid, graph))
        e, g = statistics.median(times["eager"]), statistics.median(times["graph"])
        latency.append({"image": name, "tokens": grids[0][0] * grids[0][1] * grids[0][2],
                        "eager_ms": round(e, 3), "graph_ms": round(g, 3), "eager_over_graph": round(e / g, 3)})
    res["latency"] = latency
    res["graphs_captured_after_startup"] = len(runner.block_graphs) - graphs0
    res["capture_guard_count"] = state.captures_after_startup
    res["fa4_compiles_after_startup"] = fa4.kernel_cache().compile_count() - compiles0
    res["jit_monitor_compiles_after_warmup"] = jit_monitor.compiles_after_warmup()
    res["report"] = state.report()
    faulthandler.cancel_dump_traceback_later()
    progress("done")
    return res


def rank_main(rank: int, args, port: int, queue) -> None:
    """One rank; its result goes to the parent before any teardown. The process then leaves with
    os._exit: tearing the groups down (NCCL, the custom all-reduce) hung on the H200 pair after a
    complete run, and nothing of it is under test here."""
    import os

    try:
        result = run_rank(rank, args, port)
    except BaseException:  # noqa: BLE001 - reported by the parent, which fails the check
        import traceback

        result = {"rank": rank, "error": traceback.format_exc()[-4000:]}
    queue.put(result)
    queue.close()
    queue.join_thread()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if "error" not in result else 1)


def verdict(ranks: list[dict]) -> dict:
    """What must hold: every rank sharded, its replays within tolerance of eager on the same
    inputs and finite, 0 captures / compiles after startup; the ranks' outputs identical."""
    errors = [r["error"] for r in ranks if "error" in r]
    if errors:
        return {"ok": False, "errors": errors}
    world = ranks[0]["tp_world_size"]
    v = {"sharded": all(r["tp_world_size"] == world == len(ranks) and r["heads_per_rank"] * world == 16 for r in ranks),
         "replays": [sum(m["path"] == "replay" for m in r["mixes"]) for r in ranks],
         "eager_above_budgets": [sum(m["path"] == "eager" for m in r["mixes"]) for r in ranks],
         "all_finite": all(m["finite"] for r in ranks for m in r["mixes"]),
         "worst_same_input_rel_err": max(m["same_input_rel_err"] for r in ranks for m in r["mixes"]),
         "bitwise_same_input": sum(m["same_input_max_abs_diff"] == 0.0 for r in ranks for m in r["mixes"]),
         "worst_tower_rel_err": max(m["rel_err"] for r in ranks for m in r["mixes"]),
         "ranks_identical_graph": all(len({r["mixes"][i]["graph_digest"] for r in ranks}) == 1
                                      for i in range(len(ranks[0]["mixes"]))),
         "ranks_identical_eager": all(len({r["mixes"][i]["eager_digest"] for r in ranks}) == 1
                                      for i in range(len(ranks[0]["mixes"]))),
         "captures_after_startup": sum(r["graphs_captured_after_startup"] + r["capture_guard_count"] for r in ranks),
         "compiles_after_startup": sum(r["fa4_compiles_after_startup"] + r["jit_monitor_compiles_after_warmup"]
                                       for r in ranks)}
    v["ok"] = (v["sharded"] and v["all_finite"] and min(v["replays"]) > 0 and v["worst_same_input_rel_err"] <= REL_TOL
               and v["ranks_identical_graph"] and v["ranks_identical_eager"] and v["captures_after_startup"] == 0
               and v["compiles_after_startup"] == 0)
    return v


def markdown(result: dict) -> str:
    meta, v, ranks = result["meta"], result["verdict"], result["ranks"]
    lines = [f"# Tensor-parallel ViT budget graphs ({meta.get('gpu', {}).get('name', '?')} x{result['tp']})", "",
             f"Command: `{meta['command']}`", "",
             f"SGLang {ranks[0].get('sglang', {}).get('sglang_version', '?')}, Qwen2.5-VL-7B vision tower, "
             f"TP={result['tp']} over NCCL, {len(ranks[0].get('mixes', []))} random mixes per rank (same inputs on every rank).", ""]
    if "errors" in v:
        lines += ["**FAILED**", "", *[f"```\n{e}\n```" for e in v["errors"]]]
        return "\n".join(lines) + "\n"
    r0 = ranks[0]
    lines += [f"- verdict: **{'ok' if v['ok'] else 'FAILED'}**",
              f"- sharded: {v['sharded']} ({r0['heads_per_rank']} of 16 heads per rank, qkv rows per rank "
              f"{r0['qkv_weight_rows_per_rank']}); custom all-reduce: "
              + (r0["custom_allreduce"] or "none (sgl-kernel's is not on the GPU machine: all-reduce through NCCL)")
              + f"; PyNccl: {r0['pynccl']}",
              f"- startup per rank: warmup {[r['warmup_s'] for r in ranks]} s, budget capture "
              f"{[r['capture_s'] for r in ranks]} s, budgets {r0['budgets'].get('budgets')}",
              f"- paths per rank: replays {v['replays']}, eager above the budgets {v['eager_above_budgets']}",
              f"- budget replay vs the same blocks eagerly on the same inputs: worst rel. error "
              f"{v['worst_same_input_rel_err']:.3e}, bitwise equal {v['bitwise_same_input']} of "
              f"{sum(len(r['mixes']) for r in ranks)} (tolerance {REL_TOL})",
              f"- graph tower vs eager tower: worst rel. error {v['worst_tower_rel_err']:.3e}; all finite: {v['all_finite']}",
              f"- ranks identical (output after the final all-reduce): graph {v['ranks_identical_graph']}, "
              f"eager {v['ranks_identical_eager']}",
              f"- after startup: graphs captured {v['captures_after_startup']}, compiles {v['compiles_after_startup']}",
              "", "| image | tokens | eager ms | graph ms | eager/graph |", "|---|---|---|---|---|"]
    for row in r0["latency"]:
        lines.append(f"| {row['image']} | {row['tokens']} | {row['eager_ms']} | {row['graph_ms']} | {row['eager_over_graph']} |")
    lines += ["", "Tower wall time on rank 0 (host preparation included, a device sync after each call), "
              "medians of interleaved rounds; both ranks run the same calls."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--mixes", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--pictures", nargs="+", default=["448", "720p", "1080p", "4k"])
    ap.add_argument("--rank-timeout-s", type=float, default=540, help="give up on a rank's result after this")
    ap.add_argument("--stacks-after-s", type=float, default=240, help="a rank dumps its threads' stacks every ... s")
    args = ap.parse_args(argv)
    import torch
    import torch.multiprocessing as mp

    if torch.cuda.device_count() < args.tp:
        raise SystemExit(f"--tp {args.tp} needs {args.tp} GPUs; this machine has {torch.cuda.device_count()}")
    from benchmark.sglang_on_gpu.sglang_towers import _free_port
    from sglang_fa4.bench.meta import base_meta

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=rank_main, args=(r, args, port, queue)) for r in range(args.tp)]
    for p in procs:
        p.start()
    ranks = []
    for _ in procs:
        try:
            ranks.append(queue.get(timeout=args.rank_timeout_s))
        except Exception:  # noqa: BLE001 - a rank hung (a collective waiting on a dead peer)
            ranks.append({"rank": -1, "error": f"no result within {args.rank_timeout_s} s (stacks in the log)"})
    for p in procs:
        p.join(30)
        if p.is_alive():
            p.kill()
    ranks.sort(key=lambda r: r["rank"])
    meta = base_meta("vit_tp", sys.argv if argv is None else ["check_vit_tp.py", *argv])
    result = {"meta": meta, "tp": args.tp, "ranks": ranks, "exitcodes": [p.exitcode for p in procs]}
    result["verdict"] = verdict(ranks)
    version = next((r["sglang"]["sglang_version"] for r in ranks if "sglang" in r), "unknown")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"vit_tp-{version}.json").write_text(json.dumps(result, default=str))
    (out / f"vit_tp-{version}.md").write_text(markdown(result))
    print(markdown(result))
    return 0 if result["verdict"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
