"""Routing of short-segment layouts (ViT windows) away from FA4 on SM90."""

import pytest
import torch

from sglang_fa4 import short_segments


class FakeQ:
    def __init__(self, d=80, cuda=True):
        self.shape = (100, 16, d)
        self.is_cuda = cuda


@pytest.fixture(autouse=True)
def fresh_threshold():
    short_segments.route_max_seqlen.cache_clear()
    yield
    short_segments.route_max_seqlen.cache_clear()


def route(arch=90, q=None, max_seqlen=64, window=(None, None), sinks=None):
    return short_segments.should_route(arch, q or FakeQ(), max_seqlen, window, sinks)


def test_routes_short_windows_on_sm90():
    assert route()
    assert route(max_seqlen=1)
    assert route(window=(-1, -1))  # SGLang's "no window"


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(max_seqlen=65),  # longer than the default limit: FA4 is faster there
        dict(max_seqlen=None),
        dict(arch=100),  # not measured on Blackwell
        dict(arch=103),
        dict(sinks=object()),  # FA2 has no sinks
        dict(window=(64, 64)),
        dict(window=(None, 0)),  # causal
        dict(q=FakeQ(cuda=False)),
        dict(q=FakeQ(d=300)),
        dict(q=FakeQ(d=76)),
    ],
)
def test_stays_on_fa4(kwargs):
    assert not route(**kwargs)


def test_threshold_from_env(monkeypatch):
    monkeypatch.setenv("SGLANG_FA4_SHORT_SEQLEN_ROUTE_MAX", "128")
    assert route(max_seqlen=128) and not route(max_seqlen=129)
    short_segments.route_max_seqlen.cache_clear()
    monkeypatch.setenv("SGLANG_FA4_SHORT_SEQLEN_ROUTE_MAX", "0")
    assert not route(max_seqlen=8)


def test_cpu_tensors_never_reach_the_fa2_op(monkeypatch):
    """fa4_call on CPU inputs goes to the kernel cache, never to the CUDA-only FA2 op."""
    from sglang_fa4 import fa4_call

    seen = []

    class Cache:
        arch = 90

        def __call__(self, q, *args):
            seen.append(q.shape)
            return q

    monkeypatch.setattr(fa4_call, "_cache", Cache())
    monkeypatch.setattr(short_segments, "fa2_varlen_attention", lambda *a, **k: pytest.fail("routed a CPU call"))
    q = torch.randn(8, 2, 16)
    fa4_call.fa4_varlen_attention(q, q, q, torch.tensor([0, 8], dtype=torch.int32), 8)
    assert seen == [q.shape]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fa2_route_matches_fp32_reference():
    torch.manual_seed(0)
    seqlens = [64] * 30 + [16, 48, 32]
    cu = torch.tensor([0] + list(torch.tensor(seqlens).cumsum(0)), dtype=torch.int32, device="cuda")
    q, k, v = (torch.randn(sum(seqlens), 16, 80, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = torch.full_like(q, float("nan"))
    short_segments.fa2_varlen_attention(q, k, v, cu, 64, None, out=out)
    ref = torch.cat([
        torch.nn.functional.scaled_dot_product_attention(
            *(t[a:b].float().transpose(0, 1) for t in (q, k, v))).transpose(0, 1)
        for a, b in zip(cu[:-1].tolist(), cu[1:].tolist())
    ])
    err = ((out.float() - ref).norm() / ref.norm()).item()
    assert torch.isfinite(out).all() and err < 1e-2
