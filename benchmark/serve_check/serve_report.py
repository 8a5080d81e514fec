"""The LLM serving comparison's numbers: per-round ratios against the baseline arm (with their spread
over the rounds), the greedy-token comparison of the accuracy prompts, and the markdown page.

Ratios are arm / baseline of the same round (the arms of a round run back to back on the same GPU),
so throughput > 1 and TPOT / ITL / TTFT < 1 mean the arm is faster.
"""

from __future__ import annotations

import statistics

from decode_profile import project

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
    """Per prompt: how many of the first ``n`` greedy tokens equal the baseline's (the leading run);
    the mean |logprob difference| over that run (the same token in the same context); the
    baseline's top-1 minus top-2 logprob where the run ends (how near a tie the flip was); and,
    teacher-forced (both arms scoring the baseline's ``n`` tokens in one extend), the mean and max
    |logprob difference| over all ``n`` positions, and the arm's own decode against its extend over
    the leading run (decode must equal prefill for the same cache)."""
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
        diffs = _abs_diffs(b["logprobs"][:lead], o["logprobs"][:lead])
        row = {"name": b.get("name"), "ok": True, "leading_equal": lead, "of": min(n, len(bt)),
               "mean_abs_logprob_diff": _mean(diffs)}
        margins = b.get("margins") or []
        row["base_margin_at_divergence"] = (round(margins[lead], 5) if lead < row["of"] and lead < len(margins)
                                            and margins[lead] is not None else None)
        btf, otf = b.get("tf") or {}, o.get("tf") or {}
        if btf.get("ok") and otf.get("ok"):
            tf = _abs_diffs(btf["logprobs"][:n], otf["logprobs"][:n])
            row.update(tf_mean_abs_diff=_mean(tf), tf_max_abs_diff=round(max(tf), 5) if tf else None,
                       decode_vs_extend_max=_max(_abs_diffs(o["logprobs"][:lead], otf["logprobs"][:lead])),
                       base_decode_vs_extend_mean=_mean(_abs_diffs(b["logprobs"][:n], btf["logprobs"][:n])))
        else:
            row["tf_error"] = btf.get("error") or otf.get("error") or "no teacher-forced answer"
        out.append(row)
    return out


def _abs_diffs(xs, ys) -> list[float]:
    return [abs(x - y) for x, y in zip(xs, ys) if x is not None and y is not None]


def _mean(xs):
    return round(sum(xs) / len(xs), 5) if xs else None


def _max(xs):
    return round(max(xs), 5) if xs else None


def accuracy_verdict(rows: list[dict], min_full_share: float, max_mean_diff: float,
                     near_tie: float | None = None) -> dict:
    """Every prompt answered by both arms; teacher-forced, the arm's logprobs of the baseline's
    tokens within ``max_mean_diff`` nats on average for every prompt; and the greedy tokens either
    all equal on ``min_full_share`` of the prompts, or every divergence at a near tie (the
    baseline's top-1 minus top-2 logprob at most ``near_tie`` nats, default 2 x ``max_mean_diff``):
    FP8 rounding differs between kernels, so a near tie may flip and the continuations then differ.

    The teacher-forced comparison holds only where the baseline's own prefill logprobs of its tokens
    match its decode logprobs (within ``max_mean_diff`` on every prompt): where they do not, the
    verdict is inconclusive (``ok`` False, ``inconclusive`` naming why), not a finding on the arm."""
    near_tie = 2 * max_mean_diff if near_tie is None else near_tie
    answered = [r for r in rows if r.get("ok")]
    full = [r for r in answered if r["leading_equal"] == r["of"]]
    diffs = [r["mean_abs_logprob_diff"] for r in answered if r["mean_abs_logprob_diff"] is not None]
    tf = [r.get("tf_mean_abs_diff") for r in answered]
    tf_ok = bool(answered) and all(x is not None and x <= max_mean_diff for x in tf)
    diverged = [r for r in answered if r["leading_equal"] < r["of"]]
    ties = [r for r in diverged if r.get("base_margin_at_divergence") is not None
            and r["base_margin_at_divergence"] <= near_tie]
    tokens_ok = len(full) >= min_full_share * len(rows) or len(ties) == len(diverged)
    floor = [r.get("base_decode_vs_extend_mean") for r in answered]
    floor_max = max((x for x in floor if x is not None), default=None)
    inconclusive = None
    if floor_max is not None and floor_max > max_mean_diff:
        inconclusive = (f"the baseline's own prefill logprobs of its greedy tokens differ from its decode "
                        f"logprobs by up to {floor_max} nats on average (tolerance {max_mean_diff})")
    ok = len(answered) == len(rows) and tf_ok and tokens_ok and inconclusive is None
    return {"prompts": len(rows), "answered": len(answered), "all_leading_equal": len(full),
            "base_decode_vs_extend_mean_max": floor_max, "inconclusive": inconclusive,
            "diverged_at_near_tie": len(ties), "diverged": len(diverged),
            "mean_abs_logprob_diff": round(sum(diffs) / len(diffs), 5) if diffs else None,
            "tf_mean_abs_diff_max": max((x for x in tf if x is not None), default=None),
            "decode_vs_extend_max": max((r["decode_vs_extend_max"] for r in answered
                                         if r.get("decode_vs_extend_max") is not None), default=None),
            "ok": ok, "tolerance": {"min_share_all_equal": min_full_share, "max_mean_abs_logprob_diff": max_mean_diff,
                                    "near_tie_margin": near_tie}}


def projection_lines(res: dict) -> list[str]:
    """Each profiled arm's decode step projected to the model's full depth (decode_profile.project),
    and its ratio to the baseline's: a projection from the cut model, not a measurement."""
    meta, profiles = res["meta"], res.get("profiles", {})
    layers, full = meta.get("layers"), meta.get("full_layers")
    ok = {a: p for a, p in profiles.items() if p.get("ok") and "us_per_step_once" in p}
    if not (layers and full and ok) or layers == full:
        return []
    steps = {a: project(p, layers, full) for a, p in ok.items()}
    base = steps.get(meta.get("baseline"))
    out = ["", f"Projected to the full {full} layers (once-a-step kernels kept, the rest x {full}/{layers}; "
               "a projection, not a measurement):"]
    for a, us in steps.items():
        ratio = f"; baseline / arm {base / us:.3f}" if base and a != meta.get("baseline") else ""
        out.append(f"- **{a}**: {us} us a decode step ({ok[a]['us_per_step_once']} us of it once a step){ratio}")
    return out


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
    lines += ["", "## Accuracy (greedy against the baseline; teacher-forced logprobs of its tokens)", ""]
    for arm, acc in res.get("accuracy", {}).items():
        v = acc["verdict"]
        verdict = "INCONCLUSIVE" if v.get("inconclusive") else ("PASS" if v["ok"] else "FAIL")
        lines.append(f"- **{arm}**: {verdict}: {v['answered']}/{v['prompts']} answered; "
                     f"{v['all_leading_equal']} with all leading tokens equal, {v.get('diverged_at_near_tie')} of "
                     f"{v.get('diverged')} divergences at a near tie; teacher-forced mean |logprob diff| at most "
                     f"{v.get('tf_mean_abs_diff_max')} nats; decode vs extend within the arm at most "
                     f"{v.get('decode_vs_extend_max')}; the baseline's own decode vs prefill at most "
                     f"{v.get('base_decode_vs_extend_mean_max')} on average"
                     + (f" ({v['inconclusive']})" if v.get("inconclusive") else "") + f"; tolerance {v['tolerance']}")
        lines.append("  - per prompt (leading equal / of, baseline margin where it diverged, teacher-forced mean "
                     "|diff|): " + "; ".join(
                         f"{p['name']} {p.get('leading_equal')}/{p.get('of')} m={_f(p.get('base_margin_at_divergence'), 4)} "
                         f"tf={_f(p.get('tf_mean_abs_diff'), 5)}" for p in acc["per_prompt"]))
    lines += ["", "## Servers", ""]
    for s in res.get("servers", []):
        f = s.get("log_facts", {})
        lines.append(f"- **{s['arm']}**: ready {s.get('ready')} in {s.get('startup_s')} s; backend in log "
                     f"{f.get('attention_backends')}; KV {f.get('kv_alloc')}; full/SWA tokens {f.get('pool_tokens')}; "
                     f"after ready: FA4 compiles {f.get('after_ready', {}).get('fa4_compiles')}, Triton kernels loaded "
                     f"{f.get('triton_after_ready')} (the route's own {f.get('route_triton_after_ready')}; "
                     f"{f.get('triton_after_ready_names')}); stand-ins called {f.get('stand_ins_called')}; tracebacks "
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
    lines += projection_lines(res)
    lines += ["", "## Notes", ""] + [f"- {n}" for n in res.get("notes", [])]
    return "\n".join(lines) + "\n"
