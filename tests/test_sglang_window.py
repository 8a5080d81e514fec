"""Every SGLang release of the supported window (0.5.20 .. 0.5.23) gets exactly the hooks it lacks.

Which features upstream already has is read from the installed SGLang's code
(sglang_fa4/integration/upstream_code.py), the version table only cross-checks it. Through SGLang's real loader
(``load_plugins()``) of each release, one fresh interpreter per release: the plan, every registered
hook target applied (SGLang's ``apply_hooks`` swallows a failure, so a target it could not patch is
missing from ``HookRegistry._patched``), the ViT backend an sm_103 GPU gets, and doctor's report.
The full behaviour suites run on 0.5.20 and 0.5.23 (tests/sglang_harness.py SUPPORTED_VERSIONS).
"""

from __future__ import annotations

import ast
import logging

import pytest

from sglang_fa4 import features, plugin
from sglang_fa4.integration import upstream_code
from sglang_harness import ROOT, REGISTRATION_VERSIONS, SUPPORTED_VERSIONS, require_version, run_file, target_dir

# Upstream since 0.5.21 (read in the wheels: vision.py's fa4 list branch and sm_103 default, the
# runners' fa4 layouts); 0.5.20 lacks all three.
FROM_0_5_21 = {"backend_default_table", "fa4_list_seqlens", "vit_graph_runners_fa4"}

# every opt-in feature on, so that every registrar's targets must resolve in every release (the env
# override stays unset: it would register the backend hook where upstream has the default table)
ALL_ON = {name: "1" for name in (
    "SGLANG_FA4_WARMUP", "SGLANG_FA4_VIT_GRAPH_BUDGETS_ENABLE", "SGLANG_FA4_VIT_GRAPH_INTERNVL_STARTUP",
    "SGLANG_FA4_FP8_KV_UPGRADE", "SGLANG_FA4_FP8_KV_ROUTE", "SGLANG_FA4_VIT_HOST_METADATA",
    "SGLANG_FA4_VIT_GRAPH_EAGER_POS_EMBED", "SGLANG_FA4_VIT_POS_EMBED_BATCH_INVARIANT",
    "SGLANG_VIT_ENABLE_CUDA_GRAPH")}  # the ViT budget graphs replace SGLang's ViT graphs only when they are on


@pytest.fixture(params=REGISTRATION_VERSIONS)
def window_version(request: pytest.FixtureRequest) -> str:
    request.applymarker(pytest.mark.sglang)
    require_version(request.param)
    return request.param


def test_registration_through_the_real_loader(window_version):
    env = {**ALL_ON, "SGLANG_IS_FLASHINFER_AVAILABLE": "false"}
    # the full-suite releases share their zygote with the other tests; one fresh start for the others
    out = run_file(window_version, "sglang_registration.py", {}, env=env,
                   fresh=window_version not in SUPPORTED_VERSIONS)
    upstream = set() if window_version == "0.5.20" else FROM_0_5_21
    assert out["version"] == window_version and out["supported"]
    assert set(out["upstream"]) == upstream
    want = [f.name for f in features.FEATURES if f.name not in upstream and f.name != "backend_default_env_override"]
    assert out["hooked"] == want
    # every registered target applied; upstream's own code left alone where it has the feature
    assert out["registered"] and out["patched"] == out["registered"]
    for target in out["targets"].values():
        assert (target in out["registered"]) == (window_version == "0.5.20"), target
    # sm_100 and sm_103 get fa4 (0.5.20 through our hook, later releases by themselves), Hopper fa3
    assert out["backend"] == {"10.0": "fa4", "10.3": "fa4", "9.0": "fa3"}
    # doctor says what the plugin did
    assert out["doctor"]["supported"] and out["doctor"]["backend"] == "fa4"
    assert {n for n, s in out["doctor"]["features"].items() if s == "upstream"} == upstream
    assert {n for n, s in out["doctor"]["features"].items() if s == "hooked"} == set(want)
    # the code and the version table agree on every release of the window: no cross-check warning
    assert "going by the code" not in out["log"]
    assert f"SGLang {window_version}; hooked: " in out["log"]


@pytest.mark.parametrize("version", REGISTRATION_VERSIONS)
def test_detection_reads_each_release(version, monkeypatch):
    """The detectors on each release's own files (no SGLang import), equal to the version table."""
    require_version(version)
    monkeypatch.setattr(upstream_code, "_installed_sglang_root", lambda: (version, target_dir(version)))
    found = upstream_code.detected(version)
    assert found == {name: name in FROM_0_5_21 and version != "0.5.20" for name in upstream_code.DETECTORS}
    for name in upstream_code.DETECTORS:
        assert found[name] == features.FEATURES_BY_NAME[name].upstream_has(version)


# --- the detectors on synthetic sources: each marker on its own, and what a renamed file gives ---

VISION_0_5_20 = '''
class VisionAttention:
    def _determine_attention_backend(self, passed):
        major, minor = get_device_capability()
        if major == 9:
            backend = "fa3"
        elif major == 10 and minor != 3:
            backend = "fa4"
        return backend

class VisionFlash4Attention:
    def forward(self, q, k, v, cu_seqlens, **kw):
        if cu_seqlens is None:
            cu_seqlens_gpu = None
        elif isinstance(cu_seqlens, torch.Tensor):
            cu_seqlens_gpu = cu_seqlens
        return q
'''
VISION_0_5_21 = (VISION_0_5_20.replace("major, minor = ", "major, _ = ").replace(" and minor != 3", "")
                 .replace("cu_seqlens_gpu = cu_seqlens\n", "cu_seqlens_gpu = cu_seqlens\n"
                          "        elif isinstance(cu_seqlens, list):\n"
                          "            cu_seqlens_gpu = cu_seqlens[0]\n"))
GENERIC_0_5_20 = '''
class ViTCudaGraphRunner:
    def _create_graph(self, backend):
        if backend == "fa3":
            pass
'''
GENERIC_0_5_21 = GENERIC_0_5_20.replace('backend == "fa3"', 'backend in ("fa3", "fa4")')
INTERNVL_0_5_20 = '''
class InternViTCudaGraphRunner:
    def _seqlens(self, backend):
        if backend == "fa3":
            pass
'''
INTERNVL_0_5_21 = INTERNVL_0_5_20.replace('backend == "fa3"', 'backend in ("fa3", "fa4")')


def fake_tree(tmp_path, version, vision=VISION_0_5_20, generic=GENERIC_0_5_20, internvl=INTERNVL_0_5_20):
    root = tmp_path / version
    for rel, text in ((upstream_code.VISION, vision), (upstream_code.GENERIC_RUNNER, generic),
                      (upstream_code.INTERNVL_RUNNER, internvl)):
        if text is not None:
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
    return root


@pytest.fixture
def installed(monkeypatch):
    def install(version, root):
        monkeypatch.setattr(upstream_code, "_installed_sglang_root", lambda: (version, root))
    upstream_code._warned.clear()
    return install


def test_synthetic_sources_parse():
    for text in (VISION_0_5_20, VISION_0_5_21, GENERIC_0_5_21, INTERNVL_0_5_21):
        ast.parse(text)
    assert "isinstance(cu_seqlens, list)" in VISION_0_5_21 and "minor" not in VISION_0_5_21


@pytest.mark.parametrize("vision, generic, internvl, want", [
    (VISION_0_5_20, GENERIC_0_5_20, INTERNVL_0_5_20, (False, False, False)),
    (VISION_0_5_21, GENERIC_0_5_21, INTERNVL_0_5_21, (True, True, True)),
    # each marker on its own
    (VISION_0_5_20.replace(" and minor != 3", "").replace("major, minor", "major, _"), GENERIC_0_5_20,
     INTERNVL_0_5_20, (True, False, False)),
    (VISION_0_5_21.replace("elif major == 10:", "elif major == 10 and minor != 3:"), GENERIC_0_5_20,
     INTERNVL_0_5_20, (False, True, False)),
    # the runners need fa4 in both: one alone is not the feature
    (VISION_0_5_20, GENERIC_0_5_21, INTERNVL_0_5_20, (False, False, False)),
    (VISION_0_5_20, GENERIC_0_5_20, INTERNVL_0_5_21, (False, False, False)),
    # renamed or missing code: cannot tell (None), the version table decides
    (VISION_0_5_20.replace("class VisionFlash4Attention", "class Fa4Attention"), GENERIC_0_5_21, None,
     (False, None, None)),
    (None, GENERIC_0_5_21, INTERNVL_0_5_21, (None, None, True)),
    ("def broken(:\n", GENERIC_0_5_21, INTERNVL_0_5_21, (None, None, True)),
    (VISION_0_5_20.replace('"fa4"', '"triton_attn"'), GENERIC_0_5_20, INTERNVL_0_5_20, (None, False, False)),
])
def test_detectors(tmp_path, installed, vision, generic, internvl, want):
    installed("0.5.22", fake_tree(tmp_path, "0.5.22", vision, generic, internvl))
    found = upstream_code.detected("0.5.22")
    assert (found["backend_default_table"], found["fa4_list_seqlens"], found["vit_graph_runners_fa4"]) == want


def test_other_installed_version_or_none_detects_nothing(tmp_path, installed, monkeypatch):
    installed("0.5.21", fake_tree(tmp_path, "0.5.21", VISION_0_5_21, GENERIC_0_5_21, INTERNVL_0_5_21))
    assert upstream_code.detected("0.5.21") and upstream_code.detected("0.5.20") == {}
    monkeypatch.setattr(upstream_code, "_installed_sglang_root", lambda: None)
    assert upstream_code.detected("0.5.21") == {}


def test_code_wins_over_the_version_table_with_one_warning(tmp_path, installed, caplog):
    """A 0.5.22 whose code lacks the list branch (a fork, a backport revert) gets the hook; a 0.5.20
    whose code has the sm_103 default does not; each disagreement warns once, naming both."""
    installed("0.5.22", fake_tree(tmp_path, "0.5.22", VISION_0_5_20, GENERIC_0_5_21, INTERNVL_0_5_21))
    with caplog.at_level(logging.WARNING, logger="sglang_fa4"):
        plan = plugin.make_plan("0.5.22")
        plugin.make_plan("0.5.22")
    assert "fa4_list_seqlens" in plan.hooked and "backend_default_table" in plan.hooked
    assert "vit_graph_runners_fa4" in plan.upstream
    warned = [r.getMessage() for r in caplog.records if "going by the code" in r.getMessage()]
    assert len(warned) == 2 and any("lacks fa4_list_seqlens" in m and "since 0.5.21" in m for m in warned)

    caplog.clear()
    upstream_code._detect_all.cache_clear()
    installed("0.5.20", fake_tree(tmp_path, "0.5.20", VISION_0_5_21, GENERIC_0_5_20, INTERNVL_0_5_20))
    with caplog.at_level(logging.WARNING, logger="sglang_fa4"):
        plan = plugin.make_plan("0.5.20")
    assert plan.upstream == ["backend_default_table", "fa4_list_seqlens"]
    assert "vit_graph_runners_fa4" in plan.hooked
    assert sum("going by the code" in r.getMessage() for r in caplog.records) == 2


def test_code_not_found_falls_back_to_the_version_table(tmp_path, installed):
    installed("0.5.21", tmp_path / "empty")
    plan = plugin.make_plan("0.5.21")
    assert set(plan.upstream) == FROM_0_5_21
    installed("0.5.20", tmp_path / "empty")
    assert plugin.make_plan("0.5.20").upstream == []


def test_the_window_is_every_release_from_0_5_20_to_0_5_23():
    assert features.SUPPORTED_SGLANG_VERSIONS == REGISTRATION_VERSIONS
    assert not plugin.make_plan("0.5.24").supported and not plugin.make_plan("0.5.19").supported


@pytest.mark.parametrize("version", REGISTRATION_VERSIONS)
def test_patch_series_only_where_upstream_lacks_the_sm103_row_max(version):
    """patches/sglang/ holds a series for 0.5.20 only: 0.5.21 on ship the sm_103 row max from the
    TMEM load (tcgen05.ld.red, LdRed32x32bOp) in their vendored FA4 themselves, so `patch` and
    `build-wheel` have nothing to do there (they refuse with "no patch series")."""
    from sglang_fa4.patching.series import PatchError, load_series, supported_versions

    kernel = require_version(version) / "sglang/kernels/ops/attention/flash_attn/cute/flash_fwd_sm100.py"
    upstream_has_it = "LdRed32x32bOp" in kernel.read_text()
    assert upstream_has_it == (version != "0.5.20")
    assert (version in supported_versions()) == (not upstream_has_it)
    if upstream_has_it:
        with pytest.raises(PatchError, match=f"no patch series for sglang {version}: its vendored FA4 already has "
                                             "the sm_103 row max"):
            load_series(version)
