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
        ("variables:\n  X:\n    type: bool\n    default: sometimes\n    meaning: m\n    owner: sglang-fa4\n", "does not round-trip"),
        ("variables:\n  X:\n    type: choice\n    default: a\n    meaning: m\n    owner: o\n", "needs choices"),
        ("variables: {}\n", "'default'"),
        ("variables:\n  X:\n    type: bool\n    default: false\n    meaning: m\n    owner: someone\n",
         "no reader for a bool owned by 'someone'"),  # another owner's bool is read as that owner reads it
        ("variables:\n  X:\n    type: str\n    default: ''\n    max: 3\n    meaning: m\n    owner: sglang-fa4\n",
         "min / max / multiple_of apply to int and int_list only"),
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


# ---- ranges on every integer ---------------------------------------------------------------------

INTEGERS = [var for var in envs if var.type in ("int", "int_list")]


def test_every_integer_has_a_minimum_and_a_maximum():
    assert INTEGERS and all(var.minimum is not None and var.maximum is not None for var in INTEGERS), \
        [var.name for var in INTEGERS if var.minimum is None or var.maximum is None]


@pytest.mark.parametrize("var", INTEGERS, ids=lambda var: var.name)
def test_integer_boundaries(var):
    """Exactly the minimum and the maximum are accepted; one past either is refused, naming the range."""
    step = var.multiple_of or 1
    one = (lambda v: (v,)) if var.type == "int_list" else (lambda v: v)
    assert var.parse(str(var.minimum)) == one(var.minimum)
    assert var.parse(str(var.maximum)) == one(var.maximum)
    for bad in (var.minimum - step, var.maximum + step):
        with pytest.raises(EnvValueError, match=rf"{var.name}='{bad}': {bad} is out of range; accepted: .*>= "
                                                rf"{var.minimum}.* and <= {var.maximum}$"):
            var.parse(str(bad))


@pytest.mark.parametrize("raw,why", [
    ("-5", "-5 is out of range"),
    ("1e23", "is not an integer"),
    ("1" + "0" * 23, "100000000000000000000000 is out of range"),
    ("9" * 5000, "5000 digits are out of range"),  # past Python's int() digit limit
    ("1_000", "is not an integer"),  # int() would take it
    ("\u0663", "is not an integer"),  # an Arabic-Indic 3: int() would take it
    ("", "is not an integer"),
])
def test_malformed_integers_are_refused_in_one_short_line(raw, why):
    with pytest.raises(EnvValueError) as err:
        envs.SGLANG_FA4_SHORT_SEQLEN_ROUTE_MAX.parse(raw)
    message = str(err.value)
    assert message.startswith("SGLANG_FA4_SHORT_SEQLEN_ROUTE_MAX=") and why in message
    assert message.endswith("accepted: an integer >= 0 and <= 1048576")
    assert "\n" not in message and len(message) < 260


def test_a_list_names_the_entry_out_of_range():
    with pytest.raises(EnvValueError, match=r"SGLANG_FA4_VIT_GRAPH_BUDGETS='1024,262148': 262148 is out of range"):
        envs.SGLANG_FA4_VIT_GRAPH_BUDGETS.parse("1024,262148")


# ---- variables of other owners: read as their owner reads them --------------------------------------


@pytest.mark.parametrize("raw,expected", [
    ("1", True), ("true", True), ("TRUE", True), ("yes", True), ("y", True), ("Y", True),
    ("0", False), ("false", False), ("no", False), ("n", False),
    ("on", False), ("off", False), ("", False), (" 1", False), ("2", False),  # SGLang: invalid -> its default
])
def test_sglang_bool_is_read_like_sglang_envbool(monkeypatch, raw, expected):
    """sglang/srt/environ.py EnvBool (0.5.20 = 0.5.23): lower-cased, not stripped; invalid is the
    default (False here). Checked against the real SGLang in test_plugin_real_loader.py too."""
    monkeypatch.setenv("SGLANG_VIT_ENABLE_CUDA_GRAPH", raw)
    assert envs.SGLANG_VIT_ENABLE_CUDA_GRAPH.get() is expected
    assert envs.problems(owners=("sglang",)) == []  # never refused by us


TRITON_VALUES = ["1", "0", "true", "TRUE", "on", "On", "off", "yes", "y", "Y", "no", "", " 1", "2", "t", "maybe"]


def test_triton_bool_is_read_like_triton(monkeypatch):
    """triton.knobs' env_bool reads through libtriton's getenv_bool: compare with it, value by value."""
    getenv_bool = pytest.importorskip("triton._C.libtriton").getenv_bool
    for raw in TRITON_VALUES:
        monkeypatch.setenv("TRITON_INTERPRET", raw)
        assert envs.TRITON_INTERPRET.get() is getenv_bool("TRITON_INTERPRET", False), raw
    monkeypatch.delenv("TRITON_INTERPRET")
    assert envs.TRITON_INTERPRET.get() is getenv_bool("TRITON_INTERPRET", False) is False


@pytest.mark.parametrize("raw,expected", [("1", True), ("0", False), ("true", False), ("", False), (" 1", False)])
def test_fa4_cache_flag_is_read_like_fa4(monkeypatch, raw, expected):
    """flash_attn/cute/cache_utils.py: os.getenv(..., "0") == "1"."""
    monkeypatch.setenv("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", raw)
    assert envs.FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED.get() is expected


# ---- paths, fallbacks ----------------------------------------------------------------------------


@pytest.mark.parametrize("raw,expected", [("", "~/.cache/sglang-fa4/kernels"), ("  ", "~/.cache/sglang-fa4/kernels"),
                                          ("/data/k", "/data/k")])
def test_an_empty_path_is_unset(monkeypatch, raw, expected):
    monkeypatch.setenv("SGLANG_FA4_KERNEL_CACHE_DIR", raw)
    assert envs.SGLANG_FA4_KERNEL_CACHE_DIR.get() == expected
    assert envs.problems() == [] or all(p.name != "SGLANG_FA4_KERNEL_CACHE_DIR" for p in envs.problems())


def test_fallback_covers_only_the_value_reported(monkeypatch):
    var = envs.SGLANG_FA4_WARMUP
    monkeypatch.setenv(var.name, "maybe")
    try:
        [problem] = [p for p in envs.problems() if p.name == var.name]
        envs.fall_back_to_defaults([problem])
        assert var.get() is True and envs.snapshot()[var.name]["error"] == problem.message
        monkeypatch.setenv(var.name, "0")  # a valid value set later is read as usual
        assert var.get() is False
        monkeypatch.setenv(var.name, "perhaps")  # another malformed one is refused again
        with pytest.raises(EnvValueError, match="perhaps"):
            var.get()
    finally:
        envs.clear_fallbacks()
