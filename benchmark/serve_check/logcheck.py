"""Reading a server log: what happened before the server reported ready, what after."""

from __future__ import annotations

import json
import re

READY = "The server is fired up and ready to roll!"
# the shared-library store added "N of them from stored shared libraries" and the import flag
WARMUP_SUMMARY = re.compile(r"sglang-fa4 warmup: (\d+) FA4 variant\(s\) in ([\d.]+) s \((\d+) compiled, (\d+) loaded from cache, "
                            r"(?:(\d+) of them from stored shared libraries, )?(\d+) failed(?:; flash_attn\.cute imported: (\w+))?\)")
WARMUP_VARIANT = re.compile(r"sglang-fa4 warmup \[\d+/\d+\]")
BUDGETS = re.compile(r"sglang-fa4: (\d+) ViT budget graph\(s\) \[([\d, ]*)\] captured at startup; graph memory ([\d.]+) MiB")
BACKEND = re.compile(r"sglang-fa4: ViT attention backend (\S+):")
HOOKS = re.compile(r"serve-check: hooks in (\S+) pid (\d+): (\{.*\})\s*$")
FA4_AFTER = "after the startup warmup"
CAPTURE_AFTER = "captured after the startup budgets"
MAX_TOKENS = re.compile(r"max_total_num_tokens=(\d+)")
KV_ALLOC = re.compile(r"KV Cache is allocated\..*?#tokens: (\d+), K size: ([\d.]+) GB, V size: ([\d.]+) GB")
LOAD_END = re.compile(r"Load weight end\..*?avail mem=([\d.]+) GB, mem usage=([\d.]+) GB")
POOL_END = re.compile(r"Memory pool end\. avail mem=([\d.]+) GB")
PREFILL = re.compile(r"Prefill batch, #new-seq: (\d+)")
RUNNING = re.compile(r"#running-req: (\d+)")
BUDGETS_FAILED = "ViT graph budgets not captured"
STUB_CALLED = re.compile(r"(\S+) is a stand-in \(cuda_only_stubs\)")
VIT_CALL = re.compile(r"serve-check: vit call (\{.*\})\s*$")
VIT_PROBE = re.compile(r"serve-check: vit probe (\{.*\})\s*$")


def analyse(text: str) -> dict:
    """Facts from a server log, each tied to before/after the ready line."""
    lines = text.splitlines()
    ready_at = next((i for i, line in enumerate(lines) if READY in line), None)

    def before(i: int) -> bool:
        return ready_at is not None and i < ready_at

    out: dict = {"ready": ready_at is not None, "ready_line": ready_at, "lines": len(lines)}
    warm = [(i, m) for i, line in enumerate(lines) if (m := WARMUP_SUMMARY.search(line))]
    out["warmup"] = [{"variants": int(m[1]), "seconds": float(m[2]), "compiled": int(m[3]),
                      "loaded": int(m[4]), "from_shared_libraries": int(m[5]) if m[5] else None, "failed": int(m[6]),
                      "fa4_imported": {"True": True, "False": False}.get(m[7]), "before_ready": before(i)} for i, m in warm]
    out["warmup_variant_lines"] = sum(1 for line in lines if WARMUP_VARIANT.search(line))
    bud = [(i, m) for i, line in enumerate(lines) if (m := BUDGETS.search(line))]
    out["budgets"] = [{"graphs": int(m[1]), "budgets": [int(b) for b in m[2].split(",") if b.strip()],
                       "graph_mib": float(m[3]), "before_ready": before(i)} for i, m in bud]
    out["vit_backend"] = sorted({m[1] for line in lines if (m := BACKEND.search(line))})
    hooks = []
    for i, line in enumerate(lines):
        m = HOOKS.search(line)
        if m:
            try:
                info = json.loads(m[3])
            except ValueError:
                info = {"unparsed": m[3]}
            hooks.append({"process": m[1], "pid": int(m[2]), "before_ready": before(i), **info})
    out["hooks"] = hooks
    out["fa4_compiles_after_warmup_lines"] = sum(1 for line in lines if FA4_AFTER in line)
    out["graph_captures_after_startup_lines"] = sum(1 for line in lines if CAPTURE_AFTER in line)
    out["after_ready"] = {
        "fa4_compiles": sum(1 for i, line in enumerate(lines) if FA4_AFTER in line and not before(i)),
        "graph_captures": sum(1 for i, line in enumerate(lines) if CAPTURE_AFTER in line and not before(i)),
    }
    m = [int(x[1]) for line in lines if (x := MAX_TOKENS.search(line))]
    out["max_total_num_tokens"] = m[0] if m else None
    kv = [x for line in lines if (x := KV_ALLOC.search(line))]
    out["kv_alloc"] = ({"tokens": int(kv[0][1]), "k_gb": float(kv[0][2]), "v_gb": float(kv[0][3])} if kv else None)
    le = [x for line in lines if (x := LOAD_END.search(line))]
    out["load_end"] = {"avail_gb": float(le[0][1]), "usage_gb": float(le[0][2])} if le else None
    pe = [x for line in lines if (x := POOL_END.search(line))]
    out["pool_end_avail_gb"] = float(pe[0][1]) if pe else None
    sizes: dict[int, int] = {}
    for line in lines:
        if (m := PREFILL.search(line)):
            sizes[int(m[1])] = sizes.get(int(m[1]), 0) + 1
    out["prefill_batches_by_requests"] = dict(sorted(sizes.items()))
    out["max_running_requests_seen"] = max((int(m[1]) for line in lines if (m := RUNNING.search(line))), default=None)
    out["budget_capture_failed"] = sum(1 for line in lines if BUDGETS_FAILED in line)
    out["tracebacks"] = sum(1 for line in lines if line.startswith("Traceback"))
    out["stand_ins_called"] = sorted({m[1] for line in lines if (m := STUB_CALLED.search(line))})
    out["vit_calls"] = vit_call_consistency(lines)
    out["vit_probes"] = vit_probe_summary(lines)
    return out


def vit_probe_summary(lines: list[str]) -> dict | None:
    """The ``probe`` variant's lines: per image of a multi-image call, its rows batched vs alone
    (normal path), batched vs alone eager, alone eager vs alone; how many are bitwise equal."""
    probes = [json.loads(m[1]) for line in lines if (m := VIT_PROBE.search(line))]
    failed = sum(1 for line in lines if "serve-check: vit probe failed" in line)
    if not probes and not failed:
        return None
    rows = [r for p in probes for r in p["probed"]]
    keys = ("batched_vs_alone", "batched_vs_alone_eager", "alone_eager_vs_alone")
    return {"calls": len(probes), "failed": failed, "images": len(rows),
            "bitwise_equal": {k: sum(1 for r in rows if r[k] == 0) for k in keys},
            "max_abs_diff": {k: max((r[k] for r in rows), default=None) for k in keys},
            "alone_paths": sorted({"/".join(r["alone_path"]) for r in rows}),
            "rows": rows[:40]}


def vit_call_consistency(lines: list[str]) -> dict:
    """From the check plugin's per-call hashes: every image (by the hash of its input rows) seen in
    several tower calls must have one output hash; lists the images that did not, with the sizes
    of the calls they were in."""
    outputs: dict[str, dict] = {}
    calls = 0
    for line in lines:
        m = VIT_CALL.search(line)
        if not m:
            continue
        calls += 1
        images = json.loads(m[1])["images"]
        for img in images:
            seen = outputs.setdefault(img["in"], {"grid": img["grid"], "outputs": {}})
            seen["outputs"].setdefault(img["out"], []).append(len(images))
    differing = [{"grid": v["grid"], "images_per_call_by_output": v["outputs"]}
                 for v in outputs.values() if len(v["outputs"]) > 1]
    return {"calls": calls, "images": len(outputs),
            "seen_in_several_calls": sum(1 for v in outputs.values() if sum(map(len, v["outputs"].values())) > 1),
            "with_several_outputs": len(differing), "differing": differing[:10]}


def scheduler_hooks(facts: dict) -> dict | None:
    """The serve-check evidence line of the scheduler process, if logged."""
    for h in facts.get("hooks", []):
        if "scheduler" in h.get("process", ""):
            return h
    return None
