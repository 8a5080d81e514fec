"""GPU check of the SM90 FP8 attention forward (sglang_fa4.kernels.fp8_sm90): correctness + speed of
the default kernels (kernel_config.DEFAULT_CONFIGS, the ones the product compiles).

In one process on one H100/H200:
  1. compile every variant (d 64/96/128 x non-causal/causal/local), timed;
  2. quantize_qkv (Triton) against its torch reference, bitwise;
  3. correctness: fresh random bf16 q/k/v, quantized on the device, output poisoned with NaN,
     rel. Frobenius error against an fp32 reference on the *dequantized* inputs (bar 3e-2), with
     the error of the fp8 output against bf16 FA4 (flash_attn.cute) on the original bf16 inputs
     and of bf16 FA4 itself against the fp32 reference beside it; layouts: 2 long sequences,
     GQA, seqlen_q != seqlen_k, > 256 segments with 0- and 1-token segments, 64-token segments,
     sliding window 64, one 16k sequence; never non-finite (all-zero inputs, +-448 inputs);
     both V paths (pack_vt from v, and vt straight from quantize_qkv);
  4. speed, CUDA-graph replay, medians of CUDA events: fp8 kernel vs FA4 bf16 at d128 8x4096 and
     1x16384 (non-causal), causal 1x16384, d64/d96 1x16384; the quantize and pack launches; the
     e4m3 torch._scaled_mm and bf16 matmul ceilings (8192^3); host us per call.
Writes JSON + markdown after every section (``--out-dir``, default $OUT) and prints a table last.
``--isolate`` runs each part in a child process that resumes after the case a device fault killed.

Kernel bring-up, the compute-sanitizer run and the variant tournament (kernel configs other than
the table's, side by side) left this check (issue #43): they are at
``git show 33a15f5:benchmark/release/check_fp8_attention.py``, and the configs themselves at the
tag ``lab/fp8-variants-2026-12-04`` (benchmark/lab/NOTES-fp8-variants.md); a non-default config is
built from text by benchmark/lab/fp8_kernel_configs.py.
"""

from __future__ import annotations

import argparse
import json
import re
import os
import shlex
import sys
import time
import traceback
from pathlib import Path

import torch

from sglang_fa4.bench.stats import median
from sglang_fa4.bench.timing import graph_replay_ms
from sglang_fa4.testing import attention_fp32, cu_seqlens

DEV = "cuda"
RESULT: dict = {"sections": {}}
T0 = time.perf_counter()
BAR = 3e-2
OUT_DIR = None


def log(*a):
    print(f"[{time.perf_counter() - T0:7.1f}s]", *a, flush=True)


# ----------------------------------------------------------------------------------------------
# reference maths
# ----------------------------------------------------------------------------------------------


def ref_attention(q, k, v, cu_q, cu_k, scale, causal=False, window=(None, None)):
    """fp32 reference, per sequence (sglang_fa4.testing's: GQA, bottom-right causal and window)."""
    return attention_fp32(q, k, v, cu_q, cu_k, scale=scale, causal=causal, window=window)


def fault_guard(what: str, case: str) -> None:
    """Synchronize; on a device fault say which kernel it was and leave (the context is dead)."""
    try:
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001
        print(f"FAULT {what} in {case!r}: {type(e).__name__}: {str(e).splitlines()[0]}", flush=True)
        RESULT["sections"].setdefault("faults", []).append({"kernel": what, "case": case, "error": str(e).splitlines()[0]})
        if OUT_DIR is not None:
            save(OUT_DIR)
        os._exit(3)


def rel_err(a, b):
    """Relative error; unlike sglang_fa4.testing.rel_err, an all-zero reference (the all-zero-inputs
    case) gives the absolute error, so zeros against zeros pass."""
    a, b = a.float(), b.float()
    den = b.norm().item()
    num = (a - b).norm().item()
    return num / den if den > 0 else num


def dequant(x8, desc_row, cu, heads_per_desc):
    """x8 (T, H, d) fp8 * descale[b, h // heads_per_desc] -> float32."""
    x = x8.float()
    cu_l = cu.tolist()
    for b in range(len(cu_l) - 1):
        s = desc_row[b].repeat_interleave(heads_per_desc)  # (H,)
        x[cu_l[b] : cu_l[b + 1]] *= s[None, :, None]
    return x


def vt_to_v(vt, cu_k, total_k):
    """Invert the permuted V^T (Hkv, d, cols) back to (Tk, Hkv, d) uint8, for dequantizing."""
    from sglang_fa4.kernels.fp8_sm90.layout import vt_column_offset, vt_source_key

    hkv, d, _ = vt.shape
    v = torch.zeros((total_k, hkv, d), dtype=torch.uint8, device=vt.device)
    ck = cu_k.tolist()
    for b in range(len(ck) - 1):
        lk = ck[b + 1] - ck[b]
        base = vt_column_offset(ck[b], b)
        n = -(-lk // 16) * 16
        slots = torch.arange(n)
        src = torch.tensor([vt_source_key(int(r)) for r in slots], dtype=torch.long)  # long also when empty
        ok = src < lk
        v[ck[b] + src[ok]] = vt[:, :, base + slots[ok]].permute(2, 0, 1)
    return v


def make_cu(lens):
    return cu_seqlens(lens, device=DEV)


# ----------------------------------------------------------------------------------------------
# sections
# ----------------------------------------------------------------------------------------------


JSON_NAME = "fp8_attention.json"
ARGS_CHILD = False


def save(out_dir: Path):
    if out_dir is None:
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / JSON_NAME).write_text(json.dumps(RESULT, default=str))
    if not ARGS_CHILD:
        (out_dir / JSON_NAME).with_suffix(".md").write_text(markdown())


def markdown() -> str:
    lines = ["# SM90 FP8 attention forward (sglang_fa4.kernels.fp8_sm90)", ""]
    env = RESULT.get("env", {})
    lines.append(f"GPU: {env.get('gpu')}; torch {env.get('torch')}; cutlass-dsl {env.get('cutlass')}; command: `{RESULT.get('command')}`")
    lines.append("")
    for note in RESULT.get("analysis_after_run", []):
        lines.append(f"> {note}")
    if RESULT.get("analysis_after_run"):
        lines.append("")
    faults = RESULT["sections"].get("faults", [])
    if faults:
        lines += ["## Device faults", "", "| case | kernel | error |", "|---|---|---|"]
        lines += [f"| {f['case']} | {f['kernel']} | {f['error']} |" for f in faults]
        lines.append("")
    corr = RESULT["sections"].get("correctness", [])
    if corr:
        lines += ["## Correctness (rel. Frobenius error; bar 3e-2 vs fp32 on dequantized inputs)", "",
                  "| case | d | causal/window | fp8 vs fp32(deq) | fp8 vs FA4 bf16 | FA4 bf16 vs fp32 | finite | ok |",
                  "|---|---|---|---|---|---|---|---|"]
        for c in corr:
            lines.append(
                f"| {c['case']} | {c.get('d')} | {c.get('mask')} | {c.get('err_ref', float('nan')):.2e} | "
                f"{c.get('err_vs_fa4_bf16', float('nan')):.2e} | {c.get('fa4_bf16_err', float('nan')):.2e} | "
                f"{c.get('finite')} | {c.get('ok')} |"
            )
        lines.append("")
    sp = RESULT["sections"].get("speed", [])
    if sp:
        rounds = max((len(s.get("fp8_rounds", [])) for s in sp), default=0)
        lines += ["## Speed (CUDA-graph replay, median of events" + (
            f"; {rounds} interleaved rounds of fp8 then FA4 bf16 per shape, medians, fp8/bf16 = median of the "
            "per-round ratios" if rounds > 1 else "") + ")", "",
                  "| shape | d | causal | fp8 us | fp8 TFLOP/s | FA4 bf16 us | FA4 bf16 TFLOP/s | fp8/bf16 |",
                  "|---|---|---|---|---|---|---|---|"]
        for s in sp:
            lines.append(
                f"| {s['shape']} | {s['d']} | {s['causal']} | {s.get('fp8_us', float('nan')):.1f} | "
                f"{s.get('fp8_tflops', float('nan')):.0f} | {s.get('bf16_us', float('nan')):.1f} | "
                f"{s.get('bf16_tflops', float('nan')):.0f} | {s.get('speedup', float('nan')):.2f} |"
            )
        lines.append("")
    other = RESULT["sections"].get("other", {})
    if other:
        lines += ["## Other", "", "```", json.dumps(other, indent=1, default=str), "```"]
    return "\n".join(lines) + "\n"


def section_compile():
    from sglang_fa4.kernels.fp8_sm90 import launch
    from sglang_fa4.kernels.fp8_sm90.layout import all_variants

    rows = []
    for var in all_variants():
        t = time.perf_counter()
        launch.compiled_kernel(var)
        rows.append({**var.as_dict(), "seconds": round(time.perf_counter() - t, 2)})
        log("compiled", var, rows[-1]["seconds"])
    RESULT["sections"]["compile"] = rows


def run_case(case, lens_q, lens_k, hq, hkv, d, causal=False, window=(None, None), data="randn", path="vt", dtype_scale=1.0):
    from flash_attn.cute import flash_attn_varlen_func

    from sglang_fa4.kernels.fp8_sm90 import launch
    from sglang_fa4.kernels.vit import fp8_quantize as quantize

    cu_q, cu_k = make_cu(lens_q), make_cu(lens_k)
    tq, tk = sum(lens_q), sum(lens_k)
    if data == "zeros":
        q = torch.zeros(tq, hq, d, dtype=torch.bfloat16, device=DEV)
        k = torch.zeros(tk, hkv, d, dtype=torch.bfloat16, device=DEV)
        v = torch.zeros(tk, hkv, d, dtype=torch.bfloat16, device=DEV)
    else:
        q = (torch.randn(tq, hq, d, device=DEV) * dtype_scale).bfloat16()
        k = (torch.randn(tk, hkv, d, device=DEV) * dtype_scale).bfloat16()
        v = torch.randn(tk, hkv, d, device=DEV).bfloat16()
    scale = d ** -0.5
    res = quantize.quantize_qkv(q, k, v, cu_q, cu_k)
    out = torch.full((tq, hq, res.q.shape[2]), float("nan"), dtype=torch.bfloat16, device=DEV)
    if path == "vt":
        launch.fp8_varlen_attention(
            res.q, res.k, None, cu_q, cu_k, max(lens_q), max(lens_k), descale=res.descale,
            softmax_scale=scale, causal=causal, window_size=window, out=out, vt=res.vt,
        )
        v8 = vt_to_v(res.vt, cu_k, tk).view(torch.float8_e4m3fn)
    else:  # v path: dequantizable v8 given directly, the wrapper packs V^T itself
        v8 = vt_to_v(res.vt, cu_k, tk).view(torch.float8_e4m3fn)
        launch.fp8_varlen_attention(
            res.q, res.k, v8, cu_q, cu_k, max(lens_q), max(lens_k),
            q_descale=res.descale[0], k_descale=res.descale[1], v_descale=res.descale[2],
            softmax_scale=scale, causal=causal, window_size=window, out=out,
        )
    fault_guard("fp8", case)
    g = hq // hkv
    qd = dequant(res.q, res.descale[0], cu_q, g)
    kd = dequant(res.k, res.descale[1], cu_k, 1)
    vd = dequant(v8, res.descale[2], cu_k, 1)
    ref = ref_attention(qd, kd, vd, cu_q, cu_k, scale, causal, window)
    o = out.float()
    finite = bool(torch.isfinite(o).all().item())
    row = {"case": case, "d": d, "hq": hq, "hkv": hkv, "segments": len(lens_q), "tq": tq, "tk": tk,
           "mask": "causal" if causal else (f"window{window}" if window != (None, None) else "none"),
           "path": path, "finite": finite, "err_ref": rel_err(o, ref)}
    if data == "randn":
        try:
            fa = flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(lens_q),
                                        max_seqlen_k=max(lens_k), softmax_scale=scale, causal=causal,
                                        window_size=window)
            fa = fa[0] if isinstance(fa, tuple) else fa
            fault_guard("fa4_bf16", case)
            ref_bf = ref_attention(q.float(), k.float(), v.float(), cu_q, cu_k, scale, causal, window)
            row["err_vs_fa4_bf16"] = rel_err(o[..., :d], fa)
            row["fa4_bf16_err"] = rel_err(fa, ref_bf)
        except Exception as e:  # noqa: BLE001
            row["fa4_error"] = f"{type(e).__name__}: {e}"[:200]
    if data != "zeros":
        row["ok"] = finite and row["err_ref"] <= BAR
    else:
        row["max_abs"] = o.abs().max().item() if finite else float("nan")
        row["ok"] = finite and row["max_abs"] == 0.0
    log(case, {k_: (round(v_, 5) if isinstance(v_, float) else v_) for k_, v_ in row.items()})
    return row


def _code_diff(a, b) -> dict:
    """Mismatching E4M3 bytes between two tensors and the largest distance in representable codes."""
    x, y = a.view(torch.uint8).int(), b.view(torch.uint8).int()
    bad = x != y
    if not bool(bad.any()):
        return {"bytes": 0}
    # E4M3 codes are monotone in magnitude within a sign: compare sign-magnitude code distance
    def key(t):
        mag = t & 0x7F
        return torch.where((t & 0x80) != 0, -mag, mag)
    return {"bytes": int(bad.sum()), "of": int(bad.numel()), "max_codes": int((key(x) - key(y)).abs().max())}


def section_quantize_exact():
    from sglang_fa4.kernels.vit import fp8_quantize as quantize

    lens = [5, 0, 300, 1, 77]
    cu = make_cu(lens)
    t = sum(lens)
    q = torch.randn(t, 8, 80, device=DEV).bfloat16()
    k = torch.randn(t, 2, 80, device=DEV).bfloat16()
    v = torch.randn(t, 2, 80, device=DEV).bfloat16()
    got = quantize.quantize_qkv(q, k, v, cu)
    ref = quantize.quantize_qkv_reference(q, k, v, cu, cu)
    r = {
        "descale_equal": bool(torch.allclose(got.descale, ref.descale, rtol=1e-6)),
        "q_equal": bool(torch.equal(got.q.view(torch.uint8), ref.q.view(torch.uint8))),
        "k_equal": bool(torch.equal(got.k.view(torch.uint8), ref.k.view(torch.uint8))),
        # Triton's "/" is an approximate division (ds = amax/448, 1/ds), torch's is IEEE: a value at
        # an E4M3 rounding midpoint can land one code apart.  Count such bytes and their distance.
        **{f"{n}_mismatch": _code_diff(a, b) for n, a, b in (("q", got.q, ref.q), ("k", got.k, ref.k))},
        "vt_equal": bool(torch.equal(got.vt, ref.vt)),
    }
    from sglang_fa4.kernels.fp8_sm90.vt_pack import pack_vt, pack_vt_reference

    v8 = (torch.randn(t, 2, 96, device=DEV) * 50).to(torch.float8_e4m3fn)
    r["pack_vt_equal"] = bool(torch.equal(pack_vt(v8, cu, max(lens)), pack_vt_reference(v8.view(torch.uint8), cu)))
    RESULT["sections"].setdefault("other", {})["quantize_exact"] = r
    log("quantize exact", r)
    from flash_attn.cute import flash_attn_varlen_func

    cu2 = make_cu([1000, 3000])
    x = torch.randn(4000, 16, 128, device=DEV).bfloat16()
    flash_attn_varlen_func(x, x, x, cu_seqlens_q=cu2, cu_seqlens_k=cu2, max_seqlen_q=3000, max_seqlen_k=3000)
    fault_guard("fa4_bf16", "fa4 bf16 alone 1000,3000 h16")
    RESULT["sections"]["other"]["fa4_bf16_alone_ok"] = True
    log("fa4 bf16 alone ok")


def section_correctness(quick=False, start=0):
    rows = RESULT["sections"].get("correctness", [])
    rng = torch.Generator().manual_seed(0)

    def rand_lens(n, lo, hi):
        return [int(x) for x in torch.randint(lo, hi + 1, (n,), generator=rng)]

    many = rand_lens(300, 0, 70)
    many[3] = 0
    many[10] = 1
    many[11] = 1
    cases = [
        ("2seq", [1000, 3000], [1000, 3000], 16, 16, 128, False, (None, None), "randn", "vt"),
        ("2seq causal", [1000, 3000], [1000, 3000], 16, 16, 128, True, (None, None), "randn", "vt"),
        ("2seq v-path", [777, 1500], [777, 1500], 8, 8, 128, False, (None, None), "randn", "v"),
        ("gqa 16/4 causal", [513, 2049], [513, 2049], 16, 4, 128, True, (None, None), "randn", "vt"),
        ("q!=k causal", [100, 700], [900, 1700], 8, 2, 128, True, (None, None), "randn", "vt"),
        ("q!=k", [100, 700], [900, 1700], 8, 2, 96, False, (None, None), "randn", "vt"),
        ("2seq d64", [1000, 3000], [1000, 3000], 16, 16, 64, False, (None, None), "randn", "vt"),
        ("2seq d64 causal", [1000, 3000], [1000, 3000], 16, 16, 64, True, (None, None), "randn", "vt"),
        ("2seq d96", [1000, 3000], [1000, 3000], 16, 16, 96, False, (None, None), "randn", "vt"),
        ("2seq d96 causal", [1000, 3000], [1000, 3000], 16, 16, 96, True, (None, None), "randn", "vt"),
        ("d80->96 padded", [1000, 300], [1000, 300], 16, 16, 80, False, (None, None), "randn", "vt"),
        (">256 segs 0/1-token", many, many, 8, 8, 128, False, (None, None), "randn", "vt"),
        (">256 segs d64 causal", many, many, 8, 8, 64, True, (None, None), "randn", "vt"),
        ("64-token segments", [64] * 100, [64] * 100, 16, 16, 128, False, (None, None), "randn", "vt"),
        ("64-token segs d96", [64] * 100, [64] * 100, 16, 16, 96, False, (None, None), "randn", "vt"),
        ("sliding window 64", [2000, 700], [2000, 700], 8, 8, 128, False, (64, 0), "randn", "vt"),
        ("window (64,64) d64", [2000, 700], [2000, 700], 8, 8, 64, False, (64, 64), "randn", "vt"),
        ("1x16384", [16384], [16384], 2, 2, 128, False, (None, None), "randn", "vt"),
        ("1x16384 causal", [16384], [16384], 2, 2, 128, True, (None, None), "randn", "vt"),
        ("all zeros", [300, 0, 1], [300, 0, 1], 4, 4, 128, False, (None, None), "zeros", "vt"),
        ("large scores x8", [1000], [1000], 4, 4, 128, False, (None, None), "randn8", "vt"),
        # head dims 192 / 256 (the one-level O accumulation, fewer K/V stages)
        ("2seq d192", [1000, 3000], [1000, 3000], 16, 16, 192, False, (None, None), "randn", "vt"),
        ("2seq d192 causal", [1000, 3000], [1000, 3000], 16, 16, 192, True, (None, None), "randn", "vt"),
        ("gqa 28/4 causal d192", [513, 2049], [513, 2049], 28, 4, 192, True, (None, None), "randn", "vt"),
        ("d160->192 padded v-path", [777, 300], [777, 300], 8, 8, 160, False, (None, None), "randn", "v"),
        ("2seq d256", [1000, 3000], [1000, 3000], 16, 16, 256, False, (None, None), "randn", "vt"),
        ("2seq d256 causal", [1000, 3000], [1000, 3000], 16, 16, 256, True, (None, None), "randn", "vt"),
        ("gqa 28/4 causal d256", [513, 2049], [513, 2049], 28, 4, 256, True, (None, None), "randn", "vt"),
        ("q!=k causal d256 gqa 8/2", [100, 700], [900, 1700], 8, 2, 256, True, (None, None), "randn", "vt"),
        ("sliding window 64 d256", [2000, 700], [2000, 700], 8, 8, 256, False, (64, 0), "randn", "vt"),
        (">256 segs d256 causal", many, many, 8, 8, 256, True, (None, None), "randn", "vt"),
        ("1x16384 causal d256", [16384], [16384], 2, 2, 256, True, (None, None), "randn", "vt"),
        ("large scores x8 d256", [1000], [1000], 4, 4, 256, False, (None, None), "randn8", "vt"),
        ("all zeros d256", [300, 0, 1], [300, 0, 1], 4, 4, 256, False, (None, None), "zeros", "vt"),
    ]
    if CASE_FILTER:
        cases = [c for c in cases if re.search(CASE_FILTER, c[0])]
    if quick:
        cases = cases[:2]
    for idx, (name, lq, lk, hq, hkv, d, causal, window, data, path) in enumerate(cases):
        if idx < start:
            continue
        print(f"CASESTART {idx} {name}", flush=True)
        try:
            rows.append(run_case(name, lq, lk, hq, hkv, d, causal, window,
                                 data="zeros" if data == "zeros" else "randn",
                                 dtype_scale=8.0 if data == "randn8" else 1.0, path=path))
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            rows.append({"case": name, "d": d, "error": f"{type(e).__name__}: {e}"[:300], "ok": False})
        RESULT["sections"]["correctness"] = rows
        save(OUT_DIR)
        print(f"CASEDONE {idx}", flush=True)
    if start > len(cases) or CASE_FILTER:
        return
    # +-448 directly as fp8 inputs with descale 1: finite output
    from sglang_fa4.kernels.fp8_sm90 import launch

    lens = [257, 31]
    cu = make_cu(lens)
    t = sum(lens)
    sign = lambda shape: (torch.randint(0, 2, shape, device=DEV) * 2 - 1).float()  # noqa: E731
    q8 = (sign((t, 4, 128)) * 448).to(torch.float8_e4m3fn)
    k8 = (sign((t, 4, 128)) * 448).to(torch.float8_e4m3fn)
    v8 = (sign((t, 4, 128)) * 448).to(torch.float8_e4m3fn)
    out = torch.full((t, 4, 128), float("nan"), dtype=torch.bfloat16, device=DEV)
    launch.fp8_varlen_attention(q8, k8, v8, cu, cu, max(lens), max(lens), out=out, causal=True)
    ref = ref_attention(q8.float(), k8.float(), v8.float(), cu, cu, 128 ** -0.5, True)
    o = out.float()
    fault_guard("fp8", "+-448 fp8 inputs")
    row = {"case": "+-448 fp8 inputs", "d": 128, "mask": "causal", "finite": bool(torch.isfinite(o).all()),
           "err_ref": rel_err(o, ref)}
    row["ok"] = row["finite"] and row["err_ref"] <= BAR
    rows.append(row)
    log(row)
    RESULT["sections"]["correctness"] = rows


def bench_graph(fn, iters=20):
    """Median microseconds of single CUDA-graph replays of fn."""
    return graph_replay_ms(fn, replays=iters) * 1000


SPEED_WHAT = "both"
#: --case-filter: only the correctness cases whose name matches this regex (None: all)
CASE_FILTER = None


def section_speed():
    from sglang_fa4.kernels.fp8_sm90 import launch
    from sglang_fa4.kernels.vit import fp8_quantize as quantize
    from sglang_fa4.kernels.fp8_sm90.vt_pack import pack_vt

    if SPEED_WHAT != "fp8":
        from flash_attn.cute import flash_attn_varlen_func

    rows = []
    shapes = [
        ("8x4096", [4096] * 8, 16, 128, False),
        ("1x16384", [16384], 16, 128, False),
        ("1x16384", [16384], 16, 128, True),
        ("8x4096", [4096] * 8, 16, 128, True),
        ("1x16384", [16384], 16, 64, False),
        ("1x16384", [16384], 16, 96, False),
        ("8x4096", [4096] * 8, 16, 64, False),
        # the head dims above 128 (Gemma-4's sliding layers run d256 with a causal window)
        ("1x16384", [16384], 16, 192, False),
        ("1x16384", [16384], 16, 256, False),
        ("1x16384", [16384], 16, 256, True),
    ]
    for name, lens, h, d, causal in shapes:
        cu = make_cu(lens)
        t = sum(lens)
        q = torch.randn(t, h, d, device=DEV).bfloat16()
        k = torch.randn(t, h, d, device=DEV).bfloat16()
        v = torch.randn(t, h, d, device=DEV).bfloat16()
        res = quantize.quantize_qkv(q, k, v, cu)
        out8 = torch.empty(t, h, d, dtype=torch.bfloat16, device=DEV)
        m = max(lens)
        pairs = sum(n * n for n in lens)
        if causal:
            pairs = sum(n * (n + 1) // 2 for n in lens)
        flops = 4 * pairs * h * d
        row = {"shape": name, "d": d, "causal": causal, "heads": h}
        fp8_r, bf16_r = [], []
        for rnd in range(ROUNDS):  # interleaved rounds: fp8, then FA4 bf16, on the same inputs
            if SPEED_WHAT in ("both", "fp8") and "fp8_error" not in row:
                try:
                    fp8_r.append(bench_graph(lambda: launch.fp8_varlen_attention(
                        res.q, res.k, None, cu, cu, m, m, descale=res.descale, causal=causal, out=out8, vt=res.vt)))
                except Exception as e:  # noqa: BLE001
                    row["fp8_error"] = f"{type(e).__name__}: {e}"[:300]
                fault_guard("fp8", f"speed {name} d{d} causal={causal}")
            if SPEED_WHAT in ("both", "bf16") and "bf16_error" not in row:
                try:
                    bf16_r.append(bench_graph(lambda: flash_attn_varlen_func(
                        q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=m, max_seqlen_k=m, causal=causal)))
                except Exception as e:  # noqa: BLE001
                    row["bf16_error"] = f"{type(e).__name__}: {e}"[:300]
                fault_guard("fa4_bf16", f"speed {name} d{d} causal={causal}")
        if fp8_r and "fp8_error" not in row:
            row["fp8_us"] = median(fp8_r)
            row["fp8_tflops"] = flops / row["fp8_us"] / 1e6
        if bf16_r and "bf16_error" not in row:
            row["bf16_us"] = median(bf16_r)
            row["bf16_tflops"] = flops / row["bf16_us"] / 1e6
        if "fp8_us" in row and "bf16_us" in row:
            row["speedup"] = median([b / f for f, b in zip(fp8_r, bf16_r)])
        if ROUNDS > 1:
            row["fp8_rounds"], row["bf16_rounds"] = fp8_r, bf16_r
        if d == 128 and not causal and SPEED_WHAT in ("both", "fp8"):  # 1x16384: one program per (head, tensor)
            row["quantize_us"] = bench_graph(lambda: quantize.quantize_qkv(q, k, v, cu, out=res))
            v8 = res.k  # any fp8 (t, h, d) tensor: pack timing only
            vt_buf = res.vt
            row["pack_vt_us"] = bench_graph(lambda: pack_vt(v8, cu, m, out=vt_buf))
        rows.append(row)
        log("speed", {k_: (round(v_, 1) if isinstance(v_, float) else v_) for k_, v_ in row.items()})
        RESULT["sections"]["speed"] = rows
        del q, k, v, res
    if SPEED_WHAT == "bf16":
        return
    # ceilings
    n = 8192
    a = torch.randn(n, n, device=DEV).to(torch.float8_e4m3fn)
    b = torch.randn(n, n, device=DEV).to(torch.float8_e4m3fn).t()
    one = torch.tensor(1.0, device=DEV)
    us = bench_graph(lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
    ab = torch.randn(n, n, device=DEV).bfloat16()
    us_bf = bench_graph(lambda: ab @ ab)
    RESULT["sections"].setdefault("other", {})["ceilings_8192"] = {
        "e4m3_scaled_mm_tflops": 2 * n**3 / us / 1e6, "bf16_matmul_tflops": 2 * n**3 / us_bf / 1e6}
    log("ceilings", RESULT["sections"]["other"]["ceilings_8192"])


ROUNDS = 1  # --rounds: interleaved timing rounds of the speed section


def section_host():
    from flash_attn.cute import flash_attn_varlen_func

    from sglang_fa4.kernels.fp8_sm90 import launch
    from sglang_fa4.kernels.vit import fp8_quantize as quantize

    lens = [1024] * 2
    cu = make_cu(lens)
    t = sum(lens)
    q = torch.randn(t, 16, 128, device=DEV).bfloat16()
    res = quantize.quantize_qkv(q, q, q, cu)
    out = torch.empty_like(q)
    fn = lambda: launch.fp8_varlen_attention(res.q, res.k, None, cu, cu, 1024, 1024, descale=res.descale, out=out,  # noqa: E731
                                             vt=res.vt)
    fa = lambda: flash_attn_varlen_func(q, q, q, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=1024,  # noqa: E731
                                        max_seqlen_k=1024)
    for _ in range(5):  # both warmed up (compiled) before timing
        fn()
        fa()
    torch.cuda.synchronize()
    n = 200
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    host_fp8 = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fa()
    host_bf = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    r = {"fp8_call_host_us": host_fp8, "fa4_public_bf16_host_us": host_bf}
    RESULT["sections"].setdefault("other", {})["host"] = r
    log("host", r)


SILENCE_S = 50.0


def run_child(argv: list[str], out_dir: Path, name: str, budget_end: float, resumable: bool) -> dict:
    """Run this script as a child for one part; if a device fault kills it, restart after the
    faulting case (resumable parts).  Returns the child's merged RESULT."""
    import subprocess

    merged: dict = {"sections": {}}
    start = 0
    while True:
        left = budget_end - time.perf_counter()
        if left < 15:
            merged["sections"].setdefault("skipped", []).append(f"{name} from case {start}: out of time")
            break
        cmd = [sys.executable, __file__, "--child", "--json-name", f"{name}.json", "--out-dir", str(out_dir),
               "--start", str(start), *argv]
        log("child", name, "start", start, f"{left:.0f}s left")
        last_start = last_done = None
        hung = []
        try:
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            # watchdog: a kernel that deadlocks prints nothing; kill the child after `silence` s
            # without output (or at the budget's end) and do not resume the part
            import threading

            stamp = [time.perf_counter()]

            def watch():
                while p.poll() is None:
                    now = time.perf_counter()
                    if now - stamp[0] > SILENCE_S or now > budget_end:
                        hung.append(round(now - stamp[0], 1))
                        p.kill()
                        return
                    time.sleep(1.0)

            threading.Thread(target=watch, daemon=True).start()
            for line in p.stdout:
                stamp[0] = time.perf_counter()
                line = line.rstrip()
                if "Deprecat" in line or "warnings.warn" in line:
                    continue
                print("   ", line[:400], flush=True)
                if line.startswith("CASESTART "):
                    last_start = int(line.split()[1])
                if line.startswith("CASEDONE "):
                    last_done = int(line.split()[1])
            rc = p.wait(timeout=max(left, 1))
        except subprocess.TimeoutExpired:
            p.kill()
            rc = "timeout"
        try:
            child = json.loads((out_dir / f"{name}.json").read_text())
        except Exception:  # noqa: BLE001
            child = {"sections": {}}
        for key, val in child.get("sections", {}).items():
            if isinstance(val, list):
                have = merged["sections"].setdefault(key, [])
                have.extend(x for x in val if x not in have)
            elif isinstance(val, dict):
                merged["sections"].setdefault(key, {}).update(val)
            else:
                merged["sections"][key] = val
        for key in ("env", "command"):
            if key in child:
                merged.setdefault(key, child[key])
        if hung:
            merged["sections"].setdefault("child_failures", []).append(
                {"part": name, "rc": "killed: no output for %ss (hang?)" % hung[0], "case": last_start, "hang": True})
            break
        if rc == 0 or not resumable or last_start is None:
            if rc != 0:
                merged["sections"].setdefault("child_failures", []).append({"part": name, "rc": rc})
            break
        merged["sections"].setdefault("child_failures", []).append({"part": name, "rc": rc, "case": last_start})
        start = last_start + 1
    return merged


def main():
    global SPEED_WHAT, JSON_NAME, OUT_DIR, ARGS_CHILD, CASE_FILTER, ROUNDS
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", default=os.environ.get("OUT", "benchmark/results/h200"))
    ap.add_argument("--sections", default="speed,host,quantize,correctness",
                    help="of compile, quantize, correctness, speed, host")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--isolate", action="store_true",
                    help="run each part in a child process, resuming after device faults (needs a budget)")
    ap.add_argument("--budget", type=float, default=220.0, help="seconds for --isolate")
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--speed-what", default="both", choices=["both", "fp8", "bf16"])
    ap.add_argument("--json-name", default="fp8_attention.json")
    ap.add_argument("--case-filter", default=None, help="correctness: only cases whose name matches this regex")
    ap.add_argument("--render", help="only rewrite the markdown beside this result JSON")
    ap.add_argument("--rounds", type=int, default=1, help="section 'speed': interleaved timing rounds per shape (medians)")
    ap.add_argument("--note", action="append", default=[], help="a line for the markdown's header")
    args = ap.parse_args()
    if args.render:
        RESULT.update(json.loads(Path(args.render).read_text()))
        Path(args.render).with_suffix(".md").write_text(markdown())
        return
    SPEED_WHAT = args.speed_what
    CASE_FILTER = args.case_filter
    JSON_NAME = args.json_name
    ARGS_CHILD = args.child
    ROUNDS = max(1, args.rounds)
    if args.note:
        RESULT["analysis_after_run"] = list(args.note)
    out_dir = OUT_DIR = Path(args.out_dir)
    RESULT["command"] = " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv])
    if args.isolate:
        end = T0 + args.budget
        parts = [
            # fp8 and FA4 bf16 interleaved in one child (the ratio is a median of per-round ratios;
            # two children gave a ratio of medians from two processes, and the merge lost the fp8 rounds)
            ("speed", ["--sections", "speed,host", "--speed-what", "both"], False),
            ("quantize", ["--sections", "quantize"], False),
            ("correct", ["--sections", "correctness"], True),
        ]
        wanted = set(args.sections.split(","))
        for name, argv, resumable in parts:
            if not (set(argv[1].split(",")) & wanted):
                continue
            child = run_child(argv + ["--rounds", str(ROUNDS)], out_dir, name, end, resumable)
            for key, val in child.get("sections", {}).items():
                if key == "speed" and "speed" in RESULT["sections"]:
                    by = {(r["shape"], r["d"], r["causal"]): r for r in RESULT["sections"]["speed"]}
                    for r in val:
                        by.setdefault((r["shape"], r["d"], r["causal"]), {}).update(r)
                    for r in by.values():
                        if "fp8_us" in r and "bf16_us" in r:
                            r["speedup"] = r["bf16_us"] / r["fp8_us"]
                    RESULT["sections"]["speed"] = list(by.values())
                elif isinstance(val, list):
                    RESULT["sections"].setdefault(key, []).extend(val)
                elif isinstance(val, dict):
                    RESULT["sections"].setdefault(key, {}).update(val)
                else:
                    RESULT["sections"][key] = val
            for key in ("env",):
                if key in child:
                    RESULT.setdefault(key, child[key])
            (out_dir / f"{name}.json").unlink(missing_ok=True)
            save(out_dir)
        print(markdown())
        return
    import cutlass

    RESULT["env"] = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                     "cutlass": getattr(cutlass, "__version__", "?"), "capability": torch.cuda.get_device_capability()}
    log(RESULT["env"])
    for sec in args.sections.split(","):
        t = time.perf_counter()
        try:
            {"compile": section_compile, "quantize": section_quantize_exact,
             "correctness": lambda: section_correctness(args.quick, args.start), "speed": section_speed,
             "host": section_host}[sec]()
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            RESULT["sections"].setdefault("errors", {})[sec] = f"{type(e).__name__}: {e}"[:500]
        RESULT["sections"].setdefault("seconds", {})[sec] = round(time.perf_counter() - t, 1)
        save(out_dir)
    if not args.child:
        print(markdown())


if __name__ == "__main__":
    main()
