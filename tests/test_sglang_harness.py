"""Smoke test of the real-SGLang harness: each supported release imports its ViT attention module,
both graph runners, the plugin loader and the model runner on this CPU machine, from its own target
dir."""

import pytest

import sglang_harness
from sglang_harness import SGLangRunError, run_with_sglang

IMPORTS = """
import os, warnings
warnings.simplefilter("ignore")
import sglang
import sglang.srt.layers.attention.vision as vision
import sglang.srt.multimodal.vit_cuda_graph_runner as vit_runner
import sglang.srt.multimodal.internvl_vit_cuda_graph_runner as internvl_runner
import sglang.srt.plugins as plugins
import sglang.srt.model_executor.model_runner as model_runner
import torch
emit({
    "version": sglang.__version__,
    "sglang_file": sglang.__file__,
    "target": os.environ["SGLANG_FA4_HARNESS_TARGET"],
    "has_fa4": hasattr(vision, "VisionFlash4Attention"),
    "cuda": torch.cuda.is_available(),
})
"""


@pytest.mark.parametrize("fresh", [False, True], ids=["zygote", "fresh"])
def test_imports_real_sglang(sglang_version, fresh):
    out = run_with_sglang(sglang_version, IMPORTS, fresh=fresh)
    assert out["version"] == sglang_version
    assert out["sglang_file"].startswith(out["target"])
    assert out["has_fa4"] is True
    assert out["cuda"] is False


def test_failure_reports_output(sglang_version):
    with pytest.raises(SGLangRunError, match="(?s)exited 1.*boom"):
        run_with_sglang(sglang_version, "print('hello'); raise SystemExit('boom')", timeout=60)


CHILD = """
import os, random, sys
emit({"env": os.environ.get("SGLANG_FA4_HARNESS_PROBE"), "cwd": os.getcwd(), "argv": sys.argv,
      "main": __name__, "ppid": os.getppid(), "random": random.random(), "sglang_loaded": "sglang" in sys.modules,
      "sglang_fa4_loaded": "sglang_fa4" in sys.modules})
"""


def test_zygote_child_is_like_a_fresh_interpreter(sglang_version):
    """What a forked snippet sees: its own environment and empty working directory, a fresh
    __main__, its own random state, and neither SGLang nor sglang_fa4 imported yet (both read the
    snippet's environment at import)."""
    a = run_with_sglang(sglang_version, CHILD, env={"SGLANG_FA4_HARNESS_PROBE": "a"})
    b = run_with_sglang(sglang_version, CHILD, env={"SGLANG_FA4_HARNESS_PROBE": None})
    assert (a["env"], b["env"]) == ("a", None)
    assert a["cwd"] != b["cwd"] and "sglang-harness-" in a["cwd"]
    assert a["argv"] == ["-c"] and a["main"] == "__main__"
    assert a["random"] != b["random"]
    assert not a["sglang_loaded"] and not a["sglang_fa4_loaded"]
    # both forked by the same zygote (pytest's per-test PYTEST_CURRENT_TEST does not restart it)
    assert a["ppid"] == b["ppid"] == sglang_harness._zygotes[sglang_version].proc.pid


def test_timeout_kills_the_snippet(sglang_version):
    with pytest.raises(SGLangRunError, match="timed out after 2s"):
        run_with_sglang(sglang_version, "import time; print('started', flush=True); time.sleep(60)", timeout=2)
    assert run_with_sglang(sglang_version, "emit(1)") == 1  # the zygote still serves

