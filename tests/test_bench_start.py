"""benchmark/perf/bench_start.py's arithmetic and report on CPU (the runs themselves need a GPU):
FA4's added start time is each variant's load + warmup minus the baseline's, the bar is <= 1 s with
the preload, and a restart must compile and resolve nothing."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench_start():
    spec = importlib.util.spec_from_file_location("bench_start", ROOT / "benchmark" / "perf" / "bench_start.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(variant, load, warm, fa4_compiled=0, triton_compiled=0, resolved_after=0):
    r = {"variant": variant, "load_s": load, "warmup_s": warm, "start_s": load + warm, "process_wall_s": load + warm + 3}
    if variant != "baseline":
        r.update(fa4={"compiled": fa4_compiled, "resolved": 2}, triton={"compiled": triton_compiled, "loaded_from_disk": 3},
                 import_in_background_s=7.1)
        if variant != "first_start":
            r["after_warmup"] = {"calls": 40, "fa4_resolved": resolved_after, "triton_resolved": 0}
    return r


def test_added_time_and_bar(bench_start):
    runs = {"baseline": _run("baseline", 5.0, 0.0), "preload": _run("preload", 5.2, 0.6),
            "no_preload": _run("no_preload", 5.0, 7.5)}
    s = bench_start.summarize(runs)
    assert s["preload"]["added_s"] == pytest.approx(0.8) and s["no_preload"]["added_s"] == pytest.approx(7.5)
    assert s["bar_added_le_1s"] is True and s["restart_compiles_nothing"] is True
    runs["preload"] = _run("preload", 5.2, 2.0)
    assert bench_start.summarize(runs)["bar_added_le_1s"] is False
    runs["preload"] = _run("preload", 5.2, 0.1, resolved_after=1)  # a compile after the warmup
    assert bench_start.summarize(runs)["restart_compiles_nothing"] is False


def test_markdown(bench_start):
    runs = {"first_start": _run("first_start", 5.0, 9.0, fa4_compiled=2, triton_compiled=3),
            "baseline": _run("baseline", 5.0, 0.0), "preload": _run("preload", 5.1, 0.4)}
    res = {"meta": {"command": "python3 benchmark/perf/bench_start.py --out x.json", "versions": {"torch": "2.11"},
                    "load_gb": 16.6, "tensors": 729},
           "runs": runs, "summary": bench_start.summarize(runs)}
    md = bench_start.markdown(res)
    assert "| preload | 5.10 | 0.40 | 5.50 | +0.50 |" in md and "| first_start |" in md
    assert "Bar (FA4 adds <= 1 s with the preload, restart): met" in md
