"""Run code against a REAL SGLang release, in a fresh subprocess.

tests/setup_env.sh installs each supported release with its version-specific pins into
``.cache/sglang/<version>/`` (pip ``--no-deps --target``); the shared dependencies and this package
(editable, so its ``sglang.srt.plugins`` entry point is visible) are in ``.venv``. A snippet runs as
``sys.executable -c PRELUDE+code`` with that target dir first on PYTHONPATH, and must print one JSON
value on its last stdout line (the prelude defines ``emit(obj)`` for that)::

    from sglang_harness import run_with_sglang  # the sglang_version fixture comes from conftest.py

    def test_something(sglang_version):
        out = run_with_sglang(sglang_version, "import sglang; emit({'v': sglang.__version__})")
        assert out["v"] == sglang_version

The ``sglang_version`` fixture runs a test once per supported version and skips a version whose
target dir is missing, unless SGLANG_FA4_REQUIRE_SGLANG=1 (CI), where that is a failure.
See tests/SGLANG_RECIPES.md for snippets that drive vision.py, the ViT graph runners and plugins on CPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Mapping

import pytest

from sglang_fa4.environ import envs

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ROOT / ".cache" / "sglang"
# The releases tests/setup_env.sh installs (keep the two lists equal).
SUPPORTED_VERSIONS = ("0.5.20", "0.5.23")
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
    paths = [str(target_dir(version))]
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
) -> Any:
    """Run `code` under sglang `version` in a fresh interpreter and return the JSON value on its
    last stdout line. `env` adds to (a None value removes from) the inherited environment. Raises
    SGLangRunError, with the full stdout and stderr, on a non-zero exit, a timeout or no JSON."""
    require_version(version)
    with tempfile.TemporaryDirectory(prefix="sglang-harness-") as cwd:
        try:
            proc = subprocess.run(
                [sys.executable, "-c", PRELUDE + code],
                cwd=cwd,  # not the repo root: nothing there may shadow an import
                env=_child_env(version, env),
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired as exc:
            raise SGLangRunError(
                f"sglang {version} snippet timed out after {timeout}s\n"
                f"--- stdout ---\n{_text(exc.stdout)}\n--- stderr ---\n{_text(exc.stderr)}"
            ) from None
    report = f"--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"
    if proc.returncode != 0:
        raise SGLangRunError(f"sglang {version} snippet exited {proc.returncode}\n{report}")
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    if not lines:
        raise SGLangRunError(f"sglang {version} snippet printed nothing on stdout\n{report}")
    try:
        return json.loads(lines[-1])
    except json.JSONDecodeError as exc:
        raise SGLangRunError(f"sglang {version} snippet's last stdout line is not JSON ({exc})\n{report}") from None


def _text(data: str | bytes | None) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data
