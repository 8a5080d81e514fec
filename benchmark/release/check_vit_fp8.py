"""FP8 ViT attention (SGLANG_FA4_VIT_ATTN_DTYPE=fp8, issue #16) against bf16 on the GPU, in one run.

Sections (``--sections``):

* ``crossover`` (FA4 only): per head dim (72: Qwen3-VL, 80: Qwen2.5-VL; 16 heads), layouts of n
  segments of L tokens: FA4 bf16 (``fa4_varlen_attention``, the short-window route for 64-token
  windows) vs the FP8 path (chunked quantize + SM90 FP8 forward, ``vit_attn_dtype.fp8_attention``),
  CUDA-graph replay, median of CUDA events; also the quantize alone (chunked vs the per-sequence
  kernel) and the FP8 forward alone; rel. error of each vs an fp32 reference (small layouts) and
  fp8 vs bf16. From the single-segment rows: L* per head dim = the shortest length from which
  every longer one (at least two lengths) has bf16/fp8 >= MARGIN: the table of
  ``sglang_fa4/kernels/vit/attn_dtype.py`` (confirmed by the towers' speed before it is committed).
* ``towers`` (SGLang importable, benchmark/sglang_on_gpu): SGLang's real Qwen2.5-VL-7B and
  Qwen3-VL-8B towers (random bf16 weights, q/k/v projections scaled like a trained ViT: see
  ``scale_like_trained``), sglang_fa4 loaded by SGLang's plugin loader, fa4. Startup as the plugin
  does it (warmup with the FP8 path, budget graphs captured per precision on two towers with the same
  weights). Then: fp8 vs bf16 tower output over random image/video mixes (cosine, rel. error, and
  per-layer attention rel. error FP8 vs FA4 bf16 on the same q/k/v), with every full-attention layer
  forced to FP8 (table {d: 65}) and with the measured table; tower speed at 448/720p/1080p/4K,
  eager and graph, bf16 vs fp8 (measured table); compiles after startup (FA4, FP8 forward, quantize).

usage (GPU machine): python3 benchmark/release/check_vit_fp8.py --out DIR [--sections crossover towers]
Writes DIR/vit_fp8.json and .md (``--tag T``: vit_fp8-T.*).
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

MARGIN = 1.02  # FP8 must beat bf16 by this much (above run-to-run noise) to be routed
HEADS = 16
LENGTHS = (1024, 2048, 4096, 6144, 8192, 16384)
TOWER_4K = {80: 42196, 72: 32640}  # the 4K picture's tokens (one segment) per model's head dim
FORCED_MIN = 65  # "forced": every layer with a segment over a 64-token window runs FP8
PICTURES = ("448", "720p", "1080p", "4k")
#: "noise" run: FA4 bf16 plus Gaussian noise of FA4 bf16's own rel. error vs fp32 (1.74e-3 in every
#: crossover row of vit_fp8-run1.md) in the layers the forced run puts on FP8
BF16_NOISE = 1.74e-3


def rel(a, b) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def graph_ms(fn, reps: int = 7) -> float:
    """Median ms of CUDA-graph replays of ``fn`` (captured after two eager warm calls)."""
    from sglang_fa4.bench.timing import graph_replay_ms

    return graph_replay_ms(fn, replays=reps, warmup=2, pre_replays=1)


def crossover(args) -> dict:
    from sglang_fa4.integration.vit_budget_layouts import full_capacity

    rows = []
    for d in args.head_dims:
        # the last layout: a 4K picture in its budget graph's full-attention layout (the budget's
        # segment slots, all but one empty; max_seqlen = the budget), as the graph replays it
        layouts = ([[n] for n in args.lengths] + [[TOWER_4K[d]]]
                   + ([[2048] * 4, [8192] * 4, [64] * 660] if args.multi else [])
                   + [[TOWER_4K[d]] + [0] * (full_capacity() - 1)])
        for lens in layouts:
            try:
                rows.append(crossover_row(d, lens))
            except Exception as exc:  # noqa: BLE001 - recorded; the table ignores a failed length
                rows.append({"head_dim": d, "segments": len(lens), "seg_len": max(lens), "error": repr(exc)[:300]})
                print(f"[crossover] d={d} {len(lens)}x{max(lens)} failed: {exc!r}", flush=True)
    table = {}
    for d in args.head_dims:
        single = sorted((r for r in rows if r["head_dim"] == d and r["segments"] == 1 and "error" not in r),
                        key=lambda r: r["seg_len"])
        start = None
        for i, r in enumerate(single[:-1]):  # at least two lengths: the longest alone is no trend
            if all(s["bf16_over_fp8"] >= MARGIN for s in single[i:]):
                start = r["seg_len"]
                break
        if start is not None:
            table[d] = start
    return {"rows": rows, "table": table, "margin": MARGIN}


def crossover_row(d: int, lens: list) -> dict:
    import torch

    from sglang_fa4.kernels import fa4, varlen
    from sglang_fa4.kernels.vit import attn_dtype as vit_attn_dtype
    from sglang_fa4.kernels.fp8_sm90.launch import fp8_varlen_attention
    from sglang_fa4.kernels.vit.fp8_quantize import quantize_qkv
    from sglang_fa4.kernels.vit.fp8_quantize_chunked import quantize_qkv_chunked
    from sglang_fa4.testing import attention_fp32, cu_seqlens

    total, m = sum(lens), max(lens)
    g = torch.Generator(device="cuda").manual_seed(total + d)
    q, k, v = (torch.randn(total, HEADS, d, device="cuda", generator=g).mul_(s).to(torch.bfloat16)
               for s in (2.0, 2.0, 1.0))
    cu = cu_seqlens(lens, device="cuda")
    pre = quantize_qkv_chunked(q, k, v, cu, cu, m)
    bf16 = lambda: varlen.fa4_varlen_attention(q, k, v, cu, m)  # noqa: E731
    fp8 = lambda: vit_attn_dtype.fp8_attention(q, k, v, cu, m)  # noqa: E731
    row = {"head_dim": d, "segments": len(lens), "empty_segments": lens.count(0), "seg_len": m, "tokens": total,
           "bf16_ms": graph_ms(bf16), "fp8_ms": graph_ms(fp8),
           "quantize_chunked_ms": graph_ms(lambda: quantize_qkv_chunked(q, k, v, cu, cu, m)),
           "quantize_per_seq_ms": graph_ms(lambda: quantize_qkv(q, k, v, cu, cu), reps=3),
           "fp8_kernel_ms": graph_ms(lambda: fp8_varlen_attention(
               pre.q, pre.k, None, cu, cu, m, m, descale=pre.descale, vt=pre.vt, softmax_scale=d ** -0.5))}
    old = quantize_qkv(q, k, v, cu, cu)
    row["quantize_bitwise_equal"] = bool(torch.equal(old.descale, pre.descale) and torch.equal(old.vt, pre.vt)
                                         and torch.equal(old.q.view(torch.uint8), pre.q.view(torch.uint8)))
    o_b, o_f = bf16(), fp8()
    row["fp8_vs_bf16_rel_err"] = rel(o_f, o_b)
    row["finite"] = bool(torch.isfinite(o_f).all())
    if total <= 8192:
        ref = attention_fp32(q, k, v, cu)
        row["fp8_vs_fp32_rel_err"], row["bf16_vs_fp32_rel_err"] = rel(o_f, ref), rel(o_b, ref)
    row["bf16_over_fp8"] = row["bf16_ms"] / row["fp8_ms"]
    row["bf16_over_fp8_kernel"] = row["bf16_ms"] / row["fp8_kernel_ms"]
    print(f"[crossover] d={d} {len(lens)}x{m}: bf16 {row['bf16_ms']:.3f} fp8 {row['fp8_ms']:.3f} "
          f"({row['bf16_over_fp8']:.2f}x) quant {row['quantize_chunked_ms']:.3f} vs "
          f"{row['quantize_per_seq_ms']:.3f}", flush=True)
    return {k2: (round(v2, 5) if isinstance(v2, float) else v2) for k2, v2 in row.items()}


def scale_like_trained(tower, gain: float = 2.5, outlier: float = 3.0, modules=None) -> dict:
    """Random N(0, 0.02) weights give q/k of std ~0.7 and nearly flat softmax; a trained ViT has
    logits of std several units and a few large q/k channels. q/k/v rows of every attention's qkv
    projection are scaled by ``gain`` (logit std ~3), and the q/k rows of head-dim channels
    0, 1, d/2, d/2+1 of every head by ``outlier`` more (outlier channels set each head's amax,
    the hard case for per-head FP8 scales). ``modules``: the VisionAttention modules (default: the
    tower's fa4 ones; benchmark/release/vit_fp8_accuracy.py passes its CPU towers' sdpa ones)."""
    import torch

    if modules is None:
        from sglang_fa4 import sglang_model

        modules = [m for _name, m in sglang_model.find_fa4_attention(tower)]
    n = 0
    with torch.no_grad():
        for m in modules:
            w = m.qkv_proj.weight
            h, d = int(m.num_attention_heads_per_partition), int(m.head_size)
            w.mul_(gain)
            for part in (0, 1):  # q, k
                for c in (0, 1, d // 2, d // 2 + 1):
                    w[part * h * d + c: (part + 1) * h * d: d].mul_(outlier)
            n += 1
    return {"attention_modules": n, "gain": gain, "outlier_channels": [0, 1, "d/2", "d/2+1"], "outlier": outlier}


def set_mode(mode: str) -> None:
    from sglang_fa4.kernels import settings

    os.environ["SGLANG_FA4_VIT_ATTN_DTYPE"] = mode
    settings.reload()  # the routing settings are read once: read them again


class LayerErrors:
    """Wraps the ViT kernels' ``fp8_attention`` (what the ViT form's route calls): while ``on``, each FP8 call also runs FA4 bf16 on the
    same q/k/v and records the rel. error of the FP8 output. With ``noise`` > 0 the call returns
    FA4 bf16 plus Gaussian noise of that rel. size instead (no FP8): how far the random tower moves
    for a bf16-sized perturbation of the same layers (benchmark/release/vit_fp8_accuracy.py)."""

    def __init__(self):
        import torch

        from sglang_fa4.kernels import varlen, vit

        self.on, self.errors, self.noise, self.calls, inner = False, [], 0.0, 0, vit.fp8_attention

        def wrapped(q, k, v, cu, max_seqlen, softmax_scale=None):
            self.calls += 1
            if self.noise:
                ref = varlen.fa4_varlen_attention(q, k, v, cu, max_seqlen, softmax_scale=softmax_scale).float()
                n = torch.randn_like(ref)
                out = (ref + n * (self.noise * ref.norm() / n.norm())).to(q.dtype)
                if self.on:
                    self.errors.append(rel(out, ref))
                return out
            out = inner(q, k, v, cu, max_seqlen, softmax_scale)
            if self.on:
                ref = varlen.fa4_varlen_attention(q, k, v, cu, max_seqlen, softmax_scale=softmax_scale)
                self.errors.append(rel(out, ref))
            return out

        vit.fp8_attention = wrapped


def compiles() -> dict:
    from sglang_fa4.kernels import compile_events, fa4

    return {"fa4": fa4.kernel_cache().compile_count(), "fp8_forward": compile_events.count("fp8_forward"),
            "quantize": compile_events.count("fp8_quantize")}


def call_ms(tower, x, grid, graph: bool, mode: str) -> float:
    """check_vit_graphs.call_ms (one synced tower call) with the ViT attention dtype ``mode`` set."""
    from benchmark.release.check_vit_graphs import call_ms as tower_call_ms

    set_mode(mode)
    return tower_call_ms(tower, x, grid, graph)


def graph_outputs(pair: dict, x, grid, layer_errors: LayerErrors) -> dict:
    """The fp8 tower's output through its budget graph against its eager output (the FP8 calls'
    grids differ: the graph's full-attention layout holds the budget's segment slots) and against
    the bf16 graph; the FP8 calls the eager forward made (the measured table's decision)."""
    import torch

    from benchmark.sglang_on_gpu.sglang_towers import set_graph_mode

    outs = {}
    with torch.no_grad():
        for key, mode, graph in (("eager_fp8", "fp8", False), ("graph_fp8", "fp8", True), ("graph_bf16", "bf16", True)):
            set_mode(mode)
            set_graph_mode(pair[mode], graph)
            before = layer_errors.calls
            outs[key] = pair[mode](x, grid).float()
            if key == "eager_fp8":
                fp8_calls = layer_errors.calls - before
            set_graph_mode(pair[mode], False)
    cos = lambda a, b: round(float(torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0)), 6)  # noqa: E731
    return {"fp8_calls_eager": fp8_calls,
            "graph_fp8_equals_eager_fp8": bool(torch.equal(outs["graph_fp8"], outs["eager_fp8"])),
            "graph_fp8_vs_eager_fp8_cosine": cos(outs["graph_fp8"], outs["eager_fp8"]),
            "graph_fp8_vs_graph_bf16_cosine": cos(outs["graph_fp8"], outs["graph_bf16"])}


def towers_section(model: str, args, table: dict, seed: int, layer_errors: LayerErrors) -> dict:
    import torch

    from benchmark.release.check_vit_graphs import random_mix
    from sglang_fa4.bench.layouts import PICTURES as SIZES
    from sglang_fa4.integration import vit_budgets
    from sglang_fa4.kernels.vit import attn_dtype as vit_attn_dtype
    from sglang_fa4 import sglang_model
    from sglang_fa4.startup import jit_monitor, warmup
    from benchmark.sglang_on_gpu.sglang_towers import build_tower, grid_of, pixels, set_graph_mode

    jit_monitor.reset_state()
    set_graph_mode(None, True)
    res: dict = {"model": model}
    pair, holders = {}, {}
    for mode in ("bf16", "fp8"):  # same seed: same weights; each captures its budgets in its precision
        pair[mode] = build_tower(model, seed=seed)
        res["scaling"] = scale_like_trained(pair[mode])
        holders[mode] = torch.nn.Module()
        holders[mode].visual = pair[mode]
    d = int(sglang_model.find_fa4_attention(pair["fp8"])[0][1].head_size)
    x, grid = pixels(pair["bf16"], [grid_of(model, 448, 448)], seed=1)
    set_mode("bf16")
    set_graph_mode(pair["bf16"], False)
    with torch.no_grad():
        pair["bf16"](x, grid)  # SGLang's own JIT kernels (nvcc) compile here, outside the numbers
    # warm what the forced accuracy runs need too (a superset of the measured table's shapes)
    vit_attn_dtype.set_min_segment_table({**table, d: FORCED_MIN})
    set_mode("fp8")
    t0 = time.perf_counter()
    wrep = warmup.warm_model(holders["fp8"])  # fp8=None: decided by the env and the GPU
    res["warmup_s"] = round(time.perf_counter() - t0, 2)
    res["warmup"] = wrep.as_dict() if wrep is not None else None
    vit_attn_dtype.set_min_segment_table(table)
    # one budget per picture of this model (its 4K picture included): both modes replay graphs
    os.environ["SGLANG_FA4_VIT_GRAPH_BUDGETS"] = ",".join(
        str(-(-sum(t * hh * ww for t, hh, ww in [grid_of(model, *SIZES[p][:2], SIZES[p][2])]) // 4) * 4)
        for p in args.pictures)
    res["budgets"] = os.environ["SGLANG_FA4_VIT_GRAPH_BUDGETS"]
    for mode in ("bf16", "fp8"):
        set_mode(mode)
        t0 = time.perf_counter()
        vit_budgets.capture_model_budgets(holders[mode])
        res[f"capture_{mode}_s"] = round(time.perf_counter() - t0, 2)
    c0 = compiles()

    rng = random.Random(seed)
    mixes = []
    for i in range(args.mixes):
        grids = random_mix(rng, model, args.mix_tokens)
        x, grid = pixels(pair["bf16"], grids, seed=1000 + i)
        row = {"grids": [list(g) for g in grids], "tokens": int(x.shape[0])}
        with torch.no_grad():
            set_graph_mode(pair["bf16"], False)
            set_graph_mode(pair["fp8"], False)
            set_mode("bf16")
            ref = pair["bf16"](x, grid).float()
            set_mode("fp8")
            for name, tab in (("forced", {d: FORCED_MIN}), ("table", table), ("noise", {d: FORCED_MIN})):
                vit_attn_dtype.set_min_segment_table(tab)
                layer_errors.on, layer_errors.errors = name != "table", []
                layer_errors.noise = BF16_NOISE if name == "noise" else 0.0
                out = pair["fp8"](x, grid).float()
                layer_errors.on, layer_errors.noise = False, 0.0
                row[name] = {"cosine": float(torch.nn.functional.cosine_similarity(out.flatten(), ref.flatten(), dim=0)),
                             "rel_err": rel(out, ref), "finite": bool(torch.isfinite(out).all()),
                             "fp8_layers": len(layer_errors.errors) if name != "table" else None}
                if name == "forced":
                    row["layer_attn_rel_err"] = [round(e, 5) for e in layer_errors.errors]
                if name == "noise":
                    row["noise_layer_rel_err"] = [round(e, 5) for e in layer_errors.errors]
        mixes.append(row)
    vit_attn_dtype.set_min_segment_table(table)
    res["mixes"] = mixes

    latency = []
    for name in args.pictures:
        w, h, f = SIZES[name]
        grids = [grid_of(model, w, h, f)]
        x, grid = pixels(pair["bf16"], grids, seed=7)
        runs = {("eager", "bf16"): (pair["bf16"], False), ("eager", "fp8"): (pair["fp8"], False),
                ("graph", "bf16"): (pair["bf16"], True), ("graph", "fp8"): (pair["fp8"], True)}
        times = {key: [] for key in runs}
        for (kind, mode), (tower, graph) in runs.items():
            call_ms(tower, x, grid, graph, mode)
        n = args.rounds if x.shape[0] < 20000 else max(3, args.rounds // 2)
        for r in range(n):
            for key in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
                tower, graph = runs[key]
                times[key].append(call_ms(tower, x, grid, graph, key[1]))
        med = {f"{k}_{m}_ms": round(statistics.median(v), 3) for (k, m), v in times.items()}
        latency.append({"image": name, "tokens": int(x.shape[0]), **med, "rounds": n,
                        "eager_speedup": round(med["eager_bf16_ms"] / med["eager_fp8_ms"], 3),
                        "graph_speedup": round(med["graph_bf16_ms"] / med["graph_fp8_ms"], 3),
                        **graph_outputs(pair, x, grid, layer_errors)})
        print(f"[towers] {model} {name}: {latency[-1]}", flush=True)
    res["latency"] = latency
    c1 = compiles()
    res["compiles_after_startup"] = {k: c1[k] - c0[k] for k in c0}
    res["jit_monitor_compiles_after_warmup"] = jit_monitor.compiles_after_warmup()
    set_mode("bf16")
    for t in pair.values():
        set_graph_mode(t, False)
    del pair, holders
    torch.cuda.empty_cache()
    return res


def markdown(result: dict) -> str:
    meta = result["meta"]
    lines = [f"# FP8 ViT attention vs bf16 ({meta['gpu'].get('name')})", "", f"Command: `{meta['command']}`", ""]
    cx = result.get("crossover")
    if result.get("rendered_by"):
        lines += [f"Written by `{result['rendered_by']}` from the run's JSON (models in it: "
                  f"{', '.join(m['model'] for m in result.get('models', [])) or 'none'}).", ""]
    if result.get("table_from"):
        src = result["table_from"]
        lines += [f"The crossover below (and the FP8 table the towers use) is an earlier run's, `{src['file']}`: "
                  f"`{src['command']}` (started {src['started']}).", ""]
    if cx:
        lines += ["## Attention calls: FA4 bf16 vs the FP8 path (quantize + FP8 forward), 16 heads, graph replay",
                  "", f"Table derived (head dim -> L*, bf16/fp8 >= {cx['margin']} for every single segment "
                  f"at least that long, two lengths at least): `{cx['table']}`; the towers below ran with "
                  f"`{result.get('table_used')}`", "",
                  "| d | segments x len | bf16 ms | fp8 path ms | bf16/fp8 | FP8 fwd ms | bf16/FP8 fwd | quantize ms "
                  "(chunked) | quantize ms (per seq) | fp8 vs bf16 rel | fp8 vs fp32 | bf16 vs fp32 | quant equal |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in cx["rows"]:
            if "error" in r:
                lines.append(f"| {r['head_dim']} | {r['segments']}x{r['seg_len']} | failed: {r['error']} |")
                continue
            f32 = lambda k: f"{r[k]:.2e}" if k in r else "-"  # noqa: E731
            shape = (f"1x{r['seg_len']} + {r['empty_segments']} empty (budget graph)" if r.get("empty_segments")
                     else f"{r['segments']}x{r['seg_len']}")
            lines.append(f"| {r['head_dim']} | {shape} | {r['bf16_ms']:.3f} | {r['fp8_ms']:.3f} | "
                         f"{r['bf16_over_fp8']:.2f}x | {r['fp8_kernel_ms']:.3f} | {r['bf16_over_fp8_kernel']:.2f}x | "
                         f"{r['quantize_chunked_ms']:.3f} | {r['quantize_per_seq_ms']:.3f} | {r['fp8_vs_bf16_rel_err']:.2e} | "
                         f"{f32('fp8_vs_fp32_rel_err')} | {f32('bf16_vs_fp32_rel_err')} | {r['quantize_bitwise_equal']} |")
        lines.append("")
    for m in result.get("models", []):
        mixes = m["mixes"]
        lines += [f"## {m['model']} (SGLang {meta['sglang']['sglang_version']}'s tower)", "",
                  f"- weights: random, q/k/v scaled like a trained ViT: `{m['scaling']}`",
                  f"- startup: warmup {m['warmup_s']} s (FP8 part: {len((m['warmup'] or {}).get('fp8', {}).get('variants', []))} "
                  f"items), budget capture bf16 {m['capture_bf16_s']} s, fp8 {m['capture_fp8_s']} s",
                  f"- compiles after startup: `{m['compiles_after_startup']}`; JIT monitor: "
                  f"{m['jit_monitor_compiles_after_warmup']}", ""]
        for name in ("forced", "table", "noise") if mixes else ():
            if name not in mixes[0]:
                continue
            cos = [r[name]["cosine"] for r in mixes]
            err = [r[name]["rel_err"] for r in mixes]
            what = {"forced": "every full-attention layer FP8", "table": "the measured table",
                    "noise": (f"no FP8, FA4 bf16 + Gaussian noise of rel. size {BF16_NOISE:g} (bf16-sized) in every "
                              "full-attention layer")}[name]
            lines.append(f"- {len(mixes)} mixes, {what}: tower output cosine min {min(cos):.6f} median "
                         f"{statistics.median(cos):.6f}; rel. error max {max(err):.3e} median {statistics.median(err):.3e}; "
                         f"all finite {all(r[name]['finite'] for r in mixes)}")
        applied = [e for r in mixes for e in r.get("noise_layer_rel_err", [])]
        if applied:
            lines.append(f"- the noise run's perturbation, rel. to FA4 bf16 per layer after rounding to bf16 "
                         f"({len(applied)} calls): median {statistics.median(applied):.2e}, max {max(applied):.2e}")
        layer = [e for r in mixes for e in r["layer_attn_rel_err"]]
        if layer:
            lines.append(f"- per-layer attention output, FP8 vs FA4 bf16 on the same q/k/v ({len(layer)} calls): "
                         f"rel. error max {max(layer):.3e}, median {statistics.median(layer):.3e}")
        lines += ["", "| image | tokens | eager bf16 ms | eager fp8 ms | eager bf16/fp8 | graph bf16 ms | graph fp8 ms | "
                  "graph bf16/fp8 | FP8 calls (eager) | fp8 graph = eager (bitwise) | fp8 vs bf16 graph cosine |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in m["latency"]:
            lines.append(f"| {r['image']} | {r['tokens']} | {r['eager_bf16_ms']:.2f} | {r['eager_fp8_ms']:.2f} | "
                         f"{r['eager_speedup']:.3f}x | {r['graph_bf16_ms']:.2f} | {r['graph_fp8_ms']:.2f} | "
                         f"{r['graph_speedup']:.3f}x | {r.get('fp8_calls_eager', '-')} | "
                         f"{r.get('graph_fp8_equals_eager_fp8', '-')} | {r.get('graph_fp8_vs_graph_bf16_cosine', '-')} |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out")
    ap.add_argument("--sections", nargs="+", default=["crossover", "towers"])
    ap.add_argument("--models", nargs="+", default=["qwen2_5_vl", "qwen3_vl"])
    ap.add_argument("--mixes", type=int, default=12)
    ap.add_argument("--mix-tokens", type=int, default=12000)
    ap.add_argument("--pictures", nargs="+", default=list(PICTURES))
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--tag", default="")
    ap.add_argument("--lengths", nargs="+", type=int, default=list(LENGTHS),
                    help="single-segment lengths of the crossover sweep (the 4K pictures' are added)")
    ap.add_argument("--head-dims", nargs="+", type=int, default=[80, 72], choices=sorted(TOWER_4K))
    ap.add_argument("--no-multi", dest="multi", action="store_false",
                    help="crossover without the 4x2048, 4x8192 and 660x64 layouts")
    ap.add_argument("--table-from", default=None,
                    help="a vit_fp8 JSON: use its crossover (rows and table) instead of measuring one")
    ap.add_argument("--render", default=None,
                    help="only write the markdown of this vit_fp8 JSON (a run cut short before its end) beside it")
    args = ap.parse_args(argv)
    if args.render:
        src = Path(args.render)
        result = json.loads(src.read_text())
        result["rendered_by"] = f"benchmark/release/check_vit_fp8.py --render {args.render}"
        src.with_suffix(".md").write_text(markdown(result))
        return 0
    if not args.out:
        ap.error("--out is required (unless --render)")
    os.environ.setdefault("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "1")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result: dict = {}
    info = None
    if "towers" in args.sections:
        from benchmark.sglang_on_gpu.sglang_towers import prepare_sglang

        env = {"SGLANG_VIT_ENABLE_CUDA_GRAPH": "1", "SGLANG_FA4_VIT_GRAPH_BUDGETS_ENABLE": "1",
               "SGLANG_FA4_JIT_MONITOR": "warn",
               "SGLANG_FA4_VIT_ATTN_DTYPE": "bf16"}
        info = prepare_sglang("fa4", env)
    from sglang_fa4.bench.meta import base_meta

    meta = base_meta("vit_fp8", sys.argv if argv is None else ["check_vit_fp8.py", *argv])
    meta.update(sglang=info, margin=MARGIN)
    result["meta"] = meta

    def save():
        (out / f"vit_fp8{'-' + args.tag if args.tag else ''}.json").write_text(json.dumps(result, default=str))

    from sglang_fa4.kernels.vit import attn_dtype as vit_attn_dtype

    table = dict(vit_attn_dtype.FP8_MIN_SEGMENT)
    if args.table_from:  # an earlier run's crossover (FA4 only, no SGLang)
        source = json.loads(Path(args.table_from).read_text())
        table = {int(k): v for k, v in source["crossover"]["table"].items()}
        result["table_from"] = {"file": args.table_from, "command": source["meta"]["command"],
                                "started": source["meta"]["started"]}
        result["crossover"] = source["crossover"]
    if "crossover" in args.sections:
        t0 = time.perf_counter()
        result["crossover"] = crossover(args)
        table = {int(k): v for k, v in result["crossover"]["table"].items()}
        print(f"[crossover] table {table} ({time.perf_counter() - t0:.0f} s)", flush=True)
        save()
    result["table_used"] = table
    if "towers" in args.sections:
        layer_errors = LayerErrors()
        result["models"] = []
        for i, model in enumerate(args.models):
            t0 = time.perf_counter()
            try:
                result["models"].append(towers_section(model, args, table, i, layer_errors))
            except Exception as exc:  # noqa: BLE001 - keep what the other sections measured
                import traceback

                traceback.print_exc()
                result.setdefault("failures", []).append(f"{model}: {type(exc).__name__}: {exc}")
            print(f"[towers] {model} done ({time.perf_counter() - t0:.0f} s)", flush=True)
            save()
    save()
    (out / f"vit_fp8{'-' + args.tag if args.tag else ''}.md").write_text(markdown(result))
    print(markdown(result))
    return 0 if not result.get("failures") else 1


if __name__ == "__main__":
    sys.exit(main())
