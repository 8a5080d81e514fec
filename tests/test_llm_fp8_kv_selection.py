"""Issue #17 item 1: the FA3 -> FA4 native-FP8 upgrade of SGLang's LLM attention backend on Hopper.

Every rule of :func:`sglang_fa4.llm_selection.fp8_kv_upgrade` on its own, then the same rules
through SGLang 0.5.20's and 0.5.23's real server-args resolution (``ServerArgs.resolve_once`` on a
model directory, the platform faked with SGLang's own ``override_platform``), with the plugin loaded
by SGLang's plugin loader."""

from __future__ import annotations

import pytest

from sglang_fa4 import llm_selection
from sglang_fa4.environ import envs
from sglang_fa4.llm_selection import LlmModelFacts, fp8_kv_upgrade
from sglang_harness import run_file

QWEN = LlmModelFacts(head_dim=128, v_head_dim=128)


def pick(upstream="fa3", cap=(9, 0), kv="fp8_e4m3", explicit=False, det=False, model=QWEN):
    return fp8_kv_upgrade(upstream, capability=cap, kv_cache_dtype=kv, explicit_backend=explicit,
                          deterministic=det, model=model)


@pytest.fixture()
def upgrade_on(monkeypatch):
    monkeypatch.setenv("SGLANG_FA4_FP8_KV_UPGRADE", "1")


def test_default_is_off(monkeypatch):
    monkeypatch.delenv("SGLANG_FA4_FP8_KV_UPGRADE", raising=False)
    assert envs.SGLANG_FA4_FP8_KV_UPGRADE.default is False
    choice = pick()
    assert (choice.backend, choice.upgraded) == ("fa3", False) and "SGLANG_FA4_FP8_KV_UPGRADE" in choice.reason


@pytest.mark.parametrize("d", llm_selection.FP8_KV_HEAD_DIMS)
def test_upgrade_for_every_kernel_head_dim(upgrade_on, d):
    choice = pick(model=LlmModelFacts(d, d))
    assert (choice.backend, choice.upgraded) == ("fa4", True) and f"head_dim {d}" in choice.reason


def test_head_dims_follow_the_kernel():
    from sglang_fa4.kernels.fp8_sm90.layout import SUPPORTED_HEAD_DIMS

    assert llm_selection.FP8_KV_HEAD_DIMS == tuple(SUPPORTED_HEAD_DIMS)


@pytest.mark.parametrize(
    "kwargs,why",
    [
        (dict(explicit=True), "explicitly"),
        (dict(upstream="flashinfer"), "fa3 default"),
        (dict(upstream="trtllm_mha", cap=(10, 0)), "fa3 default"),
        (dict(cap=(10, 0)), "not an SM90"),
        (dict(cap=(8, 0)), "not an SM90"),
        (dict(cap=None), "not an SM90"),
        (dict(kv="auto"), "'auto'"),
        (dict(kv="fp8_e5m2"), "'fp8_e5m2'"),
        (dict(det=True), "deterministic"),
        (dict(model=None), "unknown"),
        (dict(model=LlmModelFacts(80, 80)), "head_dim 80"),
        (dict(model=LlmModelFacts(160, 160)), "head_dim 160"),
        (dict(model=LlmModelFacts(512, 512)), "head_dim 512"),
        (dict(model=LlmModelFacts(192, 128)), "v_head_dim 128"),
        (dict(model=LlmModelFacts(128, 64)), "v_head_dim 64"),
        (dict(model=LlmModelFacts(128, 128, softcap=50.0)), "softcap"),
        (dict(model=LlmModelFacts(128, 128, use_mla=True)), "MLA"),
        (dict(model=LlmModelFacts(128, 128, swa_head_dims=(80,))), "head_dim 80"),
    ],
)
def test_every_rule_keeps_sglangs_choice(upgrade_on, kwargs, why):
    choice = pick(**kwargs)
    assert not choice.upgraded and choice.backend == kwargs.get("upstream", "fa3")
    assert why in choice.reason, choice.reason


def test_describe_rule(monkeypatch):
    monkeypatch.delenv("SGLANG_FA4_FP8_KV_UPGRADE", raising=False)
    assert not llm_selection.describe_rule((9, 0))["upgrade"]
    assert not llm_selection.describe_rule((10, 0))["upgrade"]
    monkeypatch.setenv("SGLANG_FA4_FP8_KV_UPGRADE", "1")
    on = llm_selection.describe_rule((9, 0))
    assert on["upgrade"] and "128" in on["reason"]


# ---- through SGLang's real server-args resolution ----------------------------------------------

MODELS = {
    # Qwen2.5-7B-like: 28 q heads, 4 kv heads, d=128
    "qwen2_d128": {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
                   "num_attention_heads": 28, "num_key_value_heads": 4, "num_hidden_layers": 2,
                   "intermediate_size": 18944, "vocab_size": 152064, "max_position_embeddings": 32768,
                   "rms_norm_eps": 1e-6, "rope_theta": 1e6, "torch_dtype": "bfloat16"},
    # Qwen2-0.5B-like: d=64
    "qwen2_d64": {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896,
                  "num_attention_heads": 14, "num_key_value_heads": 2, "num_hidden_layers": 2,
                  "intermediate_size": 4864, "vocab_size": 151936, "max_position_embeddings": 32768,
                  "rms_norm_eps": 1e-6, "rope_theta": 1e6, "torch_dtype": "bfloat16"},
    # Gemma-2-9B-like: d=256 and an attention logit softcap
    "gemma2_d256_softcap": {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "hidden_size": 3584,
                            "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256,
                            "num_hidden_layers": 2, "intermediate_size": 14336, "vocab_size": 256000,
                            "max_position_embeddings": 8192, "attn_logit_softcapping": 50.0,
                            "final_logit_softcapping": 30.0, "query_pre_attn_scalar": 256, "sliding_window": 4096,
                            "torch_dtype": "bfloat16"},
    # Llama-like with d=80 (not a kernel head dim)
    "llama_d80": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2560,
                  "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 2,
                  "intermediate_size": 6912, "vocab_size": 32000, "max_position_embeddings": 4096,
                  "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16"},
}

# (model, platform, server args, expected backend with the upgrade on, expected with it off)
CASES = [
    ("qwen2_d128", "sm90", {"kv_cache_dtype": "fp8_e4m3"}, "fa4", "fa3"),
    ("qwen2_d64", "sm90", {"kv_cache_dtype": "fp8_e4m3"}, "fa4", "fa3"),
    ("qwen2_d128", "sm90", {}, "fa3", "fa3"),                                     # bf16 cache
    ("qwen2_d128", "sm90", {"kv_cache_dtype": "fp8_e5m2"}, "triton", "triton"),  # SGLang: fa3 has no e5m2
    ("qwen2_d128", "sm90", {"kv_cache_dtype": "fp8_e4m3", "attention_backend": "fa3"}, "fa3", "fa3"),
    ("qwen2_d128", "sm90", {"kv_cache_dtype": "fp8_e4m3", "attention_backend": "triton"}, "triton", "triton"),
    ("qwen2_d128", "sm90", {"kv_cache_dtype": "fp8_e4m3", "attention_backend": "fa4"}, "fa4", "fa4"),
    ("qwen2_d128", "sm90", {"kv_cache_dtype": "fp8_e4m3", "prefill_attention_backend": "fa3"}, "fa3", "fa3"),
    ("qwen2_d128", "sm90", {"kv_cache_dtype": "fp8_e4m3", "enable_deterministic_inference": True}, "fa3", "fa3"),
    ("gemma2_d256_softcap", "sm90", {"kv_cache_dtype": "fp8_e4m3"}, "fa3", "fa3"),
    ("llama_d80", "sm90", {"kv_cache_dtype": "fp8_e4m3"}, "fa3", "fa3"),
    ("qwen2_d128", "sm100", {"kv_cache_dtype": "fp8_e4m3"}, "trtllm_mha", "trtllm_mha"),
]


@pytest.mark.parametrize("upgrade", [True, False])
def test_rules_through_sglangs_server_args(sglang_version, tmp_path, upgrade):
    cases = [{"model": m, "platform": p, "args": a} for m, p, a, _, _ in CASES]
    out = run_file(sglang_version, "llm_fp8_kv_server_args.py",
                   {"models": MODELS, "cases": cases, "root": str(tmp_path)}, env={
                       "SGLANG_IS_FLASHINFER_AVAILABLE": "false",
                       "SGLANG_FA4_FP8_KV_UPGRADE": "1" if upgrade else "0",
                   }, timeout=600)
    got = [r["backend"] for r in out]
    want = [on if upgrade else off for _, _, _, on, off in CASES]
    assert got == want, list(zip([c[:3] for c in CASES], got, want))
    # fa4 on SM90 keeps SGLang's page size (its page-128 rule is SM100-only)
    assert out[0]["page_size"] == 1


def test_doctor_says_what_it_would_pick(monkeypatch):
    from sglang_fa4 import doctor

    monkeypatch.delenv("SGLANG_FA4_FP8_KV_UPGRADE", raising=False)
    off = doctor.collect("9.0")["llm_fp8_kv"]
    assert not off["upgrade"] and "SGLANG_FA4_FP8_KV_UPGRADE is off" in off["reason"]
    monkeypatch.setenv("SGLANG_FA4_FP8_KV_UPGRADE", "1")
    report = doctor.collect("9.0")
    assert report["llm_fp8_kv"]["upgrade"] and "LLM, fp8 KV:  fa4 upgrade" in doctor.format_text(report)
    assert not doctor.collect("10.0")["llm_fp8_kv"]["upgrade"]
