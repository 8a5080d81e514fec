"""Two tooling edges (issue #43): ``sglang-fa4 build-wheel -o`` and ``sglang-fa4 patch`` writing where
several directories do not exist yet (made, nothing else touched); and the plugin's startup
environment check, which reports only variables the plugin owns -- another library's variable, even
one whose value we would refuse, is read as its owner reads it and is never an ERROR of ours."""

from __future__ import annotations

import logging
import zipfile
from pathlib import Path

import pytest

from _sglang_wheel import sglang_wheel
from sglang_fa4 import plugin
from sglang_fa4.cli import main
from sglang_fa4.environ import envs
from sglang_fa4.patching import series as series_mod

VERSION = "0.5.20"


def test_build_wheel_into_a_directory_several_levels_missing(tmp_path, capsys):
    wheel = sglang_wheel(VERSION)
    out = tmp_path / "a" / "b" / "c" / "dist"
    assert main(["build-wheel", "--sglang", VERSION, "-o", str(out), "--from", str(wheel)]) == 0
    built = Path(capsys.readouterr().out.strip())
    assert built.parent == out and built.name.startswith(f"sglang-{VERSION}+fa4.") and zipfile.is_zipfile(built)
    assert sorted(p.name for p in out.iterdir()) == [built.name]  # no temporary file left beside it
    assert [p.name for p in tmp_path.iterdir()] == ["a"]


NEW_FILE = "sglang/plugins_fa4/deep/er/still/note.py"
PATCH = f"""Adds one file three directories below any that exist.

--- /dev/null
+++ b/{NEW_FILE}
@@ -0,0 +1,1 @@
+NOTE = "written by a patch"
"""


def test_patch_writes_a_file_several_directories_missing(tmp_path, monkeypatch, capsys):
    """A series whose patch creates a file under directories the target lacks: apply makes them and
    writes the file (nothing else changes); revert takes the file away again."""
    root = tmp_path / "patches"
    series_dir = root / "sglang" / "9.9.9"
    series_dir.mkdir(parents=True)
    (series_dir / "series").write_text("# revision: 3\n0001-deep-file.patch\n")
    (series_dir / "base.sha256").write_text("# the patch creates its only file\n")
    (series_dir / "0001-deep-file.patch").write_text(PATCH)
    monkeypatch.setattr(series_mod, "patches_root", lambda: root)
    target = tmp_path / "site"
    (target / "sglang").mkdir(parents=True)
    (target / "sglang" / "__init__.py").write_text("__version__ = '9.9.9'\n")
    before = {p.relative_to(target).as_posix() for p in target.rglob("*")}
    assert main(["patch", "apply", "--target", str(target), "--sglang-version", "9.9.9"]) == 0, capsys.readouterr().err
    assert (target / NEW_FILE).read_text() == 'NOTE = "written by a patch"\n'
    assert main(["patch", "revert", "--target", str(target), "--sglang-version", "9.9.9"]) == 0, capsys.readouterr().err
    assert not (target / NEW_FILE).exists()
    files = {p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_file()}
    assert files == {f for f in before if (target / f).is_file()}


#: another library's variables with values that library reads its own way (we would refuse them as ours)
FOREIGN = {
    "SGLANG_VIT_ENABLE_CUDA_GRAPH": ("maybe", False),  # SGLang's EnvBool: unknown -> its default
    "TRITON_INTERPRET": ("sure", False),  # Triton's getenv_bool: set and not a true word -> false
    "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED": ("yes", False),  # FA4: only "1" is on
}


def test_the_startup_check_reports_only_our_variables(monkeypatch, caplog):
    """Malformed-looking values of SGLang's, Triton's and FA4's variables are no ERROR of ours and
    are read as their owners read them; one of ours beside them is the one ERROR line."""
    for name, (raw, _) in FOREIGN.items():
        monkeypatch.setenv(name, raw)
    assert plugin.environment_errors() == {}
    for name, (_, read_as) in FOREIGN.items():
        var = getattr(envs, name)
        assert var.owner not in ("sglang-fa4", "tests") and var.get() is read_as, name
    monkeypatch.setenv("SGLANG_FA4_WARMUP", "perhaps")
    try:
        errors = plugin.environment_errors()
        assert list(errors) == ["SGLANG_FA4_WARMUP"]
        with caplog.at_level(logging.ERROR, logger="sglang_fa4"):
            plugin._log_environment_errors(errors)
        assert [r.getMessage().split("=", 1)[0] for r in caplog.records] == ["sglang-fa4: SGLANG_FA4_WARMUP"]
    finally:
        envs.clear_fallbacks()


def test_a_tests_variable_is_not_the_servers(monkeypatch):
    """The test suite's own variables (owner ``tests``) are checked by the registry but are not the
    server's: the plugin's check leaves them out."""
    tests_vars = [v for v in envs if v.owner == "tests" and v.type == "bool"]
    assert tests_vars
    monkeypatch.setenv(tests_vars[0].name, "perhaps")
    assert [p.name for p in envs.problems()] == [tests_vars[0].name]  # the registry does see it
    assert plugin.environment_errors() == {}
    envs.clear_fallbacks()


@pytest.fixture(autouse=True)
def no_env_reported(monkeypatch):
    monkeypatch.delenv("SGLANG_FA4_ENV_ERRORS_REPORTED", raising=False)
