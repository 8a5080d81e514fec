"""CPU-side logic of `sglang-fa4 bench kernels|vit` and the TMEM red-max script: layouts and the
Qwen2.5-VL window partition, paired statistics, the result schema and reports, the CLI, and (where
torch / transformers are installed) the SDPA varlen path and the transformers attention routing."""

from __future__ import annotations

import json
import time
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_fa4.bench import layouts, report, stats
from sglang_fa4.bench.layouts import PICTURES, QWEN3_VL, QWEN25_VL, kernel_layout

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmark" / "results" / "h200"


# ---------------------------------------------------------------- layouts


def test_synthetic_layouts():
    lay = kernel_layout("700x64")
    assert lay.segments == 700 and lay.total == 44800 and lay.max_seqlen == 64 and lay.uniform
    assert kernel_layout("1x16384").seqlens == (16384,)
    mixed = kernel_layout("mixed")
    assert mixed.seqlens == layouts.MIXED_SEQLENS and not mixed.uniform
    for name in layouts.DEFAULT_KERNEL_LAYOUTS + layouts.QUICK_KERNEL_LAYOUTS:
        assert kernel_layout(name).total > 0
    for bad in ("0x64", "8x0", "win999", "foo", "8by4096"):
        with pytest.raises(ValueError):
            kernel_layout(bad)


def test_cu_roundtrip_and_costs():
    assert layouts.cu_from_seqlens([3, 0, 5]) == [0, 3, 3, 8]
    assert layouts.seqlens_from_cu([0, 3, 3, 8]) == [3, 0, 5]
    lay = kernel_layout("2x128")
    assert lay.cu_seqlens() == [0, 128, 256]
    assert lay.attn_flops(16, 64) == 4 * 16 * 64 * 2 * 128 * 128
    assert lay.io_bytes(16, 64) == 4 * 256 * 16 * 64 * 2
    with pytest.raises(ValueError):
        layouts.cu_from_seqlens([1, -1])


def test_smart_resize_known_values():
    f = QWEN25_VL.factor
    assert f == 28
    assert layouts.smart_resize(448, 448, f, layouts.QWEN25_MIN_PIXELS, layouts.QWEN25_MAX_PIXELS) == (448, 448)
    assert layouts.smart_resize(720, 1280, f, layouts.QWEN25_MIN_PIXELS, layouts.QWEN25_MAX_PIXELS) == (728, 1288)
    assert layouts.smart_resize(2160, 3840, f, layouts.QWEN25_MIN_PIXELS, layouts.QWEN25_MAX_PIXELS) == (2156, 3836)
    # over max_pixels: scaled down, still multiples of the factor
    h, w = layouts.smart_resize(8000, 8000, f, 3136, 1_000_000)
    assert h % f == 0 and w % f == 0 and h * w <= 1_000_000
    # under min_pixels: scaled up
    h, w = layouts.smart_resize(20, 20, f, 3136, 10**7)
    assert h * w >= 3136
    with pytest.raises(ValueError):
        layouts.smart_resize(1, 500, f, 1, 10**9)


def test_picture_grids():
    assert QWEN25_VL.grid_thw(448, 448) == (1, 32, 32)
    assert QWEN25_VL.grid_thw(1280, 720) == (1, 52, 92)
    assert QWEN25_VL.grid_thw(1920, 1080) == (1, 78, 138)
    assert QWEN25_VL.grid_thw(3840, 2160) == (1, 154, 274)
    assert QWEN25_VL.grid_thw(640, 360, 32) == (16, 26, 46)
    assert QWEN3_VL.grid_thw(3840, 2160) == (1, 136, 240)
    assert QWEN3_VL.full_seqlens([(16, 22, 40)]) == [880] * 16
    with pytest.raises(ValueError):
        QWEN3_VL.window_seqlens([(1, 28, 28)])


def test_window_partition_by_hand():
    # 10x6 patches -> 5x3 merged units; 4-unit windows: rows [4, 1], cols [3]
    assert QWEN25_VL.window_seqlens([(1, 10, 6)]) == [4 * 3 * 4, 1 * 3 * 4]
    # a multiple of the window: no empty edge windows
    assert QWEN25_VL.window_seqlens([(1, 16, 16)]) == [64] * 4
    # frames repeat the per-frame windows; images concatenate
    assert QWEN25_VL.window_seqlens([(2, 10, 6), (1, 8, 8)]) == [48, 12, 48, 12, 64]


@pytest.mark.parametrize("name,count", [("win448", 16), ("win720p", 84), ("win1080p", 180), ("win4k", 700)])
def test_qwen_window_layouts(name, count):
    lay = kernel_layout(name)
    picture = PICTURES[name[3:]]
    grid = QWEN25_VL.grid_thw(*picture)
    assert lay.segments == count
    assert lay.total == grid[0] * grid[1] * grid[2]
    assert lay.max_seqlen == 64 and min(lay.seqlens) > 0
    assert all(n % 4 == 0 for n in lay.seqlens)  # whole 2x2 merge units


def test_window_partition_matches_transformers():
    torch = pytest.importorskip("torch")
    from transformers import vision_utils as vu  # a pinned test dependency (tests/requirements-sglang.txt)
    grids = [QWEN25_VL.grid_thw(*p) for p in PICTURES.values()] + [(1, 10, 6), (3, 18, 34), (1, 2, 2), (2, 64, 8)]
    for g in grids:
        _, cu = vu.get_vision_window_index(torch.tensor([g]), 2, 112, 14)
        assert cu.tolist() == layouts.cu_from_seqlens(QWEN25_VL.window_seqlens([g])), g
    _, cu = vu.get_vision_window_index(torch.tensor(grids), 2, 112, 14)
    assert cu.tolist() == layouts.cu_from_seqlens(QWEN25_VL.window_seqlens(grids))


# ---------------------------------------------------------------- statistics


def test_median():
    assert stats.median([3, 1, 2]) == 2
    assert stats.median([4, 1, 3, 2]) == 2.5
    with pytest.raises(ValueError):
        stats.median([])


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_round_order_alternates_every_pair(n):
    names = [f"b{i}" for i in range(n)]
    rounds = 2 * n
    orders = [stats.round_order(names, r) for r in range(rounds)]
    assert all(sorted(o) == names for o in orders)
    for j in range(n):
        even, odd = orders[2 * j], orders[2 * j + 1]
        for a in names:
            for b in names:
                if a != b:
                    assert (even.index(a) < even.index(b)) != (odd.index(a) < odd.index(b))
    firsts = [o[0] for o in orders]
    assert all(firsts.count(x) == firsts.count(names[0]) for x in names)
    assert stats.round_order([], 3) == []


def test_paired_summary():
    a = [1.0, 1.0, 1.0, 2.0]
    b = [2.0, 3.0, 0.5, 4.0]
    s = stats.paired(a, b)
    assert s["rounds"] == 4
    assert s["median_ratio"] == pytest.approx(2.0)  # ratios 2, 3, 0.5, 2
    assert (s["wins_a"], s["wins_b"]) == (3, 1)
    assert s["min_ratio"] == 0.5 and s["max_ratio"] == 3.0
    with pytest.raises(ValueError):
        stats.paired([1.0], [1.0, 2.0])
    with pytest.raises(ValueError):
        stats.paired([0.0], [1.0])


def test_all_pairs():
    out = stats.all_pairs({"x": [1.0, 1.0], "y": [2.0, 2.0], "z": [], "w": [4.0, 4.0]})
    assert [(p["a"], p["b"]) for p in out] == [("x", "y"), ("x", "w"), ("y", "w")]
    assert out[0]["median_ratio"] == 2.0


# ---------------------------------------------------------------- schema and reports


def _kernels_result():
    rows, pairs = [], []
    for hd in (64, 128):
        for lay in ("8x4096", "700x64"):
            for mode in ("eager", "graph"):
                for b, us in (("fa4", 100.0), ("triton_attn", 250.0), ("sdpa", float("nan"))):
                    rows.append({"backend": b, "head_dim": hd, "layout": lay, "mode": mode,
                                 "median_us": None if b == "sdpa" else us, "rel_err": 2e-3,
                                 **({"error": "boom"} if b == "sdpa" else {}), "tflops": 300.0,
                                 "frac_matmul_ceiling": 0.4, "hbm_floor_us": 10.0})
                pairs.append({"layout": lay, "head_dim": hd, "mode": mode, "a": "fa4", "b": "triton_attn",
                              "rounds": 4, "median_ratio": 2.5, "wins_a": 4, "wins_b": 0})
    meta = {"gpu": {"name": "Test GPU"}, "command": "sglang-fa4 bench kernels --quick",
            "versions": {"torch": "x"}, "ceilings": {"bf16_matmul_tflops": 700.0, "copy_gbps": 4000.0}}
    return {"meta": meta, "rows": rows, "pairs": pairs}


def test_validate_and_reports(tmp_path):
    res = _kernels_result()
    assert report.validate(res, "kernels") == []
    report.write_json(res, tmp_path / "k.json", partial=True)
    back = json.loads((tmp_path / "k.json").read_text())
    assert back["meta"]["partial"] is True
    assert report.validate(back, "kernels") == []
    report.write_kernels_markdown(back, tmp_path / "k.md")
    md = (tmp_path / "k.md").read_text()
    assert "sglang-fa4 bench kernels --quick" in md and "2.50 (4/4)" in md and "## Failures" in md
    summary = report.kernels_summary(back)
    assert "2.50x" in summary


def test_host_mode_table(tmp_path):
    """Host rows: the host time per call, fa4's route and its loop wall time, side by side."""
    res = _kernels_result()
    for b, us in (("fa4", 11.5), ("triton_attn", 31.0)):
        res["rows"].append({"backend": b, "head_dim": 80, "layout": "180x64", "mode": "host", "median_us": us,
                            "rel_err": 2e-3, "loop_wall_us": 38.6 if b == "fa4" else 140.0, "iters": 100,
                            **({"route": "triton short-window"} if b == "fa4" else {})})
    res["pairs"].append({"layout": "180x64", "head_dim": 80, "mode": "host", "a": "fa4", "b": "triton_attn",
                         "rounds": 5, "median_ratio": 2.7, "wins_a": 5, "wins_b": 0})
    assert report.validate(res, "kernels") == []
    report.write_kernels_markdown(res, tmp_path / "k.md")
    md = (tmp_path / "k.md").read_text()
    assert "## mode: host (µs of host time per call)" in md
    assert "| 80 | 180x64 | triton short-window | 11.5 | 31.0 | — | 38.6 | 2.70 (5/5) | 2.0e-03 |" in md


def test_host_submit_time_excludes_the_gpu_wait(monkeypatch):
    """host_submit_us stops the host clock before the final sync: a 'GPU' that needs 50 ms to drain
    shows in the wall time only."""
    from sglang_fa4.bench import timing

    syncs = []
    monkeypatch.setattr(timing, "sync", lambda: syncs.append(1) or (len(syncs) == 2 and time.sleep(0.05)))
    host_us, wall_us = timing.host_submit_us(lambda: None, 10)
    assert host_us < 1000 and wall_us >= 50_000 / 10 and len(syncs) == 2


def test_validate_finds_problems():
    res = _kernels_result()
    del res["meta"]["ceilings"]
    del res["rows"][0]["rel_err"]
    res["rows"][1]["median_us"] = -1.0
    res["rows"][2].pop("error")
    res["pairs"][0].pop("wins_a")
    problems = report.validate(res, "kernels")
    assert "meta.ceilings missing" in problems
    assert "rows[0].rel_err missing" in problems
    assert any("rows[1]" in p for p in problems)
    assert any("rows[2] has no time" in p for p in problems)
    assert "pairs[0].wins_a missing" in problems
    assert report.validate({"meta": {}}, "vit")[-1] == "rows missing"


def test_json_is_strict(tmp_path):
    res = {"meta": {"gpu": {}, "command": "c", "versions": {}, "ceilings": None},
           "rows": [{"x": float("nan"), "y": [float("inf"), 1.0]}]}
    report.write_json(res, tmp_path / "r.json")
    text = (tmp_path / "r.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text)["rows"][0] == {"x": None, "y": [None, 1.0]}


def test_vit_markdown_and_plots(tmp_path):
    rows, pairs = [], []
    for image in ("448", "4k"):
        for mode in ("eager", "graph"):
            for b, ms in (("fa4", 10.0), ("triton_attn", 14.0), ("sdpa", 12.0)):
                rows.append({"backend": b, "model": "qwen2_5_vl", "image": image, "mode": mode, "median_ms": ms,
                             "rel_err": 0.02, "ref": "fp32", "tokens": 1024})
            pairs.append({"model": "qwen2_5_vl", "image": image, "mode": mode, "a": "fa4", "b": "triton_attn",
                          "rounds": 5, "median_ratio": 1.4, "wins_a": 5, "wins_b": 0})
    res = {"meta": {"gpu": {"name": "G"}, "command": "sglang-fa4 bench vit", "versions": {}, "ceilings": None},
           "rows": rows, "pairs": pairs}
    assert report.validate(res, "vit") == []
    report.write_vit_markdown(res, tmp_path / "v.md")
    assert "1.40 (5/5)" in (tmp_path / "v.md").read_text()
    import matplotlib  # noqa: F401 - a pinned test dependency
    report.plot_vit(res, tmp_path / "v.png")
    report.plot_kernels(_kernels_result(), tmp_path / "k.png")
    for png in ("v.png", "k.png"):
        data = (tmp_path / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) < 150_000


def test_gpu_slug_and_command_line():
    from sglang_fa4.bench.meta import command_line, gpu_slug

    assert gpu_slug("NVIDIA H200") == "h200"
    assert gpu_slug("NVIDIA B300 SXM6 AC") == "b300"
    assert command_line(["/usr/bin/sglang-fa4", "bench", "kernels", "--layouts", "8x4096"]) == \
        "sglang-fa4 bench kernels --layouts 8x4096"
    assert command_line(["/x/sglang_fa4/cli.py", "bench", "vit"]).startswith("python3 -m sglang_fa4.cli bench vit")


# ---------------------------------------------------------------- committed H200 results


@pytest.mark.parametrize("name,kind", [("kernels.json.gz", "kernels"), ("vit.json.gz", "vit")])
def test_committed_results_are_valid(name, kind):
    res = report.read_json(RESULTS / name)
    assert report.validate(res, kind) == []
    assert res["meta"]["command"].split()[:5] in (
        ["python3", "-m", "sglang_fa4.cli", "bench", kind], ["sglang-fa4", "bench", kind][:5])
    assert res["meta"]["partial"] is False
    if kind == "kernels":
        got = {(r["head_dim"], r["layout"]) for r in res["rows"]}
        for hd in (64, 72, 80, 128):
            for lay in layouts.SYNTHETIC:
                assert (hd, lay) in got
        assert {r["mode"] for r in res["rows"]} == {"eager", "graph", "host"}
        assert {r["backend"] for r in res["rows"]} == {"fa4", "fa4_public", "triton_attn", "sdpa"}
        assert all(r["rel_err"] < 1e-2 for r in res["rows"] if r["rel_err"] is not None)
    else:
        assert {r["model"] for r in res["rows"]} == {"qwen2_5_vl", "qwen3_vl"}
        assert {r["image"] for r in res["rows"]} == set(PICTURES)


# ---------------------------------------------------------------- CLI


def test_cli_help_and_quick(capsys):
    from sglang_fa4.bench import cli as bench_cli
    from sglang_fa4.cli import build_parser, main

    for sub in ("kernels", "vit"):
        with pytest.raises(SystemExit) as exc:
            main(["bench", sub, "--help"])
        assert exc.value.code == 0
        assert f"bench {sub}" in capsys.readouterr().out
    args = build_parser().parse_args(["bench", "kernels", "--quick"])
    bench_cli.apply_quick_kernels(args)
    assert args.head_dims == [80, 128] and args.layouts == list(layouts.QUICK_KERNEL_LAYOUTS) and args.rounds == 4
    args = build_parser().parse_args(["bench", "kernels", "--quick", "--head-dims", "64", "--rounds", "7"])
    bench_cli.apply_quick_kernels(args)
    assert args.head_dims == [64] and args.rounds == 7
    args = build_parser().parse_args(["bench", "vit", "--quick"])
    bench_cli.apply_quick_vit(args)
    assert args.models == ["qwen2_5_vl"] and args.images == ["448", "720p"]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "kernels", "--backends", "nope"])


def test_timing_helpers():
    from sglang_fa4.bench.kernels import _input_sets
    from sglang_fa4.bench.timing import iters_for

    assert iters_for(0.5, 2.0) == 4
    assert iters_for(10.0, 2.0) == 1
    assert iters_for(0.0001, 2.0, hi=200) == 200
    assert iters_for(0.0, 2.0, hi=50) == 50
    assert _input_sets(kernel_layout("1x256"), 16, 128, 60 * 2**20) == 8
    assert _input_sets(kernel_layout("4x1024"), 16, 64, 60 * 2**20) == 6  # 32 MiB a set, 3x L2 over all
    assert _input_sets(kernel_layout("8x4096"), 16, 128, 60 * 2**20) == 1
    assert _input_sets(kernel_layout("1x256"), 16, 128, None) == 8


# ---------------------------------------------------------------- torch / transformers on CPU


def test_sdpa_varlen_matches_loop():
    torch = pytest.importorskip("torch")
    from sglang_fa4.bench.sdpa_varlen import SdpaVarlen

    seqlens = [64, 64, 32, 0, 64, 16, 100, 16]
    total = sum(seqlens)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(total, 4, 16, generator=g) for _ in range(3))
    impl = SdpaVarlen(seqlens, "cpu")
    assert impl.num_groups == 4
    out = torch.full_like(q, float("nan"))
    impl(q, k, v, out=out, scale=0.3)
    ref, s = [], 0
    for n in seqlens:
        if n:
            qs, ks, vs = (t[s:s + n].transpose(0, 1) for t in (q, k, v))
            ref.append(torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, scale=0.3).transpose(0, 1))
        s += n
    assert torch.allclose(out, torch.cat(ref), atol=1e-5)


def test_transformers_routing_on_cpu():
    torch = pytest.importorskip("torch")
    import transformers.vision_utils  # noqa: F401 - a pinned test dependency
    from sglang_fa4.bench import hf_attention, vit

    tiny = {
        "qwen2_5_vl": dict(depth=4, hidden_size=64, num_heads=4, intermediate_size=128, out_hidden_size=64,
                           fullatt_block_indexes=[1, 3]),
        "qwen3_vl": dict(depth=3, hidden_size=64, num_heads=4, intermediate_size=128, out_hidden_size=64,
                         deepstack_visual_indexes=[1]),
    }
    calls = []
    real = hf_attention.FUNCTIONS["sdpa"]

    def spy(*a, **kw):
        calls.append(int(kw["cu_seq_lens_q"].numel()))
        return real(*a, **kw)

    hf_attention.FUNCTIONS["sdpa"] = spy
    try:
        for model, over in tiny.items():
            tower = vit.build_tower(model, over, device="cpu", dtype=torch.float32)
            inp = vit.tower_inputs(model, tower, "720p", device="cpu")
            if model == "qwen2_5_vl":
                assert inp["info"]["window_partition_matches_ours"] is True
                assert inp["info"]["window_segments"] == 84
            base = vit.forward_fn(tower, inp)()  # transformers' own sdpa path
            calls.clear()
            vit._register_layouts(inp)
            hf_attention.use_backend(tower, "sdpa")
            routed = vit.forward_fn(tower, inp)()
            assert len(calls) == over["depth"]  # one packed call per block
            assert torch.allclose(routed, base, atol=1e-5, rtol=1e-4)
    finally:
        hf_attention.FUNCTIONS["sdpa"] = real
        hf_attention.clear_layouts()


# ---------------------------------------------------------------- TMEM red-max script


def test_tmem_red_max_script_skips_off_sm103():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available() and torch.cuda.get_device_capability(0) == (10, 3):
        pytest.skip("on sm_103 the script measures for real")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmark" / "lab" / "bench_flash_attention_tmem_red_max.py")],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("skipped: ") and "sm_103" in lines[0]


def test_check_vit_graphs_default_budgets_parse():
    """The GPU check hands its --budgets default to the plugin as SGLANG_FA4_VIT_GRAPH_BUDGETS: it
    must be the variable's own text form (the typed default's repr '(1024, ...)' made the plugin
    reject its environment and the check capture no budget graph)."""
    import importlib.util

    from sglang_fa4.environ import envs

    spec = importlib.util.spec_from_file_location("check_vit_graphs", ROOT / "benchmark" / "release" / "check_vit_graphs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    budgets = mod.build_parser().parse_args(["--out", "x"]).budgets
    var = envs.SGLANG_FA4_VIT_GRAPH_BUDGETS
    assert var.parse(budgets) == var.default


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU")
def test_graph_replay_ms_times_single_replays():
    import torch

    from sglang_fa4.bench.timing import graph_replay_ms

    x = torch.zeros(1, device="cuda")
    ms = graph_replay_ms(lambda: x.add_(1), replays=5, warmup=2, pre_replays=3)
    # 2 eager warmups + 3 untimed + 5 timed replays (the capture itself does not run)
    assert ms > 0 and float(x) == 10


def test_vit_graph_profile_compare_and_markdown(monkeypatch):
    import importlib.util

    spec = importlib.util.spec_from_file_location("vit_graph_profile", ROOT / "benchmark" / "release" / "vit_graph_profile.py")
    prof = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prof)
    runs = {"a": {"event_us": 40.0, "kernel_us": 30.0, "count": 3, "kernels": {"gemm": 20.0, "attn": 10.0}},
            "b": {"event_us": 60.0, "kernel_us": 33.0, "count": 4, "kernels": {"gemm": 20.0, "attn": 8.0, "copy": 5.0}}}
    monkeypatch.setattr(prof, "kernel_times_us", lambda fn: runs[fn()])
    out = prof.compare({"a": lambda: "a", "b": lambda: "b"}, top=1)
    assert out["paths"]["b"] == {"event_us": 60.0, "kernel_us": 33.0, "count": 4}
    # the first path's top kernel, then the others' top ones; each with every path's time (0: absent)
    assert out["top"] == [{"kernel": "gemm", "a": 20.0, "b": 20.0}]
    out = prof.compare({"a": lambda: "a", "b": lambda: "b"}, top=3)
    assert out["top"][-1] == {"kernel": "copy", "a": 0.0, "b": 5.0}
    md = "\n".join(prof.markdown("qwen3_vl", "448", out))
    assert "| event_us | 40.0 | 60.0 |" in md and "| `copy` | 0.0 | 5.0 |" in md
