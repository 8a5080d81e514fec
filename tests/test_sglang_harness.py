"""Smoke test of the real-SGLang harness: each supported release imports its ViT attention module,
both graph runners, the plugin loader and the model runner on this CPU machine, from its own target
dir."""

import pytest

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


def test_imports_real_sglang(sglang_version):
    out = run_with_sglang(sglang_version, IMPORTS)
    assert out["version"] == sglang_version
    assert out["sglang_file"].startswith(out["target"])
    assert out["has_fa4"] is True
    assert out["cuda"] is False


def test_failure_reports_output(sglang_version):
    with pytest.raises(SGLangRunError, match="(?s)exited 1.*boom"):
        run_with_sglang(sglang_version, "print('hello'); raise SystemExit('boom')", timeout=60)
