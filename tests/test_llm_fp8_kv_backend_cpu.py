"""benchmark/release/check_fp8_kv_backend.py's whole path on a CPU (``--cpu-smoke``): SGLang's real
FlashAttentionBackend built by ATTENTION_BACKENDS["fa4"] from SGLang's test-kit model runner with
an fp8_e4m3 MHATokenToKVPool, a RadixAttention layer on a ForwardBatch (extend with a cached
prefix, decode), the plugin loaded by SGLang's plugin loader; the FP8 kernel replaced by the torch
model of its contract and the SM90 check faked. Every forward must take the FP8 route (once) and
match fp32 on the dequantized pool. The FA3-FP8 column runs SGLang's own fa3 backend (built by
ATTENTION_BACKENDS["fa3"]) through benchmark/sglang_on_gpu/fa3_seam.py, FA3 modelled in fp32: each
of its forwards must reach the seam once (SGLang's call mapped onto the FA3 build's arguments)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from sglang_harness import target_dir

ROOT = Path(__file__).resolve().parents[1]


def test_real_backend_and_pool_route_to_the_fp8_kernel(sglang_version, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target_dir(sglang_version)), str(ROOT)]),
           "SGLANG_IS_FLASHINFER_AVAILABLE": "false", "SGLANG_FA4_WARMUP": "0"}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmark" / "release" / "check_fp8_kv_backend.py"), "--out", str(tmp_path), "--cpu-smoke",
         "--layers", "qwen2.5-7b d128"], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / f"fp8_kv_backend-{sglang_version}.json").read_text())
    assert result["env"]["dispatch_hooked"] and result["env"]["prepare_query_hooked"]
    assert result["env"]["fa3"] == "fp32 torch model (cpu smoke)"
    rows = result["correctness"]
    assert {(r["backend"], r["page_size"], r["case"]) for r in rows} == {
        (b, p, c) for b in ("fa4", "fa3") for p in (1, 16, 64) for c in ("extend+prefix", "decode")}
    for r in rows:
        assert "error" not in r, r.get("trace")
        # bf16 output rounding only: the kernels are modelled in fp32
        calls = r["routed_calls"] if r["backend"] == "fa4" else r["fa3_calls"]
        assert calls == 1 and r["finite"] and r["rel_err"] < 1e-2 and r["pass"], r
        # a second forward on the same k/v writes the same pool bytes (the timing replays it;
        # SGLang's fp8 set_kv_buffer divides its k/v in place, sglang_llm_layer restores them)
        assert r["repeatable"], r
    assert "| fa3-fp8 | qwen2.5-7b d128 (28/4/128) | 64 | decode |" in (
        tmp_path / f"fp8_kv_backend-{sglang_version}.md").read_text()


def test_one_run_table_has_every_column_its_check_and_the_ratios():
    import importlib.util

    spec = importlib.util.spec_from_file_location("check_fp8_kv_backend", ROOT / "benchmark" / "release" / "check_fp8_kv_backend.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    ok = {"rel_err": 1.9e-2, "finite": True, "pass": True}
    row = {"shape": "prefill 8k", "layer": "qwen2.5-7b d128", "page_size": 16, "fa4_fp8_ms": 0.70, "fa4_fp8_how": "graph",
           "fa4_fp8_check": {**ok, "calls": 1}, "fa4_bf16_ms": 0.80, "fa4_bf16_how": "graph", "fa4_bf16_check": ok,
           "triton_fp8_ms": 2.7, "triton_fp8_how": "eager events", "triton_fp8_check": {**ok, "pass": False},
           "triton_bf16_error": "skipped: time budget", "fa3_fp8_error": "FA3-FP8 not measured: absent",
           "fa4_bf16_over_fa4_fp8": 0.8 / 0.7, "fa4_fp8_rounds": [0.7] * 5}
    r = {"command": "x", "env": {"sglang": "0.5.23"}, "correctness": [], "speed": [row], "notes": []}
    md = mod.markdown(r)
    line = next(ln for ln in md.splitlines() if ln.startswith("| prefill 8k |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[3:] == ["0.700 (1.9e-02)", "0.800 (1.9e-02)", "2.700 (eager) (1.9e-02 FAIL)", "n/a", "n/a",
                         "1.143x", "-x"]
    assert "median of 5 interleaved rounds" in md and "FA3-FP8 not measured: absent" in md
    assert "qwen2.5-7b d128 MET (1.143x)" in md

