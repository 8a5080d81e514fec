"""The LLM serving comparison's numbers: per-round ratios against the baseline arm (with their spread
over the rounds), the greedy-token comparison of the accuracy prompts, and the markdown page.

Ratios are arm / baseline of the same round (the arms of a round run back to back on the same GPU),
so throughput > 1 and TPOT / ITL / TTFT < 1 mean the arm is faster.
"""

from __future__ import annotations

import statistics

RATIO_METRICS = ("output_throughput", "mean_tpot_ms", "median_itl_ms", "mean_ttft_ms", "median_ttft_ms")


def ratios(runs: list[dict], baseline: str) -> dict:
    """``runs``: records {arm, workload, round, result}. Per workload, per non-baseline arm, per
    metric: the per-round ratios, their median, min and max (rounds where either run failed are
    left out and counted)."""
    table: dict = {}
    index = {(r["workload"], r["round"], r["arm"]): r["result"] for r in runs}
    for wl in sorted({r["workload"] for r in runs}):
        arms = sorted({r["arm"] for r in runs if r["workload"] == wl and r["arm"] != baseline})
        rounds = sorted({r["round"] for r in runs if r["workload"] == wl})
        for arm in arms:
            per_metric = {}
            skipped = 0
            for m in RATIO_METRICS:
                vals = []
                for rd in rounds:
                    a, b = index.get((wl, rd, arm)), index.get((wl, rd, baseline))
                    if not (a and b and a.get("ok") and b.get("ok") and a.get(m) and b.get(m)):
                        skipped += m == RATIO_METRICS[0]
                        continue
                    vals.append(a[m] / b[m])
                per_metric[m] = ({"per_round": [round(v, 4) for v in vals], "median": round(statistics.median(vals), 4),
                                  "min": round(min(vals), 4), "max": round(max(vals), 4)} if vals else None)
            table.setdefault(wl, {})[arm] = {**per_metric, "rounds_left_out": skipped}
    return table


def compare_tokens(base: list[dict], other: list[dict], n: int = 32) -> list[dict]:
    """Per prompt: how many of the first ``n`` greedy tokens equal the baseline's (the leading run),
    and the mean |logprob difference| over that run (the same token in the same context)."""
    if len(base) != len(other):
        raise ValueError(f"{len(base)} baseline answers against {len(other)}")
    out = []
    for b, o in zip(base, other):
        if not (b.get("ok") and o.get("ok")):
            out.append({"name": b.get("name"), "ok": False})
            continue
        bt, ot = b["ids"][:n], o["ids"][:n]
        lead = 0
        while lead < min(len(bt), len(ot)) and bt[lead] == ot[lead]:
            lead += 1
        diffs = [abs(x - y) for x, y in zip(b["logprobs"][:lead], o["logprobs"][:lead]) if x is not None and y is not None]
        out.append({"name": b.get("name"), "ok": True, "leading_equal": lead, "of": min(n, len(bt)),
                    "mean_abs_logprob_diff": round(sum(diffs) / len(diffs), 5) if diffs else None})
    return out


def accuracy_verdict(rows: list[dict], min_full_share: float, max_mean_diff: float) -> dict:
    """``min_full_share`` of the prompts with all leading tokens equal and the mean |logprob diff|
    over those prompts at most ``max_mean_diff``; every prompt answered."""
    answered = [r for r in rows if r.get("ok")]
    full = [r for r in answered if r["leading_equal"] == r["of"]]
    diffs = [r["mean_abs_logprob_diff"] for r in answered if r["mean_abs_logprob_diff"] is not None]
    mean_diff = round(sum(diffs) / len(diffs), 5) if diffs else None
    ok = (len(answered) == len(rows) and len(full) >= min_full_share * len(rows)
          and mean_diff is not None and mean_diff <= max_mean_diff)
    return {"prompts": len(rows), "answered": len(answered), "all_leading_equal": len(full),
            "mean_abs_logprob_diff": mean_diff, "ok": ok,
            "tolerance": {"min_share_all_equal": min_full_share, "max_mean_abs_logprob_diff": max_mean_diff}}


def _f(v, nd=2):
    return "" if v is None else (f"{v:.{nd}f}" if isinstance(v, float) else str(v))


def markdown(res: dict) -> str:
    meta = res["meta"]
    lines = [f"# LLM serving: {meta['model']} ({meta['gpu']})", "",
             f"- command: `{res['command']}`", f"- date: {meta['date']}, SGLang {meta.get('sglang')}",
             f"- model: {meta['layers_note']}",
             f"- arms: " + "; ".join(f"**{a['name']}** ({a['what']}; resolved {a.get('resolved_backend')})"
                                     for a in meta["arms"]),
             f"- baseline: {meta['baseline']}; ratios are arm / baseline per round (median [min-max] over rounds)",
             f"- server options: {meta['server_opts']}", ""]
    lines += ["## Runs", "", "| workload | round | arm | ok | completed / failed | out tok/s | mean TPOT ms | "
              "median ITL ms | mean TTFT ms | median TTFT ms |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["runs"]:
        x = r["result"]
        lines.append(f"| {r['workload']} | {r['round']} | {r['arm']} | {x.get('ok')} | {_f(x.get('completed'))} / "
                     f"{_f(x.get('failed'))} | {_f(x.get('output_throughput'), 1)} | {_f(x.get('mean_tpot_ms'))} | "
                     f"{_f(x.get('median_itl_ms'))} | {_f(x.get('mean_ttft_ms'), 1)} | {_f(x.get('median_ttft_ms'), 1)} |")
    lines += ["", "## Ratios against the baseline", "", "| workload | arm | metric | median | min-max | per round |",
              "|---|---|---|---|---|---|"]
    for wl, arms in res.get("ratios", {}).items():
        for arm, ms in arms.items():
            for m in RATIO_METRICS:
                v = ms.get(m)
                if v:
                    lines.append(f"| {wl} | {arm} | {m} | {v['median']:.3f} | {v['min']:.3f}-{v['max']:.3f} | "
                                 f"{', '.join(f'{x:.3f}' for x in v['per_round'])} |")
    lines += ["", "## Accuracy (greedy, first tokens against the baseline)", ""]
    for arm, acc in res.get("accuracy", {}).items():
        v = acc["verdict"]
        lines.append(f"- **{arm}**: {v['all_leading_equal']}/{v['prompts']} prompts with all leading tokens equal, "
                     f"mean |logprob diff| {v['mean_abs_logprob_diff']} (tolerance {v['tolerance']}): "
                     f"{'PASS' if v['ok'] else 'FAIL'}; per prompt "
                     + ", ".join(f"{p['name']} {p.get('leading_equal')}/{p.get('of')}" for p in acc["per_prompt"]))
    lines += ["", "## Servers", ""]
    for s in res.get("servers", []):
        f = s.get("log_facts", {})
        lines.append(f"- **{s['arm']}**: ready {s.get('ready')} in {s.get('startup_s')} s; backend in log "
                     f"{f.get('attention_backends')}; KV {f.get('kv_alloc')}; full/SWA tokens {f.get('pool_tokens')}; "
                     f"after ready: FA4 compiles {f.get('after_ready', {}).get('fa4_compiles')}, Triton kernels loaded "
                     f"{f.get('triton_after_ready')}; stand-ins called {f.get('stand_ins_called')}; tracebacks "
                     f"{f.get('tracebacks')}; {s.get('error', '')}")
    lines += ["", "## Decode profile", ""]
    for arm, p in res.get("profiles", {}).items():
        if not p.get("ok"):
            lines.append(f"- **{arm}**: not profiled: {p.get('error')}")
            continue
        lines.append(f"- **{arm}** ({p.get('context')}): {p['gpu_us_per_step']} us GPU per step, attention "
                     f"{p['attention_us_per_layer']} us per layer, {100 * p['attention_share']:.1f}% of the step; by kind "
                     f"{p['us_per_step_by_kind']}; top: "
                     + "; ".join(f"{k['name'][:60]} ({k['kind']}) {k['us_per_step']} us" for k in p["top_kernels"][:6]))
    lines += ["", "## Notes", ""] + [f"- {n}" for n in res.get("notes", [])]
    return "\n".join(lines) + "\n"
