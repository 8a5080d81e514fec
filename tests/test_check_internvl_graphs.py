"""The InternVL startup-graph GPU check's verdict (benchmark/release/check_internvl_graphs.py), on synthetic
results: a clean run passes; a graph captured after startup (runner count or capture guard), an FA4
compile after startup, a graph output off the eager one, a missing startup graph, a failed or
non-finite request, too few requests or a tile count never served each fail it. The request mix
covers every tile count. The GPU run itself: benchmark/results/h200/internvl_graphs[-<version>].md."""

from __future__ import annotations

import random

import pytest

from benchmark.release import check_internvl_graphs as c  # noqa: E402


def clean() -> dict:
    rng = random.Random(0)
    reqs = c.make_requests(rng, 120, 12, True)
    rows = [{"tiles": t, "batch": sum(t), "path": "replay" if sum(t) <= 13 else "eager", "finite": True,
             "bitwise": True, "max_abs_diff": 0.0, "rel_err": 0.0, "layout_bitwise": True, "layout_max_abs_diff": 0.0}
            for t in reqs]
    return {"meta": {"command": "python3 benchmark/release/check_internvl_graphs.py --out x", "gpu": {"name": "H200"},
                     "sglang": {"sglang_version": "0.5.23", "mm_attention_backend": "fa4", "plugin_hooked": []}},
            "env": c.ENV, "max_tiles": 12, "config_max_tiles": 12, "processor_max_tiles": 12, "thumbnail": True,
            "startup": {"load_model_hooks": [{"hook": "sglang_fa4.integration.hooks.warm_fa4_after_load_model",
                                              "type": "after", "seconds": 3.0, "allocated_mib": 0.0, "reserved_mib": 0.0}],
                        "server_load_model_hook_depth": 3, "graphs": 13, "graph_keys": [[b, 1025] for b in range(1, 14)],
                        "tile_batches": list(range(1, 14)), "tokens_per_tile": 1025, "sealed": True,
                        "warmup_before_capture": True, "capture_s": 2.0, "graph_mib": 900.0},
            "serving": {"requests": rows, "failures": [], "seconds": 5.0, "graphs_captured_after_startup": 0,
                        "capture_guard_count": 0, "fa4_compiles_after_startup": 0, "jit_monitor_compiles_after_warmup": 0}}


def test_request_mix_covers_every_tile_count():
    reqs = c.make_requests(random.Random(1), 100, 12, True)
    assert len(reqs) == 100
    assert {r[0] for r in reqs if len(r) == 1} == {1, *range(3, 14)}  # n tiles + thumbnail when n > 1
    assert any(len(r) > 1 for r in reqs) and all(1 <= len(r) <= 3 for r in reqs)


def test_clean_result_passes_and_renders():
    res = clean()
    v = res["verdict"] = c.verdict(res)
    assert v["ok"], v
    md = c.markdown(res)
    assert "verdict: **ok**" in md and "graphs captured at startup: **13**" in md


def broken(what: str) -> dict:
    res = clean()
    s, r = res["startup"], res["serving"]
    row = r["requests"][0]
    if what == "captured_after_startup":
        r["graphs_captured_after_startup"] = 1
    elif what == "capture_guard":
        r["capture_guard_count"] = 1
    elif what == "compile_after_startup":
        r["fa4_compiles_after_startup"] = 1
    elif what == "jit_monitor":
        r["jit_monitor_compiles_after_warmup"] = 1
    elif what == "not_bitwise":
        row.update(bitwise=False, max_abs_diff=0.0078125)
    elif what == "no_startup_graph":
        s["graphs"], s["graph_keys"] = 12, s["graph_keys"][:-1]
    elif what == "not_sealed":
        s["sealed"] = False
    elif what == "capture_before_warmup":
        s["warmup_before_capture"] = False
    elif what == "failure":
        r["failures"].append("request 3: GraphCaptureAfterStartup")
    elif what == "non_finite":
        row["finite"] = False
    elif what == "few_requests":
        del r["requests"][50:]
    elif what == "tile_count_unseen":
        r["requests"] = [x for x in r["requests"] if x["tiles"] != [13]]
    return res


@pytest.mark.parametrize("what", ["captured_after_startup", "capture_guard", "compile_after_startup", "jit_monitor",
                                  "not_bitwise", "no_startup_graph", "not_sealed", "capture_before_warmup", "failure",
                                  "non_finite", "few_requests", "tile_count_unseen"])
def test_each_broken_condition_fails(what):
    res = broken(what)
    assert not c.verdict(res)["ok"], what


def test_tolerance_allows_rounding_only_when_asked():
    res = broken("not_bitwise")
    assert c.verdict(res, tolerance=0.01)["ok"] and not c.verdict(res, tolerance=0.001)["ok"]
