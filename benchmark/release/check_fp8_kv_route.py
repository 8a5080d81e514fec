"""Issue #17 items 2-3 on an H200: SGLang's fa4 LLM attention on an fp8_e4m3 paged KV cache, routed
to sglang-fa4's SM90 FP8 kernel.

SGLang itself does not travel with this run (its bundle and the FA4 bundle together exceed one
call's 64 MiB), so the routed function -- ``integration.llm_fp8_kv.flash_attn_with_kvcache``, the
AROUND hook on SGLang's dispatcher -- is called with the tensors SGLang's FlashAttentionBackend
passes it (the CPU tests check those against SGLang 0.5.20/0.5.23's real backend methods and
MHATokenToKVPool):

* the pool: fp8 (tokens, Hkv, d) K and V buffers viewed as (pages, page_size, Hkv, d)
  (``get_paged_mha_kv_cache``), written as ``set_kv_buffer`` does (bf16 / k_scale -> E4M3);
* the page table ``req_to_token[:, ::P] // P`` of shuffled whole pages, ``cache_seqlens`` int32,
  ``cu_seqlens_q``, host ``max_seqlen_q``; q cast to E4M3 (``prepare_paged_mha_query``) and
  ``layer.k_scale.expand(batch, Hkv)`` as descales; ``causal=True``, ``ver=4``.

Correctness: fp32 attention on the dequantized cache, output poisoned first; Qwen2.5-7B-like layer
(28 q heads, 4 kv heads, d=128), page sizes 1, 16, 64, extend with a cached prefix and decode.
Speed (CUDA-graph replay, medians): prefill 8k tokens and decode (batch 64, 4k context) for the
routed fa4-fp8 call (the fused page gather + kernel), the FP8 kernel alone on already-contiguous K/V^T,
the page gather before/after (the fused Triton kernel vs the torch index ops + V^T pack it
replaced, alone and inside the routed call, interleaved rounds; bytes moved, and the floor at the
measured device copy rate; ``--gather-only``: just that, on the decode shapes),
and FA4 4.0.0b36 bf16 through its public API (contiguous K/V; and paged like SGLang's bf16 fa4 call
where FA4 takes it).

FA3-FP8 (where ``.fa3/libfa3fwd.so`` was built by ``benchmark/fa3_build/build.sh``): FlashAttention-3's
Hopper FP8 forward called as SGLang's fa3 backend calls it on the same fp8 pool (paged KV, q cast to
E4M3, k/v scales as descales, causal), checked against the same fp32 reference (plus a d=256 layer)
and timed side by side: the bar for turning the FA3 -> FA4 upgrade (SGLANG_FA4_FP8_KV_UPGRADE) on
by default is fa4-fp8 at least as fast as FA3-FP8 on these shapes.

    python3 benchmark/release/check_fp8_kv_route.py --out DIR      (writes fp8_kv_route.json / .md)
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
import traceback
from pathlib import Path


import torch  # noqa: E402

from sglang_fa4.bench.timing import interleaved_ms, timed_into  # noqa: E402
from sglang_fa4.testing import cu_seqlens, paged_attention_fp32  # noqa: E402

DEV = "cuda"
FP8 = torch.float8_e4m3fn
HQ, HKV, D = 28, 4, 128
RESULT: dict = {"command": "python3 " + " ".join(shlex.quote(a) for a in sys.argv), "correctness": [], "speed": [],
                "notes": []}
T0 = time.time()
DECODE_ONLY = False
GATHER_ONLY = False
#: (name, cached tokens per sequence, new tokens per sequence, page size)
SPEED_SHAPES = [("prefill 8k", [8192], [8192], 16), ("decode b64 ctx4k", [4096] * 64, [1] * 64, 16),
                ("decode b64 ctx4k", [4096] * 64, [1] * 64, 1)]
STEM = "fp8_kv_route"


def log(*a):
    print(f"[{time.time() - T0:6.1f}s]", *a, flush=True)


def save(out: Path):
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{STEM}.json").write_text(json.dumps(RESULT))
    (out / f"{STEM}.md").write_text(markdown(RESULT))


def make_cache(lens, page_size, k_scale, v_scale, seed, d=D):
    """SGLang-shaped fp8 pool + page table for sequences of ``lens`` cached tokens."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    n_pages = [-(-n // page_size) for n in lens]
    total_pages = sum(n_pages) + 8
    pages = (torch.randperm(total_pages - 1, generator=g)[: sum(n_pages)] + 1).tolist()  # page 0 reserved
    k_bf = torch.randn(total_pages * page_size, HKV, d, device=DEV, dtype=torch.bfloat16)
    v_bf = torch.randn(total_pages * page_size, HKV, d, device=DEV, dtype=torch.bfloat16)
    k_buf = (k_bf / k_scale).to(FP8)  # MHATokenToKVPool.set_kv_buffer: div_(scale), .to(dtype)
    v_buf = (v_bf / v_scale).to(FP8)
    width = -(-max(lens) // page_size)
    table = torch.zeros(len(lens), width, dtype=torch.int32)
    at = 0
    for b, n in enumerate(n_pages):
        table[b, :n] = torch.tensor(pages[at:at + n], dtype=torch.int32)
        at += n
    return (k_buf.view(-1, page_size, HKV, d), v_buf.view(-1, page_size, HKV, d), table.to(DEV),
            torch.tensor(lens, dtype=torch.int32, device=DEV))


def sglang_call(q8, k_cache, v_cache, table, seqlens, cu_q, max_q, kd, vd, out=None):
    """forward_extend's / forward_decode's flash_attn_with_kvcache call, through the plugin's hook."""
    from sglang_fa4.integration import llm_fp8_kv

    def upstream(q, k_cache, v_cache, k=None, v=None, qv=None, cache_seqlens=None, page_table=None,
                 cu_seqlens_q=None, cu_seqlens_k_new=None, max_seqlen_q=None, q_descale=None, k_descale=None,
                 v_descale=None, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                 num_splits=0, return_softmax_lse=False, ver=3, out=None):
        # SGLang's dispatcher's parameters (the ones its FA calls use); reaching it means no route
        raise AssertionError("the fp8 route was not taken")

    return llm_fp8_kv.flash_attn_with_kvcache(
        upstream, q=q8, k_cache=k_cache, v_cache=v_cache, page_table=table, cache_seqlens=seqlens,
        cu_seqlens_q=cu_q, cu_seqlens_k_new=None, max_seqlen_q=max_q, softmax_scale=D ** -0.5, causal=True,
        window_size=(-1, -1), softcap=0.0, return_softmax_lse=False, num_splits=0, out=out, ver=4,
        k_descale=kd, v_descale=vd)


def fa3_call(q8, k_cache, v_cache, table, seqlens, cu_q, max_q, kd, vd, out=None, lse=None, scratch=None):
    """SGLang's fa3 call on the same fp8 pool (FA3 built from source, sglang_fa4.bench.fa3), with
    num_splits=0 as SGLang passes it: FA3 picks its split count."""
    from sglang_fa4.bench import fa3

    return fa3.paged_fp8(q8, k_cache, v_cache, table, seqlens, cu_q, max_q, k_descale=kd, v_descale=vd,
                         softmax_scale=q8.shape[-1] ** -0.5, causal=True, out=out, lse=lse, scratch=scratch,
                         num_splits=0)


def fa3_available() -> bool:
    from sglang_fa4.bench import fa3

    return fa3.available()


def section_correctness():
    cases = [("extend+prefix", [1000, 3000, 517], [200, 3000, 17]), ("decode", [100, 777, 2048, 1, 129, 4096, 33, 640], [1] * 8)]
    impls = [("fa4-fp8 route", sglang_call)] + ([("fa3-fp8", fa3_call)] if fa3_available() else [])
    runs = [(p, D, impls) for p in (1, 16, 64)]
    if fa3_available():  # FA3's d=256 FP8 kernel (the route's d=256 is checked in check_fp8_kv_backend.py)
        runs.append((16, 256, impls[1:]))
    for page_size, d, run_impls in runs:
        for name, lens, new in cases:
            torch.manual_seed(page_size)
            k_scale, v_scale = torch.tensor([0.02], device=DEV), torch.tensor([0.015], device=DEV)
            kc, vc, table, seqlens = make_cache(lens, page_size, k_scale, v_scale, seed=page_size, d=d)
            cu_q = cu_seqlens(new, device=DEV)
            q8 = (torch.randn(sum(new), HQ, d, device=DEV) * 0.5).to(torch.bfloat16).to(FP8)  # q.to(fp8)
            kd, vd = k_scale.expand(len(lens), HKV), v_scale.expand(len(lens), HKV)
            ref = paged_attention_fp32(q8, kc, vc, table, seqlens, cu_q, k_descale=k_scale, v_descale=v_scale,
                                            softmax_scale=d ** -0.5, causal=True)
            for impl, call in run_impls:
                out = torch.full((sum(new), HQ, d), float("nan"), device=DEV, dtype=torch.bfloat16)
                call(q8, kc, vc, table, seqlens, cu_q, max(new), kd, vd, out=out)
                torch.cuda.synchronize()
                err = float((out.float() - ref).norm() / ref.norm())
                row = {"impl": impl, "d": d, "page_size": page_size, "case": name, "cached": lens, "new": new,
                       "rel_err": err, "finite": bool(torch.isfinite(out.float()).all()), "pass": err < 3e-2}
                RESULT["correctness"].append(row)
                log("correct", row)


def timed(label, fn, row):
    timed_into(row, label, fn)
    log(label, row.get(label), row.get(label + "_how"))


def time_gathers(row, kc, vc, table, seqlens, q8, cu_q, max_q, kd, vd, out, cu_kg, bound, copy_gbps):
    """Before/after of the page gather, interleaved: the fused kernel vs the torch index ops + V^T
    pack it replaced (the route itself has only the fused one), and the routed call; bytes moved
    and the floor at the measured copy rate."""
    from sglang_fa4.kernels.fp8_paged_kv.gather import bytes_moved, gather_paged_kv, gather_paged_kv_vt
    from sglang_fa4.kernels.fp8_sm90.vt_pack import pack_vt

    calls = {"gather_fused_ms": lambda: gather_paged_kv_vt(kc, vc, table, seqlens),
             "gather_pack_ms": lambda: pack_vt(gather_paged_kv(kc, vc, table, seqlens)[1], cu_kg, bound),
             "fa4_fp8_routed_ms": lambda: sglang_call(q8, kc, vc, table, seqlens, cu_q, max_q, kd, vd, out=out)}
    for label, t in interleaved_ms(calls, rounds=5, replays=10).items():
        row[label] = t.get("ms")
        row.update({f"{label}_{k}": v for k, v in t.items() if k != "ms"})
        log(label, row[label], t.get("how"), t.get("error", ""))
    nbytes = bytes_moved(seqlens.tolist(), HKV, D, kc.shape[1])
    row["gather_bytes"] = nbytes
    if copy_gbps:
        row["gather_floor_ms"] = nbytes / (copy_gbps * 1e9) * 1e3
    for label in ("gather_fused_ms", "gather_pack_ms"):
        if row.get(label):
            row[label.replace("_ms", "_gbps")] = nbytes / (row[label] * 1e-3) / 1e9
    if row.get("gather_fused_ms") and row.get("gather_pack_ms"):
        row["gather_fused_speedup"] = row["gather_pack_ms"] / row["gather_fused_ms"]


def fa4_bf16(row, tq, tk, cu_q, cu_k, new, lens, kc, vc, seqlens, table, budget_s):
    """FA4 bf16, contiguous K/V (its best case) and paged as SGLang's bf16 fa4 call passes it."""
    from flash_attn.cute import flash_attn_varlen_func

    qb = torch.randn(tq, HQ, D, device=DEV, dtype=torch.bfloat16)
    kb = torch.randn(tk, HKV, D, device=DEV, dtype=torch.bfloat16)
    vb = torch.randn(tk, HKV, D, device=DEV, dtype=torch.bfloat16)
    timed("fa4_bf16_contig_ms", lambda: flash_attn_varlen_func(
        qb, kb, vb, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(new), max_seqlen_k=max(lens),
        causal=True), row)
    if time.time() - T0 < budget_s:
        kpb = torch.randn(kc.shape, device=DEV, dtype=torch.bfloat16)
        vpb = torch.randn(vc.shape, device=DEV, dtype=torch.bfloat16)
        timed("fa4_bf16_paged_ms", lambda: flash_attn_varlen_func(
            qb, kpb, vpb, cu_seqlens_q=cu_q, seqused_k=seqlens, page_table=table, max_seqlen_q=max(new),
            causal=True), row)


def section_speed(budget_s):
    from sglang_fa4.bench.timing import measure_copy_gbps
    from sglang_fa4.kernels.fp8_paged_kv import gather_paged_kv
    from sglang_fa4.kernels.fp8_paged_kv.extend import descales
    from sglang_fa4.kernels.fp8_sm90.launch import fp8_varlen_attention
    from sglang_fa4.kernels.fp8_sm90.vt_pack import pack_vt

    shapes = SPEED_SHAPES
    if DECODE_ONLY or GATHER_ONLY:
        shapes = [sh for sh in shapes if max(sh[2]) == 1]
    copy = measure_copy_gbps(nbytes=1 << 30, iters=5, repeats=3)
    RESULT["env"]["copy_gbps"] = copy["gbps"]
    for name, lens, new, page_size in shapes:
        if time.time() - T0 > budget_s:
            RESULT["notes"].append(f"skipped {name} P={page_size}: time budget")
            continue
        torch.manual_seed(0)
        k_scale, v_scale = torch.tensor([0.02], device=DEV), torch.tensor([0.015], device=DEV)
        kc, vc, table, seqlens = make_cache(lens, page_size, k_scale, v_scale, seed=1)
        cu_q, cu_k = cu_seqlens(new, device=DEV), cu_seqlens(lens, device=DEV)
        B, tq, tk = len(lens), sum(new), sum(lens)
        q8 = torch.randn(tq, HQ, D, device=DEV).to(FP8)
        kd, vd = k_scale.expand(B, HKV), v_scale.expand(B, HKV)
        out = torch.empty(tq, HQ, D, device=DEV, dtype=torch.bfloat16)
        row = {"shape": name, "page_size": page_size, "batch": B, "new_tokens": tq, "kv_tokens": tk,
               "hq": HQ, "hkv": HKV, "d": D}
        k, v, cu_kg, bound = gather_paged_kv(kc, vc, table, seqlens)
        time_gathers(row, kc, vc, table, seqlens, q8, cu_q, max(new), kd, vd, out, cu_kg, bound, copy["gbps"])
        if fa3_available():  # SGLang's fa3 call on the same pool, next to ours
            from sglang_fa4.bench import fa3

            lse3 = torch.empty(HQ, tq, dtype=torch.float32, device=DEV)
            scratch3 = fa3.Scratch()
            timed("fa3_fp8_ms", lambda: fa3_call(q8, kc, vc, table, seqlens, cu_q, max(new), kd, vd, out=out,
                                                 lse=lse3, scratch=scratch3), row)
        # the same kernel on K / V^T already contiguous (what the gather costs is the difference)
        vt = pack_vt(v, cu_kg, bound)
        desc = descales(kd, vd, B, HKV, q8.device)
        if not (GATHER_ONLY and max(new) == 1):  # unpacked decode: the causal variant, another compile
            timed("fp8_kernel_only_ms", lambda: fp8_varlen_attention(
                q8, k.view(FP8), None, cu_q, cu_kg, max(new), bound, descale=desc, softmax_scale=D ** -0.5,
                causal=True, vt=vt, out=out), row)
        if max(new) == 1:  # decode: the GQA group packed into the tile (the default) vs one CTA per q head
            from sglang_fa4.kernels.fp8_paged_kv.extend import decode_gqa_pack

            qp, cu_qp, g = decode_gqa_pack(q8, HKV)
            timed("fp8_kernel_only_packed_ms", lambda: fp8_varlen_attention(
                qp, k.view(FP8), None, cu_qp, cu_kg, g, bound, descale=desc, softmax_scale=D ** -0.5,
                causal=False, vt=vt), row)
        if max(new) == 1 and not GATHER_ONLY:  # one CTA per q head: the causal variant, another compile
            # (the route packs decode-shaped calls; without a host max_seqlen_q it cannot tell one)
            from sglang_fa4.kernels.fp8_paged_kv import paged_kv_attention

            timed("fa4_fp8_routed_unpacked_ms", lambda: paged_kv_attention(
                q8, kc, vc, table, seqlens, cu_q, None, k_descale=kd, v_descale=vd, softmax_scale=D ** -0.5,
                causal=True, out=out), row)
        if not GATHER_ONLY:
            fa4_bf16(row, tq, tk, cu_q, cu_k, new, lens, kc, vc, seqlens, table, budget_s)
        flops = 4 * HQ * D * sum((n * (c - n) + n * (n + 1) / 2) for n, c in zip(new, lens))

        row["attn_flops"] = flops
        for key in ("fa4_fp8_routed_ms", "fp8_kernel_only_ms", "fa4_bf16_contig_ms", "fa4_bf16_paged_ms", "fa3_fp8_ms"):
            if row.get(key):
                row[key.replace("_ms", "_tflops")] = flops / (row[key] * 1e-3) / 1e12
        base = row.get("fa4_bf16_contig_ms")
        for key in ("fa4_fp8_routed_ms", "fp8_kernel_only_ms", "fa4_bf16_paged_ms", "fa4_fp8_routed_unpacked_ms",
                    "fp8_kernel_only_packed_ms", "fa3_fp8_ms"):
            if base and row.get(key):
                row[key.replace("_ms", "_speedup_vs_bf16_contig")] = base / row[key]
        if row.get("fa3_fp8_ms"):  # the upgrade bar: > 1 means fa4-fp8 is faster than FA3-FP8
            for key in ("fa4_fp8_routed_ms", "fa4_bf16_paged_ms", "fa4_bf16_contig_ms"):
                if row.get(key):
                    row[key.replace("_ms", "_speedup_vs_fa3_fp8")] = row["fa3_fp8_ms"] / row[key]
        RESULT["speed"].append(row)
        torch.cuda.empty_cache()


def markdown(r) -> str:
    lines = ["# fa4 on an fp8_e4m3 paged KV cache (SM90): SGLang's call routed to sglang-fa4's FP8 kernel", "",
             f"Command: `{r['command']}`", ""]
    env = r.get("env", {})
    if env:
        lines += [f"GPU: {env.get('gpu')}; torch {env.get('torch')}; flash-attn-4 {env.get('fa4')}", ""]
    if env.get("fa3"):
        lines += [f"FA3: {env['fa3']}, built from source by benchmark/fa3_build/build.sh (sm_90a; FP8 paged "
                  "non-TMA kernels, no split-KV)", ""]
    lines += ["## Correctness (fp32 on the dequantized cache; output poisoned with NaN first)", "",
              "| impl | d | page size | case | cached tokens | new tokens | rel. error | finite | pass (<3e-2) |",
              "|---|---|---|---|---|---|---|---|---|"]
    for c in r["correctness"]:
        lines.append(f"| {c.get('impl', 'fa4-fp8 route')} | {c.get('d', D)} | {c['page_size']} | {c['case']} | {c['cached']} | "
                     f"{c['new']} | {c['rel_err']:.2e} | {c['finite']} | {c['pass']} |")
    lines += ["", "## Speed (median ms; CUDA-graph replay unless noted; 28 q / 4 kv heads, d=128, causal)", "",
              "| shape | page | fa4-fp8 routed (fused gather + kernel) | FP8 kernel alone | gather before (torch + V^T pack) | fa4-bf16 contiguous | fa4-bf16 paged | routed vs bf16 | kernel vs bf16 |",
              "|---|---|---|---|---|---|---|---|---|"]

    def f(x, digits=3):
        return "-" if x is None else f"{x:.{digits}f}"

    for s in r["speed"]:
        lines.append(
            f"| {s['shape']} | {s['page_size']} | {f(s.get('fa4_fp8_routed_ms'))} | {f(s.get('fp8_kernel_only_ms'))} | "
            f"{f(s.get('gather_pack_ms'))} | {f(s.get('fa4_bf16_contig_ms'))} | {f(s.get('fa4_bf16_paged_ms'))} | "
            f"{f(s.get('fa4_fp8_routed_speedup_vs_bf16_contig'))}x | {f(s.get('fp8_kernel_only_speedup_vs_bf16_contig'))}x |")
        errs = {k: v for k, v in s.items() if k.endswith("_error")}
        if errs:
            lines.append(f"|  | errors: {errs} |  |  |  |  |  |  |  |")
    vs3 = [s for s in r["speed"] if s.get("fa3_fp8_ms")]
    if vs3:
        lines += ["", "## Against FA3-FP8 (SGLang's fa3 call on the same fp8 pool; ratio > 1: faster than FA3-FP8)", "",
                  "| shape | page | FA3-FP8 | fa4-fp8 routed | fa4-bf16 paged | fa4-bf16 contiguous | fa4-fp8 vs FA3-FP8 "
                  "| fa4-bf16 paged vs FA3-FP8 | FA3-FP8 TFLOP/s |", "|---|---|---|---|---|---|---|---|---|"]
        for s in vs3:
            lines.append(
                f"| {s['shape']} | {s['page_size']} | {f(s.get('fa3_fp8_ms'))} | {f(s.get('fa4_fp8_routed_ms'))} | "
                f"{f(s.get('fa4_bf16_paged_ms'))} | {f(s.get('fa4_bf16_contig_ms'))} | "
                f"{f(s.get('fa4_fp8_routed_speedup_vs_fa3_fp8'))}x | {f(s.get('fa4_bf16_paged_speedup_vs_fa3_fp8'))}x | "
                f"{f(s.get('fa3_fp8_tflops'))} |")
        slower = [s for s in vs3 if (s.get("fa4_fp8_routed_speedup_vs_fa3_fp8") or 0) < 1]
        lines += ["", "Upgrade bar (fa4-fp8 at least as fast as FA3-FP8 on every shape): "
                  + ("MET" if not slower else "NOT MET (slower on: " + ", ".join(
                      f"{s['shape']} P={s['page_size']}" for s in slower) + ")")]
    gathered = [s for s in r["speed"] if s.get("gather_fused_ms")]
    if gathered:
        lines += ["", "## The page gather: fused Triton kernel (default) vs torch index ops + V^T pack (before), "
                  f"interleaved rounds; floor = bytes at the measured device copy rate ({f(env.get('copy_gbps'))} GB/s)", "",
                  "| shape | page | gather before | gather fused | speedup | MB moved (fused) | floor | fused GB/s "
                  "| routed, before | routed, fused | kernel alone (packed) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for s in gathered:
            lines.append(
                f"| {s['shape']} | {s['page_size']} | {f(s.get('gather_pack_ms'))} | {f(s.get('gather_fused_ms'))} | "
                f"{f(s.get('gather_fused_speedup'))}x | {s['gather_bytes'] / 1e6:.0f} | {f(s.get('gather_floor_ms'))} | "
                f"{f(s.get('gather_fused_gbps'), 0)} | {f(s.get('fa4_fp8_routed_torch_gather_ms'))} | "
                f"{f(s.get('fa4_fp8_routed_ms'))} | {f(s.get('fp8_kernel_only_packed_ms', s.get('fp8_kernel_only_ms')))} |")
    packed = [s for s in r["speed"] if "fa4_fp8_routed_unpacked_ms" in s]
    if packed:
        lines += ["", "## Decode: the GQA group packed into the M tile (default) vs one CTA per (sequence, q head)", "",
                  "| shape | page | routed, packed | routed, unpacked | kernel alone, packed | kernel alone, unpacked "
                  "| fa4-bf16 contiguous | fa4-bf16 paged | packed / unpacked (routed) |", "|---|---|---|---|---|---|---|---|---|"]
        for s in packed:
            ratio = (s["fa4_fp8_routed_unpacked_ms"] / s["fa4_fp8_routed_ms"]
                     if s.get("fa4_fp8_routed_unpacked_ms") and s.get("fa4_fp8_routed_ms") else None)
            lines.append(
                f"| {s['shape']} | {s['page_size']} | {f(s.get('fa4_fp8_routed_ms'))} | {f(s.get('fa4_fp8_routed_unpacked_ms'))} | "
                f"{f(s.get('fp8_kernel_only_packed_ms'))} | {f(s.get('fp8_kernel_only_ms'))} | {f(s.get('fa4_bf16_contig_ms'))} | "
                f"{f(s.get('fa4_bf16_paged_ms'))} | {f(ratio)}x faster |")
    if r.get("notes"):
        lines += ["", "Notes:", ""] + [f"- {n}" for n in r["notes"]]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=95.0, help="skip optional work after this many seconds")
    ap.add_argument("--md-from", help="only rewrite the markdown from this JSON")
    ap.add_argument("--decode-only", action="store_true", help="speed: the decode shapes only")
    ap.add_argument("--gather-only", action="store_true", help="the page gather before/after: correctness as "
                    "usual; speed on the decode shapes only: gathers, routed calls, packed kernel, FA3; no FA4 bf16)")
    ap.add_argument("--json-name", default="fp8_kv_route", help="output file stem")
    args = ap.parse_args()
    global DECODE_ONLY, GATHER_ONLY, STEM
    DECODE_ONLY, GATHER_ONLY, STEM = args.decode_only, args.gather_only, args.json_name
    out = Path(args.out)
    if args.md_from:
        r = json.loads(Path(args.md_from).read_text())
        Path(args.md_from).with_suffix(".md").write_text(markdown(r))
        return
    from importlib import metadata

    from sglang_fa4.bench.fa3 import build_source

    RESULT["env"] = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                     "fa4": metadata.version("flash-attn-4") if _has("flash-attn-4") else None,
                     "fa3": build_source() if fa3_available() else None}
    RESULT["notes"].append("This script calls the plugin's hook with the tensors SGLang's FlashAttentionBackend passes "
                           "(no SGLang on the machine); benchmark/release/check_fp8_kv_backend.py runs SGLang's real backend "
                           "and pool (results/h200/fp8_kv_backend-*.md).")
    if not fa3_available():
        RESULT["notes"].append("FA3-FP8: .fa3/libfa3fwd.so absent (bash benchmark/fa3_build/build.sh), not measured.")
    for name, fn in (("correctness", section_correctness), ("speed", lambda: section_speed(args.budget_s))):
        try:
            fn()
        except Exception:  # noqa: BLE001 - keep what was measured
            RESULT.setdefault("errors", []).append({name: traceback.format_exc()[-2000:]})
            log(traceback.format_exc())
        save(out)
    log("done")
    md = markdown(RESULT)
    print(md[md.index("## The page gather"):] if "## The page gather" in md else md[-2000:])


def _has(dist):
    from importlib import metadata

    try:
        metadata.version(dist)
        return True
    except metadata.PackageNotFoundError:
        return False


if __name__ == "__main__":
    os.environ.setdefault("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "1")
    main()
