"""Each host-side input check of sglang_fa4/kernels/inputs.py on its own: one valid call, then one
field broken at a time, each refused with the message that names it (so a check that is dropped,
or reads the wrong tensor, shows up as a pass or as another check's message)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from sglang_fa4.kernels.inputs import FA4InputError
from sglang_fa4.kernels.inputs import check_out_shape, check_tensors


@dataclass
class Fake:
    """Shape, dtype and device facts only (the checks read nothing else): lets a CPU test say
    "this one tensor is not on CUDA"."""

    shape: tuple
    dtype: torch.dtype = torch.bfloat16
    is_cuda: bool = True
    device_index: int = 0

    def dim(self) -> int:
        return len(self.shape)

    def get_device(self) -> int:
        return self.device_index if self.is_cuda else -1  # as torch: -1 for a CPU tensor

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", self.device_index) if self.is_cuda else torch.device("cpu")


def good(**change):
    """q (10, 8, 64), k/v (12, 2, 64) bf16 and cu_seqlens (3,) int32, all on CUDA, with ``change``."""
    t = {"q": Fake((10, 8, 64)), "k": Fake((12, 2, 64)), "v": Fake((12, 2, 64)),
         "cu": Fake((3,), torch.int32)}
    for name, value in change.items():
        t[name] = value
    return t["q"], t["k"], t["v"], t["cu"]


def test_a_valid_call_passes_and_reports_its_shape():
    assert check_tensors(*good(), require_cuda=True) == (10, 8, 64, 12, 2, 64, torch.bfloat16)
    v = Fake((12, 2, 32))  # v's head dim may differ from q's
    assert check_tensors(*good(v=v), require_cuda=True)[5] == 32
    half = {n: Fake(t.shape, torch.float16) for n, t in zip("qkv", good()[:3])}
    assert check_tensors(*good(**half), require_cuda=True)[6] == torch.float16


@pytest.mark.parametrize("change,message", [
    (dict(q=Fake((10, 8))), r"must be \(total_tokens, heads, head_dim\)"),
    (dict(k=Fake((12, 2, 64, 1))), r"must be \(total_tokens, heads, head_dim\)"),
    (dict(v=Fake((12, 128))), r"must be \(total_tokens, heads, head_dim\)"),
    (dict(cu=[0, 5, 10]), r"must be \(total_tokens, heads, head_dim\)"),
    (dict(q=Fake((10, 8, 64), torch.float32)), "must all be bfloat16 or all float16; got torch.float32, torch.bfloat16, torch.bfloat16"),
    (dict(k=Fake((12, 2, 64), torch.float16)), "got torch.bfloat16, torch.float16, torch.bfloat16"),
    (dict(v=Fake((12, 2, 64), torch.float16)), "got torch.bfloat16, torch.bfloat16, torch.float16"),
    (dict(v=Fake((11, 2, 64))), "must share tokens and heads"),
    (dict(v=Fake((12, 4, 64))), "must share tokens and heads"),
    (dict(k=Fake((12, 2, 80))), "must have q's head_dim 64"),
    (dict(k=Fake((12, 3, 64)), v=Fake((12, 3, 64))), r"q heads \(8\) must be a multiple of k/v heads \(3\)"),
    (dict(k=Fake((12, 0, 64)), v=Fake((12, 0, 64))), r"multiple of k/v heads \(0\)"),
    (dict(cu=Fake((3,), torch.int64)), "cu_seqlens must be a 1-D int32"),
    (dict(cu=Fake((3, 1), torch.int32)), "cu_seqlens must be a 1-D int32"),
    (dict(q=Fake((10, 8, 64), is_cuda=False)), "must be on one device"),
    (dict(k=Fake((12, 2, 64), is_cuda=False)), "must be on one device"),
    (dict(v=Fake((12, 2, 64), is_cuda=False)), "must be on one device"),
    (dict(cu=Fake((3,), torch.int32, is_cuda=False)), "must be on one device"),
    (dict(q=Fake((10, 8, 64), device_index=1)), "must be on one device"),
    ({n: Fake(t.shape, t.dtype, is_cuda=False) for n, t in zip(("q", "k", "v", "cu"), good())}, "must be CUDA tensors"),
], ids=lambda x: str(x)[:48])
def test_each_tensor_check_on_its_own(change, message):
    with pytest.raises(FA4InputError, match=message):
        check_tensors(*good(**change), require_cuda=True)


def test_cpu_tensors_pass_where_no_device_is_required():
    q, k, v, cu = (Fake(t.shape, t.dtype, is_cuda=False) for t in good())
    assert check_tensors(q, k, v, cu, require_cuda=False)[0] == 10


def on_device(t: torch.Tensor, index: int) -> torch.Tensor:
    """``t`` as if on CUDA device ``index`` for get_device() (a CPU test has no second device)."""
    t.get_device = lambda: index
    return t


def test_out_checks_each_on_its_own():
    q = torch.empty(10, 8, 64, dtype=torch.bfloat16)
    check_out_shape(torch.empty(10, 8, 32, dtype=torch.bfloat16), 10, 8, 32, torch.bfloat16, q)
    for out, message in (
        ("buffer", "out must be a torch tensor"),
        (torch.empty(9, 8, 32, dtype=torch.bfloat16), r"out must be \(10, 8, 32\) torch.bfloat16, got \(9, 8, 32\)"),
        (torch.empty(10, 4, 32, dtype=torch.bfloat16), r"got \(10, 4, 32\)"),
        (torch.empty(10, 8, 64, dtype=torch.bfloat16), r"got \(10, 8, 64\)"),
        (torch.empty(10, 8, 32, dtype=torch.float16), "got \\(10, 8, 32\\) torch.float16"),
        (on_device(torch.empty(10, 8, 32, dtype=torch.bfloat16), 1), "out is on"),
    ):
        with pytest.raises(FA4InputError, match=message):
            check_out_shape(out, 10, 8, 32, torch.bfloat16, q)
