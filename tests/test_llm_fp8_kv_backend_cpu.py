"""benchmark/check_fp8_kv_backend.py's whole path on a CPU (``--cpu-smoke``): SGLang's real
FlashAttentionBackend built by ATTENTION_BACKENDS["fa4"] from SGLang's test-kit model runner with
an fp8_e4m3 MHATokenToKVPool, a RadixAttention layer on a ForwardBatch (extend with a cached
prefix, decode), the plugin loaded by SGLang's plugin loader; the FP8 kernel replaced by the torch
model of its contract and the SM90 check faked. Every forward must take the FP8 route (once) and
match fp32 on the dequantized pool."""

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
        [sys.executable, str(ROOT / "benchmark" / "check_fp8_kv_backend.py"), "--out", str(tmp_path), "--cpu-smoke",
         "--layers", "qwen2.5-7b d128"], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / f"fp8_kv_backend-{sglang_version}.json").read_text())
    assert result["env"]["dispatch_hooked"] and result["env"]["prepare_query_hooked"]
    rows = result["correctness"]
    assert {(r["page_size"], r["case"]) for r in rows} == {(p, c) for p in (1, 16, 64) for c in ("extend+prefix", "decode")}
    for r in rows:
        assert "error" not in r, r.get("trace")
        # bf16 output rounding only: the kernel is modelled in fp32
        assert r["routed_calls"] == 1 and r["finite"] and r["rel_err"] < 1e-2 and r["pass"], r
