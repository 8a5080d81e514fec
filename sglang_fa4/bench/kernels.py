"""`sglang-fa4 bench kernels`: varlen, non-causal attention kernels alone, paired rounds.

For each head dim and layout: every backend is checked against an fp32 reference on fresh random
data (outputs poisoned with NaN first), then timed in N rounds whose backend order alternates
(stats.round_order); per mode (eager, graph) one row per backend with the median over rounds,
plus a pair entry per backend pair (median per-round ratio, wins). Small layouts rotate several
input sets so that repeated calls do not just hit L2. Mode `host` times the host side of a loop of
calls (µs of the calling thread per call, the GPU not waited for; the loop's wall time beside it)
on the smallest layout and any --host-layouts. Results are written after every case, so an interrupted
run still leaves valid JSON.
"""

from __future__ import annotations

import itertools
import math
import time

from . import report
from .backends import BACKENDS, OPTIONAL_BACKENDS, BackendUnavailable, make_problem, make_runner, reference_fp32, rel_err, sdpa_groups
from .layouts import Layout, kernel_layout
from .stats import all_pairs, median, round_order
from .timing import GraphedCalls, event_time_ms, host_submit_us, iters_for, sync

MODES = ("eager", "graph", "host")
HOST_LAYOUT = "1x256"
HOST_ITERS = 100  # calls per host sample: far below the driver's launch queue (see host_submit_us)


def _cycle_call(calls):
    it = itertools.cycle(calls)
    return lambda: next(it)()


def _input_sets(layout: Layout, heads: int, head_dim: int, l2_bytes: int | None) -> int:
    per_set = layout.io_bytes(heads, head_dim)
    l2 = l2_bytes or 50 * 2**20
    return max(1, min(8, math.ceil(3 * l2 / per_set)))


def _poison(t) -> None:
    t.fill_(float("nan"))


def fa4_route(p, max_seqlen: int) -> str:
    """Which kernel the fa4 backend's call on problem ``p`` runs (the ViT form's route,
    :func:`sglang_fa4.kernels.varlen.route`)."""
    from sglang_fa4.kernels import varlen, vit

    taken = varlen.route(p.q, p.cu_seqlens, max_seqlen, (None, None), None)
    if taken != varlen.SHORT_WINDOWS:
        return "fa4" if taken == varlen.FA4 else "fp8"
    if p.q.shape[-1] in vit.TRITON_HEAD_DIMS and max_seqlen <= vit.BLOCK_S:
        return "triton short-window"
    return "fa2"


def _merge(extra: dict, more: dict) -> dict:
    return {b: {**extra.get(b, {}), **more.get(b, {})} for b in set(extra) | set(more)}


def bench_case(layout: Layout, head_dim: int, backends, modes, rounds: int, heads: int, ceil: dict,
               l2_bytes, target_ms: float, seed: int) -> tuple[list[dict], list[dict]]:
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed)
    n_sets = _input_sets(layout, heads, head_dim, l2_bytes)
    problems = [make_problem(layout.seqlens, heads, head_dim, generator=gen) for _ in range(n_sets)]
    check = make_problem(layout.seqlens, heads, head_dim, generator=gen)
    ref = reference_fp32(check)

    flops = layout.attn_flops(heads, head_dim)
    floor_us = layout.io_bytes(heads, head_dim) / (ceil["copy_gbps"] * 1e9) * 1e6 if ceil else None
    base = {"head_dim": head_dim, "layout": layout.name, "heads": heads, "segments": layout.segments,
            "tokens": layout.total, "max_seqlen": layout.max_seqlen, "input_sets": n_sets}
    rows: list[dict] = []
    runners, errors, eager_err = {}, {}, {}
    for b in backends:
        try:
            runners[b] = [make_runner(b, p) for p in problems]
            runners[b][0]()  # compile / warm
            chk = make_runner(b, check)
            _poison(check.out)
            out = chk()
            sync()
            eager_err[b] = rel_err(out, ref)
        except BackendUnavailable as exc:
            errors[b] = str(exc)
        except Exception as exc:  # a backend failing one shape must not stop the others
            errors[b] = f"{type(exc).__name__}: {exc}"
            runners.pop(b, None)
    del ref
    live = [b for b in backends if b in runners]
    route = {"fa4": {"route": fa4_route(check, check.max_seqlen)}} if "fa4" in live else {}
    for b in live:
        for c in runners[b]:
            c()
    sync()

    def add_rows(mode, times_ms: dict, errs: dict, extra: dict | None = None, failed: dict | None = None):
        failed = {**errors, **(failed or {})}
        for b in backends:
            row = {"backend": b, "mode": mode, **base}
            if b in failed:
                row.update(median_us=None, rel_err=None, error=failed[b])
            elif b in times_ms and times_ms[b]:
                us = median(times_ms[b]) * 1e3
                row.update(median_us=us, rel_err=errs.get(b), per_round_us=[t * 1e3 for t in times_ms[b]])
                row["tflops"] = flops / (us * 1e-6) / 1e12
                if ceil:
                    row["frac_matmul_ceiling"] = row["tflops"] / ceil["bf16_matmul_tflops"]
                    row["hbm_floor_us"] = floor_us
                    row["frac_hbm_floor"] = floor_us / us
            else:
                continue
            if b == "sdpa":
                row["sdpa_groups"] = sdpa_groups(layout.seqlens)
            if extra and b in extra:
                row.update(extra[b])
            rows.append(row)

    pairs: list[dict] = []

    def add_pairs(mode, times_ms):
        for p in all_pairs({b: times_ms.get(b, []) for b in live}):
            pairs.append({"layout": layout.name, "head_dim": head_dim, "mode": mode, **p})

    if "eager" in modes and live:
        calls = {b: _cycle_call(runners[b]) for b in live}
        iters = {b: iters_for(event_time_ms(calls[b], n_sets), target_ms, lo=n_sets) for b in live}
        times = {b: [] for b in live}
        for r in range(rounds):
            for b in round_order(live, r):
                times[b].append(event_time_ms(calls[b], iters[b]))
        add_rows("eager", times, eager_err, _merge({b: {"iters": iters[b]} for b in live}, route))
        add_pairs("eager", times)

    if "graph" in modes and live:
        graphs, graph_err, graph_failed = {}, {}, {}
        for b in live:
            try:
                est = event_time_ms(_cycle_call(runners[b]), n_sets)
                count = n_sets * max(1, min(64 // n_sets, math.ceil(0.5 / max(est * n_sets, 1e-3))))
                g = GraphedCalls(runners[b], count)
                # correctness of the captured graph: fresh data into set 0, poisoned output
                fresh = make_problem(layout.seqlens, heads, head_dim, generator=gen)
                for dst, src in ((problems[0].q, fresh.q), (problems[0].k, fresh.k), (problems[0].v, fresh.v)):
                    dst.copy_(src)
                _poison(g.outputs[0])
                g.replay()
                sync()
                graph_err[b] = rel_err(g.outputs[0], reference_fp32(fresh))
                del fresh
                graphs[b] = g
            except Exception as exc:
                graph_failed[b] = f"graph: {type(exc).__name__}: {exc}"
        glive = [b for b in live if b in graphs]
        reps = {b: iters_for(graphs[b].ms_per_call(1) * graphs[b].count, target_ms, 1, 50) for b in glive}
        times = {b: [] for b in glive}
        for r in range(rounds):
            for b in round_order(glive, r):
                times[b].append(graphs[b].ms_per_call(reps[b]))
        add_rows("graph", times, graph_err,
                 _merge({b: {"calls_per_graph": graphs[b].count, "replays": reps[b]} for b in glive}, route),
                 graph_failed)
        add_pairs("graph", times)
        for g in graphs.values():
            g.release()
        del graphs

    if "host" in modes and live:
        # the calling thread's time per call (not the loop's wall time, which is the GPU's on layouts
        # whose kernel outlasts the launch); the wall time is kept beside it
        times = {b: [] for b in live}
        walls = {b: [] for b in live}
        calls = {b: _cycle_call(runners[b]) for b in live}
        for r in range(max(3, min(rounds, 7))):
            for b in round_order(live, r):
                host_us, wall_us = host_submit_us(calls[b], HOST_ITERS)
                times[b].append(host_us / 1e3)
                walls[b].append(wall_us)
        add_rows("host", times, eager_err,
                 _merge({b: {"loop_wall_us": median(walls[b]), "iters": HOST_ITERS} for b in live}, route))
        add_pairs("host", times)

    del problems, check, runners
    torch.cuda.empty_cache()
    return rows, pairs


def run(args) -> dict:
    import torch

    from .meta import base_meta, ceilings

    if not torch.cuda.is_available():
        raise SystemExit("bench kernels needs a CUDA GPU")
    t_start = time.monotonic()
    out_dir = report.resolve_out_dir(args.out_dir)
    meta = base_meta("kernels")
    meta["ceilings"] = ceilings()
    meta["settings"] = {"heads": args.heads, "head_dims": args.head_dims, "layouts": args.layouts,
                        "backends": args.backends, "modes": args.modes, "rounds": args.rounds,
                        "target_ms": args.target_ms, "dtype": "bfloat16", "causal": False}
    meta["layouts"] = {n: {"segments": kernel_layout(n).segments, "tokens": kernel_layout(n).total,
                           "max_seqlen": kernel_layout(n).max_seqlen, "note": kernel_layout(n).note}
                       for n in args.layouts}
    result = {"meta": meta, "rows": [], "pairs": []}
    layouts = [kernel_layout(n) for n in args.layouts]
    timed_modes = [m for m in args.modes if m != "host"]
    # host mode: the launch-bound loop on the smallest FA4 layout and on any --host-layouts (windowed
    # layouts: the short-window routes' host time, issue #18)
    host_layouts = [HOST_LAYOUT] + [n for n in (getattr(args, "host_layouts", None) or []) if n != HOST_LAYOUT]
    meta["settings"]["host_layouts"] = host_layouts
    cases = [(hd, lay, timed_modes + (["host"] if "host" in args.modes and lay.name in host_layouts else []))
             for hd in args.head_dims for lay in layouts]
    if "host" in args.modes:
        cases += [(hd, kernel_layout(n), ["host"]) for n in host_layouts if n not in args.layouts
                  for hd in args.head_dims]
    l2 = meta["gpu"].get("l2_bytes")
    done = 0
    for i, (hd, lay, modes) in enumerate(cases):
        if args.time_budget_s and time.monotonic() - t_start > args.time_budget_s:
            meta["truncated"] = f"time budget {args.time_budget_s}s reached after {done} of {len(cases)} cases"
            break
        t0 = time.monotonic()
        rows, pairs = bench_case(lay, hd, args.backends, modes, args.rounds, args.heads, meta["ceilings"], l2,
                                 args.target_ms, seed=1000 + i)
        result["rows"] += rows
        result["pairs"] += pairs
        done += 1
        print(f"[kernels] d={hd} {lay.name} {'/'.join(modes)}: {time.monotonic() - t0:.1f}s  "
              + "  ".join(f"{r['backend']}:{r['mode'][0]}={r['median_us']:.1f}us" for r in rows if r.get("median_us")),
              flush=True)
        meta["elapsed_s"] = round(time.monotonic() - t_start, 1)
        report.write_json(result, out_dir / "kernels.json", partial=True)
    meta["elapsed_s"] = round(time.monotonic() - t_start, 1)
    report.write_json(result, out_dir / "kernels.json")
    report.write_kernels_markdown(result, out_dir / "kernels.md")
    if not args.no_plot:
        report.plot_kernels(result, out_dir / "kernels_fa4_vs_triton.png")
    print(report.kernels_summary(result))
    return result


def add_arguments(p) -> None:
    from .layouts import DEFAULT_KERNEL_LAYOUTS

    p.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS + OPTIONAL_BACKENDS)
    p.add_argument("--head-dims", nargs="+", type=int, default=[64, 72, 80, 128])
    p.add_argument("--layouts", nargs="+", default=list(DEFAULT_KERNEL_LAYOUTS),
                   help="NxL, mixed, or win448/win720p/win1080p/win4k/winvideo32 (Qwen2.5-VL windows)")
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--host-layouts", nargs="+", default=[],
                   help=f"layouts timed in mode host besides {HOST_LAYOUT} (e.g. win448 180x64: the short-window routes)")
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--rounds", type=int, default=10, help="paired rounds per case")
    p.add_argument("--target-ms", type=float, default=2.0, help="GPU time per timed sample")
