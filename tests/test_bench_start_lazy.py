"""benchmark/perf/bench_start_lazy.py's arithmetic and report on CPU (the runs need a GPU): FA4's added
start time is the median over rounds of each restart's load + warmup minus the same round's
baseline; the bar is <= 1 s with the store; the lazy restart must import neither flash_attn nor
cutlass, load every variant from a stored library, and its first calls must equal FA4's bitwise."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    from benchmark.perf import bench_start_lazy

    return bench_start_lazy


def _run(variant, rnd, load, warm, heavy=(), from_libs=2, compiled=0, bitwise=None):
    r = {"variant": variant, "round": rnd, "load_s": load, "warmup_s": warm, "start_s": load + warm,
         "process_wall_s": load + warm + 5, "heavy_after_start": list(heavy)}
    if variant != "baseline":
        r.update(fa4={"resolved": 2, "compiled": compiled, "from_shared_library": from_libs, "failures": 0},
                 triton={"resolved": 3, "compiled": 0}, host_us_per_launch=9.0)
    if bitwise is not None:
        r["bitwise"] = {"all_bitwise": bitwise, "heavy_before_fa4_import": [], "resolved_by_these_calls": 0,
                        "fa4_import_s": 6.5, "layouts": {"full_2_images": {
                            "segments": 2, "eager_bitwise": bitwise, "graph_replay_bitwise": True,
                            "rel_err_vs_fp32": 2e-3, "fa4_rel_err_vs_fp32": 2e-3}}}
    return r


def _runs(lazy_warm=0.3, heavy=(), bitwise=True):
    runs = [_run("fill", 0, 3.0, 20.0, heavy=("cutlass", "flash_attn", "quack"), from_libs=0, compiled=2)]
    for i, base in enumerate((2.8, 3.0, 2.9)):
        runs += [_run("baseline", i, base, 0.0),
                 _run("lazy", i, base + 0.1, lazy_warm, heavy=heavy, bitwise=bitwise if i == 0 else None),
                 _run("fa4_disk", i, base + 5.0, 1.5, heavy=("cutlass", "flash_attn", "quack"), from_libs=0)]
    return runs


def test_added_time_bar_and_checks(bench):
    s = bench.summarize(_runs())
    assert s["lazy"]["added_s"] == pytest.approx(0.4) and s["fa4_disk"]["added_s"] == pytest.approx(6.5)
    assert s["lazy"]["added_s_each"] == [0.4, 0.4, 0.4] and s["lazy"]["runs"] == 3
    assert s["bar_lazy_added_le_1s"] and s["lazy_imports_no_fa4"] and s["lazy_all_from_shared_libraries"]
    assert s["first_calls_bitwise_equal_fa4"] and s["restarts_compile_nothing"] and s["errors"] == []
    assert not bench.summarize(_runs(lazy_warm=1.5))["bar_lazy_added_le_1s"]
    assert not bench.summarize(_runs(heavy=("cutlass",)))["lazy_imports_no_fa4"]
    assert not bench.summarize(_runs(bitwise=False))["first_calls_bitwise_equal_fa4"]
    runs = _runs()
    runs[2] = {"variant": "lazy", "round": 0, "error": "rc 1: boom"}  # one failing run is recorded, not fatal
    s = bench.summarize(runs)
    assert s["errors"] == ["lazy round 0: rc 1: boom"] and s["lazy"]["runs"] == 2
    assert not s["first_calls_bitwise_equal_fa4"]  # its check did not run


def test_markdown_and_importtime(bench):
    stderr = "\n".join([
        "import time: 5 | 5 | os", bench.MARK,
        "import time:     30000 |      30000 |   tvm_ffi.core",
        "import time:    400000 |     900000 |     cutlass._mlir",
        "import time:    600000 |    2000000 | flash_attn.cute.interface",
        "import time:    100000 |     100000 |   cutlass.cute"])
    groups = bench.importtime_groups(stderr)
    assert groups == {"flash_attn": 0.6, "cutlass": 0.5, "tvm_ffi": 0.03}
    runs = _runs() + [{"variant": "breakdown", "round": 0, "import_self_s_by_package": groups,
                       "import_flash_attn_cute_s": 2.3, "import_tvm_ffi_s": 0.03, "dlopen_runtime_s": 0.004,
                       "load_one_library_s": 0.001, "process_wall_s": 9.0}]
    res = {"meta": {"command": "python3 benchmark/perf/bench_start_lazy.py --out x.json", "versions": {"torch": "2.11"},
                    "load_gb": 16.6, "tensors": 729}, "runs": runs, "summary": bench.summarize(runs)}
    md = bench.markdown(res)
    assert "| lazy | 0 | 2.90 | 0.30 | 3.20 | 2 / 2 / 0 | none | 9.0 |" in md
    assert "| lazy | 0.4 | [0.4, 0.4, 0.4] |" in md and "| full_2_images | 2 | True | True |" in md
    assert "flash_attn 0.6 s, cutlass 0.5 s" in md and "Bar (FA4 adds <= 1 s, restart with the store): met" in md


def test_a_breakdown_run_goes_through_run_and_summarize(bench, monkeypatch, tmp_path):
    """The H200 run's summary raised KeyError('variant'): the breakdown child's result holds no
    variant/round; run() now tags every result it reads."""
    import json
    import subprocess

    class Done:
        returncode, stderr = 0, "import time:      1200 |       1200 | cutlass\n"

    def fake_run(cmd, **kwargs):
        Path(cmd[cmd.index("--result") + 1]).write_text(json.dumps({"import_flash_attn_cute_s": 2.0}))
        return Done()

    monkeypatch.setattr(subprocess, "run", fake_run)
    args = type("A", (), {"timeout": 5, "load_gb": 1.0, "tensors": 1})()
    r = bench.run("breakdown", tmp_path, args)
    assert r["variant"] == "breakdown" and r["round"] == 0
    bench.summarize(_runs() + [r])  # no KeyError
