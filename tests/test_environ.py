import ast
from pathlib import Path

import pytest
import yaml

from sglang_fa4.environ import EnvSpecError, EnvValueError, envs, load_registry, spec_path

ROOT = Path(__file__).resolve().parents[1]


def test_spec_is_the_repo_file():
    assert spec_path() == ROOT / "environ.yaml"


def test_declared_variables_and_types():
    spec = yaml.safe_load((ROOT / "environ.yaml").read_text())["variables"]
    assert set(envs.names()) == set(spec)
    for name in ("SGLANG_VIT_ENABLE_CUDA_GRAPH", "SGLANG_FA4_TMEM_LOAD_RED_MAX", "SGLANG_FA4_MM_ATTENTION_BACKEND_DEFAULT"):
        assert name in envs
    assert envs.SGLANG_VIT_ENABLE_CUDA_GRAPH.owner == "sglang"
    assert envs.SGLANG_FA4_TMEM_LOAD_RED_MAX.owner == "sglang-fa4"
    assert envs.SGLANG_FA4_TMEM_LOAD_RED_MAX.type == "bool"


def test_defaults_when_unset(monkeypatch):
    monkeypatch.delenv("SGLANG_FA4_TMEM_LOAD_RED_MAX", raising=False)
    monkeypatch.delenv("SGLANG_VIT_ENABLE_CUDA_GRAPH", raising=False)
    assert envs.SGLANG_FA4_TMEM_LOAD_RED_MAX.get() is True
    assert envs.SGLANG_VIT_ENABLE_CUDA_GRAPH.get() is False


@pytest.mark.parametrize("raw,expected", [("1", True), ("TRUE", True), ("on", True), ("0", False), ("No", False), ("off", False)])
def test_bool_parsing(monkeypatch, raw, expected):
    monkeypatch.setenv("SGLANG_FA4_TMEM_LOAD_RED_MAX", raw)
    assert envs.SGLANG_FA4_TMEM_LOAD_RED_MAX.get() is expected


def test_bad_bool_names_variable_and_accepted_values(monkeypatch):
    monkeypatch.setenv("SGLANG_FA4_TMEM_LOAD_RED_MAX", "maybe")
    with pytest.raises(EnvValueError) as err:
        envs.SGLANG_FA4_TMEM_LOAD_RED_MAX.get()
    assert "SGLANG_FA4_TMEM_LOAD_RED_MAX" in str(err.value)
    assert "maybe" in str(err.value) and "true" in str(err.value) and "0" in str(err.value)
    assert any("SGLANG_FA4_TMEM_LOAD_RED_MAX" in e for e in envs.validate())
    assert "error" in envs.snapshot()["SGLANG_FA4_TMEM_LOAD_RED_MAX"]


def test_bad_choice(monkeypatch):
    monkeypatch.setenv("SGLANG_FA4_MM_ATTENTION_BACKEND_DEFAULT", "fa9")
    with pytest.raises(EnvValueError, match="SGLANG_FA4_MM_ATTENTION_BACKEND_DEFAULT='fa9'.*'fa4'"):
        envs.SGLANG_FA4_MM_ATTENTION_BACKEND_DEFAULT.get()


def test_override_restores(monkeypatch):
    monkeypatch.delenv("SGLANG_FA4_TMEM_LOAD_RED_MAX", raising=False)
    with envs.SGLANG_FA4_TMEM_LOAD_RED_MAX.override(False):
        assert envs.SGLANG_FA4_TMEM_LOAD_RED_MAX.get() is False
    assert not envs.SGLANG_FA4_TMEM_LOAD_RED_MAX.is_set()


def test_undeclared_variable_is_an_error():
    with pytest.raises(AttributeError, match="not declared in environ.yaml"):
        envs.SGLANG_FA4_NO_SUCH_THING


@pytest.mark.parametrize(
    "body,message",
    [
        ("variables:\n  X:\n    type: float\n    default: 1\n    meaning: m\n    owner: o\n", "type 'float'"),
        ("variables:\n  X:\n    type: bool\n    meaning: m\n    owner: o\n", "missing field"),
        ("variables:\n  X:\n    type: bool\n    default: sometimes\n    meaning: m\n    owner: o\n", "does not round-trip"),
        ("variables:\n  X:\n    type: choice\n    default: a\n    meaning: m\n    owner: o\n", "needs choices"),
        ("variables: {}\n", "'default'"),
    ],
)
def test_malformed_spec(tmp_path, body, message):
    path = tmp_path / "environ.yaml"
    path.write_text(body)
    with pytest.raises((EnvSpecError, EnvValueError), match=message):
        load_registry(path)


def _env_reads(tree: ast.AST):
    """Yield line numbers of os.environ / os.getenv / os.putenv / environ uses."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in {"environ", "getenv", "putenv", "unsetenv", "environb"}:
            yield node.lineno
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            if any(a.name in {"environ", "getenv", "putenv", "environb"} for a in node.names):
                yield node.lineno


def test_no_environment_access_outside_the_registry():
    offenders = []
    for path in sorted((ROOT / "sglang_fa4").rglob("*.py")):
        if path.name == "environ.py" and path.parent.name == "sglang_fa4":
            continue
        for line in _env_reads(ast.parse(path.read_text(), str(path))):
            offenders.append(f"{path.relative_to(ROOT)}:{line}")
    assert not offenders, "read the environment through sglang_fa4.environ.envs: " + ", ".join(offenders)


def test_scanner_catches_direct_reads():
    tree = ast.parse("import os\nx = os.environ.get('A')\ny = os.getenv('B')\nfrom os import environ\n")
    assert sorted(_env_reads(tree)) == [2, 3, 4]
