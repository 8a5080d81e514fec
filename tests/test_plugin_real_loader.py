"""Never silently off, through SGLang's REAL plugin loader (``sglang.srt.plugins.load_plugins()`` of
0.5.20 and 0.5.23, which catches every ``Exception`` a plugin raises and serves without it):

- values SGLang and Triton accept for their own variables (``SGLANG_VIT_ENABLE_CUDA_GRAPH=y``, an
  empty ``TRITON_INTERPRET``) are read as their owner reads them and stop nothing;
- a malformed variable of ours is one ERROR line, and every hook of a clean environment is applied;
- ``SGLANG_FA4_PLUGIN_STRICT=1`` stops the start through that loader (a malformed variable, a
  feature that fails to register), with the message and without SGLang's "Failed to execute".

One interpreter per SGLang version runs every case (the loader's once-per-process guard, the hook
registry and the plugin's state are reset between cases); the tests below read its results.
"""


import pytest

from sglang_harness import SUPPORTED_VERSIONS, require_version, run_file


MISSING_TARGET = "sglang.srt.models.qwen2_5_vl.Qwen2_5_VisionTransformer.no_such_forward"
# case -> (environment, feature whose registrar raises, the Qwen2.5-VL forward hook's target instead)
CASES = {
    "strict_malformed": ({"SGLANG_FA4_PLUGIN_STRICT": "1", "SGLANG_FA4_VIT_GRAPH_MAX_SEGMENTS": "0"}, None, None),
    "strict_feature": ({"SGLANG_FA4_PLUGIN_STRICT": "1"}, "vit_host_metadata", None),
    "strict_target": ({"SGLANG_FA4_PLUGIN_STRICT": "1"}, None, MISSING_TARGET),
    "owner_values_and_malformed": (
        {"SGLANG_VIT_ENABLE_CUDA_GRAPH": "y", "TRITON_INTERPRET": "", "SGLANG_FA4_WARMUP": "maybe"}, None, None),
    "feature": ({}, "vit_host_metadata", None),
    "clean": ({}, None, None),
    "strict_clean": ({"SGLANG_FA4_PLUGIN_STRICT": "1"}, None, None),
}

OWNER_VALUES = ["1", "0", "true", "False", "yes", "y", "Y", "no", "n", "on", "off", "", " 1", "2", "maybe"]

QUIET = {"SGLANG_FA4_KERNEL_CACHE": "0", "SGLANG_PLUGINS": None}


@pytest.fixture(scope="module", params=SUPPORTED_VERSIONS)
def loads(request):
    version = request.param
    request.applymarker(pytest.mark.sglang)
    require_version(version)
    return run_file(version, "plugin_loader_cases.py",
                    {"cases": CASES, "owner_values": OWNER_VALUES}, env=QUIET)


def test_a_clean_environment_applies_every_hook(loads):
    clean = loads["clean"]
    assert clean["refused"] is None and clean["errors"] == [] and clean["sglang_failed"] == []
    assert clean["targets"] and clean["applied"] == clean["targets"]


def test_sglang_variable_is_read_exactly_as_sglang_reads_it(loads):
    reads = loads["owner_reads"]
    assert [raw for raw, _, _ in reads] == OWNER_VALUES
    assert [[raw, ours] for raw, ours, _ in reads] == [[raw, sglang] for raw, _, sglang in reads]


def test_owner_values_are_read_as_their_owner_reads_them(loads):
    out = loads["owner_values_and_malformed"]
    assert out["graph_env"] is True and out["interpret"] is False  # SGLang's EnvBool, Triton's getenv_bool
    assert not any("SGLANG_VIT_ENABLE_CUDA_GRAPH" in e or "TRITON_INTERPRET" in e for e in out["errors"])


def test_a_malformed_variable_is_one_error_line_and_every_hook_stays(loads):
    out, clean = loads["owner_values_and_malformed"], loads["clean"]
    assert out["errors"] == [
        "sglang-fa4: SGLANG_FA4_WARMUP='maybe' is not a boolean; accepted values: 0/1/false/no/off/on/true/yes; "
        "SGLANG_FA4_WARMUP runs at its default (1)"]
    assert out["refused"] is None and out["sglang_failed"] == []
    # every hook of the clean start stays; SGLANG_VIT_ENABLE_CUDA_GRAPH=y is on as SGLang reads it, so
    # the ViT budget graphs (its default with fa4) join
    assert set(clean["targets"]) < set(out["targets"]) and out["applied"] == out["targets"]
    assert "vit_graph_budgets" not in clean["hooked"] and "vit_graph_budgets" in out["hooked"]
    assert [f for f in out["hooked"] if f != "vit_graph_budgets"] == clean["hooked"]
    assert "fa4_startup_warmup" in out["hooked"]


def test_a_failing_feature_leaves_the_other_hooks_applied(loads):
    out, clean = loads["feature"], loads["clean"]
    assert out["errors"] == ["sglang-fa4: vit_host_metadata failed (ImportError: no such SGLang class); "
                             "the other features stay active"]
    assert out["hooked"] == [f for f in clean["hooked"] if f != "vit_host_metadata"]
    lost = set(clean["targets"]) - set(out["targets"])
    assert lost == {"sglang.srt.models.qwen2_5_vl.Qwen2_5_VisionTransformer.forward"}
    assert out["applied"] == out["targets"] and out["sglang_failed"] == []


def test_strict_with_nothing_wrong_starts_with_every_hook(loads):
    """Strict also resolves every hook target before SGLang applies them: all resolve."""
    out, clean = loads["strict_clean"], loads["clean"]
    assert out["refused"] is None and out["errors"] == [] and out["applied"] == clean["targets"]


def test_strict_stops_the_start_on_a_malformed_variable(loads):
    out = loads["strict_malformed"]
    assert out["refused"] == ("sglang-fa4: SGLANG_FA4_VIT_GRAPH_MAX_SEGMENTS='0': 0 is out of range; accepted: "
                              "an integer >= 1 and <= 4096; SGLANG_FA4_PLUGIN_STRICT=1: the server does not start")
    assert out["sglang_failed"] == [] and out["targets"] == []


def test_strict_stops_the_start_on_a_hook_target_sglang_cannot_resolve(loads):
    """SGLang's apply_hooks would log that failure and serve without the hook: strict stops first."""
    out = loads["strict_target"]
    assert out["refused"] == (f"sglang-fa4: hook target {MISSING_TARGET} failed (SGLang cannot resolve it: "
                              "sglang.srt.models.qwen2_5_vl.Qwen2_5_VisionTransformer has no no_such_forward) -- "
                              "SGLANG_FA4_PLUGIN_STRICT=1: the server does not start")
    assert out["sglang_failed"] == [] and out["applied"] == []


def test_strict_stops_the_start_on_a_failing_feature(loads):
    out = loads["strict_feature"]
    assert out["refused"].startswith("sglang-fa4: vit_host_metadata failed (ImportError: no such SGLang class)")
    assert out["refused"].endswith("SGLANG_FA4_PLUGIN_STRICT=1: the server does not start")
    assert out["sglang_failed"] == [] and out["applied"] == []
