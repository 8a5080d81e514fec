"""benchmark/release/check_fp8_attention.py without a GPU: it checks the default kernels only (no call
passes a kernel config other than the table's), and its report renders the sections it has."""

from __future__ import annotations

import ast
import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmark" / "release" / "check_fp8_attention.py"


def load():
    spec = importlib.util.spec_from_file_location("check_fp8_attention", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_fp8_call_runs_the_tables_config():
    tree = ast.parse(SCRIPT.read_text())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "attr", None) == "fp8_varlen_attention"]
    assert len(calls) >= 4  # correctness (vt and v paths, +-448), speed, host
    assert [c.lineno for c in calls if any(k.arg == "kernel_config" for k in c.keywords)] == []
    assert "config_for" not in SCRIPT.read_text()


def test_render_has_the_correctness_speed_and_fault_tables(tmp_path, monkeypatch):
    mod = load()
    result = {"command": "x", "env": {"gpu": "H200"}, "sections": {
        "correctness": [{"case": "2seq", "d": 128, "mask": "full", "err_ref": 0.02, "err_vs_fa4_bf16": 0.03,
                         "fa4_bf16_err": 0.003, "finite": True, "ok": True}],
        "speed": [{"shape": "8x4096", "d": 128, "causal": False, "fp8_us": 700.0, "fp8_tflops": 780.0,
                   "bf16_us": 900.0, "bf16_tflops": 610.0, "speedup": 1.29}],
        "faults": [{"kernel": "fp8", "case": "1x16384", "error": "illegal address"}]}}
    path = tmp_path / "fp8_attention.json"
    path.write_text(json.dumps(result))
    monkeypatch.setattr("sys.argv", ["check_fp8_attention.py", "--render", str(path)])
    mod.main()
    md = path.with_suffix(".md").read_text()
    assert "| 2seq | 128 | full | 2.00e-02 | 3.00e-02 | 3.00e-03 | True | True |" in md
    assert "| 8x4096 | 128 | False | 700.0 | 780 | 900.0 | 610 | 1.29 |" in md
    assert "| 1x16384 | fp8 | illegal address |" in md
    assert "variant" not in md.lower() and "bring-up" not in md.lower()
