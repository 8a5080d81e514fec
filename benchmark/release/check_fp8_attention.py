"""GPU check of the SM90 FP8 attention forward (sglang_fa4.kernels.fp8_sm90): correctness + speed.

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
"""

from __future__ import annotations

import argparse
import json
import math
import re
import os
import shlex
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from sglang_fa4.bench.stats import median  # noqa: E402
from sglang_fa4.bench.timing import graph_replay_ms  # noqa: E402
from sglang_fa4.testing import attention_fp32, cu_seqlens  # noqa: E402

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
    bring = RESULT["sections"].get("bringup", [])
    faults = RESULT["sections"].get("faults", [])
    if bring or faults:
        lines += ["## Bring-up (kernel alone, torch-made E4M3 inputs, fp32 reference on the same inputs)", "",
                  "| step | debug switches | finite | rel. err |", "|---|---|---|---|"]
        for b in bring:
            lines.append(f"| {b['case']} | {b.get('flags') or '-'} | {b.get('finite')} | {b.get('err_ref', float('nan')):.2e} |")
        for f in faults:
            lines.append(f"| {f['case']} | | **device fault ({f['kernel']})**: {f['error']} | |")
        if RESULT["sections"].get("skipped_after_bringup_fault"):
            lines += ["", "The full kernel faulted in bring-up, so correctness and speed were not run in this call."]
        lines.append("")
    for f in RESULT["sections"].get("variant_failures", []):
        where = f"{f['variant']} in {f.get('phase')}" if f.get("variant") else "before its first variant"
        lines += [f"**Variants child process failed** ({where}; that variant left out, the others run again): "
                  f"{f.get('failure')}", ""]
    var = RESULT["sections"].get("variants", [])
    if var:
        rounds = RESULT["sections"].get("variant_rounds")
        lines += ["## Kernel variants side by side (same process; fp8 us, speedup vs FA4 bf16 of the same run)", "",
                  "Variant flags are kernel config changes (`FIELD=VALUE` of `kernel_config.Fp8KernelConfig`, applied to every kernel the variant's cases compile). Quick correctness: "
                  "rel. err vs fp32 on dequantized inputs, worst of the variant's cases."
                  + (f" Timing: {rounds} interleaved rounds per shape (FA4 bf16, then each variant, their order rotated); fp8 us = median "
                     "of the rounds, speedup = median of the per-round ratios to the same round's FA4 bf16." if rounds else ""), ""]
        shapes = [r["shape_key"] for r in var[0].get("speed", [])]
        lines.append("| variant | flags | worst err | " + " | ".join(shapes) + " | geomean speedup |")
        lines.append("|---|---|---|" + "---|" * len(shapes) + "---|")
        for v in var:
            cells = [f"{r.get('fp8_us', float('nan')):.1f} us ({r.get('speedup', float('nan')):.2f}x)" for r in v.get("speed", [])]
            lines.append(f"| {v['name']} | `{v['flags'] or '-'}` | {v.get('worst_err', float('nan')):.2e} | "
                         + " | ".join(cells) + f" | {v.get('geomean_speedup', float('nan')):.3f} |")
        bf = {r["shape_key"]: r for v in var for r in v.get("speed", []) if r.get("bf16_rounds")}
        if bf:
            lines += ["", "FA4 bf16 per round (us): " + "; ".join(
                f"{k}: " + ", ".join(f"{x:.1f}" for x in r["bf16_rounds"]) + f" (median {r['bf16_us']:.1f})" for k, r in bf.items())]
        if RESULT.get("winner"):
            lines += ["", f"Winner (fastest geomean among variants passing quick correctness): **{RESULT['winner']['name']}** "
                          f"(`{RESULT['winner']['flags'] or '-'}`); the correctness and speed sections below ran with it."]
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
            kernel_config=kcfg(res.q.shape[2], causal, window),
        )
        v8 = vt_to_v(res.vt, cu_k, tk).view(torch.float8_e4m3fn)
    else:  # v path: dequantizable v8 given directly, the wrapper packs V^T itself
        v8 = vt_to_v(res.vt, cu_k, tk).view(torch.float8_e4m3fn)
        launch.fp8_varlen_attention(
            res.q, res.k, v8, cu_q, cu_k, max(lens_q), max(lens_k),
            q_descale=res.descale[0], k_descale=res.descale[1], v_descale=res.descale[2],
            softmax_scale=scale, causal=causal, window_size=window, out=out,
            kernel_config=kcfg(res.q.shape[2], causal, window),
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


BRINGUP_CORE = [
    ("256", [256], 2, 128, False), ("1000 mask+wrap", [1000], 2, 128, False),
    ("256,128 early-exit CTAs", [256, 128], 2, 128, False),
    ("24,1000 unaligned key offset", [24, 1000], 2, 128, False),
    ("256,56 Q half past the end", [256, 56], 2, 128, False),
    ("4096 h16 multi-wave (512 CTAs)", [4096], 16, 128, False),
    ("1000,3000 h16", [1000, 3000], 16, 128, False),
    ("1000 causal", [1000], 2, 128, True),
    ("100,1,130 causal (1-tile CTAs)", [100, 1, 130], 4, 128, True),
]


def section_bringup(start=0, stop=None):
    """The kernel alone on torch-made E4M3 inputs (no Triton, no FA4), growing one feature at a time."""
    from sglang_fa4.kernels.fp8_sm90 import launch
    from sglang_fa4.kernels.fp8_sm90.vt_pack import pack_vt_reference

    rows = RESULT["sections"].setdefault("bringup", [])
    for idx, (name, lens, h, d, causal) in enumerate(BRINGUP_CORE):
        if idx < start or (stop is not None and idx >= stop):
            continue
        print(f"CASESTART {idx} {name}", flush=True)
        cu = make_cu(lens)
        t = sum(lens)
        q, k, v = (torch.randn(t, h, d, device=DEV).to(torch.float8_e4m3fn) for _ in range(3))
        vt = pack_vt_reference(v.view(torch.uint8), cu)
        out = torch.full((t, h, d), float("nan"), dtype=torch.bfloat16, device=DEV)
        launch.fp8_varlen_attention(q, k, None, cu, cu, max(lens), max(lens), out=out, vt=vt, causal=causal,
                                    kernel_config=kcfg(d, causal))
        fault_guard("fp8", f"bringup {name}")
        ref = ref_attention(q.float(), k.float(), v.float(), cu, cu, d ** -0.5, causal)
        o = out.float()
        rows.append({"case": name, "flags": KERNEL_CHANGES, "finite": bool(torch.isfinite(o).all()),
                     "err_ref": rel_err(o, ref)})
        log("bringup", rows[-1])
        save(OUT_DIR)
        print(f"CASEDONE {idx}", flush=True)


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
    launch.fp8_varlen_attention(q8, k8, v8, cu, cu, max(lens), max(lens), out=out, causal=True,
                                kernel_config=kcfg(128, True))
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
                        res.q, res.k, None, cu, cu, m, m, descale=res.descale, causal=causal, out=out8, vt=res.vt,
                        kernel_config=kcfg(d, causal))))
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


ROUNDS = 1  # --rounds: interleaved timing rounds (variants, speed)
VARIANTS = "base="  # name=flags;name=flags (flags: FIELD=VALUE,... kernel config changes, kcfg)
#: --kernel-config / a variant's flags: changes to the table's kernel config (kernel_config.parse_changes),
#: passed with every call this run makes (kcfg); "" = the product's configs.
KERNEL_CHANGES = ""


def kcfg(d: int, causal: bool = False, window=(None, None)):
    """The kernel config this run passes for a (head dim, causal, window) kernel: the table's with
    KERNEL_CHANGES, or None (the table's, as in use)."""
    from sglang_fa4.kernels.fp8_sm90.kernel_config import config_for
    from sglang_fa4.kernels.fp8_sm90.layout import variant_for

    return config_for(variant_for(d, causal, window), KERNEL_CHANGES) if KERNEL_CHANGES else None

def _many_segments():
    """The correctness section's >256-segment layout (0- and 1-token segments among them)."""
    rng = torch.Generator().manual_seed(0)
    many = [int(x) for x in torch.randint(0, 71, (300,), generator=rng)]
    many[3], many[10], many[11] = 0, 1, 1
    return many


#: a ViT budget graph's shape: ~70 segment slots, most of them empty, pictures of mixed sizes
_BUDGET_SLOTS = [0] * 70
_BUDGET_SLOTS[0], _BUDGET_SLOTS[4], _BUDGET_SLOTS[5], _BUDGET_SLOTS[9], _BUDGET_SLOTS[69] = 4100, 1, 1000, 257, 63
#: quick correctness per variant (--variant-cases): (name, lens_q, lens_k, q heads, kv heads, d, causal, data)
VARIANT_CASE_SETS = {
    "default": [
        ("2seq", [1000, 3000], [1000, 3000], 16, 16, 128, False, "randn"),
        ("1x16384", [16384], [16384], 2, 2, 128, False, "randn"),
        ("2seq d64", [1000, 3000], [1000, 3000], 16, 16, 64, False, "randn"),
        ("24,1000 d64 causal", [24, 1000], [24, 1000], 4, 4, 64, True, "randn"),
    ],
    # the d=128 non-causal kernel alone (the persistent variant's layouts): partial tiles at
    # sequence ends, > 128 sequences (index-order schedule) and fewer (longest-first table), empty
    # and 1-token segments, GQA with seqlen_q != seqlen_k, all-zero inputs, one 16k sequence
    "d128full": [
        ("2seq", [1000, 3000], [1000, 3000], 16, 16, 128, False, "randn"),
        ("1x16384", [16384], [16384], 2, 2, 128, False, "randn"),
        (">256 segs 0/1-token", _many_segments(), _many_segments(), 8, 8, 128, False, "randn"),
        ("70 budget slots", _BUDGET_SLOTS, _BUDGET_SLOTS, 16, 16, 128, False, "randn"),
        ("64-token segments", [64] * 100, [64] * 100, 16, 16, 128, False, "randn"),
        ("q!=k gqa 8/2", [100, 700, 0, 1, 300], [900, 1700, 5, 3, 64], 8, 2, 128, False, "randn"),
        ("all zeros", [300, 0, 1], [300, 0, 1], 4, 4, 128, False, "zeros"),
        # q rows without keys (O = 0) between tiles with keys, ~3.5 tiles a CTA: the persistent
        # loop's boundaries key tiles -> none -> none -> key tiles (w:xover's plain-tail and
        # lone-first-QK^T paths); FA4 bf16 is not asked about key-less rows
        ("no-key q rows", [3000, 2000, 1290, 640], [0, 5000, 0, 3000], 8, 8, 128, False, "randn_no_fa4"),
    ],
    # d=256 causal alone (an LLM's prefill, e.g. 16 q / 4 kv heads): partial key and q tiles at
    # sequence ends (for any key tile of 64..160), GQA, seqlen_q != seqlen_k (bottom-right
    # diagonal, 1-token and empty segments), a q block shorter than a consumer's 64 rows, one 8k
    # sequence (the causal loop's long run of unmasked tiles) -- one kernel compiled per variant
    "d256causal": [
        ("2seq causal gqa 16/4 d256", [1000, 3000], [1000, 3000], 16, 4, 256, True, "randn"),
        ("q!=k causal gqa 8/2 d256", [100, 700, 0, 1, 300], [900, 1700, 5, 3, 333], 8, 2, 256, True, "randn"),
        ("24,1000 causal d256", [24, 1000], [24, 1000], 4, 4, 256, True, "randn"),
        ("1x8192 causal gqa 4/1 d256", [8192], [8192], 4, 1, 256, True, "randn"),
    ],
}
# both d=256 kernels: the causal set plus the unmasked kernel's partial tiles and GQA
VARIANT_CASE_SETS["d256"] = VARIANT_CASE_SETS["d256causal"] + [
    ("2seq gqa 16/4 d256", [1000, 3000], [1000, 3000], 16, 4, 256, False, "randn"),
    ("q!=k gqa 8/2 d256", [100, 700, 0, 1, 300], [900, 1700, 5, 3, 333], 8, 2, 256, False, "randn"),
]
VARIANT_CASES = VARIANT_CASE_SETS["default"]
VARIANT_DIMS = (64, 128)  # head dims of the variant cases / shapes (--variant-dims)
#: timed shapes (name, lens, q heads, kv heads, d, causal); a shape is timed only where the variant
#: cases compiled its kernel (same d and causal), so no variant compiles during the timing
VARIANT_SHAPES = [("8x4096", [4096] * 8, 16, 16, 128, False), ("1x16384", [16384], 16, 16, 128, False),
                  ("8x4096", [4096] * 8, 16, 16, 64, False), ("1x16384", [16384], 16, 16, 64, False),
                  # an LLM's prefill at d=256 (16 q / 4 kv heads; fp8_kv_backend-all-0.5.23.md: 8k tokens)
                  ("1x8192 causal gqa16/4", [8192], 16, 4, 256, True), ("4x2048 causal gqa16/4", [2048] * 4, 16, 4, 256, True),
                  ("2x4096 gqa16/4", [4096] * 2, 16, 4, 256, False)]


def variant_shapes(cases, dims) -> list:
    """The VARIANT_SHAPES of head dims ``dims`` whose kernel (d, causal) the ``cases`` compile."""
    kinds = {(c[5], c[6]) for c in cases}
    return [sh for sh in VARIANT_SHAPES if sh[4] in dims and (sh[4], sh[5]) in kinds]


def section_variants():
    """Main-loop variants side by side in one process: quick correctness of each (which compiles
    it), then fp8 speed on VARIANT_SHAPES (those of the cases' kernels: d128 / d64 non-causal, d256
    causal / non-causal with GQA) against FA4 bf16 (same mask and heads), interleaved: per
    shape, ``ROUNDS`` rounds of [FA4 bf16, every variant in turn (order rotated)] on the same inputs (FA4 bf16's
    time moves by ~10% between processes and by a few % within one), each variant's time the
    median of its rounds and its speedup the median of its per-round ratios to the bf16 time of the
    same round.  The fastest variant that passes (geometric mean of the speedups) becomes
    KERNEL_CHANGES for the later sections."""
    global KERNEL_CHANGES
    from flash_attn.cute import flash_attn_varlen_func

    from sglang_fa4.kernels.fp8_sm90 import launch
    from sglang_fa4.kernels.vit import fp8_quantize as quantize

    specs = [tuple(x.split("=", 1)) for x in VARIANTS.split(";") if x]
    cases = [c for c in VARIANT_CASES if c[5] in VARIANT_DIMS]
    shapes = variant_shapes(cases, VARIANT_DIMS)
    left = [f"{sh[0]} d{sh[4]}" for sh in VARIANT_SHAPES if sh[4] in VARIANT_DIMS and sh not in shapes]
    if left:
        log("variants: not timed (no case compiles their kernel):", left)
    rows = RESULT["sections"].setdefault("variants", [])
    for name, flags in specs:
        KERNEL_CHANGES = flags  # (launch caches each (variant, config) compile: none compiled twice)
        v = {"name": name, "flags": flags, "cases": [], "speed": []}
        print(f"VARIANTSTART {name}", flush=True)  # --isolate: names the variant that hung or faulted
        for cname, lens_q, lens_k, h, hkv, d, causal, data in cases:
            try:
                r = run_case(f"{cname} [{name}]", lens_q, lens_k, h, hkv, d, causal, data=data)
            except Exception as e:  # noqa: BLE001
                r = {"case": cname, "error": f"{type(e).__name__}: {e}"[:200], "ok": False}
            v["cases"].append(r)
        v["ok"] = all(r.get("ok") for r in v["cases"])
        v["worst_err"] = max((r.get("err_ref", float("nan")) for r in v["cases"]), default=float("nan"))
        rows.append(v)
        log("variant", name, flags, "ok", v["ok"], "worst", round(v["worst_err"], 5))
        RESULT["sections"]["variants"] = rows
        save(OUT_DIR)

    def use(flags):
        global KERNEL_CHANGES
        KERNEL_CHANGES = flags

    timed = [v for v in rows if v["ok"]]
    for sname, lens, h, hkv, d, causal in shapes:
        cu = make_cu(lens)
        t = sum(lens)
        q = torch.randn(t, h, d, device=DEV).bfloat16()
        k, vv = (torch.randn(t, hkv, d, device=DEV).bfloat16() for _ in range(2))
        res = quantize.quantize_qkv(q, k, vv, cu)
        out8 = torch.empty(t, h, d, dtype=torch.bfloat16, device=DEV)
        m = max(lens)
        flops = 4 * sum(n * (n + 1) // 2 if causal else n * n for n in lens) * h * d
        key = f"{sname} d{d}"
        per = {v["name"]: {"shape_key": key, "fp8_rounds": [], "bf16_rounds": [], "ratio_rounds": []} for v in timed}
        for rnd in range(ROUNDS):
            bf = bench_graph(lambda: flash_attn_varlen_func(
                q, k, vv, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=m, max_seqlen_k=m, causal=causal), iters=30)
            fault_guard("fa4_bf16", f"variants {key}")
            for v in timed[rnd % max(1, len(timed)):] + timed[:rnd % max(1, len(timed))]:  # order rotated per round
                row = per[v["name"]]
                use(v["flags"])
                print(f"VARIANTTIME {v['name']}", flush=True)
                try:
                    config = kcfg(d, causal)
                    us = bench_graph(lambda: launch.fp8_varlen_attention(
                        res.q, res.k, None, cu, cu, m, m, descale=res.descale, causal=causal, out=out8,
                        vt=res.vt, kernel_config=config), iters=30)
                except Exception as e:  # noqa: BLE001
                    row["fp8_error"] = f"{type(e).__name__}: {e}"[:200]
                    continue
                fault_guard("fp8", f"variant {v['name']} {key}")
                row["fp8_rounds"].append(us)
                row["bf16_rounds"].append(bf)
                row["ratio_rounds"].append(bf / us)
        for v in timed:
            row = per[v["name"]]
            if row["fp8_rounds"] and "fp8_error" not in row:
                row["fp8_us"] = median(row["fp8_rounds"])
                row["fp8_tflops"] = flops / row["fp8_us"] / 1e6
                row["bf16_us"] = median(row["bf16_rounds"])
                row["speedup"] = median(row["ratio_rounds"])
            v["speed"].append(row)
        log("variants", key, {n: (round(r.get("fp8_us", float("nan")), 1), round(r.get("speedup", float("nan")), 3))
                              for n, r in per.items()}, "bf16 rounds", [round(x, 1) for x in next(iter(per.values()))["bf16_rounds"]])
        del q, k, vv, res, out8
    for v in rows:
        sp = [r["speedup"] for r in v["speed"] if "speedup" in r]
        v["geomean_speedup"] = (math.exp(sum(math.log(x) for x in sp) / len(sp))
                                if sp and len(sp) == len(shapes) else float("nan"))
        log("variant", v["name"], v["flags"], "geomean", round(v["geomean_speedup"], 3))
    RESULT["sections"]["variants"] = rows
    RESULT["sections"]["variant_rounds"] = ROUNDS
    save(OUT_DIR)
    good = [v for v in rows if v["ok"] and v["geomean_speedup"] == v["geomean_speedup"]]
    if good:
        best = max(good, key=lambda v: v["geomean_speedup"])
        RESULT["winner"] = {"name": best["name"], "flags": best["flags"]}
        use(best["flags"])
        RESULT["kernel_config"] = KERNEL_CHANGES
    else:
        use("")
    log("winner", RESULT.get("winner"))


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
    config = kcfg(128)
    fn = lambda: launch.fp8_varlen_attention(res.q, res.k, None, cu, cu, 1024, 1024, descale=res.descale, out=out,  # noqa: E731
                                             vt=res.vt, kernel_config=config)
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


def sanitize(step: int, out_dir: Path, seconds: float) -> None:
    """compute-sanitizer (memcheck) over one faulting bring-up step: which block/thread faulted."""
    import shutil
    import subprocess

    exe = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    cmd = [exe, "--tool", "memcheck", "--print-limit", "12", "--show-backtrace", "no", sys.executable, __file__,
           "--child", "--sections", "bringup", "--start", str(step), "--stop", str(step + 1),
           "--json-name", "sanitize.json", "--out-dir", str(out_dir / "san")]
    log("sanitizer on bring-up step", step)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds)
        text, rc = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        text, rc = ((e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")), "timeout"
    except Exception as e:  # noqa: BLE001
        text, rc = f"{type(e).__name__}: {e}", "error"
    keep = [ln for ln in text.splitlines() if "Deprecat" not in ln and "warnings.warn" not in ln]
    (out_dir / "sanitizer.log").write_text("\n".join(keep)[-20000:])
    lines = [ln for ln in keep if ln.startswith("=========")][:40]
    RESULT["sections"].setdefault("other", {})["sanitizer"] = {"step": step, "rc": rc, "lines": lines}
    for ln in lines:
        print("   ", ln, flush=True)


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
                if line.startswith(("VARIANTSTART ", "VARIANTTIME ")):  # section 'variants'
                    merged["last_variant"] = line.split(maxsplit=1)
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
        for key in ("env", "command", "winner"):
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


def run_variants_isolated(out_dir: Path, budget_end: float, argv: list[str]) -> None:
    """--isolate with section 'variants': the variants run in a child process (its watchdog kills a
    child that prints nothing for SILENCE_S, e.g. a deadlocked kernel); a variant whose run kills
    or hangs the child (the last VARIANTSTART / VARIANTTIME line names it) is recorded in
    'variant_failures' and the child runs again without it, so a bad variant costs only its own
    numbers and the others are still timed side by side."""
    specs = [tuple(x.split("=", 1)) for x in VARIANTS.split(";") if x]
    failures = RESULT["sections"].setdefault("variant_failures", [])
    while specs:
        (out_dir / "variants.json").unlink(missing_ok=True)  # no stale results from a dead child
        spec_arg = ";".join(f"{n}={f}" for n, f in specs)
        child = run_child(["--sections", "variants", "--variants", spec_arg, *argv], out_dir, "variants",
                          budget_end, False)
        (out_dir / "variants.json").unlink(missing_ok=True)
        for key in ("env", "winner"):
            if key in child:
                RESULT[key] = child[key]
        fails = child["sections"].get("child_failures", [])
        if not fails and "variants" in child["sections"]:
            for key in ("variants", "variant_rounds", "seconds"):
                if key in child["sections"]:
                    RESULT["sections"][key] = child["sections"][key]
            return
        last = child.get("last_variant")
        failures.append({"variant": last[1] if last else None, "phase": last[0] if last else None,
                         "failure": fails[-1] if fails else child["sections"].get("skipped")})
        log("variants child failed", failures[-1])
        save(out_dir)
        if not last or not fails:
            return
        specs = [sp for sp in specs if sp[0] != last[1]]


def main():
    global SPEED_WHAT, JSON_NAME, OUT_DIR, VARIANTS, ARGS_CHILD, VARIANT_DIMS, CASE_FILTER, ROUNDS, VARIANT_CASES
    global KERNEL_CHANGES
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", default=os.environ.get("OUT", "benchmark/results/h200"))
    ap.add_argument("--sections", default="bringup,speed,host,quantize,correctness")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--kernel-config", default="", help="kernel config changes for every kernel, FIELD=VALUE,... "
                                                        "(kernel_config.Fp8KernelConfig)")
    ap.add_argument("--isolate", action="store_true",
                    help="run each part in a child process, resuming after device faults (needs a budget)")
    ap.add_argument("--budget", type=float, default=220.0, help="seconds for --isolate")
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--stop", type=int, default=None, help="bring-up: stop before this step")
    ap.add_argument("--sanitize", type=float, default=60.0,
                    help="seconds for a compute-sanitizer run of the first faulting bring-up step (0: none)")
    ap.add_argument("--speed-what", default="both", choices=["both", "fp8", "bf16"])
    ap.add_argument("--json-name", default="fp8_attention.json")
    ap.add_argument("--case-filter", default=None, help="correctness: only cases whose name matches this regex")
    ap.add_argument("--render", help="only rewrite the markdown beside this result JSON")
    ap.add_argument("--variants", default=None,
                    help="section 'variants': name=flags;name=flags (kernel switches, e.g. 'base=;pin=pin_wait')")
    ap.add_argument("--rounds", type=int, default=1,
                    help="sections 'variants' and 'speed': interleaved timing rounds per shape (medians)")
    ap.add_argument("--variant-dims", default="64,128", help="section 'variants': head dims of its cases and shapes")
    ap.add_argument("--variant-cases", default="default", choices=sorted(VARIANT_CASE_SETS),
                    help="section 'variants': the quick correctness cases of each variant")
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
    if args.variants is not None:
        VARIANTS = args.variants
    ROUNDS = max(1, args.rounds)
    VARIANT_DIMS = tuple(int(x) for x in args.variant_dims.split(",") if x)
    VARIANT_CASES = VARIANT_CASE_SETS[args.variant_cases]
    if args.note:
        RESULT["analysis_after_run"] = list(args.note)
    out_dir = OUT_DIR = Path(args.out_dir)
    if args.kernel_config:
        KERNEL_CHANGES = args.kernel_config
        RESULT["kernel_config"] = KERNEL_CHANGES
    RESULT["command"] = " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv])
    if args.isolate:
        end = T0 + args.budget
        extra = ["--kernel-config", args.kernel_config] if args.kernel_config else []
        parts = [
            ("bringup", ["--sections", "bringup"], True),
            ("speed_fp8", ["--sections", "speed,host", "--speed-what", "fp8"], False),
            ("speed_bf16", ["--sections", "speed", "--speed-what", "bf16"], False),
            ("quantize", ["--sections", "quantize"], False),
            ("correct", ["--sections", "correctness"], True),
        ]
        wanted = set(args.sections.split(","))
        if "variants" in wanted:
            run_variants_isolated(out_dir, end, ["--rounds", str(ROUNDS), "--variant-dims", args.variant_dims,
                                                 "--variant-cases", args.variant_cases, *extra])
            save(out_dir)
            if RESULT.get("winner") and not args.kernel_config:
                # the later parts run with the winner, as in one process (section_variants)
                extra = ["--kernel-config", RESULT["winner"]["flags"]] if RESULT["winner"]["flags"] else []
        for name, argv, resumable in parts:
            if not (set(argv[1].split(",")) & wanted):
                continue
            child = run_child(argv + extra, out_dir, name, end, resumable)
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
            if name == "bringup":
                fails = [f for f in child.get("sections", {}).get("child_failures", []) if "case" in f]
                if fails:
                    if args.sanitize > 0 and end - time.perf_counter() > args.sanitize + 30:
                        sanitize(fails[0]["case"], out_dir, args.sanitize)
                    log("the kernel faulted in bring-up: skipping the parts that would fault again")
                    RESULT["sections"]["skipped_after_bringup_fault"] = True
                    wanted &= {"bringup", "quantize"}
        print(markdown())
        return
    import cutlass

    RESULT["env"] = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                     "cutlass": getattr(cutlass, "__version__", "?"), "capability": torch.cuda.get_device_capability()}
    log(RESULT["env"])
    for sec in args.sections.split(","):
        t = time.perf_counter()
        try:
            {"compile": section_compile, "quantize": section_quantize_exact, "bringup": lambda: section_bringup(args.start, args.stop),
             "variants": section_variants,
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
