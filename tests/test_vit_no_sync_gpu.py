"""GPU: the hooked Qwen2.5-VL ViT eager forward runs under torch.cuda.set_sync_debug_mode("error")
without a device->host sync, and upstream's does not (so the check can fail). Skips without CUDA
(CI is CPU-only) and for an SGLang that does not import. The tower runs through
benchmark/release/check_vit_no_sync.py in a fresh process per SGLang (the plugin and the TP group are
process-wide); that script with its defaults (the 7B tower) is the full check with timings."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from sglang_fa4.integration.vit_host_metadata import ViTGeometry, host_layout, to_device
from sglang_harness import ROOT, SUPPORTED_VERSIONS, is_installed, target_dir

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

SCRIPT = ROOT / "benchmark" / "release" / "check_vit_no_sync.py"
SMALL_TOWER = ["--depth", "4", "--hidden", "256", "--heads", "4", "--intermediate", "512",
               "--out-hidden", "128", "--fullatt", "1,3", "--grid", "1x16x20,2x8x12,1x14x22", "--iters", "3"]


def test_host_layout_reaches_the_gpu_in_one_copy_without_sync():
    lay = host_layout([[1, 16, 20], [2, 8, 12]], ViTGeometry(2, 112, 14))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        dev = to_device(lay, "cuda")
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    assert len({t.untyped_storage().data_ptr() for t in (dev.window_index, dev.cu_window, dev.pos_ids)}) == 1
    for name in ("window_index", "reverse_index", "cu_full", "seq_lens_full", "cu_window", "seq_lens_window", "pos_ids"):
        got = getattr(dev, name)
        assert got.is_cuda and torch.equal(got.cpu(), getattr(lay, name)), name


def _env_for(which: str) -> dict:
    env = dict(os.environ)
    if which != "installed":
        if not is_installed(which):
            pytest.skip(f"sglang {which} is not installed in {target_dir(which)}")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(target_dir(which)), env.get("PYTHONPATH")]))
    probe = subprocess.run([sys.executable, "-c", "import sglang.srt.models.qwen2_5_vl"], env=env,
                           capture_output=True, text=True, timeout=300)
    if probe.returncode != 0:
        pytest.skip(f"sglang ({which}) does not import here: {probe.stderr.strip().splitlines()[-1:]}")
    return env


@pytest.mark.parametrize("which", [*SUPPORTED_VERSIONS, "installed"])
def test_hooked_tower_forward_makes_no_sync(which, tmp_path):
    env = _env_for(which)
    out = tmp_path / "vit_no_sync.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--sglang-version", which, *SMALL_TOWER],
                          env=env, capture_output=True, text=True, timeout=900)
    assert out.is_file(), proc.stdout + proc.stderr
    res = json.loads(out.read_text())
    assert "hooked" in res and "upstream" in res, proc.stdout + proc.stderr
    assert res["plugin"]["forward_hooked"]
    assert res["upstream"]["raised"], "upstream's forward made no sync: the check proves nothing"
    assert not res["hooked"]["raised"], res["hooked"]
    assert res["bitwise_equal"], res["max_abs_diff"]  # README: outputs bitwise equal to upstream's
    assert proc.returncode == 0, proc.stdout + proc.stderr
