"""sglang-fa4 against a REAL other flash-attn-4 (4.0.0b30; written against 4.0.0b36), on a CPU
(issue #19 item 5): one version warning, the recorded-call check run on the old release's own call
for every configuration a ViT uses (SM90 and SM100 kernel classes), and, where the call is not
recognised, FA4's public API with one warning and no error per call; ``doctor`` names the version.

Needs .cache/fa4-drift (tests/setup_pip_layer.sh fa4-drift ..., ~13 MB) and the CUTLASS DSL layer
.cache/cutlass-dsl-4.8.1 (tests/setup_pip_layer.sh); skips when either is absent, unless
SGLANG_FA4_TEST_FA4_DRIFT=1, which builds them. ~25 s per kernel class (importing FA4 + the DSL).
The outputs of a run are committed: benchmark/results/cpu/fa4_drift-4.0.0b30-sm90.json and -sm100.json
(``tests/fa4_drift_check.py --arch 90|100 --out FILE``); the H200 run of ``--gpu``:
benchmark/results/h200/fa4_drift-4.0.0b30-h200.json.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_fa4.environ import envs

ROOT = Path(__file__).resolve().parents[1]
DRIFT = ROOT / ".cache" / "fa4-drift"
DSL = ROOT / ".cache" / "cutlass-dsl-4.8.1"
OLD_VERSION = "4.0.0b30"


def _layers_ready() -> bool:
    return (DRIFT / ".requirements.sha256").is_file() and (DSL / ".requirements.sha256").is_file()


@pytest.fixture(scope="module")
def drift_pythonpath() -> str:
    if envs.SGLANG_FA4_TEST_FA4_DRIFT.get():
        subprocess.run(["bash", str(ROOT / "tests" / "setup_pip_layer.sh"), "cutlass-dsl-4.8.1",
                        "tests/requirements-fp8-xcompile.txt", sys.executable], check=True)
        subprocess.run(["bash", str(ROOT / "tests" / "setup_pip_layer.sh"), "fa4-drift",
                        "tests/requirements-fa4-drift.txt", sys.executable], check=True)
    elif not _layers_ready():
        pytest.skip("no .cache/fa4-drift or .cache/cutlass-dsl-4.8.1 (SGLANG_FA4_TEST_FA4_DRIFT=1 builds them)")
    return os.pathsep.join([str(DRIFT), str(DSL / "nvidia_cutlass_dsl" / "dsl_packages"), str(DSL), str(ROOT)])


def drift_check(pythonpath: str, arch: int) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("FLASH_ATTENTION_ARCH", "CUTE_DSL_ARCH", "FLASH_ATTENTION_NUM_SMS")}
    env["PYTHONPATH"] = pythonpath
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "fa4_drift_check.py"), "--arch", str(arch)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("arch,nargs", [(90, 18), (100, 25)])
def test_older_fa4_runs_through_the_plugin(drift_pythonpath, arch, nargs):
    r = drift_check(drift_pythonpath, arch)
    assert r["installed_version"] == OLD_VERSION and r["flash_attn_file"].startswith(str(DRIFT))
    # doctor: the installed version and the launch path it gets
    assert r["doctor_fa4"]["flash-attn-4"] == OLD_VERSION
    assert OLD_VERSION in r["doctor_fa4"]["launch_path"]
    # b30's kernel call is b36's layout: every configuration passes the recorded-call check and is
    # launched directly (the second call of each through the recorded template)
    inst = r["as_installed"]
    assert [c["path"] for c in inst["configs"]] == ["direct_launch"] * 4, inst
    assert all("error" not in c and c["returned_out"] for c in inst["configs"]), inst
    assert inst["public_configs"] == [] and inst["kernel_nargs"] == nargs
    # a call layout sglang-fa4 does not recognise: FA4's public API for every configuration, no error
    drift = r["layout_not_recognised"]
    assert [c["path"] for c in drift["configs"]] == ["public_api"] * 4, drift
    assert all("error" not in c and c["returned_out"] for c in drift["configs"]), drift
    # one warning for the version, one for the fallback, per process
    assert r["version_warnings"] == 1 and r["layout_fallback_warnings"] == 1, r["warnings"]
    assert len(r["warnings"]) == 2, r["warnings"]
