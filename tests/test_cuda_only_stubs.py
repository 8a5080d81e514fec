"""benchmark/sglang_on_gpu/cuda_only_stubs.py: the stand-ins that let SGLang's real ViT towers run on
the GPU machine without sgl_kernel / flashinfer. Their ops must compute what sgl_kernel does (checked
here against float64 references on random data), and every other name must fail loudly."""

import importlib
import sys

import pytest
import torch

from benchmark.sglang_on_gpu import cuda_only_stubs  # noqa: E402


@pytest.fixture()
def stubs(monkeypatch):
    """The finder installed for two fake roots (the real names may exist elsewhere)."""
    monkeypatch.setattr(cuda_only_stubs, "ROOTS", ("sglfa4_fake_kernel", "sglfa4_fake_infer"))
    monkeypatch.setitem(cuda_only_stubs.IMPLEMENTED, "sglfa4_fake_kernel", cuda_only_stubs.IMPLEMENTED["sgl_kernel"])
    before = list(sys.meta_path)
    names = cuda_only_stubs.install_missing()
    yield names
    sys.meta_path[:] = before
    for mod in [m for m in sys.modules if m.startswith("sglfa4_fake_")]:
        del sys.modules[mod]


def test_install_missing_skips_installed_packages(monkeypatch):
    monkeypatch.setattr(cuda_only_stubs, "ROOTS", ("torch", "sglfa4_fake_absent"))
    before = list(sys.meta_path)
    try:
        assert cuda_only_stubs.install_missing() == ["sglfa4_fake_absent"]
        assert importlib.import_module("torch").__file__  # the real torch still wins
    finally:
        sys.meta_path[:] = before
        sys.modules.pop("sglfa4_fake_absent", None)


def test_ops_match_references(stubs):
    from sglfa4_fake_kernel import fused_add_rmsnorm, gelu_tanh_and_mul, rmsnorm, silu_and_mul

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(37, 96, generator=gen, dtype=torch.float64)
    w = torch.randn(96, generator=gen, dtype=torch.float64)
    ref = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    assert torch.allclose(rmsnorm(x, w, 1e-6), ref)
    out = torch.full_like(x, float("nan"))
    assert rmsnorm(x, w, 1e-6, out=out) is out and torch.allclose(out, ref)

    # fused: residual += input; input = rmsnorm(residual), both in place (sgl_kernel's contract)
    inp, res = x.clone(), torch.randn(37, 96, generator=gen, dtype=torch.float64)
    want_res = x + res
    want = want_res / torch.sqrt(want_res.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    assert fused_add_rmsnorm(inp, res, w, 1e-6) is None
    assert torch.allclose(res, want_res) and torch.allclose(inp, want)

    g = torch.randn(5, 2 * 48, generator=gen, dtype=torch.float64)
    assert torch.allclose(silu_and_mul(g), torch.nn.functional.silu(g[:, :48]) * g[:, 48:])
    tanh = torch.nn.functional.gelu(g[:, :48], approximate="tanh") * g[:, 48:]
    assert torch.allclose(gelu_tanh_and_mul(g), tanh)


def test_other_names_raise_naming_themselves(stubs):
    assert stubs == ["sglfa4_fake_kernel", "sglfa4_fake_infer"]
    from sglfa4_fake_infer.prefill import cudnn_batch_prefill_with_kv_cache
    from sglfa4_fake_kernel import flash_attn_varlen_func

    for fn, name in ((flash_attn_varlen_func, "sglfa4_fake_kernel.flash_attn_varlen_func"),
                     (cudnn_batch_prefill_with_kv_cache, "sglfa4_fake_infer.prefill.cudnn_batch_prefill_with_kv_cache")):
        with pytest.raises(NotImplementedError, match=name.replace(".", r"\.")):
            fn(1, 2)
    assert "sglfa4_fake_kernel.flash_attn_varlen_func" in cuda_only_stubs.called_missing

    class Sub(flash_attn_varlen_func):  # a stand-in can still be a base class at import time
        pass

    assert Sub.__name__ == "Sub"


def test_submodule_names_the_server_path_needs(stubs, monkeypatch):
    """The server check's path (SGLang's triton attention backend) imports
    sgl_kernel.utils.is_arch_support_pdl: a real answer (capability >= 9.0), not a raising stand-in."""
    monkeypatch.setitem(cuda_only_stubs.IMPLEMENTED, "sglfa4_fake_kernel.utils",
                        cuda_only_stubs.IMPLEMENTED["sgl_kernel.utils"])
    from sglfa4_fake_kernel.utils import is_arch_support_pdl

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for cap, want in (((9, 0), True), ((10, 3), True), ((8, 9), False)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, cap=cap: cap)
        assert is_arch_support_pdl() is want
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert is_arch_support_pdl() is False


def test_gemma_norms_match_references(stubs):
    """Gemma4RMSNorm (scale_shift 1) calls sgl_kernel.gemma_rmsnorm: rmsnorm(x) * (1 + w)."""
    from sglfa4_fake_kernel import gemma_fused_add_rmsnorm, gemma_rmsnorm

    gen = torch.Generator().manual_seed(1)
    x = torch.randn(9, 64, generator=gen, dtype=torch.float64)
    w = torch.randn(64, generator=gen, dtype=torch.float64)
    ref = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + w)
    assert torch.allclose(gemma_rmsnorm(x, w, 1e-6), ref)
    out = torch.empty_like(x)
    assert gemma_rmsnorm(x, w, 1e-6, out=out) is out and torch.allclose(out, ref)
    inp, res = x.clone(), torch.randn(9, 64, generator=gen, dtype=torch.float64)
    want_res = x + res
    want = want_res / torch.sqrt(want_res.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + w)
    assert gemma_fused_add_rmsnorm(inp, res, w, 1e-6) is None
    assert torch.allclose(res, want_res) and torch.allclose(inp, want)


def test_weak_ref_tensor_is_the_tensor(stubs):
    """SGLang's decode graph runner keeps its outputs through sgl_kernel.weak_ref_tensor: the
    stand-in returns the same tensor (same storage), never raises."""
    mod = importlib.import_module("sglfa4_fake_kernel")
    t = torch.arange(6.0).view(2, 3)
    r = mod.weak_ref_tensor(t)
    assert r is t and r.data_ptr() == t.data_ptr()
