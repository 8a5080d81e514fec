"""What ``pip wheel .`` ships: the package that runs in a server (and the ``sglang-fa4`` command it
carries), never the repository's tooling. The docs and figure checkers (``tools/``), the tests and
the benchmark scripts find ``benchmark/results`` and ``docs/`` from a checkout; an installed wheel
has neither, so they stay out of it."""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path, PurePosixPath

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: what the wheel holds besides sglang_fa4's modules: the environment registry's spec, the patch series
DATA = ("sglang_fa4/environ.yaml", "sglang_fa4/patches/")
#: shipped modules that look into a checkout, and why: the FA3 baseline library of `sglang-fa4 bench`
#: is built by benchmark/fa3_build/build.sh into <checkout>/.fa3 (absent: that column is skipped)
CHECKOUT = {"sglang_fa4/bench/fa3.py": 29}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--quiet", "--disable-pip-version-check",
                    "-w", str(out)], cwd=ROOT, check=True, timeout=600)
    (built,) = out.glob("sglang_fa4-*.whl")
    return zipfile.ZipFile(built)


def test_the_wheel_holds_the_package_and_nothing_of_the_repository(wheel):
    names = wheel.namelist()
    tops = {PurePosixPath(n).parts[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"sglang_fa4"}
    modules = {n for n in names if n.endswith(".py")}
    tracked = set(subprocess.run(["git", "ls-files", "sglang_fa4/*.py", "sglang_fa4/**/*.py"], cwd=ROOT,
                                 capture_output=True, text=True, check=True).stdout.split())
    assert modules == tracked  # every module of the package, and no other
    for tool in ("sglang_fa4/docs.py", "sglang_fa4/result_figures.py"):
        assert tool not in names
    assert not [n for n in names if n.startswith(("tools/", "tests/", "benchmark/", "docs/"))]
    others = [n for n in names if not n.endswith(".py") and not n.startswith(DATA) and ".dist-info/" not in n]
    assert others == []
    assert "sglang_fa4/environ.yaml" in names and any(n.startswith("sglang_fa4/patches/sglang/") for n in names)


def test_no_shipped_module_finds_files_through_the_checkout(wheel):
    """No module computes a path above the package through ``Path(__file__)...parents[N]`` (what
    docs.py and result_figures.py did to find benchmark/results): only a checkout has one. The
    checkers that do live in tools/; the one shipped module that looks there says why (CHECKOUT)."""
    offenders = []
    for name in (n for n in wheel.namelist() if n.endswith(".py")):
        tree = ast.parse(wheel.read(name).decode(), name)
        depth = len(PurePosixPath(name).parts) - 1  # parents[depth] is the directory above sglang_fa4/
        for node in ast.walk(tree):
            if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute)
                    and node.value.attr == "parents" and isinstance(node.slice, ast.Constant)
                    and node.slice.value >= depth):
                offenders.append(f"{name}:{node.lineno}")
    assert offenders == [f"{name}:{line}" for name, line in CHECKOUT.items()]
