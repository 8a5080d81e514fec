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


@pytest.fixture
def doctor_env(monkeypatch):
    """In-process doctor with only the SGLANG_* variables a test sets (fallbacks undone after)."""
    from sglang_fa4.environ import envs

    for name in [k for k in os.environ if k.startswith("SGLANG_")]:
        monkeypatch.delenv(name)
    envs.clear_fallbacks()
    yield monkeypatch
    envs.clear_fallbacks()


MAYBE_LINE = ("sglang-fa4: SGLANG_FA4_TMEM_LOAD_RED_MAX='maybe' is not a boolean; accepted values: "
              "0/1/false/no/off/on/true/yes; SGLANG_FA4_TMEM_LOAD_RED_MAX runs at its default (1)")


def test_doctor_bad_env_value_is_the_plugins_line_and_the_report(doctor_env, capsys):
    """The plugin's own ERROR line, word for word; the report shows the default the server runs
    with; exit 1."""
    from sglang_fa4 import plugin

    doctor_env.setenv("SGLANG_FA4_TMEM_LOAD_RED_MAX", "maybe")
    assert cli.main(["doctor", "--json", "--capability", "10.3"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["errors"] == [MAYBE_LINE] == list(plugin.environment_errors().values())
    entry = report["env"]["SGLANG_FA4_TMEM_LOAD_RED_MAX"]
    assert entry["value"] is True and entry["error"].startswith("SGLANG_FA4_TMEM_LOAD_RED_MAX='maybe' is not a boolean")
    assert report["vit_backend"]["backend"] == "fa4"  # every other answer is still there
    assert cli.main(["doctor", "--capability", "10.3"]) == 1
    assert capsys.readouterr().out.splitlines()[0] == MAYBE_LINE


def test_doctor_strict_says_the_server_would_not_start(doctor_env, capsys):
    doctor_env.setenv("SGLANG_FA4_PLUGIN_STRICT", "1")
    doctor_env.setenv("SGLANG_FA4_VIT_GRAPH_BUDGETS", "1023")
    assert cli.main(["doctor", "--json", "--capability", "9.0"]) == 1
    assert json.loads(capsys.readouterr().out)["errors"] == [
        "sglang-fa4: SGLANG_FA4_VIT_GRAPH_BUDGETS='1023': 1023 is out of range; accepted: a comma list of integers, "
        "each >= 4 and a multiple of 4 and <= 262144; SGLANG_FA4_PLUGIN_STRICT=1: the server does not start"]


def test_doctor_bad_capability():
    proc = run_cli("doctor", "--capability", "ten")
    assert proc.returncode == 2 and "MAJOR.MINOR" in proc.stdout and proc.stderr == ""


@pytest.mark.parametrize("cap,why", [("ten", "must look like MAJOR.MINOR"), ("100.0", "100.0 is out of range"),
                                     ("16.0", "16.0 is out of range"), ("0.0", "0.0 is out of range"),
                                     ("9.10", "9.10 is out of range"), ("10", "must look like MAJOR.MINOR")])
def test_doctor_json_refuses_a_capability_as_json(doctor_env, capsys, cap, why):
    assert cli.main(["doctor", "--json", "--capability", cap]) == 2
    [message] = json.loads(capsys.readouterr().out)["errors"]
    assert message.startswith("sglang-fa4 doctor: error: compute capability") and why in message


@pytest.mark.parametrize("cap", ["1.0", "15.9", "8.0", "12.1"])
def test_doctor_capability_range_edges_are_answered(doctor_env, capsys, cap):
    assert cli.main(["doctor", "--json", "--capability", cap]) == 0
    assert json.loads(capsys.readouterr().out)["gpu"]["capability"] == [int(x) for x in cap.split(".")]


@pytest.mark.parametrize("backend,cap,warned", [("fa4", "8.0", True), ("fa4", "12.0", True), ("fa4", "9.0", False),
                                                ("fa4", "10.3", False), ("fa3", "8.6", False), ("fa3", "7.5", True),
                                                ("triton_attn", "8.0", False)])
def test_doctor_warns_of_a_backend_override_the_gpu_cannot_run(doctor_env, capsys, backend, cap, warned):
    doctor_env.setenv("SGLANG_FA4_MM_ATTENTION_BACKEND_DEFAULT", backend)
    assert cli.main(["doctor", "--json", "--capability", cap]) == 0
    vb = json.loads(capsys.readouterr().out)["vit_backend"]
    assert vb["backend"] == backend
    if not warned:
        assert "warning" not in vb
        return
    assert vb["warning"].startswith(f"SGLANG_FA4_MM_ATTENTION_BACKEND_DEFAULT={backend}: {backend} does not run "
                                    f"on compute capability {cap} (it runs on ")
    assert cli.main(["doctor", "--capability", cap]) == 0
    assert f"  warning: {vb['warning']}" in capsys.readouterr().out.splitlines()


def test_the_plugin_warns_once_of_a_backend_override_the_gpu_cannot_run(monkeypatch, caplog):
    """The backend hook selects through select_mm_attention_backend: one WARNING per process."""
    import logging

    from sglang_fa4 import selection

    monkeypatch.setenv("SGLANG_FA4_MM_ATTENTION_BACKEND_DEFAULT", "fa4")
    monkeypatch.setattr(selection, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="sglang_fa4"):
        for _ in range(3):
            assert selection.select_mm_attention_backend(None, None, (8, 0)).backend == "fa4"
        selection.select_mm_attention_backend(None, None, (10, 0))
    assert [r.getMessage() for r in caplog.records] == [
        "sglang-fa4: SGLANG_FA4_MM_ATTENTION_BACKEND_DEFAULT=fa4: fa4 does not run on compute capability 8.0 "
        "(it runs on 9.x, 10.x, 11.x); unset it or pick another backend"]


def test_doctor_piped_into_a_reader_that_left_is_no_traceback():
    """`sglang-fa4 doctor | head -1`: the pipe's reader is gone before doctor writes."""
    proc = subprocess.Popen([sys.executable, "-m", "sglang_fa4.cli", "doctor", "--capability", "9.0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # long before the child has imported anything
    stderr = proc.stderr.read()
    assert proc.wait(timeout=120) == 1 and stderr == ""


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
