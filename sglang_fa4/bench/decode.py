"""`sglang-fa4 bench decode`: paged FP8-KV decode, one new token per sequence, against the alternatives.

Per case (batch x context x page size x head dim; every sequence holds the whole context, pages
shuffled in an E4M3 pool as SGLang's fp8_e4m3 MHATokenToKVPool lays them out, k/v scales as a
layer's), each backend's output (poisoned with NaN first) is checked against the fp32 contract on
the dequantized pool (first and last sequence), then all are timed against each other in
``--rounds`` interleaved rounds of CUDA-graph replays (bench.timing.interleaved_ms: one process,
warmup replays, every pair in both orders, the median of each round's replays, the median over
rounds, each round kept for the spread).  Achieved bandwidth = the K/V bytes the call must read
(each cached token's K and V of every kv head once: 1 byte an element in the FP8 pool, 2 in the
bf16 pool of fa4_bf16; plus the page-table entries) / time.

Backends: ``fa4_fp8_split_kv`` (ours: kernels.fp8_paged_decode, the pool read in place),
``fa3_fp8`` (the source-built FA3 called as SGLang's fa3 backend calls it: bench/fa3.py),
``triton_fp8`` (SGLang's own Triton decode kernel on the same pool, its default 8 KV splits,
q bf16 as SGLang's triton backend keeps it), ``fa4_bf16`` (FA4 b36 on a bf16 pool of the same
values, paged as SGLang's bf16 fa4 call passes it).  A backend that is missing or fails a shape is
recorded with its error, the others go on.  Results are written after every case.

``--cpu-smoke`` (CI): tiny shapes on the CPU with the kernel in Triton's interpreter
(TRITON_INTERPRET=1 must be set before the process starts), wall-clock rounds, the GPU-only
backends recorded as unavailable; it checks the plumbing and the report, not speed.
"""

from __future__ import annotations

import itertools
import time
from typing import NamedTuple

from . import report
from .stats import median

BATCHES = (1, 8, 32, 64)
CONTEXTS = (1024, 8192, 32768, 131072)
PAGES = (1, 16, 64)
HEAD_DIMS = (128, 256)
#: (q heads, kv heads) per head dim: Qwen2.5-7B's 28/4 at d=128, a 16/4 layer at d=256
HEADS = {128: (28, 4), 256: (16, 4)}
BACKENDS = ("fa4_fp8_split_kv", "fa3_fp8", "triton_fp8", "fa4_bf16")
K_SCALE, V_SCALE = 0.05, 0.04
#: SGLang's default --triton-attention-num-kv-splits
TRITON_KV_SPLITS = 8
SMOKE = dict(batches=(1, 3), contexts=(40, 130), pages=(1, 16), head_dims=(128,), heads={128: (4, 1)})


class Case(NamedTuple):
    batch: int
    context: int
    page: int
    head_dim: int
    hq: int
    hkv: int

    @property
    def name(self) -> str:
        return f"b{self.batch} ctx{self.context} P{self.page} d{self.head_dim}"


def cases(batches, contexts, pages, head_dims, heads=None) -> list[Case]:
    heads = heads or HEADS
    return [Case(b, c, p, d, *heads[d]) for d, c, b, p in itertools.product(head_dims, contexts, batches, pages)]


def kv_bytes(case: Case, element_bytes: int) -> int:
    """Bytes a decode call must read: K and V of every cached token and kv head, plus the page table."""
    pages = -(-case.context // case.page)
    return 2 * case.batch * case.context * case.hkv * case.head_dim * element_bytes + 4 * case.batch * pages


def make_inputs(case: Case, device, seed: int) -> dict:
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    per_seq = -(-case.context // case.page)
    n_pages = case.batch * per_seq + 1  # page 0 unused, like SGLang's
    shape = (n_pages, case.page, case.hkv, case.head_dim)
    fp8 = torch.float8_e4m3fn
    k = (torch.randn(shape, generator=g, device=device) / K_SCALE * 0.1).to(fp8)
    v = (torch.randn(shape, generator=g, device=device) / V_SCALE * 0.1).to(fp8)
    order = torch.randperm(n_pages - 1, generator=g, device=device) + 1
    table = order[: case.batch * per_seq].view(case.batch, per_seq).to(torch.int32).contiguous()
    q = torch.randn(case.batch, case.hq, case.head_dim, generator=g, device=device)
    return dict(q8=q.to(fp8), k=k, v=v, table=table,
                seqlens=torch.full((case.batch,), case.context, dtype=torch.int32, device=device),
                cu_q=torch.arange(case.batch + 1, dtype=torch.int32, device=device),
                kd=torch.full((case.batch, case.hkv), K_SCALE, device=device),
                vd=torch.full((case.batch, case.hkv), V_SCALE, device=device))


def runners(case: Case, x: dict, backends, num_splits: int | None = None) -> tuple[dict, dict, dict]:
    """({backend: call}, {backend: output tensor}, {backend: error}) for the asked backends."""
    import torch

    calls, outs, errors = {}, {}, {}
    scale = case.head_dim ** -0.5
    for name in backends:
        try:
            out = torch.empty(case.batch, case.hq, case.head_dim, dtype=torch.bfloat16, device=x["q8"].device)
            if name == "fa4_fp8_split_kv":
                from sglang_fa4.kernels.fp8_paged_decode import paged_decode_attention

                fn = (lambda o=out: paged_decode_attention(
                    x["q8"], x["k"], x["v"], x["table"], x["seqlens"], x["cu_q"], 1, k_descale=x["kd"],
                    v_descale=x["vd"], softmax_scale=scale, causal=True, out=o, num_splits=num_splits))
            elif not x["q8"].is_cuda:
                raise RuntimeError("needs a CUDA GPU")
            elif name == "fa3_fp8":
                from . import fa3

                ws = fa3.workspace(case.batch, x["q8"].device)
                fn = (lambda o=out, ws=ws: fa3.paged_fp8(
                    x["q8"], x["k"], x["v"], x["table"], x["seqlens"], x["cu_q"], 1, k_descale=x["kd"],
                    v_descale=x["vd"], softmax_scale=scale, causal=True, out=o, ws=ws))
            elif name == "triton_fp8":
                fn = _triton_runner(case, x, out, scale)
            elif name == "fa4_bf16":
                fn = _fa4_bf16_runner(case, x, out, scale)
            else:
                raise ValueError(f"unknown backend {name}")
            calls[name], outs[name] = fn, out
        except Exception as exc:  # noqa: BLE001 - one backend failing must not stop the others
            errors[name] = f"{type(exc).__name__}: {str(exc)[:300]}"
    return calls, outs, errors


def _triton_runner(case: Case, x: dict, out, scale: float):
    import torch
    from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd

    dev = x["q8"].device
    t = torch.arange(case.context, device=dev)
    slots = (x["table"].long()[:, t // case.page] * case.page + t % case.page).reshape(-1)
    indptr = torch.arange(0, (case.batch + 1) * case.context, case.context, dtype=torch.int32, device=dev)
    logits = torch.empty(case.batch, case.hq, TRITON_KV_SPLITS, case.head_dim, dtype=torch.float32, device=dev)
    lse = torch.empty(case.batch, case.hq, TRITON_KV_SPLITS, dtype=torch.float32, device=dev)
    splits = torch.full((case.batch,), TRITON_KV_SPLITS, dtype=torch.int32, device=dev)
    qb = x["q8"].to(torch.bfloat16)
    kbuf = x["k"].view(-1, case.hkv, case.head_dim)
    vbuf = x["v"].view(-1, case.hkv, case.head_dim)
    return lambda: decode_attention_fwd(qb, kbuf, vbuf, out, indptr, slots, logits, lse, splits, TRITON_KV_SPLITS,
                                        scale, K_SCALE, V_SCALE)


def _fa4_bf16_runner(case: Case, x: dict, out, scale: float):
    import torch
    from flash_attn.cute import flash_attn_varlen_func

    kb = (x["k"].float() * K_SCALE).to(torch.bfloat16)
    vb = (x["v"].float() * V_SCALE).to(torch.bfloat16)
    qb = x["q8"].to(torch.bfloat16)

    def fn():
        o = flash_attn_varlen_func(qb, kb, vb, cu_seqlens_q=x["cu_q"], seqused_k=x["seqlens"], page_table=x["table"],
                                   max_seqlen_q=1, softmax_scale=scale, causal=True)
        out.copy_((o[0] if isinstance(o, tuple) else o).view(out.shape))

    return fn


def reference_rows(case: Case, x: dict):
    """fp32 contract on the dequantized pool for the first and last sequence: (rows, ref)."""
    import torch

    from sglang_fa4.kernels.fp8_paged_decode_torch import paged_decode_torch

    rows = sorted({0, case.batch - 1})
    ref = torch.empty(len(rows), case.hq, case.head_dim, dtype=torch.float32, device=x["q8"].device)
    idx = torch.tensor(rows, device=x["q8"].device)
    paged_decode_torch(x["q8"][idx], x["k"], x["v"], x["table"][idx], x["seqlens"][idx],
                       torch.arange(len(rows) + 1, dtype=torch.int32, device=idx.device), x["kd"][idx], x["vd"][idx],
                       case.head_dim ** -0.5, 1 << 30, 0, ref, None)
    return rows, ref


def wall_rounds(calls: dict, rounds: int) -> dict:
    """The CPU smoke's timing: wall-clock ms per call per round (the interpreter: plumbing only)."""
    out = {}
    for name, fn in calls.items():
        times = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        out[name] = {"rounds": times, "ms": median(times), "how": "cpu wall (Triton interpreter)"}
    return out


def bench_case(case: Case, backends, rounds: int, replays: int, device, seed: int,
               num_splits: int | None = None) -> list[dict]:
    import torch

    x = make_inputs(case, device, seed)
    calls, outs, errors = runners(case, x, backends, num_splits)
    rows_idx, ref = reference_rows(case, x)
    checks = {}
    for name, fn in list(calls.items()):
        try:
            outs[name].fill_(float("nan"))
            fn()
            got = outs[name][rows_idx].float()
            checks[name] = {"rel_err": float((got - ref).norm() / ref.norm()),
                            "finite": bool(torch.isfinite(got).all())}
        except Exception as exc:  # noqa: BLE001
            errors[name] = f"{type(exc).__name__}: {str(exc)[:300]}"
            del calls[name]
    if device == "cpu":
        timed = wall_rounds(calls, rounds)
    else:
        from .timing import interleaved_ms

        timed = interleaved_ms(calls, rounds=rounds, replays=replays)
    base = dict(case._asdict(), name=case.name)
    rows = []
    for name in backends:
        t = timed.get(name, {})
        row = {**base, "backend": name, **checks.get(name, {})}
        if name in errors or "error" in t:
            row["error"] = errors.get(name) or t["error"]
        ms = t.get("ms")
        if ms:
            nbytes = kv_bytes(case, 2 if name == "fa4_bf16" else 1)
            row.update(median_us=ms * 1e3, per_round_us=[r * 1e3 for r in t["rounds"]], how=t.get("how"),
                       spread=(max(t["rounds"]) - min(t["rounds"])) / ms, kv_bytes=nbytes, gbps=nbytes / (ms * 1e-3) / 1e9)
        rows.append(row)
    ref_row = next((r for r in rows if r["backend"] == "fa3_fp8" and r.get("median_us")), None)
    for r in rows:
        if ref_row and r.get("median_us"):
            r["speedup_vs_fa3_fp8"] = ref_row["median_us"] / r["median_us"]
    del x, calls, outs
    if device != "cpu":
        torch.cuda.empty_cache()
    return rows


def markdown(result: dict) -> str:
    meta = result["meta"]
    copy = (meta.get("ceilings") or {}).get("copy_gbps")
    lines = [f"# Paged FP8-KV decode ({meta.get('gpu', {}).get('name', meta.get('device', '?'))})", "",
             f"Command: `{meta.get('command', '')}`", "",
             "Median µs over interleaved rounds (spread = (max - min) / median of the round medians), achieved "
             "K/V bandwidth in GB/s" + (f" (device copy rate {copy:.0f} GB/s)" if copy else "") +
             ", rel. error against fp32 on the dequantized pool.", ""]
    backends = meta["settings"]["backends"]
    head = "| case | " + " | ".join(backends) + " | ours vs FA3-FP8 |"
    lines += [head, "|" + "---|" * (len(backends) + 2)]
    by_case: dict = {}
    for r in result["rows"]:
        by_case.setdefault(r["name"], {})[r["backend"]] = r
    for name, per in by_case.items():
        cells = []
        for b in backends:
            r = per.get(b, {})
            if r.get("median_us") is not None:
                cells.append(f"{r['median_us']:.1f} ±{100 * r['spread']:.0f}% · {r['gbps']:.0f} GB/s · "
                             f"{r.get('rel_err', float('nan')):.1e}")
            else:
                cells.append("— " + (r.get("error", "")[:40]))
        ours = per.get("fa4_fp8_split_kv", {}).get("speedup_vs_fa3_fp8")
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {'—' if ours is None else f'{ours:.2f}x'} |")
    return "\n".join(lines) + "\n"


def run(args) -> dict:
    import torch

    from .meta import base_meta

    t_start = time.monotonic()
    smoke = args.cpu_smoke
    if smoke:
        from sglang_fa4.kernels.triton_handles import interpreting

        if not interpreting():
            raise SystemExit("--cpu-smoke runs the kernel in Triton's interpreter: start it with TRITON_INTERPRET=1")
        device = "cpu"
        todo = cases(**SMOKE)
        meta = {"kind": "decode", "command": "sglang-fa4 bench decode --cpu-smoke", "device": "cpu (interpreter)",
                "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    else:
        if not torch.cuda.is_available():
            raise SystemExit("bench decode needs a CUDA GPU (or --cpu-smoke)")
        from .meta import ceilings

        device = "cuda"
        todo = cases(args.batches, args.contexts, args.pages, args.head_dims)
        meta = base_meta("decode")
        meta["ceilings"] = ceilings()
    rounds = min(args.rounds, 2) if smoke else args.rounds
    meta["settings"] = {"backends": list(args.backends), "rounds": rounds, "num_splits": args.num_splits or "heuristic", "replays": args.replays,
                        "cases": len(todo), "k_scale": K_SCALE, "v_scale": V_SCALE, "triton_kv_splits": TRITON_KV_SPLITS}
    out_dir = report.resolve_out_dir(args.out_dir)
    stem = "decode" + (f"-{args.tag}" if args.tag else "")
    result = {"meta": meta, "rows": []}
    for i, case in enumerate(todo):
        if args.time_budget_s and time.monotonic() - t_start > args.time_budget_s:
            meta["truncated"] = f"time budget {args.time_budget_s}s reached after {i} of {len(todo)} cases"
            break
        rows = bench_case(case, args.backends, rounds, args.replays, device, seed=1000 + i,
                          num_splits=args.num_splits or None)
        result["rows"] += rows
        print(f"[decode] {case.name}: " + "  ".join(
            f"{r['backend']}={r['median_us']:.1f}us" if r.get("median_us") else f"{r['backend']}=—" for r in rows),
            flush=True)
        meta["elapsed_s"] = round(time.monotonic() - t_start, 1)
        report.write_json(result, out_dir / f"{stem}.json", partial=True)
    meta["elapsed_s"] = round(time.monotonic() - t_start, 1)
    report.write_json(result, out_dir / f"{stem}.json")
    (out_dir / f"{stem}.md").write_text(markdown(result))
    return result


def add_arguments(p) -> None:
    p.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    p.add_argument("--batches", nargs="+", type=int, default=list(BATCHES))
    p.add_argument("--contexts", nargs="+", type=int, default=list(CONTEXTS))
    p.add_argument("--pages", nargs="+", type=int, default=list(PAGES))
    p.add_argument("--head-dims", nargs="+", type=int, default=list(HEAD_DIMS), choices=sorted(HEADS))
    p.add_argument("--rounds", type=int, default=11, help="interleaved rounds per case")
    p.add_argument("--replays", type=int, default=10, help="single graph replays timed per round and backend")
    p.add_argument("--num-splits", type=int, default=0,
                   help="force the split-KV kernel's split count (0: fp8_decode_splits.choose_splits), for tuning it")
    p.add_argument("--tag", default="", help="suffix of the output files (decode-<tag>.json/.md)")
    p.add_argument("--cpu-smoke", action="store_true",
                   help="tiny shapes on the CPU, the kernel in Triton's interpreter (TRITON_INTERPRET=1); CI")
