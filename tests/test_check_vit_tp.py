"""The tensor-parallel GPU check's verdict (benchmark/release/check_vit_tp.py), on synthetic rank reports:
every condition the check claims fails the run when broken (a rank that errored, outputs that differ
between ranks, a replay off its eager reference, a non-finite output, a capture or compile after
startup, a tower that is not sharded, no replay at all); a clean report passes. The GPU run itself
is benchmark/results/h200/vit_tp-<version>.md."""

from __future__ import annotations

import copy

import pytest

from benchmark.release import check_vit_tp  # noqa: E402


def mix(path="replay", digest="a"):
    return {"grids": [[1, 32, 32]], "tokens": 1024, "path": path, "finite": True, "rel_err": 0.0,
            "same_input_rel_err": 0.0, "same_input_max_abs_diff": 0.0, "graph_digest": digest, "eager_digest": digest}


def rank(r):
    return {"rank": r, "sglang": {"sglang_version": "0.5.23"}, "tp_world_size": 2, "custom_allreduce": "CustomAllReduceV2",
            "pynccl": True, "heads_per_rank": 8, "qkv_weight_rows_per_rank": 1920, "warmup_s": 0.2, "capture_s": 0.8,
            "budgets": {"budgets": [1024]}, "mixes": [mix(), mix("eager", "b")],
            "latency": [{"image": "448", "tokens": 1024, "eager_ms": 9.0, "graph_ms": 3.0, "eager_over_graph": 3.0}],
            "graphs_captured_after_startup": 0, "capture_guard_count": 0, "fa4_compiles_after_startup": 0,
            "jit_monitor_compiles_after_warmup": 0}


def test_clean_report_passes_and_renders():
    ranks = [rank(0), rank(1)]
    v = check_vit_tp.verdict(ranks)
    assert v["ok"] and v["replays"] == [1, 1] and v["bitwise_same_input"] == 4
    md = check_vit_tp.markdown({"meta": {"command": "c", "gpu": {"name": "H200"}}, "tp": 2, "ranks": ranks, "verdict": v})
    assert "verdict: **ok**" in md and "CustomAllReduceV2" in md


def broken(what):
    ranks = [rank(0), rank(1)]
    r1 = ranks[1]
    if what == "error":
        ranks[1] = {"rank": 1, "error": "Traceback: boom"}
    elif what == "ranks_differ":
        r1["mixes"][0]["graph_digest"] = "z"
    elif what == "replay_off":
        r1["mixes"][0]["same_input_rel_err"] = 0.5
    elif what == "non_finite":
        r1["mixes"][1]["finite"] = False
    elif what == "capture_after":
        r1["capture_guard_count"] = 1
    elif what == "compile_after":
        r1["jit_monitor_compiles_after_warmup"] = 2
    elif what == "not_sharded":
        r1["heads_per_rank"] = 16
    elif what == "no_replay":
        r1["mixes"] = [mix("eager"), mix("eager", "b")]
        ranks[0]["mixes"] = copy.deepcopy(r1["mixes"])
    return ranks


@pytest.mark.parametrize("what", ["error", "ranks_differ", "replay_off", "non_finite", "capture_after",
                                  "compile_after", "not_sharded", "no_replay"])
def test_each_broken_condition_fails(what):
    ranks = broken(what)
    v = check_vit_tp.verdict(ranks)
    assert not v["ok"], what
    md = check_vit_tp.markdown({"meta": {"command": "c"}, "tp": 2, "ranks": ranks, "verdict": v})
    assert "FAILED" in md
