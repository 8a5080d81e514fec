"""The plugin against the REAL SGLang 0.5.20 and 0.5.23 (CPU; the checks are real files,
tests/sglang_scripts/vision_checks.py, run a few to an interpreter: SGLang's import is the cost).

The plugin is loaded through SGLang's own loader (``sglang.srt.plugins.load_plugins()`` finds our
installed entry point). Stubbed, because it cannot run on a CPU, and only that:
- the CUDA facts vision.py reads (``is_cuda``, ``get_device_capability``, the platform's is_blackwell,
  ``_is_cuda`` for VisionFlash4Attention's constructor);
- the FA4 kernel call itself (``sglang_fa4.kernels.varlen.fa4_varlen_attention``, or SGLang's
  ``flash_attn_func`` when the plugin is off) -> a recorder;
- CUDA graph objects (``torch.cuda.CUDAGraph``, ``torch.cuda.graph``, ``torch.cuda.synchronize``) and the
  runner's tensor-parallel capture context.
"""

import pytest

from sglang_harness import run_script

#: the checks that run in one interpreter per (plugin, ViT-graph env); the backend matrix does not
#: read SGLANG_VIT_ENABLE_CUDA_GRAPH, so it shares the graph-mode interpreter
_WITH_GRAPHS = ["forward_forms", "backend_matrix", "generic_runner", "internvl_runner"]
_results: dict = {}
#: the cases without the plugin pin upstream's behaviour per release (0.5.20's B300 default, its
#: runners refusing fa4): tripwires
WITHOUT_PLUGIN = pytest.param(False, marks=pytest.mark.tripwire, id="False")


def checks(version: str, plugin: bool, graph: str = "1", override=None) -> dict:
    """{check: result} of one interpreter, run once per module for its (version, plugin, env)."""
    key = (version, plugin, graph, override)
    if key not in _results:
        names = _WITH_GRAPHS if graph == "1" and override is None else (
            ["backend_matrix"] if override else ["forward_forms"])
        env = {"SGLANG_VIT_ENABLE_CUDA_GRAPH": graph, "SGLANG_FA4_MM_ATTENTION_BACKEND_DEFAULT": override}
        _results[key] = run_script(version, "vision_checks", f"run(plugin={plugin}, checks={names!r})", env=env)
    return _results[key]


@pytest.mark.parametrize("plugin", [True, WITHOUT_PLUGIN])
def test_backend_selection_matrix(sglang_version, plugin):
    out = checks(sglang_version, plugin)["backend_matrix"]
    defaults = {c: out[f"None|None|{c}"] for c in ("9.0", "10.0", "10.3", "12.0")}
    if plugin or sglang_version != "0.5.20":
        assert defaults == {"9.0": "fa3", "10.0": "fa4", "10.3": "fa4", "12.0": "triton_attn"}
    else:  # the B300 bug the plugin fixes
        assert defaults == {"9.0": "fa3", "10.0": "fa4", "10.3": "triton_attn", "12.0": "triton_attn"}
    for cap in ("9.0", "10.0", "10.3", "12.0"):
        # an explicit --mm-attention-backend wins over the model and the default
        assert out[f"sdpa|None|{cap}"] == "sdpa" and out[f"sdpa|triton_attn|{cap}"] == "sdpa"
        assert out[f"None|triton_attn|{cap}"] == "triton_attn"
    for cap in ("10.0", "10.3", "12.0"):
        assert out[f"None|fa3|{cap}"].startswith("error:") and "Blackwell" in out[f"None|fa3|{cap}"]
    assert out["None|fa3|9.0"] == "fa3"


def test_env_override_of_the_default(sglang_version):
    out = checks(sglang_version, True, override="triton_attn")["backend_matrix"]
    assert out["None|None|10.0"] == "triton_attn" and out["None|None|10.3"] == "triton_attn"
    assert out["None|fa3|9.0"] == "fa3" and out["sdpa|None|10.0"] == "sdpa"


@pytest.mark.parametrize("graph_env", ["0", "1"])
def test_fa4_forward_list_and_tensor_forms(sglang_version, graph_env):
    out = checks(sglang_version, True, graph=graph_env)["forward_forms"]
    for form in ("list", "tensor"):
        call = out[form]["call"]
        assert out[form]["ok"] == [10, 2, 8]
        assert call["cu"] == [0, 4, 10] and call["cu_dtype"] == "torch.int32" and call["cu_device"] == "cpu"
        assert call["max_seqlen"] == 6 and call["max_type"] == "int"
    assert "SeqlensError" in out["triton_list"]["error"] and "triton_attn runner layout" in out["triton_list"]["error"]
    # one FA4 for the ViT: the hooked forward never imports SGLang's vendored copy (README)
    assert out["vendored_fa4"] == []


@pytest.mark.tripwire  # upstream's own fa4 forward per release: 0.5.20 lacks the list branch
def test_fa4_forward_without_plugin(sglang_version):
    out = checks(sglang_version, False)["forward_forms"]
    assert out["tensor"]["ok"] == [10, 2, 8]
    if sglang_version == "0.5.20":  # no list branch upstream: the runner's layout dies here
        assert "cu_seqlens must be a torch.Tensor" in out["list"]["error"]
    else:
        assert out["list"]["ok"] == [10, 2, 8]


def test_generic_runner_with_fa4(sglang_version):
    out = checks(sglang_version, True)["generic_runner"]
    assert "error" not in out, out
    calls = [r for r in out["records"] if "cu" in r]
    first_capture = next(i for i, r in enumerate(calls) if r["capturing"])
    warm = calls[:first_capture]
    captured = calls[first_capture:]
    window, full = [0, 16, 20, 24], [0, 0, 24]
    # every layout the blocks will use was compiled eagerly before capture started
    assert {tuple(r["cu"]) for r in warm} == {tuple(window), tuple(full)}
    assert all(not r["capturing"] for r in warm)
    # the capture: one call per block, [cu_seqlens, max_seqlen] with the block's layout
    assert [r["cu"] for r in captured] == [window, full, window, full]
    assert [r["max_seqlen"] for r in captured] == [16, 24, 16, 24]
    assert all(r["capturing"] and r["max_type"] == "int" for r in captured)
    assert out["records"][-1] == {"replay": True}


@pytest.mark.tripwire  # upstream's runner per release: 0.5.20 dies on fa4, 0.5.23 took the fix
def test_generic_runner_fa4_fails_without_plugin_on_0_5_20(sglang_version):
    out = checks(sglang_version, False)["generic_runner"]
    if sglang_version == "0.5.20":
        assert "cu_seqlens must be a torch.Tensor" in out["error"]
        assert not any(r.get("capturing") for r in out["records"])
    else:  # upstream took the fix: both layouts warmed, then captured
        assert "error" not in out, out
        assert any(r.get("capturing") for r in out["records"])


@pytest.mark.parametrize("plugin", [True, WITHOUT_PLUGIN])
def test_internvl_runner_with_fa4(sglang_version, plugin):
    out = checks(sglang_version, plugin)["internvl_runner"]
    if sglang_version == "0.5.20" and not plugin:
        assert "does not support attention backend: fa4" in out["error"]
        return
    assert "error" not in out, out
    calls = [r for r in out["records"] if "cu" in r]
    assert [r["capturing"] for r in calls] == [False] * 3 + [True] * 3  # eager warmup, then capture
    assert all(r["cu"] == [0, 5, 10] and r["max_seqlen"] == 5 and r["max_type"] == "int" for r in calls)

