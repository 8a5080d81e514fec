"""benchmark/release/serve_llm.py (issues #44 item 4, #45): the LLM serving harness's CPU-checkable
parts. The checkpoints keep the public shapes (Gemma-4's 5:1 pattern at any layer count), the
tokenizers hold the configs' special ids and round-trip ASCII exactly (so bench_serving's prompts
have the requested length), bad workloads/arms are refused, bench_serving's result file is read with
failures counted, the ratios / token comparison / verdict / profile math are right, and every arm's
exact argument list resolves, through SGLang 0.5.23's own CLI parser and resolution on a faked SM90,
to the backend the arm is about."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmark" / "serve_check"), str(ROOT / "benchmark" / "release")]
import bench_serving_run as bench  # noqa: E402
import decode_profile  # noqa: E402
import llm_checkpoints as ck  # noqa: E402
import serve_arms  # noqa: E402
import serve_report  # noqa: E402

from gemma4_configs import MODELS as G4  # noqa: E402


def test_gemma4_config_is_the_31b_with_the_pattern_kept():
    full = ck.model_config("gemma4_31b")
    want = {k: v for k, v in G4["gemma4_31b"]["text_config"].items() if k not in ("rope_parameters",)}
    got = full["text_config"]
    assert all(got[k] == v for k, v in want.items()), {k: (got.get(k), v) for k, v in want.items() if got.get(k) != v}
    cut = ck.model_config("gemma4_31b", 10)
    assert ck.layer_counts(cut) == {"full_attention": 2, "sliding_attention": 8}
    assert cut["text_config"]["layer_types"][-1] == "full_attention"
    assert ck.layer_counts(ck.model_config("gemma4_31b", 12)) == {"full_attention": 2, "sliding_attention": 10}
    with pytest.raises(ValueError, match="at least 6"):
        ck.model_config("gemma4_31b", 5)
    with pytest.raises(ValueError, match="unknown model"):
        ck.model_config("gemma4_27b")
    llama = ck.model_config("llama3_8b")
    assert (llama["num_attention_heads"], llama["num_key_value_heads"], llama["hidden_size"] // 32) == (32, 8, 128)
    assert llama["max_position_embeddings"] >= 8192 + 1024


def test_kv_bytes_and_params():
    g = ck.model_config("gemma4_31b", 12)
    # sliding: 16 kv x d256, full: 4 kv x d512; K and V; 1 byte (fp8)
    assert ck.kv_bytes_per_token(g, 1) == {"swa": 10 * 2 * 16 * 256, "full": 2 * 2 * 4 * 512}
    assert ck.kv_bytes_per_token(ck.model_config("llama3_8b"), 2) == {"swa": 0, "full": 32 * 2 * 8 * 128 * 2}
    assert 7.9e9 < ck.param_count(ck.model_config("llama3_8b")) < 8.1e9  # Llama-3-8B is 8.03B
    assert 30e9 < ck.param_count(ck.model_config("gemma4_31b")) < 31.5e9  # the 31B's language model


@pytest.mark.parametrize("model", ck.MODELS)
def test_tokenizer_ids_and_ascii_roundtrip(model, tmp_path):
    from tokenizers import Tokenizer

    d = ck.write_checkpoint(model, tmp_path / model, 6 if model == "gemma4_31b" else 2)
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    for name, i in ck.SPECIALS[model].items():
        assert tok.token_to_id(name) == i
    cfg = json.loads((d / "config.json").read_text())
    text = ck.text_config(cfg)
    assert text["bos_token_id"] == ck.SPECIALS[model][ck.BOS[model]]
    s = "Conversation 3: river stone, paper!"
    ids = tok.encode(s).ids
    assert ids[0] == ck.SPECIALS[model][ck.BOS[model]] and len(ids) == len(s) + 1
    assert tok.decode(ids[1:]) == s
    assert max(ids) < text["vocab_size"]


def test_workloads_and_arms_refuse_bad_input():
    assert bench.parse_workload("8192:1024:16:16") == bench.Workload(8192, 1024, 16, 16)
    for bad, why in (("8192:1024:16", "four integers"), ("8192:1024:8:16", "never reach"), ("0:1:1:1", ">= 1")):
        with pytest.raises(ValueError, match=why):
            bench.parse_workload(bad)
    assert [a.name for a in serve_arms.parse_arms("gemma4_31b", "fa4,triton")] == ["triton", "fa4"]
    with pytest.raises(ValueError, match="baseline"):
        serve_arms.parse_arms("gemma4_31b", "fa4")
    with pytest.raises(ValueError, match="unknown arm"):
        serve_arms.parse_arms("llama3_8b", "fa3,fa5")


def test_arms_differ_only_in_kv_dtype_and_the_switch():
    import serve_llm

    w = [bench.parse_workload("8192:1024:16:16"), bench.parse_workload("1024:1024:32:32")]
    opts = serve_llm.server_opts("gemma4_31b", w, 0.85, 0.25)
    assert opts.max_total_tokens >= 16 * 9216 and opts.max_total_tokens % 4096 == 0 and opts.max_running_requests == 32
    for model, plan in serve_arms.PLANS.items():
        argvs = {a.name: serve_arms.server_args(model, a, "/m", 1, opts) for a in plan.arms}
        envs = {a.name: serve_arms.server_env(a) for a in plan.arms}
        for a in plan.arms:
            argv = argvs[a.name]
            assert "--attention-backend" not in argv  # SGLang's own default is what the rule replaces
            assert argv[argv.index("--kv-cache-dtype") + 1] == a.kv_cache_dtype
            assert argv[argv.index("--max-total-tokens") + 1] == str(opts.max_total_tokens)
            strip = [x for x in argv if x != a.kv_cache_dtype]
            assert strip == [x for x in argvs[plan.baseline] if x != serve_arms.PLANS[model].arms[0].kv_cache_dtype]
            assert envs[a.name][serve_arms.UPGRADE] == ("1" if a.upgrade else "0")
            assert {k: v for k, v in envs[a.name].items() if k != serve_arms.UPGRADE} == serve_arms.BASE_ENV
            # decode graphs on (no --disable-cuda-graph), prefill graphs off in every arm
            assert "--disable-prefill-cuda-graph" in argv and "--disable-cuda-graph" not in argv


def test_reference_arm_left_out_only_where_the_servers_do_not_fit():
    arms = serve_arms.parse_arms("gemma4_31b", None)
    need = {"triton": 26.0, "fa4": 26.0, "triton_bf16": 40.0}  # + 3 GiB a server
    kept, notes = serve_arms.arms_that_fit(arms, need, 141.0)  # 101 <= 0.9 x 141 = 126.9
    assert [a.name for a in kept] == ["triton", "fa4", "triton_bf16"] and notes == []
    kept, notes = serve_arms.arms_that_fit(arms, need, 80.0)  # 101 > 72; 58 <= 72
    assert [a.name for a in kept] == ["triton", "fa4"] and len(notes) == 1 and "triton_bf16 left out" in notes[0]
    kept, _ = serve_arms.arms_that_fit(arms, need, 101 / 0.9)  # exactly full: kept
    assert len(kept) == 3
    with pytest.raises(ValueError, match="fewer --layers"):
        serve_arms.arms_that_fit(arms, need, 60.0)  # 58 > 54: the compared arms never go


def _result(tmp_path, name, **kw):
    r = {"completed": 4, "output_throughput": 100.0, "mean_tpot_ms": 10.0, "median_itl_ms": 9.0,
         "mean_ttft_ms": 50.0, "median_ttft_ms": 50.0, "errors": ["", "", "", ""], "output_lens": [8] * 4, **kw}
    f = tmp_path / name
    f.write_text("old line\n" * 0 + json.dumps(r) + "\n")
    return f


def test_read_result_counts_failures(tmp_path):
    ok = bench.read_result(_result(tmp_path, "a.jsonl"), 4)
    assert ok["ok"] and ok["failed"] == 0 and ok["output_lens"] == [8]
    bad = bench.read_result(_result(tmp_path, "b.jsonl", completed=3, errors=["", "boom", "", ""]), 4)
    assert not bad["ok"] and bad["failed"] == 1 and bad["errors"] == ["boom"]
    short = bench.read_result(_result(tmp_path, "c.jsonl", completed=2), 4)
    assert short["failed"] == 2
    assert not bench.read_result(tmp_path / "missing.jsonl", 4)["ok"]
    assert "lacks" in bench.read_result(_result(tmp_path, "d.jsonl", mean_tpot_ms=None), 4)["error"]
    cmd = bench.command("py", 1234, "/ck", tmp_path / "ds.json", bench.Workload(8192, 1024, 16, 16), 1, tmp_path / "o")
    for flag, val in (("--dataset-name", "random"), ("--random-range-ratio", "1"), ("--request-rate", "inf"),
                      ("--max-concurrency", "16"), ("--seed", "1"), ("--tokenizer", "/ck")):
        assert cmd[cmd.index(flag) + 1] == val


def test_sharegpt_file_is_long_enough_and_distinct(tmp_path):
    data = json.loads(bench.write_sharegpt(tmp_path / "s.json", conversations=8, seed=3).read_text())
    firsts = [d["conversations"][0]["value"] for d in data]
    assert len(set(f[:20] for f in firsts)) == 8 and min(map(len, firsts)) > 8192 and all(f.isascii() for f in firsts)


def test_ratio_math_per_round_and_spread():
    runs = []
    for rd, (b, x) in enumerate(((100.0, 110.0), (100.0, 90.0), (50.0, 60.0)), 1):
        runs += [{"workload": "w", "round": rd, "arm": "base", "result": {"ok": True, "output_throughput": b,
                                                                          "mean_tpot_ms": 10.0}},
                 {"workload": "w", "round": rd, "arm": "x", "result": {"ok": True, "output_throughput": x,
                                                                       "mean_tpot_ms": 5.0}}]
    runs.append({"workload": "w", "round": 4, "arm": "x", "result": {"ok": False}})
    t = serve_report.ratios(runs, "base")["w"]["x"]
    assert t["output_throughput"] == {"per_round": [1.1, 0.9, 1.2], "median": 1.1, "min": 0.9, "max": 1.2}
    assert t["mean_tpot_ms"]["median"] == 0.5 and t["rounds_left_out"] == 1


def _answer(name, ids, lps, margins=None, tf=None):
    return {"name": name, "ok": True, "ids": ids, "logprobs": lps, "margins": margins or [1.0] * len(ids),
            "tf": {"ok": True, "logprobs": tf if tf is not None else lps}}


def test_token_comparison_and_verdict():
    base = [_answer("a", [1, 2, 3, 4], [-1.0, -2.0, -3.0, -4.0]),
            _answer("b", [1, 2, 3, 4], [-1.0, -1.0, -1.0, -1.0], margins=[1.0, 1.0, 0.05, 1.0])]
    other = [_answer("a", [1, 2, 3, 4], [-1.1, -2.0, -3.0, -4.1], tf=[-1.0, -2.0, -3.0, -4.2]),
             _answer("b", [1, 2, 9, 4], [-1.0, -1.2, -5.0, -1.0], tf=[-1.0, -1.2, -1.04, -1.0])]
    rows = serve_report.compare_tokens(base, other, 4)
    assert rows[0]["leading_equal"] == 4 and rows[0]["mean_abs_logprob_diff"] == pytest.approx(0.05)
    assert rows[0]["base_margin_at_divergence"] is None
    assert rows[0]["tf_mean_abs_diff"] == pytest.approx(0.05) and rows[0]["tf_max_abs_diff"] == pytest.approx(0.2)
    # the arm's own decode against its own extend, over the leading run: -1.1 vs -1.0 at 0, -4.1 vs -4.2 at 3
    assert rows[0]["decode_vs_extend_max"] == pytest.approx(0.1)
    assert rows[1]["leading_equal"] == 2 and rows[1]["mean_abs_logprob_diff"] == pytest.approx(0.1)
    assert rows[1]["base_margin_at_divergence"] == pytest.approx(0.05)  # where it flipped: a near tie
    assert rows[1]["tf_mean_abs_diff"] == pytest.approx(0.06)
    v = serve_report.accuracy_verdict(rows, 0.5, 0.1)
    assert v["all_leading_equal"] == 1 and v["ok"] and v["mean_abs_logprob_diff"] == pytest.approx(0.075)
    assert v["diverged"] == 1 and v["diverged_at_near_tie"] == 1 and v["tf_mean_abs_diff_max"] == pytest.approx(0.06)
    # most prompts not all equal, but the one divergence is at a near tie (0.05 <= 2 x 0.1): still ok
    assert serve_report.accuracy_verdict(rows, 0.75, 0.1)["ok"]
    # the same flip at a wide margin is not explained by rounding
    assert not serve_report.accuracy_verdict(rows, 0.75, 0.1, near_tie=0.04)["ok"]
    # teacher-forced logprobs off by more than the tolerance on one prompt fail it
    assert not serve_report.accuracy_verdict(rows, 0.5, 0.055)["ok"]
    with pytest.raises(ValueError):
        serve_report.compare_tokens(base, other[:1])


def test_verdict_needs_every_answer_and_the_teacher_forced_run():
    base = [_answer("a", [1, 2], [-1.0, -1.0]), _answer("b", [1, 2], [-1.0, -1.0])]
    unanswered = [_answer("a", [1, 2], [-1.0, -1.0]), {"name": "b", "ok": False, "error": "HTTP 500"}]
    v = serve_report.accuracy_verdict(serve_report.compare_tokens(base, unanswered, 2), 0.5, 0.1)
    assert v["answered"] == 1 and not v["ok"]
    no_tf = [_answer("a", [1, 2], [-1.0, -1.0]), _answer("b", [1, 2], [-1.0, -1.0])]
    no_tf[1]["tf"] = {"ok": False, "error": "teacher-forced ids misaligned"}
    rows = serve_report.compare_tokens(base, no_tf, 2)
    assert rows[1]["tf_error"] == "teacher-forced ids misaligned"
    assert not serve_report.accuracy_verdict(rows, 0.5, 0.1)["ok"]
    # a divergence without a recorded margin is not counted as a near tie
    flip = [_answer("a", [1, 3], [-1.0, -1.0]), _answer("b", [1, 2], [-1.0, -1.0])]
    base[0]["margins"] = [1.0]  # no margin at position 1
    v = serve_report.accuracy_verdict(serve_report.compare_tokens(base, flip, 2), 1.0, 0.1)
    assert v["diverged"] == 1 and v["diverged_at_near_tie"] == 0 and not v["ok"]


def test_verdict_is_inconclusive_where_the_baseline_disagrees_with_itself():
    """H200 run 4: SGLang's own triton server scored its greedy tokens in a prefill 1.6-4.7 nats
    away from its decode logprobs: the teacher-forced comparison then says nothing about the arm."""
    base = [_answer("a", [1, 2], [-1.0, -1.0], tf=[-1.05, -1.0]), _answer("b", [1, 2], [-1.0, -1.0], tf=[-3.0, -4.0])]
    other = [_answer("a", [1, 2], [-1.0, -1.0], tf=[-1.05, -1.0]), _answer("b", [1, 2], [-1.0, -1.0], tf=[-3.0, -4.0])]
    rows = serve_report.compare_tokens(base, other, 2)
    assert rows[0]["base_decode_vs_extend_mean"] == pytest.approx(0.025) and rows[1]["base_decode_vs_extend_mean"] == 2.5
    v = serve_report.accuracy_verdict(rows, 0.5, 0.1)
    assert not v["ok"] and "2.5 nats" in v["inconclusive"] and v["base_decode_vs_extend_mean_max"] == 2.5
    assert "INCONCLUSIVE" in serve_report.markdown(_report_with_accuracy(v, rows))
    base[1]["tf"]["logprobs"] = [-1.0, -1.0]
    v = serve_report.accuracy_verdict(serve_report.compare_tokens(base, other, 2), 0.5, 0.1)
    assert v["inconclusive"] is None


def _report_with_accuracy(verdict, rows):
    return {"command": "c", "meta": {"model": "m", "gpu": "g", "date": "d", "layers_note": "n", "arms": [],
                                     "baseline": "b", "server_opts": {}},
            "runs": [], "ratios": {}, "accuracy": {"x": {"verdict": verdict, "per_prompt": rows}}, "servers": [],
            "profiles": {}, "notes": []}


def test_accuracy_prompts_are_fixed_token_ids():
    import serve_llm

    p = serve_llm.accuracy_prompts(9)
    assert [len(x["ids"]) for x in p] == [16, 64, 200, 500, 1000, 1500, 2200, 3000, 16]
    assert p == serve_llm.accuracy_prompts(9) and p[0]["ids"] != p[8]["ids"]
    assert all(1000 <= i < 30000 for x in p for i in x["ids"])


def test_profile_analysis():
    ev = [{"ph": "X", "cat": "kernel", "name": "fp8_paged_decode_split", "dur": 30.0},
          {"ph": "X", "cat": "kernel", "name": "_fwd_kernel_stage1", "dur": 10.0},
          {"ph": "X", "cat": "kernel", "name": "nvjet_tst_128x256_gemm", "dur": 100.0},
          {"ph": "X", "cat": "kernel", "name": "void at::native::vectorized_elementwise_kernel<4>", "dur": 40.0},
          {"ph": "X", "cat": "kernel", "name": "apply_rope_kernel", "dur": 20.0},
          {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "dur": 5.0}]
    r = decode_profile.analyse({"traceEvents": ev}, steps=2, layers=2)
    assert r["gpu_us_per_step"] == 100.0 and r["attention_us_per_layer"] == 10.0 and r["attention_share"] == 0.2
    assert r["us_per_step_by_kind"] == {"attention": 20.0, "gemm": 50.0, "other": 10.0, "torch_native": 20.0}
    assert r["graph_launches"] == 1 and r["top_kernels"][0]["kind"] == "gemm"
    # every kernel above ran once in 2 steps: none once a step
    assert r["us_per_step_once"] == 0.0
    assert not decode_profile.analyse({"traceEvents": []}, 1, 1)["ok"]
    assert decode_profile.kind_of("fused_rmsnorm_attn_kernel") != "attention"


def test_profile_projection_to_full_depth():
    """Two steps of a 2-layer cut: the LM head (once a step) stays, the per-layer kernels scale with
    depth; a kernel launched twice a step is a per-layer one."""
    ev = []
    for _ in range(2):
        ev += [{"ph": "X", "cat": "kernel", "name": "lm_head_nvjet_gemm", "dur": 50.0}]
        ev += [{"ph": "X", "cat": "kernel", "name": "fp8_paged_decode_split", "dur": 10.0}] * 2
        ev += [{"ph": "X", "cat": "kernel", "name": "nvjet_layer_gemm", "dur": 20.0}] * 2
    r = decode_profile.analyse({"traceEvents": ev}, steps=2, layers=2)
    assert r["gpu_us_per_step"] == 110.0 and r["us_per_step_once"] == 50.0
    assert decode_profile.project(r, 2, 2) == 110.0
    assert decode_profile.project(r, 2, 10) == 50.0 + 60.0 * 5
    with pytest.raises(ValueError):
        decode_profile.project(r, 0, 10)


def test_cpu_dry_run_resolves_every_arm(tmp_path):
    """The whole --cpu-dry path of one model (Llama: two arms) through SGLang 0.5.23."""
    from sglang_harness import require_version

    sgl = require_version("0.5.23")
    out = subprocess.run([sys.executable, str(ROOT / "benchmark" / "release" / "serve_llm.py"), "--model", "llama3_8b",
                          "--out", str(tmp_path / "out"), "--work", str(tmp_path / "w"), "--cpu-dry",
                          "--pythonpath", str(sgl), "--layers", "2"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads((tmp_path / "out" / "serve_llm-llama3_8b.json").read_text())
    assert [(r["name"], r.get("backend", r.get("error"))) for r in res["dry"]["resolved"]] == [("fa3", "fa3"), ("fa4", "fa4")]
    assert (tmp_path / "out" / "serve_llm-llama3_8b.md").read_text().startswith("# LLM serving: llama3_8b")


def test_gemma4_checkpoint_is_read_text_only_by_sglang(tmp_path):
    """SGLang 0.5.23's ModelConfig on the written directory: not multimodal (no processor is loaded),
    the 31B's full-attention head dim, the cut layer count; without the declaration it is multimodal
    (the control: the declaration is what turns the processor off)."""
    from sglang_harness import require_version

    sgl = require_version("0.5.23")
    ck.write_checkpoint("gemma4_31b", tmp_path / "g", 6)
    code = (
        "import json, sys\n"
        "from pathlib import Path\n"
        "from sglang.srt.configs.model_config import ModelConfig\n"
        "p = Path(sys.argv[1]); c = json.loads((p / 'config.json').read_text())\n"
        "a = ModelConfig(str(p))\n"
        "c.pop('language_model_only'); q = p.parent / 'mm'; q.mkdir()\n"
        "for f in p.iterdir(): (q / f.name).write_bytes(f.read_bytes())\n"
        "(q / 'config.json').write_text(json.dumps(c))\n"
        "b = ModelConfig(str(q))\n"
        "print(json.dumps([a.is_multimodal, a.head_dim, a.num_hidden_layers, b.is_multimodal]))\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "g")], capture_output=True, text=True,
                         timeout=240, env={**os.environ, "PYTHONPATH": f"{sgl}{os.pathsep}{ROOT}"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [False, 512, 6, True]


def test_a_failing_run_exits_1_naming_the_error_and_keeps_the_report(tmp_path):
    """Without SGLang on the path the dry run's first arm fails: exit 1, the error in the report's
    notes (not mistaken for the call's time limit)."""
    out = subprocess.run([sys.executable, str(ROOT / "benchmark" / "release" / "serve_llm.py"), "--model", "llama3_8b",
                          "--out", str(tmp_path / "out"), "--work", str(tmp_path / "w"), "--cpu-dry",
                          "--pythonpath", str(tmp_path / "no-sglang"), "--layers", "2"],
                         capture_output=True, text=True, timeout=120,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert out.returncode == 1 and "resolve_arms.py failed" in out.stderr
    notes = json.loads((tmp_path / "out" / "serve_llm-llama3_8b.json").read_text())["notes"]
    assert any(n.startswith("FAILED: SystemExit: resolve_arms.py failed") for n in notes)
    assert not any("SIGTERM" in n for n in notes)


def test_bench_serving_takes_the_command_offline(tmp_path):
    """The exact bench_serving command of a run, through bench_serving_main.py --parse-only against
    SGLang 0.5.23: SGLang's parser accepts every flag and its own dataset reader builds the requests
    from the local ShareGPT file and the checkpoint's tokenizer (no network), at the workload's lengths."""
    from sglang_harness import require_version

    sgl = require_version("0.5.23")
    ck.write_checkpoint("llama3_8b", tmp_path / "ck", 2)
    ds = bench.write_sharegpt(tmp_path / "ds.json")
    w = bench.Workload(1024, 64, 4, 2)
    cmd = bench.command(sys.executable, 1, str(tmp_path / "ck"), ds, w, 1, tmp_path / "o.jsonl")
    assert cmd[1].endswith("bench_serving_main.py")
    out = subprocess.run([cmd[0], cmd[1], "--parse-only", *cmd[2:]], capture_output=True, text=True, timeout=240,
                         env={**os.environ, "PYTHONPATH": str(sgl)})
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["args"]["max_concurrency"] == 2 and res["args"]["random_range_ratio"] == 1.0
    assert len(res["requests"]) == 4 and all(abs(p - 1024) <= 1 and o == 64 for p, o in res["requests"])


def test_profile_and_accuracy_requests_send_token_ids():
    """Every /generate the harness sends carries token ids (H200 run 4's profile sent text through
    the ids path and its 16 requests never decoded): the profile's prompts are ``n`` distinct id
    lists of the context length, and ``generate`` refuses anything but a non-empty id list before
    any request goes out."""
    import serve_llm

    p = serve_llm.profile_prompts(16, 8192)
    assert len(p) == 16 and {len(x) for x in p} == {8192} and len({tuple(x[:8]) for x in p}) == 16
    for bad in ("some text", [], [1.5, 2], None):
        with pytest.raises(TypeError, match="token ids"):
            serve_llm.generate(1, bad, 4)


def test_teacher_forced_request_and_reading(monkeypatch):
    """The teacher-forced request scores the answer from the prompt's last token on (SGLang reports
    the first position of the range as None), and its reading keeps the answer's logprobs in order;
    ids that do not line up, or a missing logprob, are errors, not numbers."""
    import serve_llm

    sent = []

    def fake_http(url, body, timeout):
        sent.append(body)
        ids = body["input_ids"][body["logprob_start_len"]:]
        lp = [[None, ids[0], None]] + [[-1.0 - i, t, None] for i, t in enumerate(ids[1:])]
        return 200, json.dumps({"meta_info": {"input_token_logprobs": lp}}).encode()

    monkeypatch.setattr(serve_llm, "http", fake_http)
    r = serve_llm.teacher_forced(1, [5, 6, 7], [8, 9])
    assert sent[0]["input_ids"] == [5, 6, 7, 8, 9] and sent[0]["logprob_start_len"] == 2
    assert r == {"ok": True, "logprobs": [-1.0, -2.0]}
    monkeypatch.setattr(serve_llm, "http", lambda url, body, timeout: (200, json.dumps(
        {"meta_info": {"input_token_logprobs": [[None, 7, None], [-1.0, 9, None], [-2.0, 8, None]]}}).encode()))
    assert "misaligned" in serve_llm.teacher_forced(1, [5, 6, 7], [8, 9])["error"]
    monkeypatch.setattr(serve_llm, "http", lambda url, body, timeout: (200, json.dumps(
        {"meta_info": {"input_token_logprobs": [[None, 8, None], [-1.0, 9, None]]}}).encode()))
    assert "missing" in serve_llm.teacher_forced(1, [5, 6, 7], [8, 9])["error"]


def test_one_client_process_takes_several_runs(tmp_path):
    """bench.Client: one ``bench_serving_main.py --stdin`` process (SGLang 0.5.23 imported once)
    takes two runs' exact arguments (``--parse-only``: offline), then a bad one, then another good
    one: each answered on its own DONE line, the bad one's error named, the process still alive."""
    from sglang_harness import require_version

    sgl = require_version("0.5.23")
    ck.write_checkpoint("llama3_8b", tmp_path / "ck", 2)
    ds = bench.write_sharegpt(tmp_path / "ds.json")
    client = bench.Client(sys.executable, {**os.environ, "PYTHONPATH": str(sgl)}, tmp_path)
    try:
        for w in (bench.Workload(1024, 64, 4, 2), bench.Workload(512, 8, 3, 3)):
            cmd = bench.command(sys.executable, 1, str(tmp_path / "ck"), ds, w, 1, tmp_path / "o.jsonl")
            rc, err, text = client.run(["--parse-only", *cmd[2:]], 240)
            assert (rc, err) == (0, None), text[-3000:]
            res = json.loads(text.strip().splitlines()[-1])
            assert res["args"]["max_concurrency"] == w.concurrency
            assert len(res["requests"]) == w.num_prompts
            assert all(abs(p - w.input_len) <= 1 and o == w.output_len for p, o in res["requests"])
        pid = client.proc.pid
        rc, err, _ = client.run(["--dataset-name", "no-such-dataset"], 60)
        assert rc == 1 and "SystemExit" in err  # argparse's refusal, reported, not fatal
        rc, err, _ = client.run(["--parse-only", *cmd[2:]], 240)
        assert rc == 0 and client.proc.pid == pid
    finally:
        client.close()


def test_client_timeout_kills_and_the_next_run_restarts(tmp_path, monkeypatch):
    """A run that never sends its DONE line: ``(124, "timeout ...")`` and the process killed; the
    next run starts a new process."""
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\nexec sleep 30\n")
    fake.chmod(0o755)
    client = bench.Client(str(fake), dict(os.environ), tmp_path)
    rc, err, _ = client.run(["x"], 0.5)
    assert rc == 124 and err.startswith("timeout") and client.proc is None
    client.close()


def test_the_bench_client_gets_the_servers_stand_ins(tmp_path):
    """On a CUDA machine ``sglang.benchmark.serving`` imports ``sgl_kernel`` (SGLang's quantization
    registry): the client's path holds the same stand-ins as the servers' (the first H100 call's runs
    all failed on that import), and not the plugin's entry point."""
    import serve_llm

    a = type("A", (), {"work": tmp_path, "pythonpath": "/x/sgl"})()
    client, server = serve_llm.client_pythonpath(a).split(":"), serve_llm.server_pythonpath(a).split(":")
    assert client[-1] == "/x/sgl" and str(tmp_path / "ep") not in client and str(tmp_path / "ep") in server
    assert client[:2] == server[:2]
    out = subprocess.run([sys.executable, "-c", "from sgl_kernel import int8_scaled_mm; print(int8_scaled_mm)"],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": ":".join(client[:2])})
    assert out.returncode == 0, out.stderr[-2000:]
    bare = subprocess.run([sys.executable, "-c", "import sgl_kernel"], capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert bare.returncode != 0  # without them the import fails here too


def test_datasets_stand_in_only_where_the_package_is_missing(monkeypatch):
    import importlib.util

    import bench_serving_main as m

    monkeypatch.delitem(sys.modules, "datasets", raising=False)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    assert m.install_datasets_stand_in() is False and "datasets" not in sys.modules
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert m.install_datasets_stand_in() is True
    with pytest.raises(RuntimeError, match="stand-in"):
        sys.modules["datasets"].load_dataset("MMMU")
    monkeypatch.delitem(sys.modules, "datasets")


def test_log_facts_of_the_first_h100_servers():
    """The facts read from the first H100 run's server logs (committed): SGLang's resolved backend per
    arm (the dict form of its server_args line), the plugin's Gemma-4 line in the fa4 server, the
    route's warmups before the crash, and the stand-in that was called (the crash's cause)."""
    import tarfile

    import serve_llm

    logs = ROOT / "benchmark" / "results" / "h100" / "serve_llm-gemma4_31b-run1-logs.tgz"
    with tarfile.open(logs) as tar:
        text = {arm: tar.extractfile(f"server-gemma4_31b-{arm}.log").read().decode() for arm in ("fa4", "triton")}
    fa4, triton = serve_llm.log_facts(text["fa4"]), serve_llm.log_facts(text["triton"])
    assert fa4["attention_backends"] == ["fa4"] and triton["attention_backends"] == ["triton"]
    assert "sglang-fa4: Gemma-4 attention backend fa4" in text["fa4"]
    assert "fp8 split-KV decode d=512 heads=32/4" in text["fa4"] and "d=512" not in text["triton"]
    assert "sgl_kernel.weak_ref_tensor" in fa4["stand_ins_called"]


def test_kernels_loaded_after_ready_in_the_third_h100_run():
    """Run 3's committed logs (both servers ready): every Triton kernel loaded after "ready" is
    named; the route's own (fp8_*) count 0 in the fa4 server (all compiled by its startup warmup),
    while SGLang's own kernels (its extend `_fwd_kernel` in the triton arm, the copy kernels in both)
    still load on the request path."""
    import tarfile

    import serve_llm

    logs = ROOT / "benchmark" / "results" / "h100" / "serve_llm-gemma4_31b-run3-logs.tgz"
    with tarfile.open(logs) as tar:
        text = {arm: tar.extractfile(f"server-gemma4_31b-{arm}.log").read().decode() for arm in ("fa4", "triton")}
    fa4, triton = serve_llm.log_facts(text["fa4"]), serve_llm.log_facts(text["triton"])
    assert fa4["route_triton_after_ready"] == 0 and triton["route_triton_after_ready"] == 0
    assert sum(fa4["triton_after_ready_names"].values()) == fa4["triton_after_ready"] == 10
    assert triton["triton_after_ready_names"]["_fwd_kernel"] == 2 and "_fwd_kernel" not in fa4["triton_after_ready_names"]
    assert "fp8_paged_decode_split" in text["fa4"] and fa4["triton_before_ready"] > 0


def test_the_whole_run_against_fake_servers(tmp_path, monkeypatch):
    """serve_llm.run end to end on the CPU: real server processes (tests/fake_sglang_server.py, which
    speaks SGLang's /generate conventions and takes token ids only), the accuracy prompts and their
    teacher-forced scoring, three interleaved rounds through the bench client (a stand-in writing
    bench_serving's result line), the profiles after the rounds, the report and exit code. Both
    H200/H100 harness failures of 2026-12-07 (client without stand-ins, profile prompts sent as text)
    stopped a whole device call; this runs every step of such a call here first."""
    import serve_llm

    fake = ROOT / "tests" / "fake_sglang_server.py"
    ports = {}

    def build_servers(a, arms, ckpt, pythonpath, opts):
        out = []
        for arm in arms:
            ports[arm.name] = port = serve_llm.free_port()
            argv = [sys.executable, str(fake), "--port", str(port), "--attention-backend", arm.backend,
                    "--gather", str(serve_llm.PROFILE_REQUESTS),
                    "--gather-new-tokens", str(serve_llm.PROFILE_NEW_TOKENS)]
            env = {**os.environ, **serve_arms.server_env(arm)}
            out.append(serve_llm.Server(arm, argv, env, a.work / f"server-{a.model}-{arm.name}.log", port))
        return out

    class Client:
        def __init__(self, python, env, cwd):
            self.started = False

        def start(self):
            self.started = True

        def run(self, args, timeout):
            assert self.started  # started while the servers came up
            port, out = int(args[args.index("--port") + 1]), Path(args[args.index("--output-file") + 1])
            n = int(args[args.index("--num-prompts") + 1])
            tput = 1000.0 * (1.2 if port == ports["fa4"] else 1.0)
            out.write_text(json.dumps({"completed": n, "duration": 1.0, "output_throughput": tput,
                                       "mean_tpot_ms": 10.0, "median_tpot_ms": 10.0, "median_itl_ms": 9.0,
                                       "mean_itl_ms": 9.0, "mean_ttft_ms": 100.0, "median_ttft_ms": 100.0,
                                       "errors": [""] * n, "output_lens": [8] * n}) + "\n")
            return 0, None, "fake bench\n"

        def close(self):
            pass

    monkeypatch.setattr(serve_llm, "build_servers", build_servers)
    monkeypatch.setattr(serve_llm.bench, "Client", Client)
    rc = serve_llm.main(["--model", "gemma4_31b", "--arms", "triton,fa4", "--out", str(tmp_path / "out"),
                         "--work", str(tmp_path / "work"), "--workloads", "64:8:4:4", "--rounds", "3",
                         "--accuracy-prompts", "3", "--profile-steps", "2", "--profile-context", "512",
                         "--start-timeout-s", "60", "--time-budget-s", "400"])
    res = json.loads((tmp_path / "out" / "serve_llm-gemma4_31b.json").read_text())
    assert rc == 0, res["notes"]
    assert [s["ready"] for s in res["servers"]] == [True, True]
    assert [x["resolved_backend"] for x in res["meta"]["arms"]] == [["triton"], ["fa4"]]  # read from each log
    assert all(s["log_facts"]["triton_after_ready"] == 0 for s in res["servers"])
    assert [(r["round"], r["arm"]) for r in res["runs"]] == [(1, "triton"), (1, "fa4"), (2, "triton"), (2, "fa4"),
                                                            (3, "triton"), (3, "fa4")]
    assert all(r["result"]["ok"] for r in res["runs"])
    assert res["ratios"]["in64-out8-c4"]["fa4"]["output_throughput"]["per_round"] == [1.2, 1.2, 1.2]
    v = res["accuracy"]["fa4"]["verdict"]
    # the same "model" in both arms: every token equal, prefill scores equal decode, nothing inconclusive
    assert v["ok"] and v["all_leading_equal"] == 3 and v["tf_mean_abs_diff_max"] == 0.0
    assert v["base_decode_vs_extend_mean_max"] == 0.0 and v["inconclusive"] is None
    for arm in ("triton", "fa4"):
        p = res["profiles"][arm]
        assert p["ok"] and p["gpu_us_per_step"] == 500.0 and p["attention_us_per_layer"] == 10.0
        assert p["us_per_step_once"] == 20.0
    md = (tmp_path / "out" / "serve_llm-gemma4_31b.md").read_text()
    # the fake trace's LM head (20 us) once a step, the other 480 us x 60/12 at full depth, the arms alike
    assert "- **fa4**: 2420.0 us a decode step (20.0 us of it once a step); baseline / arm 1.000" in md
    assert "PASS" in md and "| in64-out8-c4 | fa4 | output_throughput | 1.200 |" in md
