"""GPU check of the fused ViT rotary (sglang_fa4/kernels/vit/rotary.py) against SGLang's own rotaries.

For Qwen2.5-VL (16 heads, d=80, bf16 cos/sin) and Qwen3-VL (16 heads, d=72, bf16 and fp32 cos/sin)
at the token counts of 448x448, 720p, 1080p and 4K: q and k as SGLang hands them (views into one
fused qkv projection), fresh random data, angles of real rotary magnitudes. Three implementations:

  fused     our Triton kernel (warmed first: compiled or loaded from disk, then the cached handle);
  native    SGLang's ``apply_rotary_pos_emb_native_eager`` (what its ViT graph mode runs);
  compiled  SGLang's ``apply_rotary_pos_emb_native`` (torch.compile'd: what its eager ViT runs).

Accuracy: each against the fp32 result (rel. error), fused against each of the others (max
difference in units of the bf16 step at the element's magnitude, fraction of bitwise-equal
elements); the fused outputs are allocated over NaN-poisoned memory and must be all finite.
Time: one call captured in a CUDA graph per implementation, replays timed with CUDA events, rounds
interleaved, medians; the HBM floor (q, k read and written once, cos/sin read once). Host: the
fused call's wall time per call in a launch-bound loop (448 tokens).

usage (GPU machine, SGLang importable): python3 benchmark/release/check_vit_rotary.py --out DIR
Writes DIR/vit_rotary.json and .md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

MODELS = {"qwen2_5_vl": (16, 80, ("bfloat16",)), "qwen3_vl": (16, 72, ("bfloat16", "float32"))}
PICTURES = ("448", "720p", "1080p", "4k")


def tokens_of(model: str, picture: str) -> int:
    from sglang_fa4.bench.layouts import PICTURES as SIZES
    from sglang_fa4.bench.vit import GEOMETRY

    w, h, f = SIZES[picture]
    t, gh, gw = GEOMETRY[model].grid_thw(w, h, f)
    return t * gh * gw


def inputs(tokens, heads, d, table, gen):
    import torch

    qkv = torch.randn(tokens, 3 * heads * d, device="cuda", generator=gen).bfloat16()
    q = qkv[:, : heads * d].view(tokens, heads, d)
    k = qkv[:, heads * d: 2 * heads * d].view(tokens, heads, d)
    ang = torch.rand(tokens, d // 2, device="cuda", generator=gen) * 60  # positions x inverse frequencies
    cos = torch.cat([ang.cos(), ang.cos()], -1).to(getattr(torch, table))
    sin = torch.cat([ang.sin(), ang.sin()], -1).to(getattr(torch, table))
    return q, k, cos, sin


def fp32_reference(q, k, cos, sin):
    def rot(x):
        x = x.float()
        c, s = cos.float().unsqueeze(1), sin.float().unsqueeze(1)
        half = x.shape[-1] // 2
        return x * c + torch_cat(-x[..., half:], x[..., :half]) * s

    return rot(q), rot(k)


def torch_cat(a, b):
    import torch

    return torch.cat((a, b), -1)


def rel(a, ref) -> float:
    return float((a.float() - ref).norm() / ref.norm())


def steps(a, b) -> float:
    """Largest |a - b| in bf16 steps at b's magnitude."""
    bound = b.float().abs().clamp_min(2.0 ** -14) * 2.0 ** -7
    return float(((a.float() - b.float()).abs() / bound).max())


def graph_ms(fn, replays: int = 20):
    import torch

    from sglang_fa4.bench.timing import event_time_ms

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    return g, (lambda: event_time_ms(g.replay, replays))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args(argv)

    import torch

    from benchmark.sglang_on_gpu import cuda_only_stubs

    cuda_only_stubs.install_missing()  # SGLang's utils import CUDA-only packages the machine lacks
    from sglang.srt.layers.rotary_embedding.utils import apply_rotary_pos_emb_native, apply_rotary_pos_emb_native_eager

    from sglang_fa4.bench.meta import base_meta
    from sglang_fa4.bench.timing import measure_copy_gbps
    from sglang_fa4.kernels import compile_events
    from sglang_fa4.kernels.vit import rotary as vit_rotary

    meta = base_meta("vit_rotary", sys.argv if argv is None else ["check_vit_rotary.py", *argv])
    gbps = measure_copy_gbps()["gbps"]
    meta["copy_gbps"] = round(gbps, 1)
    t0 = time.perf_counter()
    for model, (heads, d, tables) in MODELS.items():
        vit_rotary.warm(d, heads, heads, "bfloat16", table_dtypes=tables, device="cuda")
    meta["warm_s"] = round(time.perf_counter() - t0, 2)
    meta["warm_events"] = [{"kernel": e.kernel, "how": e.how, "seconds": round(e.seconds, 3)}
                           for e in compile_events.events("triton")]
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    impls = {"fused": vit_rotary.apply_rotary, "native": apply_rotary_pos_emb_native_eager,
             "compiled": apply_rotary_pos_emb_native}
    resolved0 = compile_events.count("triton")
    for model, (heads, d, tables) in MODELS.items():
        for table in tables:
            for pic in PICTURES:
                n = tokens_of(model, pic)
                q, k, cos, sin = inputs(n, heads, d, table, gen)
                rq, rk = fp32_reference(q, k, cos, sin)
                poison = torch.full((2 * n * heads * d,), float("nan"), device="cuda", dtype=torch.bfloat16)
                del poison  # the fused outputs are allocated over it (caching allocator)
                outs = {name: fn(q, k, cos, sin) for name, fn in impls.items()}
                fq, fk = outs["fused"]
                row = {"model": model, "picture": pic, "tokens": n, "heads": heads, "head_dim": d, "table_dtype": table,
                       "fused_finite": bool(torch.isfinite(fq).all() and torch.isfinite(fk).all())}
                for name, (oq, ok) in outs.items():
                    row[f"{name}_rel_err_vs_fp32"] = max(rel(oq, rq), rel(ok, rk))
                for name in ("native", "compiled"):
                    oq, ok = outs[name]
                    row[f"fused_vs_{name}_max_bf16_steps"] = max(steps(fq, oq), steps(fk, ok))
                    row[f"fused_vs_{name}_bitwise_fraction"] = float(
                        ((fq == oq).float().mean() + (fk == ok).float().mean()) / 2)
                timers = {}
                keep = []
                for name, fn in impls.items():
                    g, timer = graph_ms(lambda fn=fn: fn(q, k, cos, sin))
                    keep.append(g)
                    timers[name] = timer
                times = {name: [] for name in impls}
                for r in range(args.rounds):
                    for name in (list(impls) if r % 2 == 0 else list(impls)[::-1]):
                        times[name].append(timers[name]())
                for name in impls:
                    row[f"{name}_us"] = round(statistics.median(times[name]) * 1e3, 2)
                io = 2 * 2 * n * heads * d * 2 + 2 * n * d * cos.element_size()
                row["floor_us"] = round(io / (gbps * 1e9) * 1e6, 2) if gbps else None
                row["native_over_fused"] = round(row["native_us"] / row["fused_us"], 2)
                row["compiled_over_fused"] = round(row["compiled_us"] / row["fused_us"], 2)
                rows.append(row)
                print(f"[vit_rotary] {model} {table} {pic} {n}: fused {row['fused_us']} us, native {row['native_us']}, "
                      f"compiled {row['compiled_us']}, floor {row['floor_us']}; steps vs compiled "
                      f"{row['fused_vs_compiled_max_bf16_steps']:.2f}", flush=True)
                del keep, outs
    # host time of one fused call (launch-bound: 448x448, Qwen2.5-VL)
    from sglang_fa4.bench.timing import host_us_per_call

    q, k, cos, sin = inputs(tokens_of("qwen2_5_vl", "448"), 16, 80, "bfloat16", gen)
    host = [host_us_per_call(lambda: vit_rotary.apply_rotary(q, k, cos, sin), 300) for _ in range(5)]
    # host time of the short-window routes (180 windows of 64 tokens, 16 heads): the Triton kernel
    # through its cached handle (d=80/128), torch's FA2 (d=72); the call short_segments makes
    from sglang_fa4.kernels.vit import short_windows as short_segments
    from sglang_fa4.kernels.vit import short_window_kernel

    route_host = {}
    for d in (80, 128, 72):
        if d in short_segments.TRITON_HEAD_DIMS:
            short_window_kernel.warm(d, 16, 16, "bfloat16", device="cuda")
        cu = torch.arange(0, 181 * 64, 64, dtype=torch.int32, device="cuda")
        qq, kk, vv = (torch.randn(180 * 64, 16, d, device="cuda", generator=gen).bfloat16() for _ in range(3))
        short_segments.short_attention(qq, kk, vv, cu, 64, None)
        samples = [host_us_per_call(lambda: short_segments.short_attention(qq, kk, vv, cu, 64, None), 300)
                   for _ in range(5)]
        route = "triton" if d in short_segments.TRITON_HEAD_DIMS else "fa2"
        route_host[f"d{d}_{route}"] = round(statistics.median(samples), 2)
    print(f"[vit_rotary] short-window route host us/call: {route_host}", flush=True)
    result = {"meta": meta, "rows": rows, "host_us_per_call": round(statistics.median(host), 2),
              "short_window_route_host_us": route_host,
              "resolved_after_warm": compile_events.count("triton") - resolved0 - sum(
                  1 for e in compile_events.events("triton")[resolved0:] if e.kernel == "short_window_attention")}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "vit_rotary.json").write_text(json.dumps(result, indent=1, default=str))
    lines = [f"# Fused ViT rotary vs SGLang's rotaries ({meta['gpu']['name']})", "", f"Command: `{meta['command']}`", "",
             f"Warm (compile or disk load) {meta['warm_s']} s; specializations resolved after it: "
             f"{result['resolved_after_warm']}; host time of one fused call (Qwen2.5-VL 448x448): "
             f"{result['host_us_per_call']} us. Host time per call of the short-window routes (180 x 64-token "
             f"windows, 16 heads): {result['short_window_route_host_us']} us.", "",
             "GPU time per call (one call per CUDA graph, replays timed, medians); accuracy: rel. error vs "
             "fp32, fused vs SGLang's in bf16 steps.", "",
             "| model | cos/sin | image | tokens | fused us | native us | compiled us | floor us | native/fused "
             "| compiled/fused | fused err | compiled err | fused vs compiled (steps, bitwise) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['table_dtype']} | {r['picture']} | {r['tokens']} | {r['fused_us']} | "
                     f"{r['native_us']} | {r['compiled_us']} | {r['floor_us']} | {r['native_over_fused']}x | "
                     f"{r['compiled_over_fused']}x | {r['fused_rel_err_vs_fp32']:.1e} | "
                     f"{r['compiled_rel_err_vs_fp32']:.1e} | {r['fused_vs_compiled_max_bf16_steps']:.2f}, "
                     f"{r['fused_vs_compiled_bitwise_fraction']:.4f} |")
    (out / "vit_rotary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    ok = (all(r["fused_finite"] and r["fused_vs_compiled_max_bf16_steps"] <= 1.0 for r in rows)
          and result["resolved_after_warm"] == 0)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
