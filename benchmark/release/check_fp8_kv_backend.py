"""Issue #17 items 2-3 with SGLang's REAL attention backend and KV pool objects: SGLang's own
``FlashAttentionBackend`` (``fa4``, built by ``ATTENTION_BACKENDS["fa4"]`` from a model runner) on
an ``fp8_e4m3`` ``MHATokenToKVPool``, driven through a ``RadixAttention`` layer and a
``ForwardBatch`` exactly as a model's forward does (``init_forward_metadata``, then the layer:
``set_kv_buffer`` quantizes the new K/V into the pool, ``prepare_paged_mha_query`` casts q, the
dispatcher call goes through the plugin's hook to the SM90 FP8 kernel). The layer, runner and pool
are built by ``benchmark/sglang_on_gpu/sglang_llm_layer.py`` (SGLang's own attention test kit).

FA3-FP8 is SGLang's ``fa3`` backend (``ATTENTION_BACKENDS["fa3"]``, SGLang's Hopper default with
this cache) on the same kind of pool, its FA3 kernel loader pointed at FA3 built from source
(``.fa3/libfa3fwd.so`` from ``benchmark/fa3_build/build.sh``; ``benchmark/sglang_on_gpu/fa3_seam.py``);
skipped, with the reason recorded, where the library is absent.

Correctness: fp32 attention on the dequantized cache (K/V read back from the pool's buffers through
``req_to_token``, times the layer's k/v scales; q cast to E4M3 as SGLang does), bottom-right causal;
the CUDA caching allocator's free memory NaN-poisoned before each forward (the backend allocates
its output); Qwen2.5-7B-like layer (28 q / 4 kv heads, d=128) and a d=256 layer (16 q / 4 kv
heads), page sizes 1, 16, 64, extend with a cached prefix and decode, for fa4-fp8 (ours) and
FA3-FP8.

Speed (``--speed``): prefill 8k tokens and decode (batch 64, 4k context), page 16, the layer's
forward (KV write + attention) for fa4 on the fp8 pool (our route), fa4 on a bf16 pool (SGLang's
vendored FA4), SGLang's triton backend on both pools and FA3-FP8: each column first checked once
eagerly against fp32 (as above), then all captured as CUDA graphs and timed in ``--rounds``
interleaved rounds (``sglang_fa4.bench.timing.interleaved_ms``; eager CUDA events where capture
fails); ratios are medians of the per-round ratios.

    python3 benchmark/release/check_fp8_kv_backend.py --out DIR [--speed] [--speed-first] [--cpu-smoke]
        (writes <--stem, default fp8_kv_backend>-<sglang version><--suffix>.json / .md)

``--cpu-smoke``: on a machine without a GPU, the same code with the FP8 kernel replaced by the torch
model of its contract (tests/test_llm_fp8_kv_route.model_kernel), FA3 by the fp32 reference and the
SM90 checks faked.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

import torch  # noqa: E402

from benchmark.sglang_on_gpu import fa3_seam  # noqa: E402
from benchmark.sglang_on_gpu.sglang_llm_layer import Built, poison_free_memory  # noqa: E402

FP8 = torch.float8_e4m3fn
BAR = 3e-2
LAYERS = {"qwen2.5-7b d128": (28, 4, 128), "d256": (16, 4, 256)}
RESULT: dict = {"command": "python3 " + " ".join(shlex.quote(a) for a in sys.argv), "correctness": [], "speed": [],
                "notes": []}
T0 = time.time()
DEV = "cuda"
ROUTED_CALLS: list = []
SPEED_FILTER = None
STEM = "fp8_kv_backend"
STEM_SUFFIX = ""
FA3_SKIP = None  # why the FA3-FP8 column is not measured (None: it is)


def log(*a):
    print(f"[{time.time() - T0:6.1f}s]", *a, flush=True)


def setup(cpu_smoke: bool) -> dict:
    """What a scheduler process has before its first forward: CUDA-only wheels stubbed where absent,
    SGLang's plugin loader run (sglang_fa4's hooks applied)."""
    os.environ.setdefault("SGLANG_IS_FLASHINFER_AVAILABLE", "false")
    from benchmark.sglang_on_gpu import cuda_only_stubs

    stubbed = cuda_only_stubs.install_missing()
    import sglang
    from sglang.srt.plugins import load_plugins
    from sglang.test.kits.attention_unittest.attention_methods import dense_attention  # noqa: F401 (TP=1 view)

    load_plugins()
    import sglang.kernels.ops.attention.flash_attention as fa
    import sglang.srt.layers.attention.flashattention_backend as fab

    if cpu_smoke:
        from sglang_fa4.integration import llm_fp8_kv
        from sglang_fa4.kernels import fp8_sm90
        from sglang_fa4.testing import paged_kv_torch

        llm_fp8_kv.is_sm90 = lambda device: True
        paged_kv_torch.install()  # the split-KV kernel and the gather as their torch contracts
        fp8_sm90.fp8_varlen_attention = paged_kv_torch.fp8_forward_model([])
        import sglang.srt.layers.attention.attention_registry as registry

        registry.get_device_capability = lambda *a, **k: (9, 0)  # ATTENTION_BACKENDS["fa3"] asserts SM90
    global FA3_SKIP
    FA3_SKIP = fa3_seam.install(fa3_model if cpu_smoke else None)
    if FA3_SKIP:
        RESULT["notes"].append(FA3_SKIP)
    from sglang_fa4.kernels import fp8_paged_kv as paged

    routed = paged.paged_kv_attention  # counted: proves each forward took the FP8 route

    def counted(*a, **k):
        ROUTED_CALLS.append(1)
        return routed(*a, **k)

    paged.paged_kv_attention = counted
    from sglang_fa4.bench import fa3

    return {"sglang": sglang.__version__, "stubbed": stubbed, "fa3": None if FA3_SKIP else
            ("fp32 torch model (cpu smoke)" if cpu_smoke else fa3.build_source() or "present (no BUILD_INFO)"),
            "dispatch_hooked": getattr(fab.flash_attn_with_kvcache, "__wrapped__", None) is not None
            and fab.flash_attn_with_kvcache is fa.flash_attn_with_kvcache,
            "prepare_query_hooked": getattr(fab.FlashAttentionBackend.prepare_paged_mha_query, "__wrapped__", None)
            is not None}


def fa3_model(q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, max_seqlen_q, *, k_descale=None,
              v_descale=None, q_descale=None, softmax_scale=None, causal=True, out=None, num_splits=0,
              pack_gqa=None):
    """--cpu-smoke: FA3's paged FP8 call (sglang_fa4.bench.fa3.paged_fp8's signature) in fp32 torch
    (FA3's split count and GQA packing change no value here)."""
    from sglang_fa4.testing import paged_attention_fp32

    assert q_descale is None, "SGLang's fa3 path passes no q descale"
    res = paged_attention_fp32(q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, k_descale=k_descale,
                                    v_descale=v_descale, softmax_scale=softmax_scale, causal=causal).to(torch.bfloat16)
    if out is None:
        return res
    out.copy_(res.view(out.shape))
    return out


def label_of(backend_name: str, kv: str) -> str:
    return f"{backend_name}_{'fp8' if kv == 'fp8_e4m3' else 'bf16'}"


def build(backend_name, kv, *args, **kwargs) -> Built:
    b = Built(backend_name, kv, *args, device=DEV, **kwargs)
    if backend_name == "fa3":
        fa3_seam.prepare(b.backend)
    b.init_metadata()
    return b


def check_forward(b: Built, label: str) -> dict:
    """One eager forward on NaN-poisoned free memory against fp32 on the dequantized pool; for
    fa4-fp8 and FA3-FP8 also how many calls took the FP8 route / the FA3 build (must be one); then
    a second forward, which must leave the pool byte-identical ("repeatable")."""
    poison_free_memory()
    routed, fa3_calls = len(ROUTED_CALLS), len(fa3_seam.CALLS)
    out = b.forward()
    if DEV == "cuda":
        torch.cuda.synchronize()
    calls = {"fa4_fp8": len(ROUTED_CALLS) - routed, "fa3_fp8": len(fa3_seam.CALLS) - fa3_calls}.get(label)
    ref = b.reference()
    o = out.float().reshape(ref.shape)
    res = {"rel_err": float((o - ref).norm() / ref.norm()), "finite": bool(torch.isfinite(o).all()),
           "out_dtype": str(out.dtype)}
    if calls is not None:
        res["calls"] = calls
    # timing replays the forward on the same k/v: a second one must write the same pool bytes
    # (SGLang's fp8 set_kv_buffer divides its k/v in place; Built.forward restores them)
    pool = [t.view(torch.uint8).clone() for t in (b.pool.get_key_buffer(0), b.pool.get_value_buffer(0))]
    b.forward()
    res["repeatable"] = all(torch.equal(a, t.view(torch.uint8)) for a, t in
                            zip(pool, (b.pool.get_key_buffer(0), b.pool.get_value_buffer(0))))
    res["pass"] = res["finite"] and res["rel_err"] < BAR and calls in (None, 1) and res["repeatable"]
    return res


#: (case, cached tokens, new tokens) per sequence: empty and 1-token prefixes and news, lengths off
#: every page size; the CPU smoke runs the same shapes scaled down (its kernel is an fp32 torch model)
CASES = (("extend+prefix", [1000, 0, 517, 64], [200, 1500, 17, 1]),
         ("decode", [100, 777, 2047, 1, 129, 4095, 33, 640], None))
SMOKE_CASES = (("extend+prefix", [125, 0, 65, 64], [25, 187, 17, 1]),
               ("decode", [100, 97, 255, 1, 129, 511, 33, 80], None))


def section_correctness(budget_s=float("inf")):
    impls = [("fa4", "fp8_e4m3")] + ([] if FA3_SKIP else [("fa3", "fp8_e4m3")])
    for lname, (hq, hkv, d) in LAYERS.items():
        for page_size in (1, 16, 64):
            for mode, prefix, new in (SMOKE_CASES if DEV == "cpu" else CASES):
                for backend_name, kv in impls:
                    row = {"backend": backend_name, "layer": lname, "hq": hq, "hkv": hkv, "d": d,
                           "page_size": page_size, "case": mode, "cached": prefix, "new": new or [1] * len(prefix)}
                    if time.time() - T0 > budget_s:
                        RESULT["correctness"].append({**row, "skipped": "time budget", "pass": None})
                        continue
                    try:
                        b = build(backend_name, kv, hq, hkv, d, page_size, prefix, new, mode == "decode",
                                  seed=page_size * 7 + d)
                        res = check_forward(b, label_of(backend_name, kv))
                        res["routed_calls" if backend_name == "fa4" else "fa3_calls"] = res.pop("calls")
                        row.update(res)
                    except Exception as exc:  # noqa: BLE001 - recorded, the next case runs
                        row.update(error=f"{type(exc).__name__}: {exc}"[:400], trace=traceback.format_exc()[-1500:],
                                   **{"pass": False})
                    b = None
                    RESULT["correctness"].append(row)
                    log("correct", {k: v for k, v in row.items() if k not in ("cached", "new", "trace")})


SPEED_BACKENDS = (("fa4", "fp8_e4m3"), ("fa4", "auto"), ("triton", "fp8_e4m3"), ("triton", "auto"), ("fa3", "fp8_e4m3"))
SPEED_SHAPES = (("prefill 8k", "qwen2.5-7b d128", [0], [8192], False, 16),
                ("decode b64 ctx4k", "qwen2.5-7b d128", [4095] * 64, None, True, 16),
                ("prefill 8k", "d256", [0], [8192], False, 16),
                ("decode b64 ctx4k", "d256", [4095] * 64, None, True, 16))
#: (numerator, denominator) of the reported ratios: > 1 means the second one is faster
RATIOS = (("fa4_bf16", "fa4_fp8"), ("fa3_fp8", "fa4_fp8"), ("triton_fp8", "fa4_fp8"), ("fa3_fp8", "fa4_bf16"))


def section_speed(budget_s, rounds):
    from sglang_fa4.bench.stats import paired
    from sglang_fa4.bench.timing import interleaved_ms

    for name, lname, prefix, new, decode, page_size in SPEED_SHAPES:
        if lname not in LAYERS:
            continue
        hq, hkv, d = LAYERS[lname]
        row = {"shape": name, "layer": lname, "hq": hq, "hkv": hkv, "d": d, "page_size": page_size}
        built = {}
        for backend_name, kv in SPEED_BACKENDS:
            label = label_of(backend_name, kv)
            if SPEED_FILTER and not re.search(SPEED_FILTER, f"{name}|{lname}|{backend_name}|{kv}"):
                continue
            if backend_name == "fa3" and FA3_SKIP:
                row[label + "_error"] = FA3_SKIP
                continue
            if time.time() - T0 > budget_s:
                row[label + "_error"] = "skipped: time budget"
                continue
            try:
                b = build(backend_name, kv, hq, hkv, d, page_size, prefix, new, decode, seed=1)
                row[label + "_check"] = check_forward(b, label)
                built[label] = b
            except Exception as exc:  # noqa: BLE001 - recorded, the other columns run
                row[label + "_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            log(name, lname, label, row.get(label + "_check"), row.get(label + "_error", ""))
            b = None
            if DEV == "cuda":
                torch.cuda.empty_cache()
        if DEV == "cuda" and built:
            timings = interleaved_ms({label: b.forward for label, b in built.items()}, rounds=rounds, replays=10)
            for label, t in timings.items():
                row[label + "_ms"] = t.get("ms")
                row.update({f"{label}_{k}": v for k, v in t.items() if k != "ms"})
            for num, den in RATIOS:
                a, b_ = row.get(den + "_rounds"), row.get(num + "_rounds")
                if a and b_ and len(a) == len(b_):
                    row[f"{num}_over_{den}"] = paired(a, b_)["median_ratio"]
            log(name, lname, {k: round(v, 4) for k, v in row.items() if k.endswith("_ms") and v})
        built = None
        if DEV == "cuda":
            torch.cuda.empty_cache()
        RESULT["speed"].append(row)
        save()


OUT = None


def save():
    if OUT is None:
        return
    OUT.mkdir(parents=True, exist_ok=True)
    name = f"{STEM}-{RESULT.get('env', {}).get('sglang', 'x')}{STEM_SUFFIX}"
    (OUT / f"{name}.json").write_text(json.dumps(RESULT, separators=(",", ":")))
    (OUT / f"{name}.md").write_text(markdown(RESULT))


COLUMN_TITLES = {"fa4_fp8": "fa4, fp8 pool (ours)", "fa4_bf16": "fa4, bf16 pool", "triton_fp8": "triton, fp8 pool",
                 "triton_bf16": "triton, bf16 pool", "fa3_fp8": "FA3-FP8 (fa3, fp8 pool)"}


def _f(x, digits=3):
    return "-" if x is None else f"{x:.{digits}f}"


def speed_table(r) -> list[str]:
    """The one-run table: ms per column (eager where noted), each column's check against fp32."""
    labels = [label_of(b, kv) for b, kv in SPEED_BACKENDS]
    lines = ["| shape | layer | page | " + " | ".join(COLUMN_TITLES[lb] for lb in labels)
             + " | fa4-bf16 / fa4-fp8 | FA3-FP8 / fa4-fp8 |", "|---|---|---|" + "---|" * (len(labels) + 2)]
    for s in r["speed"]:
        cells = []
        for lb in labels:
            chk = s.get(lb + "_check") or {}
            if s.get(lb + "_ms") is None:
                cells.append("n/a" if lb + "_error" in s or "error" in chk else "-")
                continue
            how = "" if s.get(lb + "_how") == "graph" else " (eager)"
            ok = "" if chk.get("pass") else " FAIL"
            cells.append(f"{_f(s[lb + '_ms'])}{how} ({chk.get('rel_err', float('nan')):.1e}{ok})")
        lines.append(f"| {s['shape']} | {s['layer']} | {s['page_size']} | " + " | ".join(cells)
                     + f" | {_f(s.get('fa4_bf16_over_fa4_fp8'))}x | {_f(s.get('fa3_fp8_over_fa4_fp8'))}x |")
    return lines


def markdown(r) -> str:
    env = r.get("env", {})
    lines = [f"# SGLang {env.get('sglang')}'s FlashAttentionBackend (fa4) on an fp8_e4m3 MHATokenToKVPool (SM90)", "",
             f"Command: `{r['command']}`", "",
             f"GPU: {env.get('gpu')}; torch {env.get('torch')}; plugin hooks on the dispatcher / prepare_paged_mha_query: "
             f"{env.get('dispatch_hooked')} / {env.get('prepare_query_hooked')}; stubbed: {env.get('stubbed')}; "
             f"FA3: {env.get('fa3') or 'not measured'}", "",
             "## Correctness (fp32 on the dequantized pool; free memory NaN-poisoned first)", "",
             "| backend | layer (hq/hkv/d) | page | case | cached | new | rel. error | finite | FP8 route / FA3 calls "
             "| pass (<3e-2, one call) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for c in r["correctness"]:
        err = f"{c['rel_err']:.2e}" if "rel_err" in c else c.get("error", c.get("skipped", "?"))
        calls = c.get("routed_calls", c.get("fa3_calls", "-"))
        lines.append(f"| {c.get('backend', 'fa4')}-fp8 | {c['layer']} ({c['hq']}/{c['hkv']}/{c['d']}) | {c['page_size']} | "
                     f"{c['case']} | {c['cached']} | {c['new']} | {err} | {c.get('finite', '-')} | {calls} | {c['pass']} |")
    if r["speed"]:
        rounds = max((len(s.get(lb + "_rounds") or []) for s in r["speed"] for lb in COLUMN_TITLES), default=0)
        lines += ["", f"## Speed (the layer's forward: KV write + attention; ms, median of {rounds} interleaved rounds "
                  "of CUDA-graph replays unless noted; in brackets each column's rel. error against fp32 on its "
                  "pool, one eager forward; ratios: median of the per-round ratios, > 1: fa4-fp8 faster)", ""]
        lines += speed_table(r)
        for s in r["speed"]:
            errs = {k: v for k, v in s.items() if k.endswith("_error")}
            errs.update({k: v["error"] for k, v in s.items() if k.endswith("_check") and isinstance(v, dict)
                         and "error" in v})
            if errs:
                lines.append(f"\n{s['shape']} {s['layer']}: not measured / errors: `{json.dumps(errs)[:800]}`")
        pre = [s for s in r["speed"] if s["shape"].startswith("prefill") and s.get("fa4_bf16_over_fa4_fp8")]
        if pre:
            lines += ["", "Bar (fa4-fp8 prefill at long context faster than fa4-bf16): " + ", ".join(
                f"{s['layer']} {'MET' if s['fa4_bf16_over_fa4_fp8'] > 1 else 'NOT MET'} "
                f"({s['fa4_bf16_over_fa4_fp8']:.3f}x)" for s in pre)]
    if r.get("notes"):
        lines += ["", "Notes:", ""] + [f"- {n}" for n in r["notes"]]
    if r.get("errors"):
        lines += ["", "Errors:", ""] + [f"- `{json.dumps(e)[:600]}`" for e in r["errors"]]
    return "\n".join(lines) + "\n"


def wait_for(path, limit_s=90.0):
    if not path:
        return
    t = time.time()
    while not Path(path).exists() and time.time() - t < limit_s:
        time.sleep(0.5)
    RESULT["notes"].append(f"timing started after {time.time() - t:.1f} s waiting for {Path(path).name} "
                           f"({'present' if Path(path).exists() else 'absent'}): the GPU was not shared while timing"
                           if Path(path).exists() else f"{Path(path).name} absent after {limit_s} s: timing may "
                           "overlap the other process's work")


def main():
    global DEV, OUT
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--speed", action="store_true")
    ap.add_argument("--no-correctness", action="store_true")
    ap.add_argument("--suffix", default="", help="output file name suffix")
    ap.add_argument("--stem", default="fp8_kv_backend", help="output file name stem (then -<sglang version>)")
    ap.add_argument("--speed-first", action="store_true", help="the speed section before the correctness one")
    ap.add_argument("--rounds", type=int, default=5, help="speed: interleaved timing rounds")
    ap.add_argument("--speed-filter", default=None,
                    help="speed: only rows/backends whose 'shape|layer|backend|kv' matches this regex")
    ap.add_argument("--budget-s", type=float, default=150.0, help="skip speed columns (and, with --speed-first, "
                    "correctness cases) after this many seconds")
    ap.add_argument("--cpu-smoke", action="store_true")
    ap.add_argument("--layers", default=None, help="comma list of layer names (default: all of LAYERS)")
    ap.add_argument("--wait-file", help="before timing, wait (up to 90 s) for this file: another process "
                    "sharing the GPU (the other SGLang version's correctness run) is done")
    ap.add_argument("--md-from", help="only rewrite the markdown from this JSON")
    args = ap.parse_args()
    OUT = Path(args.out)
    if args.md_from:
        r = json.loads(Path(args.md_from).read_text())
        Path(args.md_from).with_suffix(".md").write_text(markdown(r))
        return
    if args.cpu_smoke:
        DEV = "cpu"
    if args.layers:
        for name in list(LAYERS):
            if name not in args.layers.split(","):
                del LAYERS[name]
    RESULT["env"] = setup(args.cpu_smoke)
    RESULT["env"].update(gpu=torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (smoke)",
                         torch=torch.__version__)
    log(RESULT["env"])
    global SPEED_FILTER, STEM, STEM_SUFFIX
    SPEED_FILTER, STEM, STEM_SUFFIX = args.speed_filter, args.stem, args.suffix
    sections = [] if args.no_correctness else [("correctness", lambda: section_correctness(
        args.budget_s if args.speed_first else float("inf")))]
    if args.speed:
        speed = ("speed", lambda: (wait_for(args.wait_file), section_speed(args.budget_s, args.rounds)))
        sections.insert(0 if args.speed_first else len(sections), speed)
    for name, fn in sections:
        try:
            fn()
        except Exception:  # noqa: BLE001 - keep what was measured
            RESULT.setdefault("errors", []).append({name: traceback.format_exc()[-2000:]})
            log(traceback.format_exc())
        save()
    log("done")
    run = [c for c in RESULT["correctness"] if "skipped" not in c]
    bad = [c for c in run if not c["pass"]]
    print(f"correctness: {len(run) - len(bad)}/{len(run)} pass ({len(RESULT['correctness']) - len(run)} skipped: "
          "time budget)" + (f"; failing: {[(c.get('backend'), c['layer'], c['page_size'], c['case']) for c in bad]}"
                            if bad else ""))
    if RESULT["speed"]:
        print("\n".join(speed_table(RESULT)))


if __name__ == "__main__":
    os.environ.setdefault("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "1")
    main()
