"""benchmark/serve_check/checkpoints.py: the small Qwen2.5-VL / Qwen3-VL checkpoint directories the
server check (benchmark/release/check_server.py) launches SGLang on. Checked against the REAL SGLang 0.5.20
and 0.5.23 (and the transformers each pins): the tokenizer holds every special token at the id the
config names and round-trips text; SGLang's ServerArgs take the check's argument set and resolve
it as intended; SGLang's model config reads the directory; SGLang's own multimodal processor turns
a prompt with an image into the number of image tokens the model's patch geometry gives."""

import json
import sys
from pathlib import Path

import pytest

from sglang_harness import run_script

ROOT = Path(__file__).resolve().parents[1]
SERVE = ROOT / "benchmark" / "serve_check"
sys.path[:0] = [str(SERVE), str(ROOT / "benchmark" / "release")]
import checkpoints  # noqa: E402

# the check's module dirs, as the scripts' first two arguments
PATHS = f"{str(SERVE)!r}, {str(ROOT / 'benchmark' / 'release')!r}"


def expected_tokens(model: str, width: int, height: int) -> int:
    """Merged image tokens for one picture: the model's smart_resize grid over merge_size**2
    (sglang_fa4.bench's geometry, written independently of the processors)."""
    from sglang_fa4.bench.vit import GEOMETRY

    t, h, w = GEOMETRY[model].grid_thw(width, height, 1)
    return t * h * w // 4


def test_configs_keep_the_public_values_and_cut_only_the_language_model():
    q25 = checkpoints.model_config("qwen2_5_vl", 4)
    assert q25["num_hidden_layers"] == 4 and q25["vision_config"]["depth"] == 32
    assert q25["vision_config"]["fullatt_block_indexes"] == [7, 15, 23, 31]
    assert (q25["hidden_size"], q25["vocab_size"], q25["image_token_id"]) == (3584, 152064, 151655)
    q3 = checkpoints.model_config("qwen3_vl", 4)
    assert q3["text_config"]["num_hidden_layers"] == 4 and q3["vision_config"]["depth"] == 27
    assert q3["vision_config"]["deepstack_visual_indexes"] == [8, 16, 24]
    assert checkpoints.QWEN3_VL_CONFIG["text_config"]["num_hidden_layers"] == 36  # the original is untouched
    with pytest.raises(ValueError, match="at least 3"):
        checkpoints.model_config("qwen3_vl", 2)  # deepstack feeds the first three layers


def test_tokenizer_and_processor_with_pinned_transformers(sglang_version, tmp_path):
    """Written with the tokenizers/transformers the SGLang version pins; loaded back through
    transformers' Auto classes."""
    out = run_script(sglang_version, "server_checkpoint_checks", f"tokenizer_and_processor({PATHS}, {str(tmp_path)!r})")
    for model in checkpoints.MODELS:
        r = out[model]
        assert r["ids"] == checkpoints.SPECIAL_IDS
        for token, cid in r["config_ids"].items():
            assert r["ids"][token] == cid, (model, token)
        assert r["roundtrip"]
        assert r["specials_single"] == [151644, 151652, 151655, 151653, 151645]  # one id per special token
        assert r["prompt"].endswith("<|vision_start|><|image_pad|><|vision_end|>Hi<|im_end|>\n<|im_start|>assistant\n")
        assert r["pads"] == {"448x448": expected_tokens(model, 448, 448), "1280x720": expected_tokens(model, 1280, 720)}
        assert r["hf_layers"] == 4
    assert out["qwen2_5_vl"]["processor"] == "Qwen2_5_VLProcessor" and out["qwen3_vl"]["processor"] == "Qwen3VLProcessor"
    assert out["qwen2_5_vl"]["pads"]["448x448"] == 256 and out["qwen3_vl"]["pads"]["448x448"] == 196


def test_sglang_reads_the_checkpoints_and_the_server_arguments(sglang_version, tmp_path):
    """SGLang's ServerArgs (from the CLI parser), ModelConfig and its own Qwen-VL multimodal
    processor (what the tokenizer manager runs per request) on the check's directories."""
    out = run_script(sglang_version, "server_checkpoint_checks", f"sglang_reads_the_checkpoints({PATHS}, {str(tmp_path)!r})",
                     env={"SGLANG_IS_FLASHINFER_AVAILABLE": "false"}, timeout=600)
    for model, arch in (("qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration"), ("qwen3_vl", "Qwen3VLForConditionalGeneration")):
        r = out[model]
        assert r["args"] == {"attention_backend": "triton", "mm_attention_backend": "fa4", "sampling_backend": "pytorch",
                             "enable_deterministic_inference": True, "disable_radix_cache": True,
                             "load_format": "dummy", "chunked_prefill_size": 16384}
        assert r["arch"] == [arch] and r["multimodal"] and r["layers"] == 4
        assert r["mm_processor"] == "QwenVLImageProcessor"
        assert r["pads"] == {k: expected_tokens(model, *map(int, k.split("x"))) for k in r["pads"]}, r["pads"]


def test_check_plugin_target_exists_and_hooks(sglang_version):
    """The check's own plugin hooks a target that exists in this SGLang (DummyModelLoader.load_model)
    and its hook redraws and logs after the real dummy loader's output."""
    out = run_script(sglang_version, "server_checkpoint_checks", f"check_plugin_hooks({PATHS})")
    assert out["patched"]
    assert out["norm"] == [1.0, 0.0] and out["bias"] == 0.0
    assert 0.015 < out["std"] < 0.025
    assert "serve-check: weights redrawn" in out["log"] and "serve-check: hooks in" in out["log"]
    import check_plugin
    import logcheck

    hooks = logcheck.analyse(out["log"])["hooks"]  # the orchestrator's own reader
    # registered outside load_plugins(): no plugin source, hence "?"
    assert len(hooks) == 1
    assert sorted(hooks[0]["applied"]["?"]) == sorted([check_plugin.LOADER_TARGET, *check_plugin.TOWER_TARGETS])


def test_redraw_is_deterministic_per_parameter_name():
    import torch

    import check_plugin

    def build():
        m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
        torch.nn.init.uniform_(m[0].weight)
        return m

    a, b = build(), build()
    torch.nn.init.zeros_(b[1].weight)
    counts = check_plugin.redraw_(a)
    check_plugin.redraw_(b)
    assert counts == {"normal": 2, "ones": 0, "zeros": 2, "qk_norm": 0}
    assert torch.equal(a[0].weight, b[0].weight) and torch.equal(a[1].weight, b[1].weight)
    assert not torch.equal(a[0].weight, a[1].weight)  # seeded by name, not one stream reused
    assert check_plugin._is_norm("visual.merger.ln_q.weight") and check_plugin._is_norm("model.layers.0.self_attn.q_norm.weight")
    assert not check_plugin._is_norm("model.layers.0.mlp.down_proj.weight")


def test_redraw_scales_qk_norms_only_where_attention_does_not():
    """Gemma-4 (q.k unscaled after the q/k norms): q_norm / k_norm weights head_dim**-0.25, so the
    attention logits of unit-RMS q and k spread ~1; the same module tree under another model class
    keeps them 1, and Gemma-4's other norms stay 1."""
    import torch

    import check_plugin

    def tree(cls_name, d):
        attn = torch.nn.Module()
        attn.q_norm, attn.k_norm, attn.o_proj = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d), torch.nn.Linear(d, d)
        layer = torch.nn.Module()
        layer.self_attn, layer.input_layernorm = attn, torch.nn.LayerNorm(d)
        return type(cls_name, (torch.nn.Module,), {})(), layer

    for cls_name, d, want in (("Gemma4ForConditionalGeneration", 256, 0.25), ("Gemma4ForCausalLM", 512, 512 ** -0.25),
                              ("Qwen3ForCausalLM", 256, 1.0)):
        model, layer = tree(cls_name, d)
        model.layer = layer
        counts = check_plugin.redraw_(model)
        for norm in (layer.self_attn.q_norm, layer.self_attn.k_norm):
            assert torch.allclose(norm.weight, torch.full((d,), want)) and torch.equal(norm.bias, torch.zeros(d))
        assert torch.equal(layer.input_layernorm.weight, torch.ones(d))
        assert counts["qk_norm"] == (2 if want != 1.0 else 0)
    # the logits' spread the fill gives: unit-RMS q and k over d dims, weighted, dot product std ~1
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(4096, 256, generator=g), torch.randn(4096, 256, generator=g)
    assert 0.9 < ((q * 0.25) * (k * 0.25)).sum(-1).std().item() < 1.1


def test_vit_call_line_holds_hashes_and_call_context():
    """The per-call evidence line: per image its grid and input/output hashes (the output rows found
    through the merger's ratio), and what the call ran under; never raises into the server."""
    import json
    import logging

    import torch

    import check_plugin

    records = []
    handler = logging.Handler()
    handler.emit = lambda r: records.append(r.getMessage())
    check_plugin.logger.addHandler(handler)
    try:
        x = torch.randn(8 + 16, 6).to(torch.bfloat16)  # two images: 8 and 16 patch rows
        out = torch.randn(6, 4).to(torch.bfloat16)  # merger: 4 rows -> 1
        with torch.inference_mode():
            check_plugin.after_tower_forward(out, torch.nn.Linear(2, 2), x, torch.tensor([[1, 2, 4], [1, 4, 4]]))
        check_plugin.after_tower_forward(out, object(), "not a tensor", [[1, 2, 4]])  # logged, not raised
    finally:
        check_plugin.logger.removeHandler(handler)
    line = json.loads(records[0].split("vit call ", 1)[1])
    assert [i["grid"] for i in line["images"]] == [[1, 2, 4], [1, 4, 4]]
    assert line["images"][0]["out"] == check_plugin._bits_hash(out[:2])
    assert line["images"][1]["out"] == check_plugin._bits_hash(out[2:6])
    assert line["images"][1]["in"] == check_plugin._bits_hash(x[8:])
    ctx = line["call_context"]
    assert ctx["x_dtype"] == "torch.bfloat16" and ctx["x_contiguous"] and ctx["inference_mode"] is True
    assert "batch_invariant" in ctx and "budget" in ctx
    assert "not hashed" in records[1]


def test_vit_probe_separates_batch_dependence_from_graph_vs_eager(monkeypatch):
    """The probe variant: each image of a multi-image call runs again alone through the normal path
    and with the budgets set aside (eager); a tower whose eager path differs from its replay by one
    ulp shows up as alone_eager != alone, batched == alone; the log reader summarises the lines."""
    import json
    import logging
    from types import SimpleNamespace

    import torch

    import check_plugin
    import logcheck
    from sglang_fa4.integration import vit_budgets

    state = SimpleNamespace(budgets=(1024,), replays=0, eager_runs=0)

    class Tower:
        def forward(self, x, grid_thw):
            out = x.reshape(-1, 4, x.shape[1]).sum(1)
            if state.budgets == (0,):
                state.eager_runs += 1
                return out + 2.0 ** -8
            state.replays += 1
            return out

    tower = Tower()
    monkeypatch.setattr(vit_budgets, "find_runners", lambda model: [model])
    monkeypatch.setattr(vit_budgets, "budget_state", lambda runner: state)
    monkeypatch.setenv("SERVE_CHECK_VIT_PROBE", "1")
    records = []
    handler = logging.Handler()
    handler.emit = lambda r: records.append(r.getMessage())
    check_plugin.logger.addHandler(handler)
    try:
        x = torch.randn(8 + 16, 6)
        grid = torch.tensor([[1, 2, 4], [1, 4, 4]])
        check_plugin.after_tower_forward(tower.forward(x, grid), tower, x, grid)
    finally:
        check_plugin.logger.removeHandler(handler)
    assert state.budgets == (1024,)  # restored
    probes = [r for r in records if "vit probe" in r]
    assert len(probes) == 1 and len([r for r in records if "vit call" in r]) == 1  # the probe's calls log nothing
    line = json.loads(probes[0].split("vit probe ", 1)[1])
    assert line["images"] == 2 and [r["alone_path"] for r in line["probed"]] == [["replay"], ["replay"]]
    for r in line["probed"]:
        assert r["batched_vs_alone"] == 0 and r["batched_vs_alone_eager"] > 0 and r["alone_eager_vs_alone"] > 0
    summary = logcheck.vit_probe_summary(["x " + p for p in probes])
    assert summary["images"] == 2 and summary["bitwise_equal"]["batched_vs_alone"] == 2
    assert summary["bitwise_equal"]["alone_eager_vs_alone"] == 0 and summary["alone_paths"] == ["replay"]
    assert logcheck.vit_probe_summary(["nothing here"]) is None
