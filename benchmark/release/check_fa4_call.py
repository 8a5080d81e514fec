"""GPU check of sglang_fa4.kernels.varlen's direct-launch path against FA4's public API.

On one GPU, in one process:
  1. bitwise: fa4_varlen_attention == flash_attn_varlen_func for head_dim 64/72/80/128 over
     several varlen layouts (fresh random data each time, output poisoned with NaN first,
     contiguous and packed-qkv strided inputs, a loose max_seqlen bound, > 256 segments);
  2. window + sinks: bitwise vs the public API, and rel. error vs an fp32 reference;
  3. host microseconds per call in a launch-bound loop: public API, ours (out given / allocated),
     and the bare compiled function (the floor);
  4. CUDA graph: capture ours (incl. the > 256-segment path), refill inputs, replay, compare
     with eager public results;
  5. compile events: how many configurations ours resolved, and that none were added by calls
     that only changed max_seqlen / window sizes.
Writes JSON (``--json``, default $OUT/fa4_call_check.json) after every section and prints a table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

import torch  # noqa: E402

from sglang_fa4.testing import attention_fp32, cu_seqlens, rel_err  # noqa: E402

DEV = "cuda"
RESULT: dict = {}
T0 = time.perf_counter()


def save(path: Path) -> None:
    RESULT["elapsed_s"] = round(time.perf_counter() - T0, 2)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(RESULT, indent=1, default=str))


def rand_qkv(total, heads, d, dtype, packed=False):
    if packed:
        qkv = torch.randn(total, 3, heads, d, dtype=dtype, device=DEV)
        return qkv.unbind(1)
    return tuple(torch.randn(total, heads, d, dtype=dtype, device=DEV) for _ in range(3))


def public(q, k, v, cu, ms, scale=None, window=(None, None), sinks=None):
    from flash_attn.cute import flash_attn_varlen_func

    r = flash_attn_varlen_func(
        q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=ms, max_seqlen_k=ms,
        softmax_scale=scale, window_size=window, learnable_sink=sinks,
    )
    return r[0] if isinstance(r, tuple) else r


def host_us(fn, n):
    torch.cuda.synchronize()
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(n):
        t = time.perf_counter_ns()
        fn()
        ts.append(time.perf_counter_ns() - t)
    torch.cuda.synchronize()
    ts.sort()
    return {
        "median_us": ts[len(ts) // 2] / 1e3,
        "p10_us": ts[len(ts) // 10] / 1e3,
        "p90_us": ts[9 * len(ts) // 10] / 1e3,
        "n": n,
    }


def _fa4_version(module) -> str:
    try:
        from importlib.metadata import version

        return version("flash-attn-4")
    except Exception:  # noqa: BLE001 (a bundle without dist-info)
        return getattr(module, "__version__", "unknown (no dist-info)")


def guarded(section: str, fn, *a):
    """Run one case; an exception is recorded (and fails the run) instead of ending it."""
    try:
        return fn(*a)
    except Exception as exc:  # noqa: BLE001
        import traceback

        RESULT.setdefault("errors", []).append(
            {"section": section, "error": repr(exc), "traceback": traceback.format_exc()[-3000:]}
        )
        print(f"ERROR in {section}: {exc!r}", flush=True)
        return None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "fa4_call_check.json"))
    ap.add_argument("--budget-s", type=float, default=150.0, help="skip the remaining head dims past this")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--shell-command", default="", help="the full command line, recorded in the JSON")
    args = ap.parse_args()
    out_path = Path(args.json)

    from sglang_fa4.kernels import fa4, varlen
    import flash_attn

    torch.manual_seed(0)
    dev = torch.cuda.get_device_properties(0)
    RESULT.update(
        command=" ".join(shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv]),
        device=dev.name,
        capability=f"{dev.major}.{dev.minor}",
        torch=torch.__version__,
        flash_attn=_fa4_version(flash_attn),
        shell_command=args.shell_command,
        python=platform.python_version(),
        host_cpu=platform.processor() or platform.machine(),
    )
    H = args.heads
    bf16 = torch.bfloat16
    ok_all = True
    events_log = []
    fa4.kernel_cache().add_compile_listener(lambda e: events_log.append(e))

    # ---- 1. bitwise ------------------------------------------------------------------------
    layouts = {
        "one_1024": [1024],
        "mixed_4": [196, 784, 400, 64],
        "short_3": [100, 50, 64],  # max_seqlen <= tile_m: FA4's key differs, the kernel does not
    }
    many = [int(x) for x in torch.randint(1, 40, (300,), generator=torch.Generator().manual_seed(1))]
    rows: list = []
    RESULT["bitwise"] = rows

    def bitwise_for(d):
        nonlocal ok_all
        cases = [("one_1024", False, None), ("mixed_4", False, None), ("mixed_4", True, None),
                 ("mixed_4", False, 8192)]
        if d == 80:
            cases += [("short_3", False, None), ("many_300", False, None), ("many_300", True, 4096)]
        for case in cases:
            guarded(f"bitwise d={d} {case}", one_case, d, *case)
        save(out_path)

    def one_case(d, name, packed, loose):
        nonlocal ok_all
        if True:
            lens = many if name == "many_300" else layouts[name]
            total, ms = sum(lens), max(lens)
            q, k, v = rand_qkv(total, H, d, bf16, packed)
            cu = cu_seqlens(lens, device=DEV)
            out = torch.full((total, H, d), float("nan"), dtype=bf16, device=DEV)
            before = fa4.kernel_cache().compile_count()
            ours = varlen.fa4_varlen_attention(q, k, v, cu, loose or ms, out=out)
            ours_alloc = varlen.fa4_varlen_attention(q, k, v, cu, ms)
            ref = public(q, k, v, cu, ms)
            torch.cuda.synchronize()
            row = {
                "head_dim": d, "layout": name, "segments": len(lens), "total": total,
                "packed_qkv": packed, "max_seqlen_passed": loose or ms,
                "all_written": bool(not torch.isnan(ours).any()),
                "bitwise": bool(torch.equal(ours, ref) and torch.equal(ours_alloc, ref)),
                "new_configs": fa4.kernel_cache().compile_count() - before,
            }
            ok_all &= row["all_written"] and row["bitwise"]
            rows.append(row)

    # d=80 first (short, > 256 segments); d=64/72/128 after the other sections, budget allowing
    bitwise_for(80)

    # ---- 2. window + sinks -----------------------------------------------------------------
    ws = []
    lens = [196, 784, 400, 64]
    total, ms = sum(lens), max(lens)
    def window_case(d, window, sink_dtype):
        nonlocal ok_all
        q, k, v = rand_qkv(total, H, d, bf16)
        cu = cu_seqlens(lens, device=DEV)
        sinks = None if sink_dtype is None else (torch.randn(H, device=DEV) * 2 + 3).to(sink_dtype)
        scale = 1.0 / math.sqrt(d)
        before = fa4.kernel_cache().compile_count()
        out = torch.full((total, H, d), float("nan"), dtype=bf16, device=DEV)
        ours = varlen.fa4_varlen_attention(q, k, v, cu, ms, window_size=window, sinks=sinks, out=out)
        fa4_window = tuple(None if (w is not None and w < 0) else w for w in window)
        pub = public(q, k, v, cu, ms, window=fa4_window, sinks=sinks)
        ref = attention_fp32(q, k, v, cu, scale=scale, window=fa4_window, sinks=sinks)
        nosink = attention_fp32(q, k, v, cu, scale=scale, window=fa4_window) if sinks is not None else None
        torch.cuda.synchronize()
        row = {
            "head_dim": d, "window": list(window), "sinks": str(sink_dtype),
            "bitwise_vs_public": bool(torch.equal(ours, pub)),
            "all_written": bool(not torch.isnan(ours).any()),
            "rel_err_vs_fp32": rel_err(ours, ref),
            "rel_err_public_vs_fp32": rel_err(pub, ref),
            "sinks_matter_rel_diff": rel_err(ref, nosink) if nosink is not None else None,
            "new_configs": fa4.kernel_cache().compile_count() - before,
        }
        ok_all &= row["bitwise_vs_public"] and row["all_written"] and row["rel_err_vs_fp32"] < 2e-2
        ws.append(row)

    for case in ((64, (64, 64), torch.float32), (64, (32, 16), torch.float32), (80, (-1, -1), None)):
        guarded(f"window_sinks {case}", window_case, *case)
    RESULT["window_sinks"] = ws
    save(out_path)

    # ---- 3. host overhead ------------------------------------------------------------------
    def host_section():
        nonlocal ok_all
        d, lens = 80, [256]
        q, k, v = rand_qkv(256, H, d, bf16)
        cu = cu_seqlens(lens, device=DEV)
        out = torch.empty_like(q)
        with torch.inference_mode():
            varlen.fa4_varlen_attention(q, k, v, cu, 256, out=out)
            launcher = next(
                l for l in fa4.kernel_cache()._launchers.values()
                if l.config.head_dim == 80 and not l.config.many_segments
                and not l.config.window_left and l.config.sink_dtype is None
            )
            lay = launcher.layout
            raw = launcher.template.copy()
            raw[lay.q], raw[lay.k], raw[lay.v], raw[lay.out] = q, k, v, out
            raw[lay.softmax_scale] = launcher.default_scale
            raw[lay.cu_seqlens_q] = raw[lay.cu_seqlens_k] = cu
            if lay.max_seqlen is not None:
                raw[lay.max_seqlen] = 256
            fn = launcher.fn
            before = fa4.kernel_cache().compile_count()
            timing = {
                "shape": {"total": 256, "heads": H, "head_dim": d, "segments": 1},
                "fa4_public": host_us(lambda: public(q, k, v, cu, 256), 1000),
                "ours_out_given": host_us(
                    lambda: varlen.fa4_varlen_attention(q, k, v, cu, 256, out=out), 4000),
                "ours_alloc": host_us(lambda: varlen.fa4_varlen_attention(q, k, v, cu, 256), 4000),
                "ours_window_sinks": None,
                "compiled_fn_direct": host_us(lambda: fn(*raw), 4000),
            }
            sinks = torch.randn(H, device=DEV)
            q64, k64, v64 = rand_qkv(256, H, 64, bf16)
            timing["ours_window_sinks"] = host_us(
                lambda: varlen.fa4_varlen_attention(q64, k64, v64, cu, 256, window_size=(64, 64),
                                                      sinks=sinks), 4000)
            timing["fa4_public_window_sinks"] = host_us(
                lambda: public(q64, k64, v64, cu, 256, window=(64, 64), sinks=sinks), 1000)
            timing["new_configs_during_timing"] = fa4.kernel_cache().compile_count() - before
        RESULT["host_overhead"] = timing
        ok_all &= timing["ours_out_given"]["median_us"] <= 15.0

    guarded("host_overhead", host_section)
    save(out_path)

    # ---- 4. CUDA graph -----------------------------------------------------------------------
    def graph_section():
        nonlocal ok_all
        g_res = {}
        d, lens = 80, [196, 784, 400, 64]
        total, ms = sum(lens), max(lens)
        q, k, v = rand_qkv(total, H, d, bf16)
        cu = cu_seqlens(lens, device=DEV)
        lens_many = many
        qm, km, vm = rand_qkv(sum(lens_many), H, d, bf16)
        cum = cu_seqlens(lens_many, device=DEV)
        q6, k6, v6 = rand_qkv(total, H, 64, bf16)
        sinks = torch.randn(H, device=DEV)
        out1 = torch.empty_like(q)
        out6 = torch.empty_like(q6)
        before = fa4.kernel_cache().compile_count()

        def body():
            varlen.fa4_varlen_attention(q, k, v, cu, ms, out=out1)
            o2 = varlen.fa4_varlen_attention(out1, k, v, cu, ms)  # chained, allocated in pool
            om = varlen.fa4_varlen_attention(qm, km, vm, cum, max(lens_many))  # > 256 segments
            varlen.fa4_varlen_attention(q6, k6, v6, cu, ms, window_size=(64, 64), sinks=sinks, out=out6)
            return o2, om

        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s), torch.inference_mode():
            body()
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.inference_mode():
            with torch.cuda.graph(graph):
                o2, om = body()
        eq = []
        for _ in range(2):
            for t in (q, k, v, qm, km, vm, q6, k6, v6):
                t.copy_(torch.randn_like(t))
            out1.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            e1 = public(q, k, v, cu, ms)
            e2 = public(e1, k, v, cu, ms)
            em = public(qm, km, vm, cum, max(lens_many))
            e6 = public(q6, k6, v6, cu, ms, window=(64, 64), sinks=sinks)
            torch.cuda.synchronize()
            eq.append([torch.equal(out1, e1), torch.equal(o2, e2), torch.equal(om, em), torch.equal(out6, e6)])
        g_res["replays_bitwise_equal"] = eq
        g_res["ok"] = all(all(r) for r in eq)
        g_res["new_configs"] = fa4.kernel_cache().compile_count() - before
        # replay cost
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(50):
            graph.replay()
        torch.cuda.synchronize()
        g_res["replay_ms"] = (time.perf_counter() - t) * 1e3 / 50
        ok_all &= g_res["ok"]
        RESULT["cuda_graph"] = g_res

    guarded("cuda_graph", graph_section)
    save(out_path)

    # ---- 1b. the other head dims ------------------------------------------------------------
    skipped = []
    for d in (64, 72, 128):
        if time.perf_counter() - T0 < args.budget_s:
            bitwise_for(d)
        else:
            skipped.append(d)
    RESULT["bitwise_skipped_head_dims"] = skipped
    ok_all &= not skipped

    # ---- 5. compile events -------------------------------------------------------------------
    RESULT["compile_count"] = fa4.kernel_cache().compile_count()
    RESULT["compile_events"] = [e.as_dict() for e in fa4.kernel_cache().compile_events()]
    RESULT["listener_saw"] = len(events_log)
    RESULT["ok"] = bool(ok_all and not RESULT.get("errors"))
    save(out_path)

    # ---- table -------------------------------------------------------------------------------
    print(f"\n{RESULT['device']} sm_{RESULT['capability']} torch {RESULT['torch']} flash_attn {RESULT['flash_attn']}")
    print(f"{'d':>4} {'layout':10} {'segs':>5} {'packed':>6} {'max_sl':>6} {'bitwise':>7} {'written':>7} {'new':>3}")
    for r in RESULT["bitwise"]:
        print(f"{r['head_dim']:>4} {r['layout']:10} {r['segments']:>5} {str(r['packed_qkv']):>6} "
              f"{r['max_seqlen_passed']:>6} {str(r['bitwise']):>7} {str(r['all_written']):>7} {r['new_configs']:>3}")
    for r in RESULT["window_sinks"]:
        print(f"win {r['window']} sinks {r['sinks']}: bitwise {r['bitwise_vs_public']} "
              f"rel_err {r['rel_err_vs_fp32']:.2e} (public {r['rel_err_public_vs_fp32']:.2e}) new {r['new_configs']}")
    if "host_overhead" in RESULT:
        h = RESULT["host_overhead"]
        for k_ in ("fa4_public", "ours_out_given", "ours_alloc", "compiled_fn_direct",
                   "fa4_public_window_sinks", "ours_window_sinks"):
            print(f"host {k_:24s} median {h[k_]['median_us']:8.2f} us  p90 {h[k_]['p90_us']:8.2f}")
    if "cuda_graph" in RESULT:
        print(f"cuda graph: {RESULT['cuda_graph']}")
    print(f"compiles: {RESULT['compile_count']} ("
          + ", ".join(f"d{e['config']['head_dim']}{'/many' if e['config']['many_segments'] else ''}"
                      f"{'/win' if e['config']['window_left'] else ''}{'/sink' if e['config']['sink_dtype'] else ''}"
                      f" {e['seconds']:.1f}s" for e in RESULT["compile_events"]) + ")")
    print(f"OK: {RESULT['ok']}  elapsed {RESULT['elapsed_s']} s")
    return 0 if RESULT["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
