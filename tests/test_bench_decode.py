"""`sglang-fa4 bench decode` (sglang_fa4/bench/decode.py): the case matrix, the bandwidth arithmetic,
the report, and the whole command in its CPU smoke mode (the kernel in Triton's interpreter, the
GPU-only backends recorded as unavailable)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_fa4.bench import decode

ROOT = Path(__file__).resolve().parents[1]


def test_the_matrix_is_the_issues():
    full = decode.cases(decode.BATCHES, decode.CONTEXTS, decode.PAGES, decode.HEAD_DIMS)
    assert len(full) == 4 * 4 * 3 * 2 and len({c.name for c in full}) == 96
    assert {(c.batch, c.context, c.page, c.head_dim) for c in full} == {
        (b, x, p, d) for b in (1, 8, 32, 64) for x in (1024, 8192, 32768, 131072) for p in (1, 16, 64) for d in (128, 256)}
    assert {(c.head_dim, c.hq, c.hkv) for c in full} == {(128, 28, 4), (256, 16, 4)}


def test_kv_bytes_is_one_read_of_k_and_v_plus_the_page_table():
    case = decode.Case(64, 4096, 16, 128, 28, 4)
    assert decode.kv_bytes(case, 1) == 2 * 64 * 4096 * 4 * 128 + 4 * 64 * 256  # 268 MB: the issue's FA3 figure
    assert decode.kv_bytes(case, 2) == 2 * 2 * 64 * 4096 * 4 * 128 + 4 * 64 * 256
    assert decode.kv_bytes(decode.Case(1, 17, 16, 64, 1, 1), 1) == 2 * 17 * 64 + 4 * 2  # a partial last page


def test_markdown_has_time_spread_bandwidth_error_and_the_ratio():
    rows = [dict(name="b64 ctx4096 P16 d128", backend="fa4_fp8_split_kv", median_us=100.0, spread=0.04, gbps=2684.0,
                 rel_err=3e-3, speedup_vs_fa3_fp8=1.38),
            dict(name="b64 ctx4096 P16 d128", backend="fa3_fp8", median_us=138.0, spread=0.02, gbps=1945.0,
                 rel_err=4e-3, speedup_vs_fa3_fp8=1.0),
            dict(name="b64 ctx4096 P16 d128", backend="triton_fp8", error="ImportError: no sglang")]
    result = {"meta": {"command": "sglang-fa4 bench decode", "gpu": {"name": "H200"}, "ceilings": {"copy_gbps": 4100.0},
                       "settings": {"backends": ["fa4_fp8_split_kv", "fa3_fp8", "triton_fp8"]}}, "rows": rows}
    md = decode.markdown(result)
    assert "(device copy rate 4100 GB/s)" in md
    assert ("| b64 ctx4096 P16 d128 | 100.0 ±4% · 2684 GB/s · 3.0e-03 | 138.0 ±2% · 1945 GB/s · 4.0e-03 | "
            "— ImportError: no sglang | 1.38x |") in md, md


def test_cli_has_decode(capsys):
    from sglang_fa4.cli import build_parser, main

    with pytest.raises(SystemExit) as exc:
        main(["bench", "decode", "--help"])
    assert exc.value.code == 0 and "bench decode" in capsys.readouterr().out
    args = build_parser().parse_args(["bench", "decode", "--batches", "8", "--contexts", "32768", "--pages", "16",
                                      "--head-dims", "256", "--tag", "x", "--num-splits", "12"])
    assert (args.batches, args.contexts, args.pages, args.head_dims, args.rounds, args.tag, args.num_splits) == (
        [8], [32768], [16], [256], 11, "x", 12)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "decode", "--head-dims", "96"])


def test_smoke_needs_the_interpreter(monkeypatch, tmp_path):
    from sglang_fa4.cli import build_parser

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    args = build_parser().parse_args(["bench", "decode", "--cpu-smoke", "--out-dir", str(tmp_path)])
    with pytest.raises(SystemExit, match="TRITON_INTERPRET=1"):
        decode.run(args)


def test_cpu_smoke_runs_the_command_end_to_end(tmp_path):
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-m", "sglang_fa4.cli", "bench", "decode", "--cpu-smoke", "--out-dir", str(tmp_path)], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    result = json.loads((tmp_path / "decode.json").read_text())
    assert result["meta"]["partial"] is False and result["meta"]["settings"]["rounds"] == 2
    assert result["meta"]["settings"]["num_splits"] == "heuristic"
    rows = result["rows"]
    smoke = decode.cases(**decode.SMOKE)
    assert len(rows) == len(smoke) * len(decode.BACKENDS)
    for r in rows:
        if r["backend"] == "fa4_fp8_split_kv":  # ran, checked against fp32, timed
            assert r["finite"] and r["rel_err"] < 1e-2 and len(r["per_round_us"]) == 2 and "error" not in r, r
            case = decode.Case(r["batch"], r["context"], r["page"], r["head_dim"], r["hq"], r["hkv"])
            assert r["kv_bytes"] == decode.kv_bytes(case, 1)
            assert r["gbps"] == pytest.approx(r["kv_bytes"] / (r["median_us"] * 1e-6) / 1e9)
        else:
            assert r["error"] == "RuntimeError: needs a CUDA GPU" and "median_us" not in r, r
    md = (tmp_path / "decode.md").read_text()
    assert all(f"| {c.name} |" in md for c in smoke)
