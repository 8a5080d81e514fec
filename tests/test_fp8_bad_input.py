"""Bad input at the FP8 forward's entry (``fp8_sm90.fp8_varlen_attention``), and E4M3 tensors at the
ViT form's (``varlen.fa4_varlen_attention``, 16-bit only): each mistake raises an error that names
it, before anything touches a GPU.  CPU tensors; the SM90 device check is tested on its own with the
capability query replaced, and switched off where a test must reach the checks behind it."""

from __future__ import annotations

import pytest
import torch

from sglang_fa4.kernels import fp8_sm90, varlen
from sglang_fa4.kernels.inputs import FA4InputError
from sglang_fa4.kernels.fp8_sm90 import launch
from sglang_fa4.kernels.fp8_sm90.launch import Fp8AttentionError, check_device, resolve_descale
from sglang_fa4.testing import cu_seqlens

FP8 = torch.float8_e4m3fn


def fp8(*shape):
    return torch.zeros(*shape).to(FP8)


@pytest.fixture
def past_device_check(monkeypatch):
    """CPU tensors reach the checks that follow the device check (a fresh signature cache, so
    nothing checked here is remembered as valid by later tests)."""
    monkeypatch.setattr(launch, "check_device", lambda device: None)
    monkeypatch.setattr(launch, "_checked", {})
    monkeypatch.setattr(launch, "compiled_kernel", lambda variant: pytest.fail("reached the kernel"))


# ---- through the public functions ---------------------------------------------------------------


def fp8_call(q, k, v, cu, max_seqlen, **kw):
    return fp8_sm90.fp8_varlen_attention(q, k, v, cu, cu, max_seqlen, max_seqlen, **kw)


def test_fp8_q_with_bf16_k_or_v_names_the_tensor():
    q, kv = fp8(16, 4, 128), fp8(16, 4, 128)
    with pytest.raises(Fp8AttentionError, match=r"k must be torch.float8_e4m3fn, got torch.bfloat16"):
        fp8_call(q, kv.to(torch.bfloat16), kv, cu_seqlens([16]), 16)
    with pytest.raises(Fp8AttentionError, match=r"v must be torch.float8_e4m3fn, got torch.float16"):
        fp8_call(q, kv, kv.to(torch.float16), cu_seqlens([16]), 16)


def test_e4m3_tensors_at_the_vit_form_name_the_fp8_forms():
    """The ViT form takes 16-bit q/k/v only: E4M3 ones (all, or mixed with bf16) are refused with the
    FP8 forms' names, never sent to FA4; an FP8-only argument is not one it has."""
    q = torch.zeros(16, 4, 128, dtype=torch.bfloat16)
    for args in ((q, fp8(16, 4, 128), q), (q, q, fp8(16, 4, 128)), (fp8(16, 4, 128),) * 3):
        with pytest.raises(FA4InputError, match="must all be bfloat16 or all float16.*fp8_sm90.fp8_varlen_attention"):
            varlen.fa4_varlen_attention(*args, cu_seqlens([16]), 16)
    with pytest.raises(TypeError, match="k_descale"):
        varlen.fa4_varlen_attention(q, q, q, cu_seqlens([16]), 16, k_descale=torch.ones(1, 4))


@pytest.mark.parametrize("d", [32, 80, 160, 512])
def test_head_dims_outside_the_kernels(d):
    q = fp8(16, 4, d)
    with pytest.raises(Fp8AttentionError, match=rf"head dim {d} is not supported .*\(64, 96, 128, 192, 256\)"):
        fp8_call(q, q, q, cu_seqlens([16]), 16)


@pytest.mark.parametrize("dtype", [torch.int64, torch.float32])
def test_non_int32_cu_seqlens(dtype):
    q = fp8(16, 4, 128)
    with pytest.raises(Fp8AttentionError, match=f"cu_seqlens_q must be int32, got {dtype}"):
        fp8_call(q, q, q, cu_seqlens([16], dtype=dtype), 16)


@pytest.mark.parametrize(
    "out,match",
    [
        (torch.zeros(16, 4, 128, dtype=torch.float16), "out must be bfloat16, got torch.float16"),
        (torch.zeros(16, 4, 64, dtype=torch.bfloat16), r"out must have shape \(16, 4, 128\), got \(16, 4, 64\)"),
        (torch.zeros(8, 4, 128, dtype=torch.bfloat16), r"out must have shape \(16, 4, 128\), got \(8, 4, 128\)"),
        (torch.zeros(16, 4, 128, dtype=torch.bfloat16, device="meta"), "all tensors must be on one device"),
    ],
)
def test_out_of_the_wrong_shape_dtype_or_device(out, match):
    q = fp8(16, 4, 128)
    with pytest.raises(Fp8AttentionError, match=match):
        fp8_call(q, q, q, cu_seqlens([16]), 16, out=out)


def test_only_some_descales_given(past_device_check):
    q = fp8(16, 4, 128)
    with pytest.raises(Fp8AttentionError, match=r"go together \(got only q_descale, k_descale\)"):
        fp8_call(q, q, q, cu_seqlens([16]), 16, q_descale=torch.ones(1, 4), k_descale=torch.ones(1, 4))
    with pytest.raises(Fp8AttentionError, match=r"go together \(got only v_descale\)"):
        fp8_call(q, q, q, cu_seqlens([16]), 16, v_descale=0.5)


def test_descale_of_the_wrong_shape_or_dtype_through_the_entry(past_device_check):
    q = fp8(16, 4, 128)
    ones = torch.ones(1, 4)
    with pytest.raises(Fp8AttentionError, match=r"k_descale must be a scalar or \(batch, num_kv_heads\) = \(1, 4\)"):
        fp8_call(q, q, q, cu_seqlens([16]), 16, q_descale=ones, k_descale=torch.ones(4, 1), v_descale=ones)
    with pytest.raises(Fp8AttentionError, match="v_descale must be float32, got torch.bfloat16"):
        fp8_call(q, q, q, cu_seqlens([16]), 16, q_descale=ones, k_descale=ones,
                                      v_descale=ones.to(torch.bfloat16))


# ---- the descale and device checks on their own -------------------------------------------------


def test_resolve_descale():
    ok = torch.ones(3, 2, 4)
    assert resolve_descale(ok, None, None, None, 2, 4, "cpu") is ok
    assert torch.equal(resolve_descale(None, None, None, None, 2, 4, "cpu"), torch.ones(3, 2, 4))
    assert resolve_descale(None, 2.0, 3.0, torch.ones(2, 4), 2, 4, "cpu").shape == (3, 2, 4)
    with pytest.raises(Fp8AttentionError, match=r"descale must be float32 \(3, batch, Hkv\) = \(3, 2, 4\), got torch.float32 \(3, 4, 2\)"):
        resolve_descale(torch.ones(3, 4, 2), None, None, None, 2, 4, "cpu")
    with pytest.raises(Fp8AttentionError, match="got torch.float16"):
        resolve_descale(ok.half(), None, None, None, 2, 4, "cpu")
    with pytest.raises(Fp8AttentionError, match="not both .*got descale and q_descale"):
        resolve_descale(ok, torch.ones(2, 4), None, None, 2, 4, "cpu")
    with pytest.raises(Fp8AttentionError, match="descale must be a torch.Tensor, got list"):
        resolve_descale([1.0], None, None, None, 2, 4, "cpu")
    with pytest.raises(Fp8AttentionError, match="descale must be on meta, got cpu"):
        resolve_descale(ok, None, None, None, 2, 4, torch.device("meta"))
    with pytest.raises(Fp8AttentionError, match="q_descale must be on meta, got cpu"):
        resolve_descale(None, torch.ones(2, 4), 1.0, 1.0, 2, 4, torch.device("meta"))
    with pytest.raises(Fp8AttentionError, match="descale must be contiguous"):
        resolve_descale(torch.ones(3, 4, 2).transpose(1, 2), None, None, None, 2, 4, "cpu")


@pytest.mark.parametrize("cap,name", [((10, 0), "sm_100"), ((8, 0), "sm_80"), ((12, 0), "sm_120")])
def test_non_sm90_device(monkeypatch, cap, name):
    asked = []
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: asked.append(index) or cap)
    with pytest.raises(Fp8AttentionError, match=f"built for SM90 \\(Hopper\\); cuda:1 is {name}"):
        check_device(torch.device("cuda", 1))
    assert asked == [1]


def test_sm90_device_passes_and_cpu_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (9, 0))
    check_device(torch.device("cuda", 0))
    with pytest.raises(Fp8AttentionError, match="needs CUDA tensors, got cpu"):
        check_device(torch.device("cpu"))
    q = fp8(16, 4, 128)
    with pytest.raises(Fp8AttentionError, match="needs CUDA tensors"):  # the entry point runs it
        fp8_call(q, q, q, cu_seqlens([16]), 16)
