"""Lab: tune the paged split-KV FP8 decode kernel's launch (key block, warps, pipeline stages, split
count) against the device's copy bandwidth, L2-cold, on ragged batches.

Not a product path: the product's constants live in ``sglang_fa4/kernels/fp8_paged_kv/decode_plan.py``;
this script measures candidates for them (issue #42, item 4).  For each shape, every candidate is
CUDA-graphed over ``layers`` separate pools (one layer's cache each, as a model's decode step reads
them: no call hits L2 from the call before), all candidates interleaved in rounds in one process
(``sglang_fa4.bench.timing.interleaved_ms``).  Each candidate's output is checked against the fp32
contract (NaN-poisoned first) before it is timed; a wrong candidate is reported, not timed.

    python benchmark/lab/decode_tune.py --out $OUT --budget-s 400              # GPU
    TRITON_INTERPRET=1 python benchmark/lab/decode_tune.py --cpu-smoke         # plumbing only
    python benchmark/lab/decode_tune.py --pick decode_tune-candidate.json      # the winners per head dim
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from pathlib import Path


import torch  # noqa: E402

from benchmark.lab import decode_transposed  # noqa: E402

from sglang_fa4.kernels.fp8_paged_kv import decode_plan as S  # noqa: E402
from sglang_fa4.kernels.fp8_paged_kv import paged_decode_attention  # noqa: E402

FP8 = torch.float8_e4m3fn
#: (name, batch, context, page, q heads, kv heads, head dim)
SHAPES = [
    ("llama b1 32k P16", 1, 32768, 16, 32, 8, 128),
    ("llama b8 8k P16", 8, 8192, 16, 32, 8, 128),
    ("llama b32 8k P16", 32, 8192, 16, 32, 8, 128),
    ("llama b128 4k P16", 128, 4096, 16, 32, 8, 128),
    ("llama b8 8k P1", 8, 8192, 1, 32, 8, 128),
    ("llama b8 8k P64", 8, 8192, 64, 32, 8, 128),
    ("qwen b1 32k P16", 1, 32768, 16, 28, 4, 128),
    ("qwen b16 8k P16", 16, 8192, 16, 28, 4, 128),
    ("d256 b1 32k P16", 1, 32768, 16, 16, 8, 256),
    ("d256 b16 8k P16", 16, 8192, 16, 16, 8, 256),
    ("d256 b64 8k P16", 64, 8192, 16, 16, 8, 256),
    # Gemma-4 31B's full-attention layers (32 q / 4 kv heads, d512) and its sliding layers' shape
    ("gemma d512 b1 32k P16", 1, 32768, 16, 32, 4, 512),
    ("gemma d512 b8 8k P16", 8, 8192, 16, 32, 4, 512),
    ("gemma d512 b64 8k P16", 64, 8192, 16, 32, 4, 512),
]
SMOKE_SHAPES = [("smoke b2 200 P16", 2, 200, 16, 8, 2, 128)]
#: the wide sweep: 4k contexts in a table as wide as a 128k context limit, against a tight table
WIDE_SHAPES = [("llama b1 4k P16", 1, 4096, 16, 32, 8, 128), ("llama b8 4k P16", 8, 4096, 16, 32, 8, 128),
               ("llama b32 4k P16", 32, 4096, 16, 32, 8, 128), ("llama b128 4k P16", 128, 4096, 16, 32, 8, 128),
               ("qwen b4 4k P16", 4, 4096, 16, 28, 4, 128), ("d256 b8 4k P16", 8, 4096, 16, 16, 8, 256)]
WIDE_TOKENS = 131072
#: the shapes the launch sweep runs on (the split sweep runs on all)
LAUNCH_SHAPES = ("llama b1 32k P16", "llama b32 8k P16", "qwen b1 32k P16", "d256 b16 8k P16")
#: the kernel sweep's: those, a mid and a large batch, and batch 1 at d256
KERNEL_SHAPES = LAUNCH_SHAPES + ("llama b8 8k P16", "llama b128 4k P16", "d256 b1 32k P16")
#: the d512 sweep's (--sweep kernel --shapes gemma)
GEMMA_SHAPES = ("gemma d512 b1 32k P16", "gemma d512 b8 8k P16", "gemma d512 b64 8k P16")
#: the candidate and custom sweeps': the kernel shapes, d256 at batch 16 and 64, the d512 ones
CANDIDATE_SHAPES = KERNEL_SHAPES + ("d256 b16 8k P16", "d256 b64 8k P16") + GEMMA_SHAPES
#: bytes the layers of one shape span at least (several times the 50-60 MB L2)
COLD_BYTES = 384 << 20
MAX_LAYERS = 48


def ragged_lens(batch: int, context: int, g) -> list[int]:
    """Lengths uniform in context +- 10% (a real batch is ragged)."""
    lo, hi = max(1, int(context * 0.9)), int(context * 1.1)
    return [int(x) for x in torch.randint(lo, hi + 1, (batch,), generator=g)]


def make_layers(lens, page, hkv, d, layers, device, g):
    """``layers`` E4M3 pools sharing one shuffled page table (SGLang: one table, a pool per layer),
    NaN everywhere a sequence has no token."""
    need = [-(-n // page) for n in lens]
    width = max(need)
    n_pages = sum(need) + 1
    order = torch.randperm(n_pages - 1, generator=g) + 1
    table = torch.zeros(len(lens), width, dtype=torch.int32)
    at = 0
    for b, n in enumerate(need):
        table[b, :n] = order[at:at + n].to(torch.int32)
        at += n
    table = table.to(device)
    pools = []
    for _ in range(layers):
        k = torch.randn(n_pages, page, hkv, d, device=device).mul_(2).to(FP8)
        v = torch.randn(n_pages, page, hkv, d, device=device).to(FP8)
        pools.append((k, v))
    return table, pools


def reference_row(q, k, v, table, n, page, kd, vd, scale):
    """fp32 attention of one decode row on the dequantized pool."""
    t = torch.arange(n, device=k.device)
    slots = table.long()[t // page] * page + t % page
    hkv, d = k.shape[2], k.shape[3]
    kk = k.view(-1, hkv, d)[slots].float() * kd[None, :, None].float()
    vv = v.view(-1, hkv, d)[slots].float() * vd[None, :, None].float()
    g = q.shape[0] // hkv
    qf = q.float().view(hkv, g, d)
    s = torch.einsum("hgd,nhd->hgn", qf, kk) * scale
    p = torch.softmax(s, dim=-1)
    return torch.einsum("hgn,nhd->hgd", p, vv).reshape(q.shape[0], d)


def candidates(d: int, smoke: bool) -> list[dict]:
    if smoke:
        return [{}, {"block_n": 32}]
    bns = (32, 64, 128) if d <= 128 else (32, 64)
    out = [{}]
    for bn, st in itertools.product(bns, (2, 3, 4)):
        out.append({"block_n": bn, "num_warps": 4, "num_stages": st})
    out += [{"block_n": bn, "num_warps": 8, "num_stages": 3} for bn in bns[1:]]
    # fewer warps: the softmax's row max / sum cross fewer warps (a barrier each per key block)
    out += [{"block_n": bn, "num_warps": w, "num_stages": st} for bn, w, st in
            ((bns[1], 2, 3), (bns[-1], 2, 3), (bns[0], 2, 4), (bns[1], 1, 3), (bns[0], 1, 4))]
    return out


#: a register cap per thread that lets more CTAs share an SM, with the one-wave split rule told the
#: count (registers / spill, ptxas sm_90a under Triton 3.6.0: d256 block 64 uncapped 255 / 64 B, block
#: 32 capped at 168 16 B (3 CTAs), at 128 128 B (4); d128 block 64 at 128 32 B (4), block 32 at 96 32 B (5))
OCCUPANCY_CAP = {128: {"block_n": 32, "maxnreg": 96, "programs_per_sm": 5},
                 256: {"block_n": 32, "maxnreg": 168, "programs_per_sm": 3}}
#: the head dim in two column pieces (decode_plan launch ``d_pieces``) under a d128 register cap for
#: more CTAs an SM (above d128 the split regime's launch, decode_plan.SPLIT_REGIME_LAUNCH, is the
#: default where it won and part of the candidate elsewhere)
PIECES_CAPS = {128: [{"d_pieces": 2, "maxnreg": 96, "programs_per_sm": 5}]}


def head_dim_bucket(d: int) -> int:
    """The ``--variants`` key a head dim falls under."""
    return 128 if d <= 128 else 256 if d <= 256 else 512


def custom_launches(spec, d: int) -> list[dict]:
    """``--variants``' launches at head dim ``d``: one list for every head dim, or {head dim: list}
    (keyed by the head dim bucket: 128, 256, 512; a head dim it leaves out runs no shape)."""
    if isinstance(spec, list):
        return spec
    return spec.get(str(head_dim_bucket(d)), [])


def product_variants(cands: list[dict], smoke: bool) -> dict:
    """The plan's default and launch overrides of the product kernel, labelled as the sweeps label them
    (the first override only in the CPU smoke)."""
    variants = {"product {}": ({}, None, "tight")}
    variants.update({f"product {json.dumps(c, sort_keys=True)}": (c, None, "tight")
                     for c in (cands[:1] if smoke else cands)})
    return variants


def split_candidates(smoke: bool) -> list[int]:
    return [1, 2] if smoke else [1, 2, 4, 8, 16, 32, 64]


def run_shape(shape, smoke: bool, rounds: int, replays: int, device, seed: int, copy_gbps, sweep: str,
              custom=None) -> list[dict]:
    name, batch, context, page, hq, hkv, d = shape
    g = torch.Generator().manual_seed(seed)
    lens = ragged_lens(batch, context, g)
    layer_bytes = 2 * sum(lens) * hkv * d
    layers = 1 if smoke else max(1, min(MAX_LAYERS, -(-COLD_BYTES // layer_bytes)))
    table, pools = make_layers(lens, page, hkv, d, layers, device, g)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    cu_q = torch.arange(batch + 1, dtype=torch.int32, device=device)
    q = torch.randn(batch, hq, d, generator=g).to(FP8).to(device)
    kd = (0.02 + torch.rand(batch, hkv, generator=g) * 0.08).to(device)
    vd = (0.02 + torch.rand(batch, hkv, generator=g) * 0.08).to(device)
    scale = d ** -0.5
    out = torch.empty(batch, hq, d, dtype=torch.bfloat16, device=device)
    ref = reference_row(q[batch - 1], pools[0][0], pools[0][1], table[batch - 1], lens[batch - 1], page,
                        kd[batch - 1], vd[batch - 1], scale)
    sms = 132 if smoke else torch.cuda.get_device_properties(0).multi_processor_count
    heuristic = S.plan(batch, hkv, hq // hkv, d, 1, table.shape[1] * page, sms)
    tables = {"tight": table}
    if sweep == "launch":
        variants = {json.dumps(c, sort_keys=True): (c, None, "tight") for c in candidates(d, smoke)}
    elif sweep == "kernel":  # occupancy (registers per thread bound the CTAs an SM holds) and the
        # transposed lab kernel (decode_transposed.py); register counts from ptxas for sm_90a, d128
        variants = {"product {}": ({}, None, "tight")}  # the plan's default
        # registers a thread, ptxas sm_90a (d128 G4): 190, capped at 128 with no spill. (A loop that
        # prefetched the next block into registers by hand lost: decode_tune-kernel-call{2,3}.json.gz.)
        cands = [("product", {"block_n": 32}),
                 ("product", {"maxnreg": 0}),  # 190 registers: 2 CTAs
                 ("product", {"block_n": 128, "num_warps": 8}),
                 ("transposed", {"block_n": 32, "num_stages": 3, "num_warps": 4})]
        if d > 256:  # d512: 16 keys, at most 32 rows, 8 warps by default (registers: decode_plan.block_n)
            cands = [("product", {"block_n": 32}), ("product", {"num_warps": 4}),
                     ("product", {"block_n": 32, "num_warps": 4}), ("product", {"num_warps": 16}),
                     ("product", {"num_stages": 2}), ("product", {"num_stages": 4})]
        elif d > 128:
            cands = [("product", {"block_n": 32}),
                     ("product", {"num_stages": 4}),
                     ("product", {"block_n": 32, "num_warps": 1, "num_stages": 4}),
                     ("product", {"num_warps": 8}),
                     ("transposed", {"block_n": 32, "num_warps": 4, "maxnreg": 168})]
        for kernel, c in (cands[:2] if smoke else cands):
            label = f"{kernel} {json.dumps(c, sort_keys=True)}"
            variants[label] = ({**c, "kernel": kernel} if kernel == "transposed" else c, None, "tight")
    elif sweep == "candidate":  # decode_plan.CANDIDATE (the launch under evaluation) beside its parts
        cands = [dict(S.CANDIDATE), dict(S.SPLIT_REGIME_LAUNCH), {"fill_waves": True},
                 {**S.CANDIDATE, "num_stages": 4}]
        if d <= 128:  # and the head-dim pieces under the d128 caps
            cands += PIECES_CAPS[128]
        variants = product_variants(cands, smoke)
    elif sweep == "occupancy":  # more CTAs an SM by a register cap (OCCUPANCY_CAP and its neighbours)
        if d > 256:
            cands = []
        elif d > 128:
            cap = OCCUPANCY_CAP[256]
            cands = [{"block_n": 32}, cap, {**cap, "num_stages": 4}, {**cap, "maxnreg": 128, "programs_per_sm": 4}]
        else:
            cap = OCCUPANCY_CAP[128]
            cands = [cap, {**cap, "num_stages": 4}, {"block_n": 32, "programs_per_sm": 4}]
        variants = product_variants(cands, smoke)
    elif sweep == "custom":  # --variants: launches named on the command line, beside the default
        variants = product_variants(custom_launches(custom, d), smoke)
    elif sweep == "splits":
        variants = {"{}": ({}, None, "tight")}  # the heuristic's count
        variants.update({f"splits={s}": ({}, s, "tight") for s in split_candidates(smoke) if s <= S.MAX_SPLITS})
    else:  # SGLang's decode graphs pass the table as wide as the context limit: the same batch both ways
        wide_tokens = 1024 if smoke else WIDE_TOKENS
        wide = torch.zeros(batch, -(-wide_tokens // page), dtype=torch.int32, device=device)
        wide[:, :table.shape[1]] = table
        tables["wide"] = wide
        variants = {"tight table": ({}, None, "tight"), f"table {wide_tokens} tokens wide": ({}, None, "wide")}
    rows, calls = [], {}
    for label, (launch, splits, which) in variants.items():
        row = {"shape": name, "batch": batch, "context": context, "page": page, "hq": hq, "hkv": hkv, "d": d,
               "lens_min": min(lens), "lens_max": max(lens), "layers": layers, "variant": label,
               "heuristic_splits": heuristic.num_splits, "launch": launch, "forced_splits": splits}

        row["splits"] = S.plan(batch, hkv, hq // hkv, d, 1, tables[which].shape[1] * page, sms, splits,
                               launch={k: v for k, v in launch.items() if k != "kernel"} or None).num_splits

        def call(k, v, launch=launch, splits=splits, t=tables[which]):
            launch = dict(launch)
            transposed = launch.pop("kernel", None) == "transposed"
            decode_transposed.install(transposed)
            try:
                return paged_decode_attention(q, k, v, t, seqlens, cu_q, 1, k_descale=kd, v_descale=vd,
                                              softmax_scale=scale, causal=True, out=out, num_splits=splits,
                                              launch=launch or None)
            finally:
                decode_transposed.install(False)
        try:
            out.fill_(float("nan"))
            call(*pools[0])
            got = out[batch - 1].float().reshape(hq, d)
            row["rel_err"] = float((got - ref).norm() / ref.norm())
            row["finite"] = bool(torch.isfinite(out).all())
            if not row["finite"] or row["rel_err"] > 2e-2:
                row["error"] = "wrong result"
            else:
                calls[label] = (lambda call=call: [call(k, v) for k, v in pools])  # bound now, not at the last variant
        except Exception as exc:  # noqa: BLE001 - a candidate that does not compile is a finding
            row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        rows.append(row)
    if smoke:
        timed = {}
        for label, fn in calls.items():
            t0 = time.perf_counter()
            fn()
            timed[label] = {"ms": (time.perf_counter() - t0) * 1e3, "rounds": [(time.perf_counter() - t0) * 1e3]}
    else:
        from sglang_fa4.bench.timing import interleaved_ms

        timed = interleaved_ms(calls, rounds=rounds, replays=replays)
    nbytes = 2 * sum(lens) * hkv * d + 4 * sum(-(-n // page) for n in lens)
    for row in rows:
        t = timed.get(row["variant"], {})
        if t.get("ms"):
            us = t["ms"] * 1e3 / layers
            row.update(us=us, per_round_us=[r * 1e3 / layers for r in t["rounds"]],
                       spread=(max(t["rounds"]) - min(t["rounds"])) / t["ms"], gbps=nbytes / (us * 1e-6) / 1e9)
            if copy_gbps:
                row["copy_fraction"] = row["gbps"] / copy_gbps
        elif "error" not in row and t:
            row["error"] = t.get("error") or t.get("graph_error") or "not timed"
    del pools
    if device != "cpu":
        torch.cuda.empty_cache()
    return rows


def summarize(paths, out: Path) -> str:
    """A markdown of committed sweeps: per variant, its time over the same call's default ("{}" /
    "product {}" / the tight table) on each shape, and the range over the shapes."""
    from sglang_fa4.bench.report import read_json

    lines = ["# Split-KV decode sweeps (H100)", "",
             "Command: `python benchmark/lab/decode_tune.py --summarize " + " ".join(str(p) for p in paths) + "`", "",
             "Time of each variant over the default of the same sweep in the same process (> 1: slower), "
             "per shape, and the range over the shapes.", ""]
    for path in paths:
        res = read_json(path)
        rows = [r for r in res["rows"] if r.get("us")]
        base = {}
        for r in rows:
            if r["variant"] in ("{}", "product {}", "tight table"):
                base[r["shape"]] = r["us"]
        by_variant: dict = {}
        for r in rows:
            if r["shape"] in base and r["variant"] not in ("{}", "product {}", "tight table"):
                by_variant.setdefault(r["variant"], []).append((r["shape"], r["us"] / base[r["shape"]]))
        lines += [f"## `{Path(path).name}`", "", "| variant | range over shapes | per shape |", "|---|---|---|"]
        for variant, got in by_variant.items():
            vals = [x for _, x in got]
            per = ", ".join(f"{shape} {x:.2f}" for shape, x in got)
            lines.append(f"| {variant} | {min(vals):.2f}-{max(vals):.2f} | {per} |")
        lines.append("")
    text = "\n".join(lines)
    out.write_text(text)
    return text


#: a sweep's variant replaces the default at a head dim only when its geometric-mean time over the
#: default's, on that head dim's shapes, is below PICK_BELOW and no shape is slower than PICK_WORST
#: (the rounds' spread is a few percent: a tie is not a win, and a default must not lose a shape)
PICK_BELOW = 0.97
PICK_WORST = 1.02


def pick(rows: list[dict]) -> dict:
    """{head dim: launch} of a sweep's winners (the launch that ``bench decode --candidate`` and
    ``fp8_decode_child.py --launch`` take): per head dim, the product-kernel variant with the lowest
    geometric-mean time over the plan's default ("product {}") of the same shape, among those timed
    and right on every shape of that head dim where the default was timed; head dims where none
    clears PICK_BELOW / PICK_WORST are left out (the default stays)."""
    base = {r["shape"]: r["us"] for r in rows if r["variant"] == "product {}" and r.get("us")}
    shapes: dict = {}
    ratios: dict = {}
    for r in rows:
        if r["shape"] not in base:
            continue
        shapes.setdefault(r["d"], set()).add(r["shape"])
        if r["variant"] == "product {}" or "kernel" in r["launch"] or r.get("forced_splits") is not None:
            continue
        got = ratios.setdefault((r["d"], r["variant"]), {"launch": r["launch"], "by_shape": {}})
        got["by_shape"][r["shape"]] = r["us"] / base[r["shape"]] if r.get("us") else None
    winners = {}
    for d, names in sorted(shapes.items()):
        best = None
        for (dd, _), got in ratios.items():
            vals = list(got["by_shape"].values())
            if dd != d or set(got["by_shape"]) != names or None in vals or max(vals) > PICK_WORST:
                continue
            gm = math.exp(sum(math.log(x) for x in vals) / len(vals))
            if gm < PICK_BELOW and (best is None or gm < best[0]):
                best = (gm, got["launch"])
        if best:
            winners[str(d)] = best[1]
    return winners


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--summarize":
        print(summarize([Path(p) for p in sys.argv[2:-1]], Path(sys.argv[-1])))
        return
    if len(sys.argv) == 3 and sys.argv[1] == "--pick":  # the winners as JSON (gpu_decode_call.sh matrix-best)
        from sglang_fa4.bench.report import read_json

        print(json.dumps(pick(read_json(Path(sys.argv[2]))["rows"]), sort_keys=True))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--tag", default="")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--replays", type=int, default=5)
    ap.add_argument("--budget-s", type=float, default=400)
    ap.add_argument("--variants", type=json.loads, default=None, metavar="JSON",
                    help="--sweep custom's launches: a list for every head dim or {head dim: list} (128, 256, 512)")
    ap.add_argument("--sweep", choices=["launch", "splits", "wide", "kernel", "occupancy", "candidate", "custom",
                                        "both"],
                    default="both")
    ap.add_argument("--shapes", nargs="*", default=None, help="names (substrings) of SHAPES to run")
    ap.add_argument("--cpu-smoke", action="store_true")
    args = ap.parse_args()
    smoke = args.cpu_smoke
    if args.sweep == "custom":
        if not isinstance(args.variants, (list, dict)) or not all(
                isinstance(v, dict) for vs in ([args.variants] if isinstance(args.variants, list)
                                               else args.variants.values()) for v in vs):
            ap.error("--sweep custom needs --variants: a JSON list of launch objects, or {head dim: list}")
        for d in (128, 256, 512):  # a malformed launch fails here, not after the first shapes ran
            for launch in custom_launches(args.variants, d):
                S.plan(1, 1, 1, d, 1, 4096, 132, launch=launch)
    device = "cpu" if smoke else "cuda"
    t0 = time.monotonic()
    meta = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "argv": sys.argv,
            "plan_defaults": {"block_n(128)": S.block_n(128), "block_n(256)": S.block_n(256),
                              "num_stages": S.NUM_STAGES, "programs_per_sm": S.PROGRAMS_PER_SM,
                              "min_keys_per_split": S.MIN_KEYS_PER_SPLIT}}
    copy_gbps = None
    if not smoke:
        from sglang_fa4.bench.meta import base_meta
        from sglang_fa4.bench.timing import measure_copy_gbps

        meta.update(base_meta("decode_tune"))
        cp = measure_copy_gbps()
        copy_gbps = cp["gbps"]
        meta["copy"] = cp
    pool = WIDE_SHAPES if args.sweep == "wide" else SHAPES
    shapes = SMOKE_SHAPES if smoke else [s for s in pool if not args.shapes or any(x in s[0] for x in args.shapes)]
    sweeps = ["launch", "splits"] if args.sweep == "both" else [args.sweep]
    rows = []
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "decode_tune" + (f"-{args.tag}" if args.tag else "")
    for sweep in sweeps:
        for i, shape in enumerate(shapes):
            if not smoke and shape[0] not in {"launch": LAUNCH_SHAPES,
                                              "kernel": KERNEL_SHAPES + GEMMA_SHAPES,
                                              "occupancy": KERNEL_SHAPES + ("d256 b16 8k P16",),
                                              "candidate": CANDIDATE_SHAPES,
                                              "custom": CANDIDATE_SHAPES,
                                              }.get(sweep, (shape[0],)):
                continue
            if sweep == "custom" and not custom_launches(args.variants, shape[6]):
                continue
            if time.monotonic() - t0 > args.budget_s:
                meta["truncated"] = f"budget reached before {sweep} {shape[0]}"
                break
            got = run_shape(shape, smoke, args.rounds, args.replays, device, 100 + i, copy_gbps, sweep, args.variants)
            for r in got:
                r["sweep"] = sweep
            rows += got
            best = min((r for r in got if r.get("us")), key=lambda r: r["us"], default=None)
            default = next((r for r in got if r["variant"] in ("{}",) and r.get("us")), None)
            msg = f"[{sweep}] {shape[0]}: layers={got[0]['layers']}"
            if best:
                msg += f" best {best['variant']} {best['us']:.1f}us {best['gbps']:.0f}GB/s"
            if default:
                msg += f"; default {default['us']:.1f}us {default['gbps']:.0f}GB/s"
            print(msg, flush=True)
            meta["elapsed_s"] = round(time.monotonic() - t0, 1)
            (out / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    # the table the reply shows: per shape, default / best / splits sweep
    print(f"copy {copy_gbps or 0:.0f} GB/s")
    for r in rows:
        if r.get("us"):
            frac = f" {100 * r['copy_fraction']:.0f}%" if r.get("copy_fraction") else ""
            print(f"{r['sweep'][:1]} {r['shape']:<20} {r['variant']:<50} {r['us']:8.1f}us ±{100 * r['spread']:.0f}% "
                  f"{r['gbps']:6.0f}GB/s{frac} err {r['rel_err']:.1e} splits {r['splits']}")
        else:
            print(f"{r['sweep'][:1]} {r['shape']:<20} {r['variant']:<50} ERROR {r.get('error')}")
    print(f"done in {time.monotonic() - t0:.0f}s; heuristic splits per shape: "
          + ", ".join(sorted({f"{r['shape']}={r['heuristic_splits']}" for r in rows})))


if __name__ == "__main__":
    main()
