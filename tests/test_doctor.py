import json
import os
import subprocess
import sys

import pytest

from sglang_fa4 import cli
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
    assert report["sglang"]["version"]  # a version or "not installed"


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


def test_doctor_does_not_import_heavy_modules():
    code = ("import sys, json; from sglang_fa4 import cli; cli.main(['doctor','--json','--capability','9.0']);"
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('flash_attn','cutlass','sglang'))))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []


def test_cli_help_lists_doctor():
    with pytest.raises(SystemExit) as exc:
        cli.main(["--help"])
    assert exc.value.code == 0
