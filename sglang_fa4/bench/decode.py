"""`sglang-fa4 bench decode`: paged FP8-KV decode, one new token per sequence, against the alternatives.

Per case (model shape x batch x context x page size), sequence lengths drawn uniformly within
+-10% of the context (real batches are ragged), pages shuffled in E4M3 pools laid out as SGLang's
fp8_e4m3 MHATokenToKVPool, k/v scales as a layer's.  **L2-cold**: the case holds ``layers`` pools
sharing one page table (SGLang: one table, one pool per layer), enough that together they span
several times the L2, and each timed graph replay runs the call once per layer, each on its own
pool -- as a model's decode step does -- so no call reads what the call before left in L2; times
are per layer call.  Each backend's output (NaN first) is checked against the fp32 contract on
the dequantized pool (first and last sequence), then all are timed against each other in
``--rounds`` interleaved rounds of CUDA-graph replays (bench.timing.interleaved_ms: one process,
every pair in both orders, the median of each round's replays, the median over rounds, each round
kept for the spread).  Achieved bandwidth = the K/V bytes the call must read (each cached token's
K and V of every kv head once: 1 byte an element in an FP8 pool, 2 in a bf16 pool; plus the
page-table entries) / time, and that as a fraction of a device-to-device copy measured in the same
process.

Backends: ``fa4_fp8_split_kv`` (ours: kernels.fp8_paged_decode, the pool read in place),
``fa3_fp8`` (the source-built FA3 called as SGLang's fa3 backend calls it, ``num_splits=0``: FA3
picks its split count and runs its combine; bench/fa3.py), ``triton_fp8`` (SGLang's own Triton
decode kernel on the same pool, its split heuristic ``get_num_kv_splits_triton`` with SGLang's
default 8 splits at most, q bf16 as SGLang's triton backend keeps it), ``fa3_bf16`` (FA3 on a bf16
pool of the same values: what FP8 halves), and, on request, ``fa4_bf16`` (FA4 b36 on the bf16
pool) and ``fa4_fp8_split_kv_candidate`` (our kernel with ``decode_plan.CANDIDATE``, the launch
change under evaluation, timed beside the default and FA3-FP8 before it may become the default;
``--candidate`` names another, per head dim where it differs).
A backend that is missing, fails a shape or does not fit is recorded with its reason, the others
go on.  Results are written after every case.

``--cpu-smoke`` (CI): tiny shapes on the CPU with the kernel in Triton's interpreter
(TRITON_INTERPRET=1 must be set before the process starts), wall-clock rounds, one layer, the
GPU-only backends recorded as unavailable; it checks the plumbing and the report, not speed.
"""

from __future__ import annotations

import itertools
import json
import time
from typing import NamedTuple

from . import report
from .stats import median

#: (q heads, kv heads, head dim) of the model shapes the issue names
MODELS = {"llama3-8b": (32, 8, 128), "qwen2.5-7b": (28, 4, 128), "d256": (16, 8, 256)}
#: shapes measured only when named (``--models``): Gemma-4 31B's full-attention layers (bf16 q, as
#: SGLang hands it there) and its sliding layers; SGLang's default on Hopper for Gemma-4 is triton
OPTIONAL_MODELS = {"gemma4-31b-full": (32, 4, 512), "gemma4-31b-swa": (32, 16, 256)}
BATCHES = (1, 8, 32, 64, 128, 256)
CONTEXTS = (1024, 8192, 32768, 131072)
PAGES = (16,)
#: page sizes measured beyond PAGES, for one model shape
EXTRA_PAGES = {"llama3-8b": (1, 64)}
BACKENDS = ("fa4_fp8_split_kv", "fa3_fp8", "triton_fp8", "fa3_bf16")
#: our kernel with the launch change under evaluation (``decode_plan.CANDIDATE``)
CANDIDATE = "fa4_fp8_split_kv_candidate"
OPTIONAL_BACKENDS = ("fa4_bf16", CANDIDATE)
#: our kernels, each given its ratios to the baselines
OURS = ("fa4_fp8_split_kv", CANDIDATE)
K_SCALE, V_SCALE = 0.05, 0.04
#: SGLang's default --triton-attention-num-kv-splits
TRITON_KV_SPLITS = 8
#: the pools of one case span at least this many bytes (several times an H200's 50-60 MB L2), in
#: at most MAX_LAYERS layers
COLD_BYTES = 384 << 20
MAX_LAYERS = 48
#: lengths within a batch: context x (1 +- RAGGED)
RAGGED = 0.10
#: the largest rel. error against fp32 a backend may have to be timed (FP8 attention's bar: FA3-FP8
#: rounds P to E4M3, ~2.5e-2)
BAR = 3e-2
#: the share of free GPU memory a case may take
MEMORY_SHARE = 0.85
SMOKE = dict(models={"smoke": (4, 1, 128)}, batches=(1, 3), contexts=(40, 130), pages=(1, 16), extra_pages={})


class Case(NamedTuple):
    model: str
    batch: int
    context: int
    page: int
    head_dim: int
    hq: int
    hkv: int

    @property
    def name(self) -> str:
        return f"{self.model} b{self.batch} ctx{self.context} P{self.page}"


def cases(models=None, batches=BATCHES, contexts=CONTEXTS, pages=PAGES, extra_pages=None) -> list[Case]:
    """Every (model, context, batch, page) of the matrix: PAGES for every model, EXTRA_PAGES for theirs."""
    models = MODELS if models is None else models
    extra_pages = EXTRA_PAGES if extra_pages is None else extra_pages
    out = []
    for m, (hq, hkv, d) in models.items():
        for c, b, p in itertools.product(contexts, batches, tuple(pages) + tuple(extra_pages.get(m, ()))):
            out.append(Case(m, b, c, p, d, hq, hkv))
    return out


def ragged_lens(case: Case, g) -> list[int]:
    """Lengths uniform in context x (1 +- RAGGED), at least 1 (``g``: a torch CPU generator)."""
    import torch

    lo, hi = max(1, round(case.context * (1 - RAGGED))), max(1, round(case.context * (1 + RAGGED)))
    return [int(x) for x in torch.randint(lo, hi + 1, (case.batch,), generator=g)]


def kv_bytes(lens, case: Case, element_bytes: int) -> int:
    """Bytes a decode call must read: K and V of every cached token and kv head, plus the page table."""
    return (2 * sum(lens) * case.hkv * case.head_dim * element_bytes
            + 4 * sum(-(-n // case.page) for n in lens))


def layers_for(lens, case: Case) -> int:
    """Pools a case rotates through so the replayed calls span COLD_BYTES (1 at least)."""
    one = kv_bytes(lens, case, 1)
    return max(1, min(MAX_LAYERS, -(-COLD_BYTES // max(one, 1))))


def pool_bytes(lens, case: Case, element_bytes: int) -> int:
    """One layer's K + V pool (every page the batch holds, plus SGLang's unused page 0)."""
    pages = sum(-(-n // case.page) for n in lens) + 1
    return 2 * pages * case.page * case.hkv * case.head_dim * element_bytes


def make_inputs(case: Case, device, seed: int, layers: int = 1, bf16: bool = False, wide_tokens: int = 0) -> dict:
    """Ragged lengths, one shuffled page table (``wide_tokens``: as wide as that many tokens, as
    SGLang's decode graphs pass it, the columns past a sequence's pages pointing at page 0), one
    E4M3 K/V pool per layer, and with ``bf16`` the same values in bf16 pools."""
    import torch

    g = torch.Generator().manual_seed(seed)
    lens = ragged_lens(case, g)
    need = [-(-n // case.page) for n in lens]
    width = max(max(need), -(-wide_tokens // case.page))
    n_pages = sum(need) + 1  # page 0 unused, like SGLang's
    order = torch.randperm(n_pages - 1, generator=g) + 1
    table = torch.zeros(case.batch, width, dtype=torch.int32)
    at = 0
    for b, n in enumerate(need):
        table[b, :n] = order[at:at + n].to(torch.int32)
        at += n
    shape = (n_pages, case.page, case.hkv, case.head_dim)
    fp8 = torch.float8_e4m3fn
    gd = torch.Generator(device=device).manual_seed(seed)
    pools, pools16 = [], []
    for _ in range(layers):
        k = _random_e4m3(shape, 0.1 / K_SCALE, gd)
        v = _random_e4m3(shape, 0.1 / V_SCALE, gd)
        pools.append((k, v))
        if bf16:
            pools16.append((_dequantized_bf16(k, K_SCALE), _dequantized_bf16(v, V_SCALE)))
    q = torch.randn(case.batch, case.hq, case.head_dim, generator=gd, device=device)
    # every backend's call loops over the layers: the output checked is the last layer's
    return dict(q8=q.to(fp8), k=pools[-1][0], v=pools[-1][1], pools=pools, pools16=pools16, lens=lens,
                table=table.to(device), seqlens=torch.tensor(lens, dtype=torch.int32, device=device),
                cu_q=torch.arange(case.batch + 1, dtype=torch.int32, device=device),
                kd=torch.full((case.batch, case.hkv), K_SCALE, device=device),
                vd=torch.full((case.batch, case.hkv), V_SCALE, device=device))


def _random_e4m3(shape, scale: float, gen):
    """N(0, scale^2) values in an E4M3 tensor of ``shape``, drawn a page block at a time (a whole
    pool drawn in fp32 first would take four times its bytes: 32 GiB for batch 256 x 32k)."""
    import torch

    out = torch.empty(shape, dtype=torch.float8_e4m3fn, device=gen.device)
    per_page = max(1, int(torch.tensor(shape[1:]).prod()))
    step = max(1, (256 << 20) // per_page)
    for i in range(0, shape[0], step):
        n = min(step, shape[0] - i)
        out[i:i + n] = (torch.randn((n, *shape[1:]), generator=gen, device=gen.device) * scale).to(out.dtype)
    return out


def _dequantized_bf16(x, scale: float):
    """``x`` (E4M3) x ``scale`` in bf16, a page block at a time (no fp32 copy of a whole pool)."""
    import torch

    out = torch.empty(x.shape, dtype=torch.bfloat16, device=x.device)
    step = max(1, (256 << 20) // max(1, x[0].numel()))
    for i in range(0, x.shape[0], step):
        out[i:i + step] = (x[i:i + step].float() * scale).to(torch.bfloat16)
    return out


def _head_dim_keys(candidate: dict) -> list[int]:
    """The head dims a per-head-dim ``--candidate`` names (none for one launch for every head dim)."""
    keys = [k for k in candidate if str(k).isdigit()]
    if keys and len(keys) != len(candidate):
        raise ValueError(f"--candidate mixes head-dim keys and launch keys: {sorted(map(str, candidate))}")
    return [int(k) for k in keys]


def candidate_launch(candidate, head_dim: int) -> dict:
    """The candidate backend's launch overrides at ``head_dim``: ``candidate`` is one launch dict for
    every head dim, or {head dim: launch dict} (a head dim it leaves out runs the default launch);
    None is ``decode_plan.CANDIDATE``."""
    from sglang_fa4.kernels.fp8_paged_kv import DECODE_CANDIDATE

    if candidate is None:
        return dict(DECODE_CANDIDATE)
    if not isinstance(candidate, dict):
        raise ValueError(f"--candidate must be a JSON object, got {candidate!r}")
    if not _head_dim_keys(candidate):
        return dict(candidate)
    launch = candidate.get(str(head_dim), candidate.get(head_dim, {}))
    if not isinstance(launch, dict):
        raise ValueError(f"--candidate's launch for head dim {head_dim} must be a JSON object, got {launch!r}")
    return dict(launch)


def check_candidate(candidate, head_dims) -> None:
    """Plan the candidate's launch at every head dim the run has and every one it names: a malformed
    ``--candidate`` raises (ValueError / PagedKVError) before any case runs."""
    from sglang_fa4.kernels.fp8_paged_kv import decode_launch_plan

    named = _head_dim_keys(candidate) if isinstance(candidate, dict) else []
    for d in sorted(set(head_dims) | set(named)):
        decode_launch_plan(1, 1, 1, d, 1, 4096, 132, launch=candidate_launch(candidate, d))


def runners(case: Case, x: dict, backends, num_splits: int | None = None,
            candidate=None) -> tuple[dict, dict, dict, dict]:
    """({backend: call over every layer}, {backend: output tensor}, {backend: error}, {backend: its
    split facts}) for the asked backends (``candidate``: :func:`candidate_launch`'s argument)."""
    import torch

    calls, outs, errors, splits = {}, {}, {}, {}
    scale = case.head_dim ** -0.5
    for name in backends:
        try:
            out = torch.empty(case.batch, case.hq, case.head_dim, dtype=torch.bfloat16, device=x["q8"].device)
            if name in OURS:
                from sglang_fa4.integration.llm_fp8_kv import BF16_QUERY_HEAD_DIMS
                from sglang_fa4.kernels.fp8_paged_kv import decode_launch_plan, paged_decode_attention, sm_count

                # the q the route gets: bf16 where SGLang leaves it so (the same values: q8 in bf16)
                q = x["q8"].to(torch.bfloat16) if case.head_dim in BF16_QUERY_HEAD_DIMS else x["q8"]
                launch = candidate_launch(candidate, case.head_dim) if name == CANDIDATE else None

                def one(k, v, o=out, q=q, launch=launch):
                    paged_decode_attention(q, k, v, x["table"], x["seqlens"], x["cu_q"], 1, k_descale=x["kd"],
                                           v_descale=x["vd"], softmax_scale=scale, causal=True, out=o,
                                           num_splits=num_splits, launch=launch)
                p = decode_launch_plan(case.batch, case.hkv, case.hq // case.hkv, case.head_dim, 1,
                                       x["table"].shape[1] * case.page, sm_count(x["q8"].device), num_splits,
                                       launch=launch)
                splits[name] = {"num_splits": p.num_splits, "block_n": p.block_n, "num_warps": p.num_warps,
                                "num_stages": p.num_stages, "prefetch_pages": p.prefetch_pages, "d_pieces": p.d_pieces,
                                "maxnreg": p.maxnreg}
                fn = _over_layers(one, x["pools"])
            elif not x["q8"].is_cuda:
                raise RuntimeError("needs a CUDA GPU")
            elif name in ("fa3_fp8", "fa3_bf16"):
                fn, splits[name] = _fa3_runner(case, x, out, scale, name == "fa3_bf16")
            elif name == "triton_fp8":
                fn, splits[name] = _triton_runner(case, x, out, scale)
            elif name == "fa4_bf16":
                fn = _fa4_bf16_runner(case, x, out, scale)
            else:
                raise ValueError(f"unknown backend {name}")
            calls[name], outs[name] = fn, out
        except Exception as exc:  # noqa: BLE001 - one backend failing must not stop the others
            errors[name] = f"{type(exc).__name__}: {str(exc)[:300]}"
    return calls, outs, errors, splits


def _over_layers(one, pools):
    def fn():
        for k, v in pools:
            one(k, v)

    return fn


def _fa3_runner(case: Case, x: dict, out, scale: float, bf16: bool):
    import torch

    from . import fa3

    pools = x["pools16"] if bf16 else x["pools"]
    if not pools:
        raise RuntimeError("the bf16 pools do not fit beside the FP8 ones")
    q = x["q8"].to(torch.bfloat16) if bf16 else x["q8"]
    scratch = fa3.Scratch()
    kw = {} if bf16 else {"k_descale": x["kd"], "v_descale": x["vd"]}
    call = fa3.paged_bf16 if bf16 else fa3.paged_fp8

    def one(k, v):
        call(q, k, v, x["table"], x["seqlens"], x["cu_q"], 1, softmax_scale=scale, causal=True, out=out,
             scratch=scratch, num_splits=0, **kw)
    p = fa3.plan(q, pools[0][0], pools[0][1], x["table"], x["seqlens"], x["cu_q"], 1, causal=True)
    return _over_layers(one, pools), {"num_splits_max": p.num_splits, "pack_gqa": p.pack_gqa,
                                      "note": "FA3's per-batch dynamic split is at most this"}


def _triton_runner(case: Case, x: dict, out, scale: float):
    """SGLang's triton backend's decode: its split heuristic once (SGLang runs it per step, outside
    the graph), then its decode kernel per layer on the pool's token slots, its page size passed."""
    import torch
    from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd
    from sglang.kernels.ops.attention.metadata import get_num_kv_splits_triton

    dev = x["q8"].device
    lens = x["lens"]
    slots = []
    for b, n in enumerate(lens):
        t = torch.arange(n, device=dev)
        slots.append(x["table"][b].long()[t // case.page] * case.page + t % case.page)
    indices = torch.cat(slots).to(torch.int64)
    indptr = torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32, device=dev)
    logits = torch.empty(case.batch, case.hq, TRITON_KV_SPLITS, case.head_dim, dtype=torch.float32, device=dev)
    lse = torch.empty(case.batch, case.hq, TRITON_KV_SPLITS, dtype=torch.float32, device=dev)
    splits = torch.empty((case.batch,), dtype=torch.int32, device=dev)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    get_num_kv_splits_triton[(1,)](splits, x["seqlens"], case.batch, 1, case.hq, case.hkv, TRITON_KV_SPLITS, sms,
                                   MAX_NUM_SEQ=max(256, 1 << (case.batch - 1).bit_length()))
    qb = x["q8"].to(torch.bfloat16)
    pdl = torch.cuda.get_device_capability(dev)[0] >= 9

    def one(k, v):
        decode_attention_fwd(qb, k.view(-1, case.hkv, case.head_dim), v.view(-1, case.hkv, case.head_dim), out,
                             indptr, indices, logits, lse, splits, TRITON_KV_SPLITS, scale, K_SCALE, V_SCALE,
                             use_pdl=pdl, page_size=case.page)
    s = splits.tolist()
    return _over_layers(one, x["pools"]), {"num_kv_splits_min": min(s), "num_kv_splits_max": max(s)}


def _fa4_bf16_runner(case: Case, x: dict, out, scale: float):
    import torch
    from flash_attn.cute import flash_attn_varlen_func

    if not x["pools16"]:
        raise RuntimeError("the bf16 pools do not fit beside the FP8 ones")
    qb = x["q8"].to(torch.bfloat16)

    def one(kb, vb):
        o = flash_attn_varlen_func(qb, kb, vb, cu_seqlens_q=x["cu_q"], seqused_k=x["seqlens"], page_table=x["table"],
                                   max_seqlen_q=1, softmax_scale=scale, causal=True)
        out.copy_((o[0] if isinstance(o, tuple) else o).view(out.shape))

    return _over_layers(one, x["pools16"])


def reference_rows(case: Case, x: dict):
    """fp32 contract on the dequantized pool for the first and last sequence: (rows, ref)."""
    import torch

    from sglang_fa4.testing.paged_kv_torch import paged_decode_torch

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
               num_splits: int | None = None, copy_gbps: float | None = None, wide_tokens: int = 0,
               candidate=None) -> list[dict]:
    import torch

    g = torch.Generator().manual_seed(seed)
    lens = ragged_lens(case, g)  # the same draw make_inputs makes (same seed)
    smoke = device == "cpu"
    layers = 1 if smoke else layers_for(lens, case)
    wants16 = any(b in ("fa3_bf16", "fa4_bf16") for b in backends)
    base = dict(case._asdict(), name=case.name, layers=layers, lens_min=min(lens), lens_max=max(lens),
                table_tokens=max(max(lens), wide_tokens))
    skip16 = None
    if not smoke:
        free = torch.cuda.mem_get_info()[0] * MEMORY_SHARE
        need8 = layers * pool_bytes(lens, case, 1)
        if need8 > free:
            return [{**base, "backend": b, "error": f"skipped: {need8 / 2**30:.1f} GiB of FP8 pools do not fit"}
                    for b in backends]
        if wants16 and need8 + layers * pool_bytes(lens, case, 2) > free:
            wants16, skip16 = False, f"skipped: the bf16 pools ({layers * pool_bytes(lens, case, 2) / 2**30:.1f} GiB) do not fit"
    x = make_inputs(case, device, seed, layers, bf16=wants16, wide_tokens=wide_tokens)
    calls, outs, errors, split_facts = runners(case, x, backends, num_splits, candidate)
    if skip16:
        for b in ("fa3_bf16", "fa4_bf16"):
            if b in errors:
                errors[b] = skip16
    rows_idx, ref = reference_rows(case, x)
    checks = {}
    for name, fn in list(calls.items()):
        try:
            outs[name].fill_(float("nan"))
            fn()
            got = outs[name][rows_idx].float()
            checks[name] = {"rel_err": float((got - ref).norm() / ref.norm()),
                            "finite": bool(torch.isfinite(got).all())}
            if not checks[name]["finite"] or checks[name]["rel_err"] > BAR:
                errors[name] = f"wrong result (rel. error {checks[name]['rel_err']:.2e})"
                del calls[name]
        except Exception as exc:  # noqa: BLE001
            errors[name] = f"{type(exc).__name__}: {str(exc)[:300]}"
            del calls[name]
    if smoke:
        timed = wall_rounds(calls, rounds)
    else:
        from .timing import interleaved_ms

        timed = interleaved_ms(calls, rounds=rounds, replays=replays)
    rows = []
    for name in backends:
        t = timed.get(name, {})
        row = {**base, "backend": name, **checks.get(name, {}), **({"splits": split_facts[name]} if name in split_facts else {})}
        if name in errors or "error" in t:
            row["error"] = errors.get(name) or t["error"]
        ms = t.get("ms")
        if ms:
            per = ms / layers
            nbytes = kv_bytes(lens, case, 2 if name.endswith("bf16") else 1)
            row.update(median_us=per * 1e3, per_round_us=[r * 1e3 / layers for r in t["rounds"]], how=t.get("how"),
                       spread=(max(t["rounds"]) - min(t["rounds"])) / ms, kv_bytes=nbytes,
                       gbps=nbytes / (per * 1e-3) / 1e9)
            if copy_gbps:
                row["copy_fraction"] = row["gbps"] / copy_gbps
        rows.append(row)
    by = {r["backend"]: r for r in rows if r.get("median_us")}
    for r in rows:
        if r.get("median_us"):
            for ref_name, key in (("fa3_fp8", "speedup_vs_fa3_fp8"), ("fa3_bf16", "speedup_vs_fa3_bf16"),
                                  ("triton_fp8", "speedup_vs_triton_fp8")):
                if ref_name in by:
                    # per-round ratios (the rounds are interleaved: round i of both ran together)
                    ratios = [b / a for a, b in zip(r["per_round_us"], by[ref_name]["per_round_us"])]
                    r[key] = median(ratios)
                    r[key + "_range"] = [min(ratios), max(ratios)]
    del x, calls, outs
    if not smoke:
        torch.cuda.empty_cache()
    return rows


def markdown(result: dict) -> str:
    meta = result["meta"]
    copy = (meta.get("ceilings") or {}).get("copy_gbps")
    lines = [f"# Paged FP8-KV decode ({meta.get('gpu', {}).get('name', meta.get('device', '?'))})", "",
             f"Command: `{meta.get('command', '')}`", "",
             "Per layer call, L2-cold (each graph replay runs every layer's pool once), ragged batches "
             f"(lengths within +-{int(RAGGED * 100)}% of the context). Median µs over interleaved rounds "
             "(spread = (max - min) / median of the round medians), achieved K/V bandwidth in GB/s"
             + (f" and its share of the device copy rate ({copy:.0f} GB/s, same process)" if copy else "")
             + ", rel. error against fp32 on the dequantized pool.", ""]
    backends = meta["settings"]["backends"]
    ratios = [(b, k) for b, k in (("fa3_fp8", "speedup_vs_fa3_fp8"), ("fa3_bf16", "speedup_vs_fa3_bf16"),
                                  ("triton_fp8", "speedup_vs_triton_fp8")) if b in backends]
    ours = [b for b in OURS if b in backends]
    label = {"fa4_fp8_split_kv": "ours", CANDIDATE: "candidate"}
    head = ("| case | " + " | ".join(backends)
            + "".join(f" | {label[o]} vs {b}" for o in ours for b, _ in ratios) + " |")
    lines += [head, "|" + "---|" * (len(backends) + 1 + len(ours) * len(ratios))]
    by_case: dict = {}
    for r in result["rows"]:
        by_case.setdefault(r["name"], {})[r["backend"]] = r
    for name, per in by_case.items():
        cells = []
        for b in backends:
            r = per.get(b, {})
            if r.get("median_us") is not None:
                share = f" ({100 * r['copy_fraction']:.0f}%)" if r.get("copy_fraction") else ""
                cells.append(f"{r['median_us']:.1f} ±{100 * r['spread']:.0f}% · {r['gbps']:.0f} GB/s{share} · "
                             f"{r.get('rel_err', float('nan')):.1e}")
            else:
                cells.append("— " + (r.get("error", "")[:40]))
        for o in ours:
            mine = per.get(o, {})
            cells += ["—" if mine.get(k) is None else
                      f"{mine[k]:.2f}x ({mine[k + '_range'][0]:.2f}-{mine[k + '_range'][1]:.2f})" for _, k in ratios]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def run(args) -> dict:
    import torch

    from .meta import base_meta

    t_start = time.monotonic()
    smoke = args.cpu_smoke
    copy_gbps = None
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
        models = {m: {**MODELS, **OPTIONAL_MODELS}[m] for m in args.models}
        todo = cases(models, args.batches, args.contexts, args.pages,
                     EXTRA_PAGES if args.extra_pages else {})
        meta = base_meta("decode")
        meta["ceilings"] = ceilings()
        copy_gbps = meta["ceilings"]["copy_gbps"]
    rounds = min(args.rounds, 2) if smoke else args.rounds
    meta["settings"] = {"backends": list(args.backends), "rounds": rounds, "num_splits": args.num_splits or "heuristic",
                        "replays": args.replays, "cases": len(todo), "k_scale": K_SCALE, "v_scale": V_SCALE,
                        "triton_kv_splits": TRITON_KV_SPLITS, "ragged": RAGGED, "cold_bytes": COLD_BYTES,
                        "wide_table_tokens": args.wide_table}
    if CANDIDATE in args.backends:  # a malformed --candidate stops here, before any case runs
        try:
            check_candidate(args.candidate, {c.head_dim for c in todo})
        except ValueError as exc:  # PagedKVError is one
            raise SystemExit(f"--candidate: {exc}") from exc
        meta["settings"]["candidate"] = args.candidate if args.candidate is not None else "decode_plan.CANDIDATE"
    out_dir = report.resolve_out_dir(args.out_dir)
    stem = "decode" + (f"-{args.tag}" if args.tag else "")
    result = {"meta": meta, "rows": []}
    for i, case in enumerate(todo):
        if args.time_budget_s and time.monotonic() - t_start > args.time_budget_s:
            meta["truncated"] = f"time budget {args.time_budget_s}s reached after {i} of {len(todo)} cases"
            break
        try:
            rows = bench_case(case, args.backends, rounds, args.replays, device, seed=1000 + i,
                              num_splits=args.num_splits or None, copy_gbps=copy_gbps, wide_tokens=args.wide_table,
                              candidate=args.candidate)
        except torch.cuda.OutOfMemoryError as exc:  # a case that does not fit is recorded; the others go on
            rows = [dict(case._asdict(), name=case.name, backend=b, error=f"OutOfMemoryError: {str(exc)[:200]}")
                    for b in args.backends]
            torch.cuda.empty_cache()
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
    p.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS + OPTIONAL_BACKENDS)
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS) + list(OPTIONAL_MODELS))
    p.add_argument("--batches", nargs="+", type=int, default=list(BATCHES))
    p.add_argument("--contexts", nargs="+", type=int, default=list(CONTEXTS))
    p.add_argument("--pages", nargs="+", type=int, default=list(PAGES))
    p.add_argument("--no-extra-pages", dest="extra_pages", action="store_false",
                   help=f"leave out the extra page sizes ({EXTRA_PAGES})")
    p.add_argument("--rounds", type=int, default=7, help="interleaved rounds per case")
    p.add_argument("--replays", type=int, default=5, help="single graph replays (every layer once) timed per round")
    p.add_argument("--num-splits", type=int, default=0,
                   help="force the split-KV kernel's split count (0: fp8_paged_kv.choose_splits), for tuning it")
    p.add_argument("--wide-table", type=int, default=0, metavar="TOKENS",
                   help="page tables this many tokens wide (SGLang's decode graphs pass the context limit), "
                        "the columns past a sequence's pages unused")
    p.add_argument("--candidate", type=json.loads, default=None, metavar="JSON",
                   help=f"{CANDIDATE}'s launch overrides: one object for every head dim, or one per head dim "
                        "('{\"256\": {\"d_pieces\": 2, \"maxnreg\": 168, \"programs_per_sm\": 3}}'; a head dim "
                        "left out runs the default launch); default decode_plan.CANDIDATE")
    p.add_argument("--tag", default="", help="suffix of the output files (decode-<tag>.json/.md)")
    p.add_argument("--cpu-smoke", action="store_true",
                   help="tiny shapes on the CPU, the kernel in Triton's interpreter (TRITON_INTERPRET=1); CI")
