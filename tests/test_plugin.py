"""The plugin's version-aware plan and registration, with SGLang's HookRegistry faked
(the real-SGLang integration tests are in test_sglang_integration.py)."""

import logging
import sys
import types
from enum import Enum

import pytest

from sglang_fa4 import features, plugin
from sglang_fa4.integration import hooks, llm_fp8_kv, registration, vit_graph_rotary
from sglang_fa4.environ import EnvValueError


class FakeHookType(Enum):
    BEFORE = "before"
    AFTER = "after"
    AROUND = "around"
    REPLACE = "replace"


class FakeRegistry:
    registered = []

    @classmethod
    def register(cls, target, hook, hook_type):
        cls.registered.append((target, hook, hook_type))


@pytest.fixture
def fake_sglang(monkeypatch):
    FakeRegistry.registered = []
    mod = types.ModuleType("sglang.srt.plugins.hook_registry")
    mod.HookRegistry, mod.HookType = FakeRegistry, FakeHookType
    for name in ("sglang", "sglang.srt", "sglang.srt.plugins"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "sglang.srt.plugins.hook_registry", mod)
    monkeypatch.setattr(plugin, "_registered_plan", None)
    monkeypatch.delenv("SGLANG_FA4_MM_ATTENTION_BACKEND_DEFAULT", raising=False)
    monkeypatch.delenv("SGLANG_FA4_WARMUP", raising=False)
    monkeypatch.delenv("SGLANG_FA4_VIT_HOST_METADATA", raising=False)
    monkeypatch.delenv("SGLANG_FA4_VIT_GRAPH_INTERNVL_STARTUP", raising=False)
    monkeypatch.delenv("SGLANG_FA4_VIT_GRAPH_EAGER_POS_EMBED", raising=False)
    monkeypatch.setenv("SGLANG_FA4_KERNEL_CACHE", "0")  # register() would set FA4's cache variables
    return FakeRegistry


def use_version(monkeypatch, version):
    monkeypatch.setattr(plugin, "installed_sglang_version", lambda: version)


def test_plan_0_5_20_hooks_everything():
    plan = plugin.make_plan("0.5.20")
    assert plan.supported
    assert set(plan.hooked) == {
        "backend_default_table", "fa4_list_seqlens", "fa4_checked_forward", "vit_graph_runners_fa4",
        "vit_graph_outputs_owned", "fa4_startup_warmup", "vit_graph_internvl_startup", "vit_host_metadata",
        "llm_fa4_fp8_kv_sm90", "vit_graph_rotary_fused", "vit_graph_eager_pos_embed",
        "vit_pos_embed_batch_invariant",
    }
    assert plan.upstream == []


def test_plan_0_5_23_hooks_only_what_goes_beyond():
    plan = plugin.make_plan("0.5.23")
    assert plan.hooked == ["vit_graph_outputs_owned", "fa4_checked_forward", "fa4_startup_warmup",
                           "vit_graph_internvl_startup", "vit_graph_rotary_fused", "vit_host_metadata",
                           "llm_fa4_fp8_kv_sm90", "vit_graph_eager_pos_embed", "vit_pos_embed_batch_invariant"]
    assert set(plan.upstream) == {"backend_default_table", "fa4_list_seqlens", "vit_graph_runners_fa4"}


def test_env_override_feature_only_when_set(monkeypatch):
    monkeypatch.setenv("SGLANG_FA4_MM_ATTENTION_BACKEND_DEFAULT", "triton_attn")
    assert "backend_default_env_override" in plugin.make_plan("0.5.23").hooked


@pytest.mark.parametrize("version", ["0.5.20", "0.5.23"])
def test_llm_fp8_kv_upgrade_is_opt_in_and_the_route_opt_out(monkeypatch, version):
    monkeypatch.delenv("SGLANG_FA4_FP8_KV_UPGRADE", raising=False)
    assert "llm_fp8_kv_upgrade" not in plugin.make_plan(version).hooked
    monkeypatch.setenv("SGLANG_FA4_FP8_KV_UPGRADE", "1")
    assert "llm_fp8_kv_upgrade" in plugin.make_plan(version).hooked
    monkeypatch.setenv("SGLANG_FA4_FP8_KV_ROUTE", "0")
    assert "llm_fa4_fp8_kv_sm90" not in plugin.make_plan(version).hooked


@pytest.mark.parametrize("version", ["0.5.19", "0.5.24", "0.6.0", None])
def test_plan_unknown_versions(version):
    plan = plugin.make_plan(version)
    assert not plan.supported and plan.hooked == []


def test_register_0_5_20(fake_sglang, monkeypatch):
    use_version(monkeypatch, "0.5.20")
    plan = plugin.register()
    targets = {(t, ht) for t, _, ht in fake_sglang.registered}
    assert targets == {
        (hooks.DETERMINE_BACKEND, FakeHookType.AROUND),
        (hooks.FA4_FORWARD, FakeHookType.REPLACE),
        (hooks.GENERIC_RUNNER, FakeHookType.AROUND),
        (hooks.INTERNVL_RUNNER + "._warmup_once", FakeHookType.AROUND),
        (hooks.INTERNVL_RUNNER + "._capture_graph", FakeHookType.AROUND),
        (hooks.GENERIC_RUNNER_CLASS + ".replay", FakeHookType.AROUND),
        (hooks.INTERNVL_RUNNER + ".run", FakeHookType.AROUND),
        (hooks.INTERNVL_RUNNER + ".create_graph", FakeHookType.AROUND),
        (hooks.MODEL_RUNNER_LOAD_MODEL, FakeHookType.BEFORE),
        (hooks.MODEL_RUNNER_LOAD_MODEL, FakeHookType.AFTER),
        (hooks.QWEN2_5_VIT_FORWARD, FakeHookType.AROUND),
        (llm_fp8_kv.FA_DISPATCH, FakeHookType.AROUND),
        (llm_fp8_kv.PREPARE_QUERY, FakeHookType.AROUND),
        (llm_fp8_kv.BACKEND_INIT, FakeHookType.AFTER),
        (vit_graph_rotary.ROTARY_NATIVE_EAGER, FakeHookType.AROUND),
        (hooks.QWEN3_VIT_POS_EMBED, FakeHookType.AROUND),
        (hooks.QWEN3_VIT_VECTORIZED_POS_EMBED, FakeHookType.AROUND),
    }
    assert len(fake_sglang.registered) == 18  # two features share the forward hook: registered once
    assert plugin.register() is plan and len(fake_sglang.registered) == 18  # idempotent


def test_register_0_5_23_hooks_nothing_upstream_has(fake_sglang, monkeypatch):
    use_version(monkeypatch, "0.5.23")
    plugin.register()
    assert [t for t, _, _ in fake_sglang.registered] == [
        hooks.GENERIC_RUNNER_CLASS + ".replay", hooks.INTERNVL_RUNNER + ".run",
        hooks.FA4_FORWARD, hooks.MODEL_RUNNER_LOAD_MODEL, hooks.MODEL_RUNNER_LOAD_MODEL,
        hooks.INTERNVL_RUNNER + ".create_graph", hooks.MODEL_RUNNER_LOAD_MODEL,
        vit_graph_rotary.ROTARY_NATIVE_EAGER, hooks.QWEN2_5_VIT_FORWARD,
        llm_fp8_kv.FA_DISPATCH, llm_fp8_kv.PREPARE_QUERY, llm_fp8_kv.BACKEND_INIT,
        hooks.QWEN3_VIT_POS_EMBED, hooks.QWEN3_VIT_VECTORIZED_POS_EMBED,
    ]


def test_warmup_opt_out_registers_no_load_hook(fake_sglang, monkeypatch):
    use_version(monkeypatch, "0.5.23")
    monkeypatch.setenv("SGLANG_FA4_WARMUP", "0")
    monkeypatch.setenv("SGLANG_FA4_VIT_GRAPH_INTERNVL_STARTUP", "0")
    assert "fa4_startup_warmup" not in plugin.make_plan("0.5.23").hooked
    plugin.register()
    assert [t for t, _, _ in fake_sglang.registered] == [
        hooks.GENERIC_RUNNER_CLASS + ".replay", hooks.INTERNVL_RUNNER + ".run",
        hooks.FA4_FORWARD, hooks.QWEN2_5_VIT_FORWARD, llm_fp8_kv.FA_DISPATCH, llm_fp8_kv.PREPARE_QUERY,
        llm_fp8_kv.BACKEND_INIT, hooks.QWEN3_VIT_POS_EMBED, hooks.QWEN3_VIT_VECTORIZED_POS_EMBED]


@pytest.mark.parametrize("version", ["0.5.20", "0.5.23"])
def test_internvl_startup_graphs_after_warmup_and_opt_out(fake_sglang, monkeypatch, version):
    """The InternVL startup capture runs after the FA4 warmup (AFTER hooks run in registration
    order); SGLANG_FA4_VIT_GRAPH_INTERNVL_STARTUP=0 registers neither of its hooks."""
    from sglang_fa4.integration import internvl_graphs

    use_version(monkeypatch, version)
    plugin.register()
    load = [fn for t, fn, ht in fake_sglang.registered if t == hooks.MODEL_RUNNER_LOAD_MODEL and ht == FakeHookType.AFTER]
    assert load == [hooks.warm_fa4_after_load_model, internvl_graphs.capture_after_load_model]
    assert (hooks.INTERNVL_RUNNER + ".create_graph", internvl_graphs.create_graph_around, FakeHookType.AROUND) \
        in fake_sglang.registered
    fake_sglang.registered.clear()
    monkeypatch.setattr(plugin, "_registered_plan", None)
    monkeypatch.setenv("SGLANG_FA4_VIT_GRAPH_INTERNVL_STARTUP", "0")
    assert "vit_graph_internvl_startup" not in plugin.make_plan(version).hooked
    plugin.register()
    assert internvl_graphs.capture_after_load_model not in [fn for _, fn, _ in fake_sglang.registered]
    assert hooks.INTERNVL_RUNNER + ".create_graph" not in [t for t, _, _ in fake_sglang.registered]


@pytest.mark.parametrize("version", ["0.5.20", "0.5.23"])
def test_vit_graph_eager_pos_embed_on_by_default_with_opt_out(fake_sglang, monkeypatch, version):
    use_version(monkeypatch, version)
    plugin.register()
    assert (hooks.QWEN3_VIT_POS_EMBED, hooks.qwen3_vit_graph_pos_embed, FakeHookType.AROUND) in fake_sglang.registered
    monkeypatch.setattr(plugin, "_registered_plan", None)
    fake_sglang.registered = []
    monkeypatch.setenv("SGLANG_FA4_VIT_GRAPH_EAGER_POS_EMBED", "0")
    assert "vit_graph_eager_pos_embed" not in plugin.make_plan(version).hooked
    plugin.register()
    assert hooks.QWEN3_VIT_POS_EMBED not in [t for t, _, _ in fake_sglang.registered]


@pytest.mark.parametrize("version", ["0.5.20", "0.5.23"])
def test_vit_host_metadata_opt_out(fake_sglang, monkeypatch, version):
    use_version(monkeypatch, version)
    monkeypatch.setenv("SGLANG_FA4_VIT_HOST_METADATA", "0")
    assert "vit_host_metadata" not in plugin.make_plan(version).hooked
    plugin.register()
    assert hooks.QWEN2_5_VIT_FORWARD not in [t for t, _, _ in fake_sglang.registered]


@pytest.mark.parametrize("host_metadata", ["0", "1"])
def test_qwen2_5_forward_hooked_once_for_budgets_and_host_metadata(fake_sglang, monkeypatch, host_metadata):
    """Two AROUND hooks on one target nest, and the inner one's original is SGLang's syncing forward:
    the budget routing and the no-sync forward share one hook."""
    use_version(monkeypatch, "0.5.23")
    monkeypatch.setenv("SGLANG_FA4_VIT_GRAPH_BUDGETS_ENABLE", "1")
    monkeypatch.setenv("SGLANG_FA4_VIT_HOST_METADATA", host_metadata)
    plugin.register()
    forward = [(fn, ht) for t, fn, ht in fake_sglang.registered if t == hooks.QWEN2_5_VIT_FORWARD]
    assert forward == [(hooks.qwen2_5_vit_forward, FakeHookType.AROUND)]


def test_register_unknown_version_warns_once_and_changes_nothing(fake_sglang, monkeypatch, caplog):
    use_version(monkeypatch, "0.5.24")
    with caplog.at_level(logging.WARNING, logger="sglang_fa4"):
        plan = plugin.register()
        plugin.register()
    assert not plan.supported and fake_sglang.registered == []
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "0.5.24" in warnings[0].getMessage()


def test_register_unknown_version_strict(fake_sglang, monkeypatch):
    use_version(monkeypatch, "0.5.24")
    monkeypatch.setenv("SGLANG_FA4_PLUGIN_STRICT", "1")
    with pytest.raises(plugin.UnsupportedSGLangVersion, match="0.5.24"):
        plugin.register()


def test_register_refuses_a_bad_environment(fake_sglang, monkeypatch):
    use_version(monkeypatch, "0.5.20")
    monkeypatch.setenv("SGLANG_FA4_TMEM_LOAD_RED_MAX", "maybe")
    with pytest.raises(EnvValueError, match="SGLANG_FA4_TMEM_LOAD_RED_MAX"):
        plugin.register()
    assert fake_sglang.registered == []


@pytest.mark.parametrize("name,value,accepted", [
    ("SGLANG_FA4_VIT_GRAPH_BUDGETS", "1024,2000,x", "a comma list of integers, each >= 4 and a multiple of 4"),
    ("SGLANG_FA4_VIT_GRAPH_BUDGETS", "1023", "a comma list of integers, each >= 4 and a multiple of 4"),
    ("SGLANG_FA4_VIT_GRAPH_BUDGETS", "", "a comma list of integers, each >= 4 and a multiple of 4"),
    ("SGLANG_FA4_VIT_GRAPH_MAX_SEGMENTS", "0", "an integer >= 1"),
    ("SGLANG_FA4_VIT_GRAPH_MAX_SEGMENTS", "many", "an integer >= 1"),
])
def test_register_refuses_malformed_budgets(fake_sglang, monkeypatch, name, value, accepted):
    """A malformed budget setting fails registration, naming the variable and what it accepts,
    whether or not the budgets are enabled (never a warning with half the graphs captured)."""
    use_version(monkeypatch, "0.5.23")
    monkeypatch.setenv("SGLANG_FA4_VIT_GRAPH_BUDGETS_ENABLE", "1")
    monkeypatch.setenv(name, value)
    with pytest.raises(EnvValueError, match=f"{name}=.*accepted: {accepted}"):
        plugin.register()
    assert fake_sglang.registered == []


def test_every_feature_has_a_registrar():
    assert set(registration.REGISTRARS) == {f.name for f in features.FEATURES}


def test_upstream_has():
    f = features.FEATURES_BY_NAME["backend_default_table"]
    assert not f.upstream_has("0.5.20") and f.upstream_has("0.5.21") and f.upstream_has("0.5.23")
    assert not features.FEATURES_BY_NAME["fa4_checked_forward"].upstream_has("9.9.9")
