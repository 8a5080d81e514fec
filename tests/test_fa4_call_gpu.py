"""GPU: fa4_varlen_attention's direct launch is bitwise FA4's public API, compiles once per
configuration, passes windows and sinks through, and replays in a CUDA graph. Skips without CUDA
or flash_attn.cute (CI is CPU-only). The full sweep and timings: benchmark/release/check_fa4_call.py."""

from __future__ import annotations

import pytest
import torch

from sglang_fa4.kernels import fa4, varlen
from sglang_fa4.testing import cu_seqlens

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

H = 16


@pytest.fixture(scope="module")
def public():
    pytest.importorskip("flash_attn.cute", reason="needs flash-attn-4")
    from flash_attn.cute import flash_attn_varlen_func

    def public(q, k, v, cu, ms, window=(None, None), sinks=None):
        r = flash_attn_varlen_func(
            q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=ms, max_seqlen_k=ms,
            window_size=window, learnable_sink=sinks,
        )
        return r[0] if isinstance(r, tuple) else r

    return public


def rand(total, d, packed=False):
    if packed:
        return torch.randn(total, 3, H, d, dtype=torch.bfloat16, device="cuda").unbind(1)
    return tuple(torch.randn(total, H, d, dtype=torch.bfloat16, device="cuda") for _ in range(3))


@pytest.mark.parametrize("d", [64, 80])
def test_bitwise_and_one_compile_per_configuration(public, d):
    start = fa4.kernel_cache().compile_count()
    for lens, packed in (([1024], False), ([196, 784, 400, 64], True), ([100, 50, 64], False)):
        q, k, v = rand(sum(lens), d, packed)
        cu = cu_seqlens(lens, device="cuda")
        out = torch.full((sum(lens), H, d), float("nan"), dtype=torch.bfloat16, device="cuda")
        ours = varlen.fa4_varlen_attention(q, k, v, cu, max(lens), out=out)
        assert ours is out and not torch.isnan(out).any()
        assert torch.equal(ours, public(q, k, v, cu, max(lens)))
    # another max_seqlen / layout of the same configuration compiled nothing new
    assert fa4.kernel_cache().compile_count() - start <= 1


def test_many_segments(public):
    """> 256 segments: its own configuration (FA4's scheduler aids), resolved by THIS call (a
    fresh kernel cache, so no earlier test's configuration can satisfy the check), then launched
    directly, bitwise FA4's public API both times."""
    from sglang_fa4.kernels.fa4.b36 import MANY_SEGMENTS, FA4Backend
    from sglang_fa4.kernels.fa4.cache import KernelCache

    lens = [int(x) for x in torch.randint(1, 40, (MANY_SEGMENTS + 44,))]
    lens[0] = 100  # a segment over 64 tokens: FA4's route, not the short-window kernel (never bitwise FA4)
    q, k, v = rand(sum(lens), 80)
    cu = cu_seqlens(lens, device="cuda")
    previous = fa4.install_kernel_cache(KernelCache(FA4Backend()))
    try:
        for _ in range(2):  # resolve, then the direct launch with the recomputed scheduler aids
            assert torch.equal(varlen.fa4_varlen_attention(q, k, v, cu, max(lens)), public(q, k, v, cu, max(lens)))
        (config,) = fa4.kernel_cache().configs_seen()
        assert config.many_segments and config.head_dim == 80
    finally:
        fa4.install_kernel_cache(previous)


def test_window_and_sinks(public):
    lens = [196, 784, 400, 64]
    q, k, v = rand(sum(lens), 64)
    cu = cu_seqlens(lens, device="cuda")
    sinks = torch.randn(H, device="cuda") * 2 + 3
    ours = varlen.fa4_varlen_attention(q, k, v, cu, 784, window_size=(64, 64), sinks=sinks)
    assert torch.equal(ours, public(q, k, v, cu, 784, window=(64, 64), sinks=sinks))
    assert not torch.equal(ours, public(q, k, v, cu, 784))  # window + sinks were not dropped
    n = fa4.kernel_cache().compile_count()
    ours2 = varlen.fa4_varlen_attention(q, k, v, cu, 784, window_size=(32, 16), sinks=sinks)
    assert fa4.kernel_cache().compile_count() == n  # window sizes are runtime values
    assert torch.equal(ours2, public(q, k, v, cu, 784, window=(32, 16), sinks=sinks))
    # SGLang's (-1, -1) means no window
    assert torch.equal(
        varlen.fa4_varlen_attention(q, k, v, cu, 784, window_size=(-1, -1)), public(q, k, v, cu, 784)
    )


def test_cuda_graph_capture_and_replay(public):
    lens = [196, 784, 400, 64]
    q, k, v = rand(sum(lens), 80)
    cu = cu_seqlens(lens, device="cuda")
    out = torch.empty_like(q)
    with torch.inference_mode():
        varlen.fa4_varlen_attention(q, k, v, cu, 784, out=out)  # resolve outside the capture
        n = fa4.kernel_cache().compile_count()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            varlen.fa4_varlen_attention(q, k, v, cu, 784, out=out)
    for t in (q, k, v):
        t.copy_(torch.randn_like(t))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, public(q, k, v, cu, 784))
    assert fa4.kernel_cache().compile_count() == n
