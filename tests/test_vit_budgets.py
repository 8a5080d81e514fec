"""ViT graphs over token budgets (sglang_fa4.integration.vit_budgets): the pure layout logic, and the real
SGLang 0.5.20 / 0.5.23 ViTCudaGraphRunner driven on a CPU with the plugin loaded.

In the runner tests CUDA graphs are faked so that replay is checkable: a fake graph's ``replay()``
re-runs the runner's own ``_create_graph`` body (the captured Python), reading the same static
buffers and the max_seqlen fixed at capture, exactly what a real graph replays. FA4 is a torch
reference varlen attention that fills only rows inside segments (others stay NaN, like
uninitialised memory) and raises if a segment is longer than the max_seqlen it was given.
"""

from itertools import accumulate

import pytest

from sglang_fa4 import plugin
from sglang_fa4.environ import EnvValueError, envs
from sglang_fa4.integration import vit_budgets as vb
from sglang_fa4.integration import vit_budget_layouts as budget_layouts
from sglang_harness import ROOT, run_file

# ---------------------------------------------------------------------------------------------
# pure
# ---------------------------------------------------------------------------------------------


def test_parse_budgets_and_env(monkeypatch):
    var = envs.SGLANG_FA4_VIT_GRAPH_BUDGETS
    assert var.parse(" 2048,1024,1024 ,") == (1024, 2048)
    for bad in ("", "abc", "1023", "0", "-4"):
        with pytest.raises(EnvValueError, match="SGLANG_FA4_VIT_GRAPH_BUDGETS=.*accepted: a comma list of integers, each >= 4 and a multiple of 4"):
            var.parse(bad)
    monkeypatch.delenv("SGLANG_FA4_VIT_GRAPH_BUDGETS", raising=False)
    assert budget_layouts.budgets_from_env() == (896, 1024, 1536, 2048, 3072, 4096, 5120, 6144, 8192)
    monkeypatch.setenv("SGLANG_FA4_VIT_GRAPH_BUDGETS", "64,256")
    assert budget_layouts.budgets_from_env() == (64, 256)
    monkeypatch.delenv("SGLANG_FA4_VIT_GRAPH_BUDGETS_ENABLE", raising=False)
    assert vb.enabled() is True  # on by default: what SGLANG_VIT_ENABLE_CUDA_GRAPH=1 gets with fa4
    monkeypatch.setenv("SGLANG_FA4_VIT_GRAPH_BUDGETS_ENABLE", "0")  # the opt-out
    assert vb.enabled() is False


def test_pick_budget():
    budgets = (1024, 256, 4096)
    assert budget_layouts.pick_budget(1, budgets) == 256
    assert budget_layouts.pick_budget(256, budgets) == 256
    assert budget_layouts.pick_budget(257, budgets) == 1024
    assert budget_layouts.pick_budget(4096, budgets) == 4096
    assert budget_layouts.pick_budget(4097, budgets) is None


def test_pad_layout_fixed_shape_and_pad_segments():
    cap = budget_layouts.segment_capacity(256)
    out = budget_layouts.pad_layout([0, 0, 100, 140], 256, cap, max_seqlen=256)
    assert len(out) == cap + 1
    assert out[:4] == [0, 0, 100, 140]
    # the 116 padding rows: segments of <= 64, then empty segments at the budget
    assert out[4:6] == [204, 256] and set(out[6:]) == {256}
    # every row 0..budget lies in exactly one segment; none longer than max_seqlen
    lens = [b - a for a, b in zip(out, out[1:])]
    assert sum(lens) == 256 and max(lens) <= 256
    # windowed: pad segments no longer than the window
    w = budget_layouts.pad_layout([0, 16, 20, 24], 64, budget_layouts.segment_capacity(64), max_seqlen=16)
    assert max(b - a for a, b in zip(w, w[1:])) <= 16 and w[-1] == 64 and w[3:6] == [24, 40, 56]


@pytest.mark.parametrize("cu,budget,max_seqlen", [
    ([0, 300], 256, 256),  # more tokens than the budget
    ([0, 20, 40], 64, 16),  # a segment longer than the fixed max_seqlen (window)
    ([0, 8, 4], 64, 64),  # not monotone
    ([1, 8], 64, 64),
])
def test_pad_layout_rejects(cu, budget, max_seqlen):
    with pytest.raises(budget_layouts.LayoutDoesNotFit):
        budget_layouts.pad_layout(cu, budget, budget_layouts.segment_capacity(budget), max_seqlen)


def test_pad_layout_capacity():
    # segments of CAPACITY_TOKENS_PER_SEGMENT tokens fill any budget, with Qwen2.5's empty lead
    step = budget_layouts.CAPACITY_TOKENS_PER_SEGMENT
    for budget in (64, 256, 1024):
        for tokens in range(0, budget + 1, step):
            cu = [0, 0] + list(range(step, tokens + 1, step))
            out = budget_layouts.pad_layout(cu, budget, budget_layouts.segment_capacity(budget), max_seqlen=16)
            assert len(out) == budget_layouts.segment_capacity(budget) + 1
    # more, smaller segments than the capacity: does not fit (that batch runs eagerly)
    with pytest.raises(budget_layouts.LayoutDoesNotFit):
        budget_layouts.pad_layout([0] + list(range(4, 257, 4)), 256, budget_layouts.segment_capacity(256), 64)
    # with windows, a slot per quarter window (never under MIN_SEGMENT_TOKENS)
    assert budget_layouts.segment_capacity(1024, 64) == 1024 // 16 + budget_layouts.SPARE_SEGMENTS
    assert budget_layouts.segment_capacity(1024, 8) == 1024 // budget_layouts.MIN_SEGMENT_TOKENS + budget_layouts.SPARE_SEGMENTS


def test_capacity_fits_real_qwen_window_layouts():
    from sglang_fa4.bench.layouts import QWEN25_VL, PICTURES

    for name, (width, height, frames) in PICTURES.items():
        seqlens = QWEN25_VL.window_seqlens([QWEN25_VL.grid_thw(width, height, frames)])
        tokens = sum(seqlens)
        budget = 1 << (tokens - 1).bit_length()
        cu = list(accumulate(seqlens, initial=0))
        cap = budget_layouts.segment_capacity(budget, 64)
        out = budget_layouts.pad_layout(cu, budget, cap, max_seqlen=64)
        # the real windows unchanged, then padding of <= 64-token segments covering every row up to
        # the budget, then empty segments: the fixed length, with slots to spare
        assert len(out) == cap + 1 and out[: len(cu)] == cu, name
        pads = [b - a for a, b in zip(out[len(cu) - 1:], out[len(cu):])]
        assert out[-1] == budget and all(0 <= p <= 64 for p in pads), name
        assert sum(pads) == budget - tokens, name
        assert len(seqlens) + -(-(budget - tokens) // 64) <= cap, name


def test_full_layout_capacity_and_padding(monkeypatch):
    monkeypatch.delenv("SGLANG_FA4_VIT_GRAPH_MAX_SEGMENTS", raising=False)
    cap = budget_layouts.full_capacity()
    assert cap == 64 + budget_layouts.FULL_PAD_CHUNKS + budget_layouts.SPARE_SEGMENTS
    # below the largest budget: a slot per 256 tokens, at least MIN_FULL_SLOTS, at most 64
    extra = budget_layouts.FULL_PAD_CHUNKS + budget_layouts.SPARE_SEGMENTS
    ladder = (1024, 2048, 4096, 8192, 32768)
    assert [budget_layouts.full_capacity(b, 32768) - extra for b in ladder] == [4, 8, 16, 32, 64]
    assert budget_layouts.full_slots(512, 8192) == budget_layouts.MIN_FULL_SLOTS == 4
    assert budget_layouts.full_slots(8192, 8192) == 64 and budget_layouts.full_slots(20000, 32768) == 64
    monkeypatch.setenv("SGLANG_FA4_VIT_GRAPH_TOKENS_PER_SEGMENT_SLOT", "0")  # every budget: 64
    assert budget_layouts.full_slots(1024, 8192) == 64
    monkeypatch.setenv("SGLANG_FA4_VIT_GRAPH_TOKENS_PER_SEGMENT_SLOT", "128")
    assert budget_layouts.full_slots(1024, 8192) == 8
    with pytest.raises(ValueError, match="tokens_per_slot must be >= 0"):
        budget_layouts.full_slots(1024, 8192, tokens_per_slot=-1)
    monkeypatch.setenv("SGLANG_FA4_VIT_GRAPH_TOKENS_PER_SEGMENT_SLOT", "-1")
    with pytest.raises(EnvValueError, match="SGLANG_FA4_VIT_GRAPH_TOKENS_PER_SEGMENT_SLOT"):
        budget_layouts.full_slots(1024, 8192)
    monkeypatch.delenv("SGLANG_FA4_VIT_GRAPH_TOKENS_PER_SEGMENT_SLOT")
    assert budget_layouts.budgets_holding(1500, (8192, 1024, 2048)) == [2048, 8192]
    assert budget_layouts.budgets_holding(9000, (8192, 1024)) == []
    monkeypatch.setenv("SGLANG_FA4_VIT_GRAPH_MAX_SEGMENTS", "3")
    assert budget_layouts.full_capacity() == 3 + budget_layouts.FULL_PAD_CHUNKS + budget_layouts.SPARE_SEGMENTS
    with pytest.raises(ValueError, match="max_segments must be >= 1"):
        budget_layouts.full_capacity(max_segments=0)
    monkeypatch.setenv("SGLANG_FA4_VIT_GRAPH_MAX_SEGMENTS", "0")
    with pytest.raises(EnvValueError, match="SGLANG_FA4_VIT_GRAPH_MAX_SEGMENTS='0'.*accepted: an integer >= 1"):
        budget_layouts.full_capacity()
    monkeypatch.setenv("SGLANG_FA4_VIT_GRAPH_MAX_SEGMENTS", "3")
    # Qwen2.5-VL's full layout (empty lead) of 3 images in a 16384 budget: the 5620 padding rows go
    # in at most FULL_PAD_CHUNKS segments, then empty ones; fixed length
    cu = [0, 0, 1024, 4000, 10764]
    out = budget_layouts.pad_layout(cu, 16384, cap, max_seqlen=16384, pad_segment=budget_layouts.full_pad_segment(16384, 10764))
    assert len(out) == cap + 1 and out[:5] == cu and out[-1] == 16384
    pads = [b - a for a, b in zip(out[4:], out[5:]) if b > a]
    assert sum(pads) == 16384 - 10764 and len(pads) <= budget_layouts.FULL_PAD_CHUNKS
    assert budget_layouts.full_pad_segment(1024, 1024) == 1 and budget_layouts.full_pad_segment(1024, 1021) == 1
    # more images than the capacity: does not fit (eager)
    many = list(range(0, 4 * (cap + 1), 4))
    with pytest.raises(budget_layouts.LayoutDoesNotFit):
        budget_layouts.pad_layout(many, 16384, cap, 16384, budget_layouts.full_pad_segment(16384, many[-1]))


def test_capture_layout_max_seqlen():
    cu = budget_layouts.capture_layout(1024, budget_layouts.segment_capacity(1024), 64)
    assert max(b - a for a, b in zip(cu, cu[1:])) == 64 and cu[-1] == 1024
    cu = budget_layouts.capture_layout(1024, budget_layouts.segment_capacity(1024), 1024)
    assert cu[:2] == [0, 1024]
    assert max(b - a for a, b in zip(cu, cu[1:])) == 1024


def test_plugin_plan_gates_on_env(monkeypatch):
    monkeypatch.delenv("SGLANG_FA4_VIT_GRAPH_BUDGETS_ENABLE", raising=False)
    monkeypatch.setenv("SGLANG_VIT_ENABLE_CUDA_GRAPH", "1")
    for v in ("0.5.20", "0.5.23"):  # default, with SGLang's ViT graphs on: hooked
        assert "vit_graph_budgets" in plugin.make_plan(v).hooked
    monkeypatch.setenv("SGLANG_FA4_VIT_GRAPH_BUDGETS_ENABLE", "0")  # the opt-out
    for v in ("0.5.20", "0.5.23"):
        assert "vit_graph_budgets" not in plugin.make_plan(v).hooked
    monkeypatch.delenv("SGLANG_FA4_VIT_GRAPH_BUDGETS_ENABLE")
    monkeypatch.setenv("SGLANG_VIT_ENABLE_CUDA_GRAPH", "0")  # no ViT graphs: nothing to replace
    for v in ("0.5.20", "0.5.23"):
        assert "vit_graph_budgets" not in plugin.make_plan(v).hooked


# ---------------------------------------------------------------------------------------------
# the real runner
# ---------------------------------------------------------------------------------------------

# The scripts (tests/sglang_scripts/): vit_graph_fakes.py fakes CUDA graphs on SGLang's real runner
# (see the module docstring) with FA4 a CPU reference; vit_budget_tower.py holds a small
# Qwen2.5-VL-like (windows, full blocks, output permutation) and Qwen3-VL-like (deepstack mergers)
# tower with the real fa4 backend, random image mixes, the unpadded eager reference;
# vit_budget_hooks.py reads what the plugin registered through SGLang's HookRegistry and calls the
# startup path as registered (the AFTER ModelRunner.load_model budget hook).


def test_budget_graphs_on_real_runner(sglang_version):
    # the budgets' switch left at its default: on
    out = run_file(sglang_version, "vit_budgets_runner.py", env={"SGLANG_VIT_ENABLE_CUDA_GRAPH": "1",
                                                                "SGLANG_FA4_VIT_GRAPH_BUDGETS_ENABLE": None,
                                                                "SGLANG_FA4_JIT_MONITOR": "warn",
                                                                "SGLANG_FA4_VIT_GRAPH_BUDGETS": "128,32,64"})
    # the default with SGLANG_VIT_ENABLE_CUDA_GRAPH=1: the budget hooks, the startup capture after the
    # FA4 warmup's load_model hook
    hooks = out["hooks"]
    assert hooks["run"] == [["around", "run_around"]] and hooks["create_graph"] == [["around", "create_graph_around"]]
    assert hooks["forward"] == [["around", "qwen2_5_vit_forward"]]  # one hook: routing + no-sync forward
    assert hooks["load_model"].index("sglang_fa4.integration.hooks.warm_fa4_after_load_model") < \
        hooks["load_model"].index("sglang_fa4.integration.vit_budgets.capture_budgets_after_load_model")
    for name in ("qwen25", "qwen3"):
        r = out[name]
        assert r["startup_captures"] == 3 and r["graphs"] == 3, r  # one graph per budget, at startup
        assert r["captures_after"] == 0, r  # serving never captured
        assert {c["budget"] for c in r["cases"]} >= {32, 64}, r["cases"]  # the mixes hit several budgets
        for c in r["cases"]:
            assert c["shape_ok"] and not c["nan"], c
            assert c["max_err"] < 1e-4, c  # budgeted replay == eager on the real tokens
            assert c["pad_rows_zero"] and not c["static_nan"], c  # padded rows zeroed, nothing uninitialised
        assert r["big_err"] < 1e-4  # above the largest budget: eager, right
        rep = r["report"]
        assert rep["eager_runs"] == (1 if name == "qwen3" else 2), rep
        assert rep["replays"] == len(r["cases"]) + 2 and rep["captures_after_startup"] == 0
        assert rep["replay_ms"] == {}  # route "smallest" (the default): nothing timed at startup
        assert rep["budgets"] == [32, 64, 128]
        # the full-attention layout is sized apart from the windowed one (few, fixed slots); budgets
        # below the largest hold MIN_FULL_SLOTS real segments (256 tokens a slot), the largest 64
        assert rep["segment_capacity_full"] == {"32": 10, "64": 10, "128": 70}, rep
        assert {str(b): budget_layouts.full_capacity(b, 128) for b in (32, 64, 128)} == rep["segment_capacity_full"]
        # 12 images of 4 tokens: 48 tokens fit the 64 budget, 12 segments do not: replayed in 128
        assert r["many"] == {"err": r["many"]["err"], "budget": 128, "replays": 1, "eager": 0}, r["many"]
        assert r["many"]["err"] < 1e-4, r["many"]
        assert r["routed"]["budget"] == 128 and r["routed"]["err"] < 1e-4, r["routed"]  # the fastest holding budget
        if name == "qwen25":
            assert rep["segment_capacity_window"] == {str(b): budget_layouts.segment_capacity(b, 16) for b in (32, 64, 128)}
        else:
            assert rep["segment_capacity_window"] is None
    assert out["qwen25"]["misfit_err"] < 1e-4
    assert out["qwen25"]["report"]["window_tokens"] == 16 and out["qwen3"]["report"]["window_tokens"] is None
    assert out["guard_warn"] == "ok" and out["guard_raise"] == "GraphCaptureAfterStartup"
    assert out["guard_count"] == 2
    # FA4 calls while budgets are captured count as warmup for the JIT monitor; serving ones do not
    assert out["warming"] == [[False, 0], [True, 1]]
    assert "captured after the startup budgets" in out["log"]
    # the one startup line per runner: what was captured, what it took, the bound (default 3072 MiB)
    for name in ("qwen25", "qwen3"):
        est = out[name]["report"]["estimate_bytes_total"]
        assert est == sum(out[name]["report"]["estimate_bytes"].values()) > 0
        line = (f"sglang-fa4: 3 ViT budget graph(s) [32, 64, 128] captured at startup; graph memory not "
                f"measured (CPU), estimate {est} bytes; within the 3072.0 MiB bound (SGLANG_FA4_VIT_GRAPH_MEMORY_MB)")
        assert line in out["log"], (line, out["log"])
        assert out[name]["report"]["trimmed"] == [] and out[name]["report"]["memory_limit_mb"] == 3072
    assert out["log"].count("ViT budget graph(s)") == 2  # one line per runner, none per budget

    # the memory bound: the exact estimated cost of [32, 64] keeps both, one byte less drops 64 too;
    # trimmed budgets are never captured, and batches above the kept ladder run eagerly (right)
    for name, case, kept, trimmed in (("qwen25", "exact", [32, 64], [128]), ("qwen3", "exact", [32, 64], [128]),
                                      ("qwen3", "byte_over", [32], [64, 128])):
        r = out["bound"][name][case]
        c = {int(k): v for k, v in r["costs"].items()}
        assert c[32] < c[64] < c[128]
        assert r["budgets"] == kept and r["trimmed"] == trimmed, (case, r)
        assert r["captured"] == r["graphs"] == len(kept) and r["serving_captures"] == 0, (case, r)
        assert r["report"]["estimate_bytes_total"] == sum(c[k] for k in kept)
        assert r["served"], case
        for tokens, served in r["served"].items():
            want = next((k for k in kept if int(tokens) <= k), None)
            assert served["budget"] == want and served["err"] < 1e-4, (case, tokens, served)
        limit = c[32] + c[64] - (case == "byte_over")
        line = (f"sglang-fa4: {len(kept)} ViT budget graph(s) {kept} captured at startup; graph memory not "
                f"measured (CPU), estimate {sum(c[k] for k in kept)} bytes; trimmed {trimmed} to fit the "
                f"{limit} bytes bound (SGLANG_FA4_VIT_GRAPH_MEMORY_MB)")
        assert line in r["log"] and r["log"].count("ViT budget graph(s)") == 1, (case, r["log"])
    # under the smallest budget: nothing captured, the runner sealed with no budget (every batch eager,
    # nothing captured while serving), one warning
    none = out["bound"]["qwen3"]["none"]
    assert none["budgets"] == [] and none["trimmed"] == [32, 64, 128] and none["captured"] == 0 == none["graphs"]
    assert none["serving_captures"] == 0 and all(v["budget"] is None and v["err"] < 1e-4 for v in none["served"].values())
    assert "no budget fits, every ViT batch runs eagerly" in none["log"]
    # measured on "CUDA" (a reserved probe reading twice each estimate): the plan [32, 64, 128] fits the
    # estimate exactly, but after 64 the measured 6x c[32] plus 128's estimate scaled by the 2x shortfall
    # (8x c[32]) passes the bound: 128 is not captured
    m = out["bound"]["qwen3"]["measured"]
    c = {int(k): v for k, v in m["costs"].items()}
    assert m["budgets"] == [32, 64] and m["trimmed"] == [128] and m["graphs"] == 2, m
    assert m["report"]["reserved_bytes"] == {"32": 2 * c[32], "64": 2 * c[64]}
    assert m["report"]["reserved_bytes_total"] == 2 * (c[32] + c[64])
    assert f"graph memory {2 * (c[32] + c[64])} bytes reserved, estimate {c[32] + c[64]} bytes; trimmed [128]" in m["log"]


# The opt-out: SGLANG_FA4_VIT_GRAPH_BUDGETS_ENABLE=0 registers no budget hook, and SGLang's own runner
# captures one graph per image layout on the request path (the default is test_budget_graphs_on_real_runner).
def test_opt_out_gives_sglangs_per_layout_runner(sglang_version):
    out = run_file(sglang_version, "vit_budgets_opt_out.py", env={"SGLANG_FA4_VIT_GRAPH_BUDGETS_ENABLE": "0",
                                                                  "SGLANG_VIT_ENABLE_CUDA_GRAPH": "1"})
    assert out["run"] == [] and out["create_graph"] == [] and out["startup_hooks"] == 0
    assert out["forward"] == [["around", "qwen2_5_vit_forward"]]  # the host-metadata feature's
    assert "sglang_fa4.integration.vit_budgets.capture_budgets_after_load_model" not in out["load_model"]
    # nothing at startup; a capture per layout while serving, SGLang's way; outputs right
    assert out["state"] is False and out["startup_captures"] == 0 and out["serving_captures"] == 2, out
    assert out["err"] < 1e-4, out


# SGLang's real Qwen2.5-VL tower, tensor-parallel over 2 CPU processes (gloo): its linears are
# TP-sharded (2 of 4 heads per rank, all-reduces inside every block), the generic runner is the
# real one with graphs faked, budgets captured by the startup path on each rank. Per rank: the
# budget replay (windowed + full blocks, padded) equals the tower's eager forward.
def test_budget_graphs_on_tensor_parallel_tower(sglang_version):
    out = run_file(sglang_version, "vit_budgets_tp_tower.py", {},
                   env={"SGLANG_VIT_ENABLE_CUDA_GRAPH": "1", "SGLANG_FA4_VIT_GRAPH_BUDGETS_ENABLE": "1",
                        "SGLANG_FA4_JIT_MONITOR": "raise", "SGLANG_FA4_VIT_GRAPH_BUDGETS": "128,256,512"})
    for r in out["ranks"]:
        assert "error" not in r, r.get("error")
    assert out["exitcodes"] == [0, 0]
    for r in out["ranks"]:
        assert r["heads_per_rank"] == 2  # the tower really is sharded
        assert r["report"]["graphs"] == 3 and r["captures_after"] == 0, r
        assert sum(c["replayed"] for c in r["cases"]) >= 4, r["cases"]  # most mixes fit a budget
        for c in r["cases"]:
            assert c["max_err"] <= 1e-5 * max(1.0, c["scale"]), c  # replay == eager, fp32 on CPU
        big = r["big"]
        assert big["runner_calls"] == 0 and big["eager_runs"] == 1 and big["enable_cg_restored"], big
        assert big["max_err"] == 0.0, big
        # one unfused (graph-mode) rotary per block; our no-sync forward ran, SGLang's syncing one did not
        assert big["rotary"] == {"compiled": 0, "unfused": 4, "no_sync_forward": 1, "sglang_window_index": 0,
                                 "sglang_rot_pos_emb": 0}, big


def test_startup_capture_sees_deterministic_inference_kernels(monkeypatch):
    """--enable-deterministic-inference: SGLang turns its batch-invariant kernels on right after
    ModelRunner.load_model, i.e. after this AFTER hook. The budget graphs must capture those
    kernels, so the hook asks the runner to turn them on (SGLang's own idempotent method) before
    capturing; without the graph switch it does neither."""
    from sglang_fa4.integration import vit_budgets as vb

    calls = []

    class Runner:
        model = object()

        def maybe_enable_batch_invariant_mode(self):
            calls.append("batch_invariant")

    monkeypatch.setattr(vb, "capture_model_budgets", lambda model: calls.append(("capture", model)))
    monkeypatch.setenv("SGLANG_FA4_VIT_GRAPH_BUDGETS_ENABLE", "1")
    monkeypatch.setenv("SGLANG_VIT_ENABLE_CUDA_GRAPH", "1")
    runner = Runner()
    assert vb.capture_budgets_after_load_model(None, runner) is None
    assert calls == ["batch_invariant", ("capture", runner.model)]
    calls.clear()
    monkeypatch.setenv("SGLANG_VIT_ENABLE_CUDA_GRAPH", "0")
    vb.capture_budgets_after_load_model(None, runner)
    assert calls == []
    monkeypatch.setenv("SGLANG_VIT_ENABLE_CUDA_GRAPH", "1")

    class OldRunner:  # a runner without the method (another SGLang): capture only
        model = None

    vb.capture_budgets_after_load_model(None, OldRunner())
    assert calls == [("capture", None)]


def test_sglang_has_the_batch_invariant_switch(sglang_version):
    """The method the startup capture calls exists on SGLang's ModelRunner (else the deterministic
    path would be skipped silently) and only acts under --enable-deterministic-inference."""
    out = run_file(sglang_version, "sglang_batch_invariant_switch.py")
    assert out == {"has": True, "gated": True, "init_order": True}


def test_graphs_read_the_rotary_tables_in_the_towers_table_dtype(sglang_version):
    """The budget graphs read the rotary tables in the dtype the tower produces them (Qwen3-VL:
    SGLang's fp32 rotary cache), not rounded into the runner's bf16 workspace, and the eager path
    above the budgets is handed the same dtype: on the H200 server a replay's bf16-rounded tables
    made an image's rows differ alone (replay) vs batched (eager) (issue #14)."""
    out = run_file(sglang_version, "vit_budgets_table_dtype.py", env={"SGLANG_VIT_ENABLE_CUDA_GRAPH": "1",
                                                                     "SGLANG_FA4_VIT_GRAPH_BUDGETS_ENABLE": "1",
                                                                     "SGLANG_FA4_VIT_GRAPH_BUDGETS": "32,64"})
    assert out["dims"]["table_dtype"] == "torch.float64" and out["dims"]["rope_kind"] == "rotary", out
    assert out["report"]["replays"] == 1 and out["report"]["eager_runs"] == 1, out["report"]
    assert out["24"] == ["float64"], out  # the replay's blocks
    assert out["160"] == ["float64"], out  # the eager blocks


def test_host_layouts_come_from_the_layout_key_without_a_read_back():
    class DeviceCu:  # a device tensor stand-in: its shape is host data, reading it back is a sync
        def __init__(self, values):
            self.values, self.shape = values, (len(values),)

        def tolist(self):
            raise AssertionError("read back from the device")

    full, win = DeviceCu([0, 0, 16, 48]), DeviceCu([0, 8, 16, 32, 48])
    assert vb.host_layouts(full, win, ((0, 0, 16, 48), (0, 8, 16, 32, 48))) == ([0, 0, 16, 48], [0, 8, 16, 32, 48])
    assert vb.host_layouts(full, None, ((0, 0, 16, 48), None)) == ([0, 0, 16, 48], None)
    # a key that does not describe the tensors (other length, not ints, no key): read back
    import torch
    cu = torch.tensor([0, 16, 48], dtype=torch.int32)
    for key in (((0, 48), None), ((0.0, 16.0, 48.0), None), None, "layout"):
        assert vb.host_layouts(cu, None, key) == ([0, 16, 48], None)
