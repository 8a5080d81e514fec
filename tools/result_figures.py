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

KERNELS = f"{H200}/kernels.json.gz"
VIT_GRAPHS = f"{H200}/vit_graphs-ladder896-0.5.23.json.gz"
FP8_ATTENTION = f"{H200}/fp8_attention_kvsplit.json.gz"
FP8_KV_BACKEND = f"{H200}/fp8_kv_backend-all-0.5.23.json.gz"


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
        for other, label in (("fa4_bf16", "fa4 on a bf16 pool"), ("fa3_fp8", "FA3-FP8")):
            r = _ratios(s[f"{other}_rounds"], s["fa4_fp8_rounds"])
            med = statistics.median(r)
            verdict = f"{_x(med)} faster" if med >= 1 else f"{_x(med)} (slower)"
            rows.append([f"LLM layer on an FP8 KV cache, {s['shape']} d=128: ours vs {label}", verdict,
                         f"rounds {_spread(min(r), max(r))}", str(len(r)), f"`{FP8_KV_BACKEND}`"])
    return rows


def headline_table() -> str:
    rows = ["| H200 | result | spread | rounds | from |", "|---|---|---|---|---|"]
    for row in kernel_rows() + tower_rows() + fp8_attention_rows() + fp8_kv_rows():
        rows.append("| " + " | ".join(row) + " |")
    return "\n".join(rows)
