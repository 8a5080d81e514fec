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
    """Three model shapes x batches 1-256 x contexts 1k-128k at page 16, plus pages 1 and 64 for the
    Llama shape (issue #42, item 3)."""
    full = decode.cases()
    assert decode.MODELS == {"llama3-8b": (32, 8, 128), "qwen2.5-7b": (28, 4, 128), "d256": (16, 8, 256)}
    assert len(full) == 3 * 6 * 4 + 6 * 4 * 2 and len({c.name for c in full}) == len(full)
    assert {(c.model, c.batch, c.context, c.page) for c in full} == {
        (m, b, x, p) for m in decode.MODELS for b in (1, 8, 32, 64, 128, 256) for x in (1024, 8192, 32768, 131072)
        for p in ((16, 1, 64) if m == "llama3-8b" else (16,))}
    assert all((c.hq, c.hkv, c.head_dim) == decode.MODELS[c.model] for c in full)
    assert set(decode.BACKENDS) == {"fa4_fp8_split_kv", "fa3_fp8", "triton_fp8", "fa3_bf16"}


def test_lengths_are_ragged_within_ten_percent_and_reproducible():
    import torch

    case = decode.Case("llama3-8b", 256, 8192, 16, 128, 32, 8)
    lens = decode.ragged_lens(case, torch.Generator().manual_seed(3))
    assert len(lens) == 256 and min(lens) >= round(8192 * 0.9) and max(lens) <= round(8192 * 1.1)
    assert max(lens) - min(lens) > 8192 * 0.15  # spread over the range, not one value
    assert lens == decode.ragged_lens(case, torch.Generator().manual_seed(3))
    one = decode.Case("llama3-8b", 3, 1, 1, 128, 32, 8)
    assert decode.ragged_lens(one, torch.Generator().manual_seed(0)) == [1, 1, 1]


def test_kv_bytes_is_one_read_of_k_and_v_plus_the_page_table():
    case = decode.Case("qwen2.5-7b", 64, 4096, 16, 128, 28, 4)
    lens = [4096] * 64
    assert decode.kv_bytes(lens, case, 1) == 2 * 64 * 4096 * 4 * 128 + 4 * 64 * 256  # 268 MB
    assert decode.kv_bytes(lens, case, 2) == 2 * 2 * 64 * 4096 * 4 * 128 + 4 * 64 * 256
    small = decode.Case("x", 1, 17, 16, 64, 1, 1)
    assert decode.kv_bytes([17], small, 1) == 2 * 17 * 64 + 4 * 2  # a partial last page
    assert decode.pool_bytes([17], small, 1) == 2 * 3 * 16 * 64  # 2 pages + SGLang's page 0


def test_layers_make_every_case_l2_cold():
    """Enough pools that one replay's calls span COLD_BYTES (each call on another layer's cache), at
    most MAX_LAYERS; one layer once a single cache is that large."""
    small = decode.Case("llama3-8b", 1, 1024, 16, 128, 32, 8)
    one = decode.kv_bytes([1024], small, 1)
    n = decode.layers_for([1024], small)
    assert n == min(decode.MAX_LAYERS, -(-decode.COLD_BYTES // one)) and n * one >= min(decode.COLD_BYTES, 48 * one)
    big = decode.Case("llama3-8b", 64, 32768, 16, 128, 32, 8)
    assert decode.kv_bytes([32768] * 64, big, 1) > decode.COLD_BYTES and decode.layers_for([32768] * 64, big) == 1
    mid = decode.Case("llama3-8b", 8, 8192, 16, 128, 32, 8)
    k = decode.layers_for([8192] * 8, mid)
    assert (k - 1) * decode.kv_bytes([8192] * 8, mid, 1) < decode.COLD_BYTES <= k * decode.kv_bytes([8192] * 8, mid, 1)


def test_wide_table_points_past_the_pages_at_page_zero():
    torch = __import__("torch")
    case = decode.Case("smoke", 2, 40, 16, 64, 4, 1)
    x = decode.make_inputs(case, "cpu", 5, wide_tokens=1024)
    assert x["table"].shape == (2, 64)
    for b, n in enumerate(x["lens"]):
        used = -(-n // 16)
        assert (x["table"][b, :used] > 0).all() and (x["table"][b, used:] == 0).all()
    assert sorted(torch.cat([x["table"][b, :-(-n // 16)] for b, n in enumerate(x["lens"])]).tolist()) == list(
        range(1, x["k"].shape[0]))


def test_markdown_has_time_spread_bandwidth_copy_share_error_and_the_ratios():
    rows = [dict(name="llama3-8b b64 ctx4096 P16", backend="fa4_fp8_split_kv", median_us=100.0, spread=0.04,
                 gbps=2684.0, copy_fraction=0.65, rel_err=3e-3, speedup_vs_fa3_fp8=1.38, speedup_vs_fa3_bf16=2.1,
                 speedup_vs_fa3_fp8_range=[1.31, 1.42], speedup_vs_fa3_bf16_range=[2.05, 2.2]),
            dict(name="llama3-8b b64 ctx4096 P16", backend="fa3_fp8", median_us=138.0, spread=0.02, gbps=1945.0,
                 rel_err=4e-3, speedup_vs_fa3_fp8=1.0),
            dict(name="llama3-8b b64 ctx4096 P16", backend="fa3_bf16", median_us=210.0, spread=0.01, gbps=2557.0,
                 rel_err=2e-3),
            dict(name="llama3-8b b64 ctx4096 P16", backend="triton_fp8", error="ImportError: no sglang")]
    result = {"meta": {"command": "sglang-fa4 bench decode", "gpu": {"name": "H200"}, "ceilings": {"copy_gbps": 4100.0},
                       "settings": {"backends": ["fa4_fp8_split_kv", "fa3_fp8", "fa3_bf16", "triton_fp8"]}},
              "rows": rows}
    md = decode.markdown(result)
    assert "device copy rate (4100 GB/s, same process)" in md and "L2-cold" in md
    assert ("| llama3-8b b64 ctx4096 P16 | 100.0 ±4% · 2684 GB/s (65%) · 3.0e-03 | 138.0 ±2% · 1945 GB/s · 4.0e-03 | "
            "210.0 ±1% · 2557 GB/s · 2.0e-03 | — ImportError: no sglang | 1.38x (1.31-1.42) | 2.10x (2.05-2.20) | — |") in md, md


def test_cli_has_decode(capsys):
    from sglang_fa4.cli import build_parser, main

    with pytest.raises(SystemExit) as exc:
        main(["bench", "decode", "--help"])
    assert exc.value.code == 0 and "bench decode" in capsys.readouterr().out
    args = build_parser().parse_args(["bench", "decode", "--batches", "8", "--contexts", "32768", "--pages", "16",
                                      "--models", "d256", "--tag", "x", "--num-splits", "12", "--wide-table", "131072",
                                      "--no-extra-pages"])
    assert (args.batches, args.contexts, args.pages, args.models, args.rounds, args.tag, args.num_splits,
            args.wide_table, args.extra_pages) == ([8], [32768], [16], ["d256"], 7, "x", 12, 131072, False)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "decode", "--models", "gemma"])


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
            case = decode.Case(r["model"], r["batch"], r["context"], r["page"], r["head_dim"], r["hq"], r["hkv"])
            assert r["layers"] == 1 and r["lens_min"] >= 1
            lens = decode.ragged_lens(case, __import__("torch").Generator().manual_seed(1000 + smoke.index(case)))
            assert r["kv_bytes"] == decode.kv_bytes(lens, case, 1) and (min(lens), max(lens)) == (r["lens_min"], r["lens_max"])
            assert r["gbps"] == pytest.approx(r["kv_bytes"] / (r["median_us"] * 1e-6) / 1e9)
        else:
            assert r["error"] == "RuntimeError: needs a CUDA GPU" and "median_us" not in r, r
    md = (tmp_path / "decode.md").read_text()
    assert all(f"| {c.name} |" in md for c in smoke)


def test_cpu_smoke_times_the_launch_candidate_beside_the_default(tmp_path):
    """``fa4_fp8_split_kv_candidate``: the kernel with decode_plan.CANDIDATE (the launch change under
    evaluation), checked against fp32 and timed in the same rounds as the default, with its own ratio
    columns."""
    pytest.importorskip("triton")
    from sglang_fa4.kernels.fp8_paged_kv.decode_plan import CANDIDATE

    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-m", "sglang_fa4.cli", "bench", "decode", "--cpu-smoke", "--backends",
                        "fa4_fp8_split_kv", decode.CANDIDATE, "fa3_fp8", "--out-dir", str(tmp_path)],
                       env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = json.loads((tmp_path / "decode.json").read_text())["rows"]
    ours = {(r["name"], r["backend"]): r for r in rows if r["backend"] in decode.OURS}
    assert len(ours) == 2 * len(decode.cases(**decode.SMOKE))
    for (name, backend), r in ours.items():
        assert "error" not in r and r["finite"] and r["rel_err"] < 1e-2 and len(r["per_round_us"]) == 2, r
        # d128: the default launch is whole and capped at 128 registers, the candidate's its own
        want = (CANDIDATE["d_pieces"], CANDIDATE["maxnreg"]) if backend == decode.CANDIDATE else (1, 128)
        assert (r["splits"]["d_pieces"], r["splits"]["maxnreg"]) == want and r["splits"]["prefetch_pages"] is True
        # the same keys in the same order: the same error against fp32
        assert r["rel_err"] == pytest.approx(ours[(name, "fa4_fp8_split_kv")]["rel_err"], rel=1e-6)
    md = (tmp_path / "decode.md").read_text()
    assert "| ours vs fa3_fp8 | candidate vs fa3_fp8 |" in md


def test_the_candidate_launch_per_head_dim_and_its_refusals():
    """``--candidate``: one launch for every head dim, or one per head dim (a head dim left out runs the
    default launch); default decode_plan.CANDIDATE. A malformed one is refused by name."""
    from sglang_fa4.kernels.fp8_paged_kv import PagedKVError
    from sglang_fa4.kernels.fp8_paged_kv.decode_plan import CANDIDATE, plan

    assert decode.candidate_launch(None, 256) == CANDIDATE
    assert decode.candidate_launch({"d_pieces": 2}, 128) == {"d_pieces": 2}
    per = {"256": {"d_pieces": 2, "maxnreg": 168, "programs_per_sm": 3}, "512": {"block_n": 16}}
    assert decode.candidate_launch(per, 256) == per["256"] and decode.candidate_launch(per, 512) == per["512"]
    assert decode.candidate_launch(per, 128) == {}
    with pytest.raises(ValueError, match="must be a JSON object, got 3"):
        decode.candidate_launch(3, 128)
    with pytest.raises(ValueError, match="mixes head-dim keys and launch keys"):
        decode.candidate_launch({"128": {}, "block_n": 32}, 128)
    with pytest.raises(ValueError, match="for head dim 128 must be a JSON object, got 32"):
        decode.candidate_launch({"128": 32}, 128)
    with pytest.raises(PagedKVError, match=r"launch overrides \['d_piece'\] are not among"):
        plan(1, 1, 2, 256, 1, 8192, 132, launch={"d_piece": 2})


@pytest.mark.parametrize("candidate,message", [('{"d_piece": 2}', "launch overrides ['d_piece']"),
                                               ('{"256": {"d_pieces": 3}}', "d_pieces must be 1 or 2, got 3"),
                                               ("[1]", "must be a JSON object")])
def test_a_malformed_candidate_stops_the_command_before_any_case(tmp_path, candidate, message):
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-m", "sglang_fa4.cli", "bench", "decode", "--cpu-smoke", "--backends",
                        "fa4_fp8_split_kv", decode.CANDIDATE, "--candidate", candidate, "--out-dir", str(tmp_path)],
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode != 0 and f"--candidate: " in p.stderr and message in p.stderr, p.stderr[-2000:]
    assert not (tmp_path / "decode.json").exists()


def test_a_per_head_dim_candidate_reaches_the_kernel(tmp_path):
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    cand = {"128": {"d_pieces": 2}}
    p = subprocess.run([sys.executable, "-m", "sglang_fa4.cli", "bench", "decode", "--cpu-smoke", "--backends",
                        "fa4_fp8_split_kv", decode.CANDIDATE, "--candidate", json.dumps(cand), "--out-dir",
                        str(tmp_path)], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads((tmp_path / "decode.json").read_text())
    assert res["meta"]["settings"]["candidate"] == cand
    rows = [r for r in res["rows"] if r["backend"] in decode.OURS]
    assert rows and all("error" not in r and r["rel_err"] < 1e-2 for r in rows), rows
    assert {(r["backend"], r["splits"]["d_pieces"]) for r in rows} == {("fa4_fp8_split_kv", 1), (decode.CANDIDATE, 2)}
