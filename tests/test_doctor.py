import json
import os
import subprocess
import sys

import pytest

from sglang_fa4 import cli
from sglang_fa4.features import FEATURES
from sglang_harness import SUPPORTED_VERSIONS, is_installed, target_dir


def run_cli(*args, env=None):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "sglang_fa4.cli", *args], capture_output=True, text=True,
                          env=full_env, timeout=120)


def test_doctor_json_capability_10_3_reports_fa4():
    proc = run_cli("doctor", "--json", "--capability", "10.3")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["vit_backend"]["backend"] == "fa4"
    assert "10.3" in report["vit_backend"]["reason"]
    assert report["gpu"]["capability"] == [10, 3]
    assert "SGLANG_FA4_TMEM_LOAD_RED_MAX" in report["env"]


@pytest.mark.parametrize("cap,backend", [("9.0", "fa3"), ("12.0", "triton_attn"), ("10.0", "fa4")])
def test_doctor_text(cap, backend):
    proc = run_cli("doctor", "--capability", cap)
    assert proc.returncode == 0, proc.stderr
    assert f"ViT backend:  {backend}" in proc.stdout


def test_doctor_bad_env_value_exits_non_zero_naming_it():
    proc = run_cli("doctor", "--json", env={"SGLANG_FA4_TMEM_LOAD_RED_MAX": "maybe"})
    assert proc.returncode != 0
    assert "SGLANG_FA4_TMEM_LOAD_RED_MAX" in proc.stdout + proc.stderr


def test_doctor_bad_capability():
    proc = run_cli("doctor", "--capability", "ten")
    assert proc.returncode == 2 and "MAJOR.MINOR" in proc.stdout


@pytest.mark.parametrize("args", [["--capability", "9.0"], []])
def test_doctor_does_not_import_heavy_modules(args):
    """doctor answers without torch (whose import without numpy prints a warning first), SGLang,
    FA4 or CUTLASS; the GPU, when no --capability is given, comes from the CUDA driver."""
    code = (f"import sys, json; from sglang_fa4 import cli; cli.main(['doctor', '--json', *{args!r}]);"
            "print(json.dumps(sorted(m for m in sys.modules "
            "if m.split('.')[0] in ('flash_attn', 'cutlass', 'sglang', 'torch', 'numpy'))))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []
    assert proc.stderr == ""


def test_doctor_gpu_from_the_cuda_driver_agrees_with_torch():
    import torch

    from sglang_fa4.doctor import cuda_driver_gpu

    gpu = cuda_driver_gpu()
    if torch.cuda.is_available():
        assert gpu["capability"] == list(torch.cuda.get_device_capability(0))
        assert gpu["name"] == torch.cuda.get_device_name(0)
    else:
        assert gpu["capability"] is None and gpu["source"].startswith("no CUDA")


@pytest.mark.parametrize("version", [None, *SUPPORTED_VERSIONS])
def test_doctor_reports_the_installed_sglang(version):
    """The SGLang line is the distribution on the path (found without importing it): a supported
    version with its feature states, or "not installed"."""
    env = {}
    if version is not None:
        if not is_installed(version):
            pytest.skip(f"sglang {version} is not installed in {target_dir(version)}")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(target_dir(version)), os.environ.get("PYTHONPATH")]))
    proc = run_cli("doctor", "--json", "--capability", "10.3", env=env)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    if version is None:
        assert report["sglang"] == {"version": "not installed", "supported": False, "note": "SGLang is not installed"}
        assert report["features"] == {}
    else:
        assert report["sglang"]["version"] == version and report["sglang"]["supported"]
        assert set(report["features"]) == {f.name for f in FEATURES}
        assert report["features"]["vit_graph_outputs_owned"] == "hooked"


def test_cli_help_lists_doctor():
    with pytest.raises(SystemExit) as exc:
        cli.main(["--help"])
    assert exc.value.code == 0


@pytest.mark.parametrize("installed, expect", [
    (None, "none (flash-attn-4 not installed)"),
    ("4.0.0b36", "direct cached-kernel launch"),
    ("4.0.0b31", "FA4's public API for configurations where it does not"),
    ("4.0.0b30", "4.0.0b30's kernel call was checked to match 4.0.0b36's layout (sm90, sm100)"),
])
def test_doctor_reports_the_fa4_version_and_launch_path(monkeypatch, installed, expect):
    from sglang_fa4 import doctor

    real = doctor._dist_version
    monkeypatch.setattr(doctor, "_dist_version", lambda name: installed if name == "flash-attn-4" else real(name))
    fa4 = doctor._fa4_report()
    assert fa4["flash-attn-4"] == installed and fa4["written_against"] == "4.0.0b36"
    assert expect in fa4["launch_path"]
    assert "launch path: " + fa4["launch_path"] in doctor.format_text({**doctor.collect("9.0"), "fa4": fa4})
