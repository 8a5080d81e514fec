"""Figures the README quotes, computed from the committed results they cite.

Each speed figure is the median of per-round ratios from interleaved rounds in one process, shown
with the range of the rounds (or of the layouts' medians, where a row sums up several layouts).
``tools.docs`` renders them into the README; a test keeps the README equal to them.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from sglang_fa4.bench import report

ROOT = Path(__file__).resolve().parents[1]
H200 = "benchmark/results/h200"
H100 = "benchmark/results/h100"

KERNELS = f"{H200}/kernels.json.gz"
VIT_GRAPHS = f"{H200}/vit_graphs-ladder896-0.5.23.json.gz"
FP8_ATTENTION = f"{H200}/fp8_attention_kvsplit.json.gz"
FP8_KV_BACKEND = f"{H200}/fp8_kv_backend-all-0.5.23.json.gz"
DECODE = (f"{H100}/decode-short.json.gz", f"{H100}/decode-long.json.gz")
DECODE_MODELS = {"llama3-8b": "Llama-3-8B shape (32/8 heads, d128)", "qwen2.5-7b": "Qwen2.5-7B shape (28/4, d128)",
                 "d256": "16/8 heads, d256"}


def read_result(path: str | Path) -> dict:
    """A committed result, by its path from the repository root (``.json`` or ``.json.gz``)."""
    return report.read_json(ROOT / path)


def _x(v: float) -> str:
    return f"{v:.2f}x"


def _spread(lo: float, hi: float) -> str:
    return f"{lo:.2f}-{hi:.2f}"


def _ratios(a: list[float], b: list[float]) -> list[float]:
    """Per-round ratios a/b of two columns timed in the same rounds."""
    if len(a) != len(b) or not a:
        raise ValueError(f"rounds differ in number ({len(a)} vs {len(b)}) or are empty")
    return [x / y for x, y in zip(a, b)]


def kernel_rows(head_dims=(80, 72)) -> list[list[str]]:
    """fa4 vs SGLang's triton_attn, graph replay, every synthetic layout: the range of the layouts'
    median ratios, and the lowest / highest single round over all of them."""
    res = read_result(KERNELS)
    rows = []
    for d in head_dims:
        pairs = [p for p in res["pairs"] if p["a"] == "fa4" and p["b"] == "triton_attn"
                 and p["mode"] == "graph" and p["head_dim"] == d]
        if not pairs:
            raise ValueError(f"{KERNELS} has no fa4/triton_attn graph pairs at d={d}")
        med = [p["median_ratio"] for p in pairs]
        rounds = {p["rounds"] for p in pairs}
        rows.append([f"ViT attention kernel, fa4 vs SGLang's triton_attn, d={d}, {len(pairs)} layouts",
                     f"{_x(min(med))} to {_x(max(med))} faster",
                     f"rounds {_spread(min(p['min_ratio'] for p in pairs), max(p['max_ratio'] for p in pairs))}",
                     "/".join(map(str, sorted(rounds))), f"`{KERNELS}`"])
    return rows


def tower_rows(pictures=("448", "720p", "1080p")) -> list[list[str]]:
    """Tower eager / graph time (startup budget graphs, the default ladder), per model and picture."""
    res = read_result(VIT_GRAPHS)
    rows = []
    for m in res["models"]:
        lat = {r["image"]: r for r in m["latency"]}
        missing = [p for p in pictures if p not in lat]
        if missing:
            raise ValueError(f"{VIT_GRAPHS}: {m['model']} has no latency row for {missing}")
        cells = [f"{p} {_x(lat[p]['eager_over_graph'])}" for p in pictures]
        spread = [f"{p} {_spread(*lat[p]['eager_over_graph_range'])}" for p in pictures]
        rounds = {lat[p]["rounds"] for p in pictures}
        name = {"qwen2_5_vl": "Qwen2.5-VL-7B", "qwen3_vl": "Qwen3-VL-8B"}.get(m["model"], m["model"])
        rows.append([f"{name} vision tower, graph mode vs eager (SGLang {res['meta']['versions']['sglang']})",
                     ", ".join(cells) + " faster", ", ".join(spread),
                     "/".join(map(str, sorted(rounds))), f"`{VIT_GRAPHS}`"])
    return rows


def fp8_attention_rows() -> list[list[str]]:
    """The d=128 non-causal FP8 default (the run's winner) vs FA4 bf16, per shape."""
    res = read_result(FP8_ATTENTION)
    winner = res["winner"]["name"]
    (var,) = [v for v in res["sections"]["variants"] if v["name"] == winner]
    rows = []
    for s in var["speed"]:
        r = _ratios(s["bf16_rounds"], s["fp8_rounds"])
        rows.append([f"FP8 (E4M3) attention vs FA4 bf16, {s['shape_key']} non-causal, 16 heads",
                     f"{_x(statistics.median(r))} faster", f"rounds {_spread(min(r), max(r))}",
                     str(len(r)), f"`{FP8_ATTENTION}`"])
    return rows


def fp8_kv_rows() -> list[list[str]]:
    """SGLang's real attention layer on an fp8 KV pool: ours vs fa4 on a bf16 pool and vs FA3-FP8."""
    res = read_result(FP8_KV_BACKEND)
    rows = []
    for s in res["speed"]:
        if s["d"] != 128:
            continue
        if not s["shape"].startswith("prefill"):
            continue  # decode: the split-KV kernel's rows (decode_rows), not this run's gather route
        for other, label in (("fa4_bf16", "fa4 on a bf16 pool"), ("fa3_fp8", "FA3-FP8")):
            r = _ratios(s[f"{other}_rounds"], s["fa4_fp8_rounds"])
            med = statistics.median(r)
            verdict = f"{_x(med)} faster" if med >= 1 else f"{_x(med)} (slower)"
            rows.append([f"LLM layer on an FP8 KV cache, {s['shape']} d=128: ours vs {label} (H200)", verdict,
                         f"rounds {_spread(min(r), max(r))}", str(len(r)), f"`{FP8_KV_BACKEND}`"])
    return rows


def decode_cases(model: str, page: int = 16) -> list[dict]:
    """The split-KV kernel's timed rows of the decode matrix for one model shape at one page size."""
    return [r for path in DECODE for r in read_result(path)["rows"]
            if r["model"] == model and r["page"] == page and r["backend"] == "fa4_fp8_split_kv" and r.get("median_us")]


def decode_rows() -> list[list[str]]:
    """Paged FP8-KV decode (H100, L2-cold, ragged): per model shape at page 16, ours against FA3-FP8
    (FA3's split-KV build, num_splits=0) over every shape that fit, and against FA3 on a bf16 pool at
    contexts >= 8k: the range of the shapes' median per-round ratios, the lowest / highest round."""
    rows = []
    for model, label in DECODE_MODELS.items():
        cases = decode_cases(model)
        if not cases:
            raise ValueError(f"{DECODE} have no timed split-KV rows for {model}")
        rounds = "/".join(map(str, sorted({len(r["per_round_us"]) for r in cases})))
        src = " + ".join(f"`{p}`" for p in DECODE)
        for key, other, pick in (("speedup_vs_fa3_fp8", "FA3-FP8", lambda r: True),
                                 ("speedup_vs_fa3_bf16", "FA3 on a bf16 pool, contexts >= 8k",
                                  lambda r: r["context"] >= 8192)):
            sel = [r for r in cases if pick(r) and r.get(key) is not None]
            med = [r[key] for r in sel]
            at_least = sum(1 for m in med if m >= 1.0)
            rows.append([f"Paged FP8-KV decode, {label}, page 16, {len(sel)} shapes (batch 1-256 x context "
                         f"1k-128k that fit): ours vs {other} (H100)",
                         f"{_x(min(med))} to {_x(max(med))}; >= 1.0x on {at_least} of {len(sel)}",
                         f"rounds {_spread(min(r[key + '_range'][0] for r in sel), max(r[key + '_range'][1] for r in sel))}",
                         rounds, src])
    return rows


def headline_table() -> str:
    rows = ["| result | value | spread | rounds | from |", "|---|---|---|---|---|"]
    for row in kernel_rows() + tower_rows() + fp8_attention_rows() + fp8_kv_rows() + decode_rows():
        rows.append("| " + " | ".join(row) + " |")
    return "\n".join(rows)
