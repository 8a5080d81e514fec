"""The plugin's version-aware plan and registration, with SGLang's HookRegistry faked
(the real-SGLang integration tests are in test_sglang_integration.py)."""

import logging
import sys
import types
from enum import Enum

import pytest

from sglang_fa4 import features, plugin
from sglang_fa4.integration import gemma4_fp8_kv, hooks, llm_fp8_kv, registration, vit_graph_rotary
from sglang_fa4.environ import envs


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
    monkeypatch.setenv("SGLANG_FA4_ENV_ERRORS_REPORTED", "")  # register() may set it: restored after
    monkeypatch.delenv("SGLANG_FA4_ENV_ERRORS_REPORTED")
    envs.clear_fallbacks()
    yield FakeRegistry
    envs.clear_fallbacks()  # register() read malformed values as defaults: this process only


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
    # two features share the forward hook: registered once; BACKEND_INIT has two AFTER hooks (the
    # Gemma-4 refusal, then the warmup)
    assert len(fake_sglang.registered) == 19
    assert [f for t, f, _ in fake_sglang.registered if t == llm_fp8_kv.BACKEND_INIT] == [
        gemma4_fp8_kv.refuse_unrunnable_gemma4, llm_fp8_kv.warm_fp8_after_backend_init]
    assert plugin.register() is plan and len(fake_sglang.registered) == 19  # idempotent


def test_register_0_5_23_hooks_nothing_upstream_has(fake_sglang, monkeypatch):
    use_version(monkeypatch, "0.5.23")
    plugin.register()
    assert [t for t, _, _ in fake_sglang.registered] == [
        hooks.GENERIC_RUNNER_CLASS + ".replay", hooks.INTERNVL_RUNNER + ".run",
        hooks.FA4_FORWARD, hooks.MODEL_RUNNER_LOAD_MODEL, hooks.MODEL_RUNNER_LOAD_MODEL,
        hooks.INTERNVL_RUNNER + ".create_graph", hooks.MODEL_RUNNER_LOAD_MODEL,
        vit_graph_rotary.ROTARY_NATIVE_EAGER, hooks.QWEN2_5_VIT_FORWARD,
        llm_fp8_kv.FA_DISPATCH, llm_fp8_kv.PREPARE_QUERY, llm_fp8_kv.BACKEND_INIT, llm_fp8_kv.BACKEND_INIT,
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
        llm_fp8_kv.BACKEND_INIT, llm_fp8_kv.BACKEND_INIT, hooks.QWEN3_VIT_POS_EMBED, hooks.QWEN3_VIT_VECTORIZED_POS_EMBED]


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
    monkeypatch.setenv("SGLANG_VIT_ENABLE_CUDA_GRAPH", "1")  # the budgets replace SGLang's ViT graphs
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
    """Strict refuses with a SystemExit: SGLang's load_plugins() catches Exception, not this."""
    use_version(monkeypatch, "0.5.24")
    monkeypatch.setenv("SGLANG_FA4_PLUGIN_STRICT", "1")
    with pytest.raises(plugin.UnsupportedSGLangVersion, match="0.5.24") as refused:
        plugin.register()
    assert isinstance(refused.value, SystemExit) and not isinstance(refused.value, Exception)
    assert "the server does not start" in str(refused.value.code)


ACCEPTS_BUDGETS = "a comma list of integers, each >= 4 and a multiple of 4 and <= 262144"
# variable, malformed value, what the message says it accepts, its default as the message shows it
MALFORMED = [
    ("SGLANG_FA4_TMEM_LOAD_RED_MAX", "maybe", "0/1/false/no/off/on/true/yes", "1"),
    ("SGLANG_FA4_WARMUP", "y", "0/1/false/no/off/on/true/yes", "1"),
    ("SGLANG_FA4_PLUGIN_STRICT", "enable", "0/1/false/no/off/on/true/yes", "0"),
    ("SGLANG_FA4_VIT_GRAPH_BUDGETS", "1024,2000,x", ACCEPTS_BUDGETS, "896,1024,1536,2048,3072,4096,5120,6144,8192"),
    ("SGLANG_FA4_VIT_GRAPH_BUDGETS", "1023", ACCEPTS_BUDGETS, "896,1024,1536,2048,3072,4096,5120,6144,8192"),
    ("SGLANG_FA4_VIT_GRAPH_BUDGETS", "", ACCEPTS_BUDGETS, "896,1024,1536,2048,3072,4096,5120,6144,8192"),
    ("SGLANG_FA4_VIT_GRAPH_BUDGETS", "262148", ACCEPTS_BUDGETS, "896,1024,1536,2048,3072,4096,5120,6144,8192"),
    ("SGLANG_FA4_VIT_GRAPH_MAX_SEGMENTS", "0", "an integer >= 1 and <= 4096", "64"),
    ("SGLANG_FA4_VIT_GRAPH_MAX_SEGMENTS", "many", "an integer >= 1 and <= 4096", "64"),
    ("SGLANG_FA4_SHORT_SEQLEN_ROUTE_MAX", "-5", "an integer >= 0 and <= 1048576", "64"),
    ("SGLANG_FA4_SHORT_SEQLEN_ROUTE_MAX", "1" + "0" * 23, "an integer >= 0 and <= 1048576", "64"),
    ("SGLANG_FA4_MM_ATTENTION_BACKEND_DEFAULT", "fa9", "'', 'fa3', 'fa4'", '""'),
    ("SGLANG_FA4_JIT_MONITOR", "loud", "'off', 'warn', 'raise'", "warn"),
]


@pytest.mark.parametrize("name,value,accepted,default", MALFORMED)
def test_malformed_variable_is_one_error_line_and_its_default(fake_sglang, monkeypatch, caplog, name, value,
                                                             accepted, default):
    """A malformed variable of ours: exactly one ERROR line naming it, its value and what it
    accepts; it runs at its default and every hook of the clean environment is registered."""
    use_version(monkeypatch, "0.5.23")
    plugin.register()
    clean = list(fake_sglang.registered)
    fake_sglang.registered.clear()
    monkeypatch.setattr(plugin, "_registered_plan", None)
    monkeypatch.setenv(name, value)
    with caplog.at_level(logging.INFO, logger="sglang_fa4"):
        plan = plugin.register()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].startswith(f"sglang-fa4: {name}={value!r}")
    assert "accepted" in errors[0] and accepted in errors[0]
    assert errors[0].endswith(f"; {name} runs at its default ({default})")
    assert fake_sglang.registered == clean and plan.failed == {}
    assert getattr(envs, name).get() == getattr(envs, name).default


def test_a_child_process_does_not_log_the_error_again(fake_sglang, monkeypatch, caplog):
    """SGLang's scheduler processes inherit the environment and register again: the variable falls
    back there too, but only the first process logs the line."""
    use_version(monkeypatch, "0.5.23")
    monkeypatch.setenv("SGLANG_FA4_WARMUP", "maybe")
    monkeypatch.setenv("SGLANG_FA4_JIT_MONITOR", "loud")
    with caplog.at_level(logging.ERROR, logger="sglang_fa4"):
        parent = plugin.register()
        assert len(caplog.records) == 2
        monkeypatch.setattr(plugin, "_registered_plan", None)  # a child: a fresh plugin, the same environment
        envs.clear_fallbacks()
        monkeypatch.setenv("SGLANG_FA4_VIT_HOST_METADATA", "sometimes")  # a problem only the child has
        child = plugin.register()
    assert [r.getMessage().split("=", 1)[0] for r in caplog.records] == [
        "sglang-fa4: SGLANG_FA4_WARMUP", "sglang-fa4: SGLANG_FA4_JIT_MONITOR", "sglang-fa4: SGLANG_FA4_VIT_HOST_METADATA"]
    assert envs.SGLANG_FA4_WARMUP.get() is True and "fa4_startup_warmup" in child.hooked == parent.hooked
    assert envs.SGLANG_FA4_ENV_ERRORS_REPORTED.get() == \
        "SGLANG_FA4_JIT_MONITOR,SGLANG_FA4_VIT_HOST_METADATA,SGLANG_FA4_WARMUP"


def test_strict_refuses_a_malformed_variable(fake_sglang, monkeypatch, caplog):
    use_version(monkeypatch, "0.5.23")
    monkeypatch.setenv("SGLANG_FA4_PLUGIN_STRICT", "1")
    monkeypatch.setenv("SGLANG_FA4_SHORT_SEQLEN_ROUTE_MAX", "-5")
    with caplog.at_level(logging.ERROR, logger="sglang_fa4"), pytest.raises(plugin.PluginStartRefused) as refused:
        plugin.register()
    line = "sglang-fa4: SGLANG_FA4_SHORT_SEQLEN_ROUTE_MAX='-5': -5 is out of range; accepted: an integer >= 0 and <= 1048576; SGLANG_FA4_PLUGIN_STRICT=1: the server does not start"
    assert refused.value.code == line and [r.getMessage() for r in caplog.records] == [line]
    assert not isinstance(refused.value, Exception) and fake_sglang.registered == []


def _broken_registrar(registry, hook_type):
    raise ImportError("sglang.srt.models.qwen2_5_vl has no Qwen2_5_VisionTransformer")


@pytest.mark.parametrize("strict", [False, True])
def test_a_failing_feature_leaves_the_others(fake_sglang, monkeypatch, caplog, strict):
    """A registrar that raises costs its feature only (one ERROR line naming it), or, strict, the start."""
    use_version(monkeypatch, "0.5.23")
    plugin.register()
    clean = list(fake_sglang.registered)
    fake_sglang.registered.clear()
    monkeypatch.setattr(plugin, "_registered_plan", None)
    monkeypatch.setitem(registration.REGISTRARS, "vit_host_metadata", (_broken_registrar,))
    if strict:
        monkeypatch.setenv("SGLANG_FA4_PLUGIN_STRICT", "1")
        with pytest.raises(plugin.PluginStartRefused, match="vit_host_metadata failed .ImportError: sglang.srt.models"):
            plugin.register()
        return
    with caplog.at_level(logging.ERROR, logger="sglang_fa4"):
        plan = plugin.register()
    assert [r.getMessage() for r in caplog.records] == [
        "sglang-fa4: vit_host_metadata failed (ImportError: sglang.srt.models.qwen2_5_vl has no "
        "Qwen2_5_VisionTransformer); the other features stay active"]
    assert "vit_host_metadata" not in plan.hooked and set(plan.failed) == {"vit_host_metadata"}
    assert fake_sglang.registered == [r for r in clean if r[0] != hooks.QWEN2_5_VIT_FORWARD]


def test_registration_that_cannot_start_is_one_error_line(fake_sglang, monkeypatch, caplog):
    """Before any hook (SGLang's HookRegistry missing): one ERROR line, SGLang runs; strict stops."""
    use_version(monkeypatch, "0.5.23")
    monkeypatch.delitem(sys.modules, "sglang.srt.plugins.hook_registry")
    monkeypatch.setitem(sys.modules, "sglang.srt.plugins.hook_registry", None)  # import raises ImportError
    with caplog.at_level(logging.ERROR, logger="sglang_fa4"):
        plan = plugin.register()
    assert not plan.supported and len(caplog.records) == 1
    assert caplog.records[0].getMessage().startswith("sglang-fa4: not registered (ModuleNotFoundError: ")
    monkeypatch.setattr(plugin, "_registered_plan", None)
    monkeypatch.setenv("SGLANG_FA4_PLUGIN_STRICT", "1")
    with pytest.raises(plugin.PluginStartRefused, match="not registered .ModuleNotFoundError"):
        plugin.register()


def test_strict_checks_that_sglang_can_resolve_every_target(monkeypatch):
    assert plugin.unresolvable_targets(["os.path.join", "json.dumps"]) == {}
    assert plugin.unresolvable_targets(["os.path.join", "os.path.no_such_function"]) == {
        "os.path.no_such_function": "SGLang cannot resolve it: os.path has no no_such_function"}
    [(target, why)] = plugin.unresolvable_targets(["no_such_module_xyz.f"]).items()
    assert target == "no_such_module_xyz.f" and why.startswith("SGLang cannot resolve it: ModuleNotFoundError: ")


def test_every_feature_has_a_registrar():
    assert set(registration.REGISTRARS) == {f.name for f in features.FEATURES}


def test_upstream_has():
    f = features.FEATURES_BY_NAME["backend_default_table"]
    assert not f.upstream_has("0.5.20") and f.upstream_has("0.5.21") and f.upstream_has("0.5.23")
    assert not features.FEATURES_BY_NAME["fa4_checked_forward"].upstream_has("9.9.9")


def test_a_variable_read_outside_the_registry_falls_back_there_too(fake_sglang, monkeypatch, caplog):
    """SGLANG_FA4_TMEM_LOAD_RED_MAX is also read by the 0.5.20 kernel patch inside SGLang's vendored FA4,
    which cannot see the registry's fallback and would raise per call: the plugin gives that reader the
    default in the environment; a variable read only through the registry keeps its raw value."""
    import os

    use_version(monkeypatch, "0.5.23")
    monkeypatch.setenv("SGLANG_FA4_TMEM_LOAD_RED_MAX", "maybe")
    monkeypatch.setenv("SGLANG_FA4_WARMUP", "maybe")
    with caplog.at_level(logging.ERROR, logger="sglang_fa4"):
        plugin.register()
    assert envs.SGLANG_FA4_TMEM_LOAD_RED_MAX.read_outside and not envs.SGLANG_FA4_WARMUP.read_outside
    assert os.environ["SGLANG_FA4_TMEM_LOAD_RED_MAX"] == "1"  # the default, as the patch spells true
    assert os.environ["SGLANG_FA4_WARMUP"] == "maybe"
    assert len([r for r in caplog.records if r.levelno == logging.ERROR]) == 2
