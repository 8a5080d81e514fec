import pytest

from sglang_fa4.environ import envs
from sglang_fa4.selection import BackendSelectionError, parse_capability, select_mm_attention_backend


@pytest.mark.parametrize(
    "cap,backend",
    [((9, 0), "fa3"), ((10, 0), "fa4"), ((10, 3), "fa4"), ((12, 0), "triton_attn"), ((12, 1), "triton_attn"),
     ((8, 0), "triton_attn"), ((8, 9), "triton_attn"), ((11, 0), "triton_attn")],
)
def test_platform_default_table(monkeypatch, cap, backend):
    monkeypatch.delenv("SGLANG_FA4_MM_ATTENTION_BACKEND_DEFAULT", raising=False)
    choice = select_mm_attention_backend(None, None, cap)
    assert choice.backend == backend
    assert choice.source == "table"
    assert f"{cap[0]}.{cap[1]}" in choice.reason


def test_priority_server_arg_then_model_then_default():
    assert select_mm_attention_backend("sdpa", "triton_attn", (10, 3)).backend == "sdpa"
    assert select_mm_attention_backend("sdpa", "triton_attn", (10, 3)).source == "server_arg"
    model = select_mm_attention_backend(None, "triton_attn", (10, 3))
    assert (model.backend, model.source) == ("triton_attn", "model")


def test_env_override_replaces_only_the_default(monkeypatch):
    monkeypatch.setenv("SGLANG_FA4_MM_ATTENTION_BACKEND_DEFAULT", "triton_attn")
    choice = select_mm_attention_backend(None, None, (10, 0))
    assert (choice.backend, choice.source) == ("triton_attn", "env_override")
    assert "SGLANG_FA4_MM_ATTENTION_BACKEND_DEFAULT" in choice.reason
    assert select_mm_attention_backend(None, "fa4", (10, 0)).backend == "fa4"


@pytest.mark.parametrize("cap", [(10, 0), (10, 3), (12, 0)])
def test_fa3_on_blackwell_is_an_error(cap):
    with pytest.raises(BackendSelectionError, match="fa3.*Blackwell"):
        select_mm_attention_backend("fa3", None, cap)
    with pytest.raises(BackendSelectionError):
        select_mm_attention_backend(None, "fa3", cap)


def test_fa3_env_override_on_blackwell_is_an_error(monkeypatch):
    monkeypatch.setenv("SGLANG_FA4_MM_ATTENTION_BACKEND_DEFAULT", "fa3")
    with pytest.raises(BackendSelectionError, match="SGLANG_FA4_MM_ATTENTION_BACKEND_DEFAULT"):
        select_mm_attention_backend(None, None, (10, 0))
    assert select_mm_attention_backend(None, None, (9, 0)).backend == "fa3"


def test_non_cuda_platform_defers_to_sglang():
    choice = select_mm_attention_backend(None, None, None, platform="hip")
    assert choice.backend is None and choice.source == "upstream"
    assert select_mm_attention_backend("sdpa", None, None, platform="hip").backend == "sdpa"


def test_cuda_without_capability_is_an_error():
    with pytest.raises(ValueError, match="compute capability"):
        select_mm_attention_backend(None, None, None)


def test_table_is_read_from_environ_yaml():
    table = envs.mm_attention_backend_defaults
    assert table["10.3"] == "fa4" and table["9.0"] == "fa3" and table["default"] == "triton_attn"


@pytest.mark.parametrize("text", ["10", "ten.three", "10.3.1", ""])
def test_parse_capability_rejects(text):
    with pytest.raises(ValueError, match="MAJOR.MINOR"):
        parse_capability(text)


def test_parse_capability():
    assert parse_capability("10.3") == (10, 3)
