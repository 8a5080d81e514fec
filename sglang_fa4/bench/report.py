"""Benchmark results on disk: the JSON schema (and its check), markdown tables, PNG plots.

kernels.json: {"meta": {"gpu", "command", "versions", "ceilings", ...},
               "rows": [{"backend", "head_dim", "layout", "mode", "median_us", "rel_err", ...}],
               "pairs": [{"layout", "head_dim", "mode", "a", "b", "median_ratio", "wins_a", "wins_b", ...}]}
vit.json:     {"meta": {...}, "rows": [{"backend", "model", "image", "mode", "median_ms", "rel_err", ...}],
               "pairs": [...]}
matplotlib is imported only to draw.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

META_KEYS = ("gpu", "command", "versions", "ceilings")
ROW_KEYS = {
    "kernels": ("backend", "head_dim", "layout", "mode", "median_us", "rel_err"),
    "vit": ("backend", "model", "image", "mode", "median_ms", "rel_err"),
}
PAIR_KEYS = ("mode", "a", "b", "median_ratio", "wins_a", "wins_b", "rounds")


def validate(result: dict, kind: str) -> list[str]:
    """Schema problems of a result dict (empty list: valid)."""
    problems = []
    if not isinstance(result, dict):
        return ["result is not an object"]
    meta = result.get("meta")
    if not isinstance(meta, dict):
        problems.append("meta missing")
    else:
        problems += [f"meta.{k} missing" for k in META_KEYS if k not in meta]
        if not isinstance(meta.get("command"), str) or not meta.get("command"):
            problems.append("meta.command must be the command line")
    rows = result.get("rows")
    if not isinstance(rows, list):
        return problems + ["rows missing"]
    for i, row in enumerate(rows):
        for k in ROW_KEYS[kind]:
            if k not in row:
                problems.append(f"rows[{i}].{k} missing")
        t = row.get("median_us" if kind == "kernels" else "median_ms")
        if t is not None and (not isinstance(t, (int, float)) or not t > 0):
            problems.append(f"rows[{i}] time must be positive or null")
        if t is None and "error" not in row:
            problems.append(f"rows[{i}] has no time and no error")
    for i, pair in enumerate(result.get("pairs", [])):
        for k in PAIR_KEYS:
            if k not in pair:
                problems.append(f"pairs[{i}].{k} missing")
    return problems


def resolve_out_dir(out_dir: str | None) -> Path:
    if out_dir is None:
        import torch

        from .meta import gpu_slug

        out_dir = os.path.join("benchmark", "results", gpu_slug(torch.cuda.get_device_name(0)))
    path = Path(out_dir)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _clean(x):
    """JSON-safe: NaN/inf -> None (strict JSON), recursively."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def write_json(result: dict, path: Path, partial: bool = False) -> None:
    data = _clean(result)
    data["meta"] = {**data["meta"], "partial": partial}
    tmp = Path(str(path) + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)


def _fmt(x, spec=".1f"):
    return "—" if x is None else format(x, spec)


def _err(x):
    return "—" if x is None else f"{x:.1e}"


def _row_index(rows, *keys):
    return {tuple(r.get(k) for k in keys): r for r in rows}


def _pair_ratio(pairs, a, b, **where):
    """a's speed-up over b from the paired rounds (b_time / a_time), or None."""
    for p in pairs:
        if all(p.get(k) == v for k, v in where.items()):
            if p["a"] == a and p["b"] == b:
                return p["median_ratio"], p["wins_a"], p["rounds"]
            if p["a"] == b and p["b"] == a:
                return 1 / p["median_ratio"], p["wins_b"], p["rounds"]
    return None


def write_kernels_markdown(result: dict, path: Path) -> None:
    meta, rows, pairs = result["meta"], result["rows"], result.get("pairs", [])
    c = meta.get("ceilings") or {}
    lines = [
        f"# Attention kernels on {meta['gpu'].get('name')}",
        "",
        f"Command: `{meta['command']}`",
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items() if v and k != "triton_attn_source"),
        "",
        f"Ceilings measured in the same run: bf16 matmul {_fmt(c.get('bf16_matmul_tflops'))} TFLOP/s, "
        f"copy {_fmt(c.get('copy_gbps'), '.0f')} GB/s (read + write).",
        "",
        "16 heads, bf16, non-causal varlen. Times are medians over paired rounds (µs per call); "
        "`x triton` / `x sdpa` (/ `x fa3`) are fa4's median per-round speed-ups (wins/rounds). "
        "`%mm` = TFLOP/s over the matmul ceiling; `floor` = HBM floor (q,k,v,o bytes over copy bandwidth).",
        "",
    ]
    if meta.get("truncated"):
        lines += [f"**Truncated:** {meta['truncated']}", ""]
    lines += ["Notes:"] + [f"- {n}" for n in meta["notes"]] + [""] if meta.get("notes") else []
    backends = sorted({r["backend"] for r in rows}, key=lambda b: ["fa4", "fa4_public", "triton_attn", "sdpa"].index(b)
                      if b in ("fa4", "fa4_public", "triton_attn", "sdpa") else 9)
    idx = _row_index(rows, "backend", "head_dim", "layout", "mode")
    for mode in ("graph", "eager", "host"):
        mode_rows = [r for r in rows if r["mode"] == mode]
        if not mode_rows:
            continue
        if mode == "host":
            lines += _host_table(mode_rows, backends, idx, pairs)
            continue
        lines += [f"## mode: {mode} (µs)", ""]
        others = ["triton_attn", "sdpa"] + (["fa3"] if "fa3" in backends else [])
        head = (["d", "layout"] + backends + ["fa4 TFLOP/s", "%mm", "floor µs"]
                + [f"x {'triton' if o == 'triton_attn' else o}" for o in others] + ["max rel err"])
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        cases = []
        for r in mode_rows:
            key = (r["head_dim"], r["layout"])
            if key not in cases:
                cases.append(key)
        for hd, lay in cases:
            cells = [str(hd), lay]
            errs = []
            for b in backends:
                r = idx.get((b, hd, lay, mode))
                cells.append(_fmt(r.get("median_us")) if r else "—")
                if r and r.get("rel_err") is not None:
                    errs.append(r["rel_err"])
            f = idx.get(("fa4", hd, lay, mode)) or {}
            cells += [_fmt(f.get("tflops")), _fmt(100 * f["frac_matmul_ceiling"], ".0f") + "%" if f.get("frac_matmul_ceiling") else "—",
                      _fmt(f.get("hbm_floor_us"))]
            for other in others:
                pr = _pair_ratio(pairs, "fa4", other, head_dim=hd, layout=lay, mode=mode)
                cells.append(f"{pr[0]:.2f} ({pr[1]}/{pr[2]})" if pr else "—")
            cells.append(_err(max(errs)) if errs else "—")
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    failed = [r for r in rows if r.get("error")]
    if failed:
        lines += ["## Failures", ""] + [f"- {r['backend']} d={r['head_dim']} {r['layout']} {r['mode']}: {r['error']}"
                                        for r in failed] + [""]
    path.write_text("\n".join(lines))


def _host_table(mode_rows, backends, idx, pairs) -> list[str]:
    """Host mode: µs of the calling thread per call (the GPU not waited for), which route fa4's call
    took, and the loop's wall time per call (the GPU's time where the kernel outlasts the launch)."""
    lines = ["## mode: host (µs of host time per call)", "",
             "Host time: a loop of calls timed until the last call returns, before the GPU is waited for "
             "(medians over rounds). `fa4 wall` = the same loop's wall time per call, GPU included.", ""]
    head = ["d", "layout", "fa4 route"] + backends + ["fa4 wall µs", "x triton", "max rel err"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    cases = []
    for r in mode_rows:
        if (r["head_dim"], r["layout"]) not in cases:
            cases.append((r["head_dim"], r["layout"]))
    for hd, lay in cases:
        f = idx.get(("fa4", hd, lay, "host")) or {}
        cells = [str(hd), lay, f.get("route", "—")]
        errs = []
        for b in backends:
            r = idx.get((b, hd, lay, "host"))
            cells.append(_fmt(r.get("median_us")) if r else "—")
            if r and r.get("rel_err") is not None:
                errs.append(r["rel_err"])
        cells.append(_fmt(f.get("loop_wall_us")))
        pr = _pair_ratio(pairs, "fa4", "triton_attn", head_dim=hd, layout=lay, mode="host")
        cells.append(f"{pr[0]:.2f} ({pr[1]}/{pr[2]})" if pr else "—")
        cells.append(_err(max(errs)) if errs else "—")
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


def kernels_summary(result: dict) -> str:
    """A short text table for the console: fa4 vs triton_attn / sdpa per case (graph mode first)."""
    pairs = result.get("pairs", [])
    out = ["mode   d    layout      fa4/triton      fa4/sdpa"]
    for mode in ("graph", "eager", "host"):
        seen = []
        for r in result["rows"]:
            if r["mode"] == mode and (r["head_dim"], r["layout"]) not in seen:
                seen.append((r["head_dim"], r["layout"]))
        for hd, lay in seen:
            t = _pair_ratio(pairs, "fa4", "triton_attn", head_dim=hd, layout=lay, mode=mode)
            s = _pair_ratio(pairs, "fa4", "sdpa", head_dim=hd, layout=lay, mode=mode)
            out.append(f"{mode:6} {hd:<4} {lay:11} {(f'{t[0]:.2f}x' if t else '-'):15} {(f'{s[0]:.2f}x' if s else '-')}")
    return "\n".join(out)


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_kernels(result: dict, path: Path) -> None:
    """fa4's paired speed-up over triton_attn per layout, one bar per head dim, eager and graph."""
    plt = _plt()
    pairs = result.get("pairs", [])
    modes = [m for m in ("graph", "eager") if any(p["mode"] == m for p in pairs)]
    if not modes:
        return
    layouts = []
    for r in result["rows"]:
        if r["layout"] not in layouts and r["mode"] in modes:
            layouts.append(r["layout"])
    dims = sorted({r["head_dim"] for r in result["rows"]})
    fig, axes = plt.subplots(len(modes), 1, figsize=(9, 2.6 * len(modes) + 0.6), squeeze=False)
    width = 0.8 / max(1, len(dims))
    for ax, mode in zip(axes[:, 0], modes):
        for j, hd in enumerate(dims):
            vals = []
            for lay in layouts:
                pr = _pair_ratio(pairs, "fa4", "triton_attn", head_dim=hd, layout=lay, mode=mode)
                vals.append(pr[0] if pr else float("nan"))
            xs = [i + (j - (len(dims) - 1) / 2) * width for i in range(len(layouts))]
            ax.bar(xs, vals, width, label=f"d={hd}")
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_yscale("log")
        ax.set_xticks(range(len(layouts)))
        ax.set_xticklabels(layouts, fontsize=8)
        ax.set_ylabel("fa4 speed-up")
        ax.set_title(f"fa4 / triton_attn ({mode}), {result['meta']['gpu'].get('name')}", fontsize=9)
        ax.legend(fontsize=7, ncol=len(dims))
        ax.grid(axis="y", alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def write_vit_markdown(result: dict, path: Path) -> None:
    meta, rows, pairs = result["meta"], result["rows"], result.get("pairs", [])
    lines = [
        f"# Vision towers end to end on {meta['gpu'].get('name')}",
        "",
        f"Command: `{meta['command']}`",
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items() if v and k != "triton_attn_source"),
        "",
        "transformers vision towers with random weights (bf16), attention routed through each backend via "
        "ALL_ATTENTION_FUNCTIONS. ms per image (median over paired rounds); graph = the whole tower forward "
        "captured in one CUDA graph. rel err: pooler output vs the fp32 tower (sdpa) where `ref` says fp32, "
        "else vs the bf16 sdpa tower.",
        "",
    ]
    if meta.get("truncated"):
        lines += [f"**Truncated:** {meta['truncated']}", ""]
    lines += ["Notes:"] + [f"- {n}" for n in meta["notes"]] + [""] if meta.get("notes") else []
    backends = [b for b in ("fa4", "triton_attn", "sdpa") if any(r["backend"] == b for r in rows)]
    idx = _row_index(rows, "backend", "model", "image", "mode")
    for model in dict.fromkeys(r["model"] for r in rows):
        lines += [f"## {model}", ""]
        head = ["image", "tokens"] + [f"{b} {m}" for m in ("eager", "graph") for b in backends] + \
               ["fa4 x triton (graph)", "fa4 x sdpa (graph)", "rel err fa4/triton/sdpa", "ref"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for image in dict.fromkeys(r["image"] for r in rows if r["model"] == model):
            any_row = next(r for r in rows if r["model"] == model and r["image"] == image)
            cells = [image, str(any_row.get("tokens", "—"))]
            for m in ("eager", "graph"):
                for b in backends:
                    r = idx.get((b, model, image, m))
                    cells.append(_fmt(r.get("median_ms"), ".2f") if r else "—")
            for other in ("triton_attn", "sdpa"):
                pr = _pair_ratio(pairs, "fa4", other, model=model, image=image, mode="graph")
                cells.append(f"{pr[0]:.2f} ({pr[1]}/{pr[2]})" if pr else "—")
            errs = [idx.get((b, model, image, "eager"), {}).get("rel_err") for b in backends]
            cells.append(" / ".join(_err(e) for e in errs))
            cells.append(str((idx.get(("fa4", model, image, "eager")) or {}).get("ref", "—")))
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    failed = [r for r in rows if r.get("error")]
    if failed:
        lines += ["## Failures", ""] + [f"- {r['backend']} {r['model']} {r['image']} {r['mode']}: {r['error']}"
                                        for r in failed] + [""]
    path.write_text("\n".join(lines))


def plot_vit(result: dict, path: Path) -> None:
    """ms per image per backend (graph mode, eager where no graph), one panel per model."""
    plt = _plt()
    rows = [r for r in result["rows"] if r.get("median_ms")]
    models = list(dict.fromkeys(r["model"] for r in rows))
    if not models:
        return
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 3.4), squeeze=False)
    for ax, model in zip(axes[0], models):
        mrows = [r for r in rows if r["model"] == model]
        mode = "graph" if any(r["mode"] == "graph" for r in mrows) else "eager"
        images = list(dict.fromkeys(r["image"] for r in mrows))
        backends = [b for b in ("fa4", "triton_attn", "sdpa") if any(r["backend"] == b for r in mrows)]
        width = 0.8 / max(1, len(backends))
        idx = _row_index(mrows, "backend", "image", "mode")
        for j, b in enumerate(backends):
            vals = [(idx.get((b, im, mode)) or {}).get("median_ms") or float("nan") for im in images]
            xs = [i + (j - (len(backends) - 1) / 2) * width for i in range(len(images))]
            ax.bar(xs, vals, width, label=b)
        ax.set_yscale("log")
        ax.set_xticks(range(len(images)))
        ax.set_xticklabels(images, fontsize=8)
        ax.set_ylabel("ms per image")
        ax.set_title(f"{model} tower ({mode})", fontsize=9)
        ax.legend(fontsize=7)
        ax.grid(axis="y", alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def read_json(path) -> dict:
    """A result file: ``x.json``, or ``x.json.gz`` (bulky raw data is committed gzipped)."""
    import gzip

    p = Path(path)
    return json.loads(gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_text())
