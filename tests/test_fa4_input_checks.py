"""Host-side input checks run first, on any device: each malformed argument is one FA4InputError
naming it, on every route (FA4's cached launch, the short-window Triton kernel, FA2, the SM90 FP8
forward), raised before the GPU is asked what it is -- so all of it runs on a CPU."""

from __future__ import annotations

import pytest
import torch

from sglang_fa4.kernels import fp8_sm90
from sglang_fa4.kernels.vit import short_windows as short_segments
from sglang_fa4.kernels.inputs import FA4InputError
from sglang_fa4.kernels.fa4.cache import KernelCache

FP8 = torch.float8_e4m3fn


class NoGpuBackend:
    """A backend whose architecture query fails the test: the checks must come before it."""

    requires_cuda = False  # (a real backend's True: the CUDA requirement, also a host check)

    def arch(self) -> int:
        raise AssertionError("the GPU architecture was asked before the host checks")


def _fa4(q, k, v, cu, max_seqlen, softmax_scale):
    return KernelCache(NoGpuBackend())(q, k, v, cu, max_seqlen, softmax_scale, (None, None), None, None)


def _short_window(q, k, v, cu, max_seqlen, softmax_scale):
    return short_segments.short_attention(q, k, v, cu, max_seqlen, softmax_scale)


def _fp8(q, k, v, cu, max_seqlen, softmax_scale):
    q, k, v = (t.to(FP8) if t.dtype is torch.bfloat16 else t for t in (q, k, v))
    return fp8_sm90.fp8_varlen_attention(q, k, v, cu, cu, max_seqlen, max_seqlen, softmax_scale=softmax_scale)


# (route, its call, a head dim it takes): the short-window call runs the Triton kernel at d=72 and
# FA2 at d=96; both take the same checks before choosing
ROUTES = {"fa4": (_fa4, 64), "short_window": (_short_window, 72), "fa2": (_short_window, 96), "fp8": (_fp8, 64)}


def inputs(d, heads=2, tokens=16, segments=2):
    q = torch.randn(tokens, heads, d).bfloat16()
    cu = torch.tensor([0, tokens // 2, tokens][: segments + 1], dtype=torch.int32)
    return q, q.clone(), q.clone(), cu


@pytest.mark.parametrize("route", sorted(ROUTES))
@pytest.mark.parametrize("case, match", [
    ("max_seqlen_zero", "max_seqlen must be > 0"),
    ("max_seqlen_negative", "max_seqlen must be > 0"),
    ("max_seqlen_tensor", "max_seqlen must be a host int"),
    ("max_seqlen_float", "max_seqlen must be an int"),
    ("cu_seqlens_one_entry", "cu_seqlens"),
    ("zero_heads", "q heads \\(0\\)"),
    ("head_dim", "head.dim"),
    ("devices", "device"),
    ("softmax_scale_str", "softmax_scale must be a real number"),
    ("softmax_scale_bool", "softmax_scale must be a real number"),
])
def test_each_check_on_each_route(route, case, match):
    call, d = ROUTES[route]
    q, k, v, cu = inputs(d)
    max_seqlen, scale = 8, None
    if case == "max_seqlen_zero":
        max_seqlen = 0
    elif case == "max_seqlen_negative":
        max_seqlen = -3
    elif case == "max_seqlen_tensor":
        max_seqlen = torch.tensor(8)
    elif case == "max_seqlen_float":
        max_seqlen = 8.0
    elif case == "cu_seqlens_one_entry":
        cu = cu[:1]
    elif case == "zero_heads":
        q = q[:, :0]
    elif case == "head_dim":  # FA4 / FA2 / Triton: multiples of 8 up to 256; FP8: 64/96/128/192/256
        q, k, v, cu = inputs(80 if route == "fp8" else 12)
    elif case == "devices":
        k = torch.empty(k.shape, dtype=k.dtype, device="meta")
    elif case == "softmax_scale_str":
        scale = "0.1"
    elif case == "softmax_scale_bool":
        scale = True
    with pytest.raises(FA4InputError, match=match):
        call(q, k, v, cu, max_seqlen, scale)


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_a_well_formed_call_passes_the_host_checks(route):
    """The same call without the fault gets past every host check (to the CUDA requirement, or
    the GPU query: this machine has no GPU)."""
    call, d = ROUTES[route]
    q, k, v, cu = inputs(d)
    with pytest.raises((FA4InputError, AssertionError)) as err:
        call(q, k, v, cu, 8, 0.125)
    assert "CUDA" in str(err.value) or "architecture was asked" in str(err.value)


def test_max_seqlen_zero_only_without_tokens():
    from sglang_fa4.kernels.inputs import check_scalars

    check_scalars(0, None, torch.empty(0, 2, 64))  # an empty call: FA4's own early exit
    with pytest.raises(FA4InputError, match="max_seqlen must be > 0"):
        check_scalars(0, None, torch.empty(1, 2, 64))
    with pytest.raises(FA4InputError, match="max_seqlen must be > 0"):
        check_scalars(-1, None, torch.empty(0, 2, 64))
    check_scalars(1, 0.5)
    check_scalars(None, None)


def test_head_dims_at_the_bounds():
    from sglang_fa4.kernels.inputs import check_tensors

    for d in (8, 256, 136):
        check_tensors(*inputs(d), require_cuda=False)
    for d in (0, 4, 264, 100):
        with pytest.raises(FA4InputError, match="head_dim"):
            check_tensors(*inputs(d), require_cuda=False)
