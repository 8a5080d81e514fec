"""Run code against a REAL SGLang release, in a fresh subprocess.

tests/setup_env.sh installs each supported release with its version-specific pins into
``.cache/sglang/<version>/`` (pip ``--no-deps --target``); the shared dependencies and this package
(editable, so its ``sglang.srt.plugins`` entry point is visible) are in ``.venv``. A snippet runs as
``sys.executable -c PRELUDE+code`` with that target dir first on PYTHONPATH, and must print one JSON
value on its last stdout line (the prelude defines ``emit(obj)`` for that). The process is forked
from a per-version zygote (tests/sglang_zygote.py) that has already imported SGLang's third-party
stack (torch, transformers, ...; not SGLang, not sglang_fa4), which cuts each snippet's start-up
from ~20 s to a few on a 2-core machine; ``fresh=True`` runs a plain ``python -c`` instead::

    from sglang_harness import run_with_sglang  # the sglang_version fixture comes from conftest.py

    def test_something(sglang_version):
        out = run_with_sglang(sglang_version, "import sglang; emit({'v': sglang.__version__})")
        assert out["v"] == sglang_version

The ``sglang_version`` fixture runs a test once per supported version and skips a version whose
target dir is missing, unless SGLANG_FA4_REQUIRE_SGLANG=1 (CI), where that is a failure.
See tests/SGLANG_RECIPES.md for snippets that drive vision.py, the ViT graph runners and plugins on CPU.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Mapping

import pytest

from sglang_fa4.environ import envs

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ROOT / ".cache" / "sglang"
# The releases the full suites run on (the first and the last of the supported window).
SUPPORTED_VERSIONS = ("0.5.20", "0.5.23")
# Every release of the window: registration through the real loader (tests/test_sglang_window.py).
# tests/setup_env.sh installs these (keep the two lists equal).
REGISTRATION_VERSIONS = ("0.5.20", "0.5.21", "0.5.22", "0.5.23")
STAMP = ".sglang-fa4-stamp"  # written by setup_env.sh once a target dir is complete

PRELUDE = """\
import json as _sglang_fa4_json
def emit(obj):
    print(_sglang_fa4_json.dumps(obj, default=str), flush=True)
"""


class SGLangRunError(RuntimeError):
    """The snippet failed, timed out, or did not end its stdout with a JSON line."""


def target_dir(version: str) -> Path:
    return TARGETS / version


def is_installed(version: str) -> bool:
    return (target_dir(version) / STAMP).is_file()


def available_versions() -> list[str]:
    """The supported versions whose target dir is complete."""
    return [v for v in SUPPORTED_VERSIONS if is_installed(v)]


def require_version(version: str) -> Path:
    """The target dir of `version`; skip the calling test if it is missing (fail under CI's
    SGLANG_FA4_REQUIRE_SGLANG=1)."""
    if is_installed(version):
        return target_dir(version)
    msg = f"sglang {version} is not installed in {target_dir(version)} (run tests/setup_env.sh)"
    if envs.SGLANG_FA4_REQUIRE_SGLANG.get():
        pytest.fail(msg + "; SGLANG_FA4_REQUIRE_SGLANG=1 makes that a failure", pytrace=False)
    pytest.skip(msg)


@pytest.fixture(params=SUPPORTED_VERSIONS)
def sglang_version(request: pytest.FixtureRequest) -> str:
    """Each supported SGLang version; skips (or fails, see require_version) when it is missing."""
    request.applymarker(pytest.mark.sglang)
    require_version(request.param)
    return request.param


def _child_env(version: str, env: Mapping[str, str | None] | None) -> dict[str, str]:
    child = dict(os.environ)
    for key, value in (env or {}).items():
        if value is None:
            child.pop(key, None)
        else:
            child[key] = str(value)
    # the version's packages, then the scripts and the test modules they share (imported by name)
    paths = [str(target_dir(version)), str(SCRIPTS), str(SCRIPTS.parent)]
    if child.get("PYTHONPATH"):
        paths.append(child["PYTHONPATH"])
    child["PYTHONPATH"] = os.pathsep.join(paths)
    child["SGLANG_FA4_HARNESS_TARGET"] = str(target_dir(version))
    return child


def run_with_sglang(
    version: str,
    code: str,
    env: Mapping[str, str | None] | None = None,
    timeout: float = 300,
    fresh: bool = False,
) -> Any:
    """Run `code` under sglang `version` in a fresh interpreter and return the JSON value on its
    last stdout line. `env` adds to (a None value removes from) the inherited environment. Raises
    SGLangRunError, with the full stdout and stderr, on a non-zero exit, a timeout or no JSON.

    The interpreter is a child forked from the version's zygote (tests/sglang_zygote.py: SGLang's
    third-party stack already imported, SGLang itself not), which saves ~80% of each snippet's
    start-up; `fresh=True` starts a plain ``python -c`` instead."""
    require_version(version)
    child_env = _child_env(version, env)
    with tempfile.TemporaryDirectory(prefix="sglang-harness-") as cwd:
        zygote = None if fresh else _zygote(version, child_env)
        if zygote is not None:
            rc, timed_out, stdout, stderr = zygote.run(PRELUDE + code, child_env, cwd, timeout)
        else:
            rc, timed_out, stdout, stderr = _run_fresh(PRELUDE + code, child_env, cwd, timeout)
    report = f"--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}"
    if timed_out:
        raise SGLangRunError(f"sglang {version} snippet timed out after {timeout}s\n{report}")
    if rc != 0:
        raise SGLangRunError(f"sglang {version} snippet exited {rc}\n{report}")
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        raise SGLangRunError(f"sglang {version} snippet printed nothing on stdout\n{report}")
    try:
        return json.loads(lines[-1])
    except json.JSONDecodeError as exc:
        raise SGLangRunError(f"sglang {version} snippet's last stdout line is not JSON ({exc})\n{report}") from None


#: the scripts run_script runs: real files (linted like any test), importable from each other
SCRIPTS = Path(__file__).resolve().parent / "sglang_scripts"


def run_script(version: str, module: str, call: str, **kwargs) -> Any:
    """Import ``tests/sglang_scripts/<module>.py`` under sglang ``version`` and return the JSON of
    ``<module>.<call>`` (e.g. ``run(plugin=True, checks=["forward_forms"])``); ``kwargs`` as for
    :func:`run_with_sglang`."""
    code = f"import {module}\nemit({module}.{call})\n"
    return run_with_sglang(version, code, **kwargs)


def run_file(version: str, name: str, params: Any = None, **kwargs) -> Any:
    """Run the script ``tests/sglang_scripts/<name>`` under sglang ``version`` as a snippet (its
    ``emit`` from tests/sglang_scripts/emit.py, ``params`` as JSON in ``sys.argv[1]``); ``kwargs`` as
    for :func:`run_with_sglang`."""
    code = f"import sys\nsys.argv = [{name!r}, {json.dumps(params if params is not None else {})!r}]\n"
    return run_with_sglang(version, code + (SCRIPTS / name).read_text(), **kwargs)


def _run_fresh(code: str, env: dict[str, str], cwd: str, timeout: float) -> tuple[int, bool, str, str]:
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code],
            cwd=cwd,  # not the repo root: nothing there may shadow an import
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        return -9, True, _text(exc.stdout), _text(exc.stderr)
    return proc.returncode, False, proc.stdout, proc.stderr


ZYGOTE_SOURCE = (Path(__file__).resolve().parent / "sglang_zygote.py").read_text()


def _import_env(env: Mapping[str, str]) -> dict[str, str]:
    """The part of an environment the zygote's preloaded (non-SGLang) packages may have read: all
    but SGLang's and sglang_fa4's variables and pytest's (PYTEST_CURRENT_TEST changes every test)."""
    return {k: v for k, v in env.items() if not k.startswith(("SGLANG_", "PYTEST_"))}


class _Zygote:
    """A running tests/sglang_zygote.py for one version (see its docstring)."""

    def __init__(self, env: dict[str, str]):
        self.import_env = _import_env(env)
        self.dir = tempfile.mkdtemp(prefix="sglang-zygote-")  # its cwd: nothing to shadow an import
        self.count = 0
        self.stderr_path = Path(self.dir) / "zygote.stderr"
        with open(self.stderr_path, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", ZYGOTE_SOURCE], cwd=self.dir, env=env, text=True,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
            )

    def run(self, code: str, env: dict[str, str], cwd: str, timeout: float) -> tuple[int, bool, str, str]:
        self.count += 1
        out, err = (Path(self.dir) / f"{self.count}.{name}" for name in ("stdout", "stderr"))
        req = {"code": code, "env": env, "cwd": cwd, "stdout": str(out), "stderr": str(err), "timeout": timeout}
        try:
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
            answer = self.proc.stdout.readline()
        except (BrokenPipeError, OSError):
            answer = ""
        if not answer:
            raise SGLangRunError(f"the sglang zygote died (exit {self.proc.poll()})\n"
                                 f"--- zygote stderr ---\n{self.stderr_path.read_text()[-8000:]}")
        reply = json.loads(answer)
        texts = [p.read_text(errors="replace") if p.exists() else "" for p in (out, err)]
        for p in (out, err):
            p.unlink(missing_ok=True)
        return reply["rc"], reply["timed_out"], texts[0], texts[1]

    def close(self) -> None:
        try:
            self.proc.stdin.close()  # end of requests: it exits
            self.proc.wait(timeout=30)
        except Exception:  # noqa: BLE001
            self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


_zygotes: dict[str, _Zygote] = {}


def _zygote(version: str, env: dict[str, str]) -> _Zygote:
    """The version's zygote, started on first use and started again if it died or if `env` differs
    from the one it was started with outside SGLANG_*/PYTEST_* variables (what it imported might
    have read those)."""
    z = _zygotes.get(version)
    if z is not None and (z.proc.poll() is not None or _import_env(env) != z.import_env):
        z.close()
        z = None
    if z is None:
        z = _zygotes[version] = _Zygote(env)
    return z


@atexit.register
def _close_zygotes() -> None:
    for z in _zygotes.values():
        z.close()
    _zygotes.clear()


def _text(data: str | bytes | None) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data
