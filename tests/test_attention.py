"""VisionFlash4Attention semantics with the FA4 call replaced by a recording fake."""

import pytest
import torch

from sglang_fa4.integration import vision_fa4
from sglang_fa4.kernels.inputs import window_bounds
from sglang_fa4.kernels import varlen
from sglang_fa4.integration.vision_fa4 import SeqlensError, resolve_seqlens, vision_fa4_forward

H, D = 4, 16


class RecordingFA4:
    def __init__(self):
        self.calls = []

    def __call__(self, q, k, v, cu_seqlens, max_seqlen, *, softmax_scale=None, window_size=(None, None), sinks=None, out=None):
        self.calls.append(dict(q=q, k=k, v=v, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen,
                               softmax_scale=softmax_scale, window_size=window_size, sinks=sinks))
        return torch.full_like(q, 7.0)


@pytest.fixture
def fake(monkeypatch):
    rec = RecordingFA4()
    monkeypatch.setattr(varlen, "fa4_varlen_attention", rec)
    return rec


def qkv(tokens):
    g = torch.Generator().manual_seed(tokens)
    return [torch.randn(tokens, H, D, generator=g, dtype=torch.bfloat16) for _ in range(3)]


@pytest.mark.parametrize("graph_env", ["0", "1"])
def test_list_form(fake, monkeypatch, graph_env):
    monkeypatch.setenv("SGLANG_VIT_ENABLE_CUDA_GRAPH", graph_env)
    q, k, v = qkv(10)
    cu = torch.tensor([0, 3, 10], dtype=torch.int32)
    out = vision_fa4_forward(q, k, v, [cu, 7], bsz=1, seq_len=10, softmax_scale=0.25)
    call = fake.calls[-1]
    assert call["q"] is q and call["k"] is k and call["v"] is v  # untouched
    assert call["cu_seqlens"] is cu and call["max_seqlen"] == 7 and type(call["max_seqlen"]) is int
    assert call["softmax_scale"] == 0.25
    assert torch.equal(out, torch.full_like(q, 7.0))


@pytest.mark.parametrize("graph_env", ["0", "1"])
def test_tensor_form_ignores_graph_env(fake, monkeypatch, graph_env):
    monkeypatch.setenv("SGLANG_VIT_ENABLE_CUDA_GRAPH", graph_env)
    q, k, v = qkv(12)
    cu64 = torch.tensor([0, 5, 12], dtype=torch.int64)
    vision_fa4_forward(q, k, v, cu64, bsz=1, seq_len=12)
    call = fake.calls[-1]
    assert call["cu_seqlens"].dtype == torch.int32
    assert call["cu_seqlens"].device == q.device
    assert call["cu_seqlens"].tolist() == [0, 5, 12]
    assert call["max_seqlen"] == 7 and type(call["max_seqlen"]) is int


def test_none_means_uniform_segments(fake):
    q, k, v = qkv(12)
    vision_fa4_forward(q, k, v, None, bsz=3, seq_len=4)
    assert fake.calls[-1]["cu_seqlens"].tolist() == [0, 4, 8, 12]
    assert fake.calls[-1]["max_seqlen"] == 4


def test_sglang_resolver_is_used_for_tensor_forms(fake):
    q, k, v = qkv(8)
    seen = []

    def resolver(cu, bsz, seq_len, *, device):
        seen.append((cu, bsz, seq_len, device))
        return torch.tensor([0, 8], dtype=torch.int32)

    marker = object()
    vision_fa4_forward(q, k, v, marker, bsz=1, seq_len=8, resolve_tensor=resolver)
    assert seen == [(marker, 1, 8, q.device)]
    assert fake.calls[-1]["max_seqlen"] == 8


def test_forward_metadata_wins(fake):
    q, k, v = qkv(6)

    class Meta:
        cu_seqlens = torch.tensor([0, 6], dtype=torch.int32)
        max_seqlen = 6

    vision_fa4_forward(q, k, v, [torch.tensor([0, 1, 6], dtype=torch.int32), 5], bsz=1, seq_len=6, forward_metadata=Meta)
    assert fake.calls[-1]["cu_seqlens"] is Meta.cu_seqlens and fake.calls[-1]["max_seqlen"] == 6


def test_precomputed_max_seqlen_kwarg_is_used(fake):
    q, k, v = qkv(9)
    vision_fa4_forward(q, k, v, torch.tensor([0, 4, 9], dtype=torch.int32), bsz=1, seq_len=9, max_seqlen=5)
    assert fake.calls[-1]["max_seqlen"] == 5


def test_window_and_sinks_reach_fa4(fake):
    q, k, v = qkv(8)
    sinks = torch.randn(H)
    cu = torch.tensor([0, 8], dtype=torch.int32)
    vision_fa4_forward(q, k, v, cu, bsz=1, seq_len=8, window_size=(64, 64), s_aux=sinks)
    assert fake.calls[-1]["window_size"] == (64, 64) and fake.calls[-1]["sinks"] is sinks
    vision_fa4_forward(q, k, v, cu, bsz=1, seq_len=8, window_size=(-1, -1), s_aux=None)
    assert fake.calls[-1]["window_size"] == (None, None) and fake.calls[-1]["sinks"] is None


@pytest.mark.parametrize(
    "arg,message",
    [
        (lambda cu: [cu], "expected 2 elements, got 1"),
        (lambda cu: [cu, cu, 8], "triton_attn runner layout"),
        (lambda cu: [cu.to(torch.int64), 8], "must be int32"),
        (lambda cu: [cu, torch.tensor(8)], "max_seqlen must be a Python int"),
        (lambda cu: [cu, 8.0], "max_seqlen must be a Python int"),
        (lambda cu: [cu, True], "max_seqlen must be a Python int"),
        (lambda cu: [cu, 0], "must be positive"),
        (lambda cu: [cu.tolist(), 8], "must be a torch.Tensor"),
        (lambda cu: [torch.zeros(2, 2, dtype=torch.int32), 8], "1-D"),
    ],
)
def test_bad_list_form_is_a_clear_error(fake, arg, message):
    q, k, v = qkv(8)
    cu = torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(SeqlensError, match=message):
        vision_fa4_forward(q, k, v, arg(cu), bsz=1, seq_len=8)
    assert not fake.calls


def test_list_form_on_another_device_is_an_error():
    q = torch.randn(8, H, D, device="meta")
    with pytest.raises(SeqlensError, match="is on cpu but q is on meta"):
        resolve_seqlens(q, [torch.tensor([0, 8], dtype=torch.int32), 8], 1, 8)


def test_token_count_disagreeing_with_cu_seqlens(fake):
    q, k, v = qkv(8)
    with pytest.raises(SeqlensError, match="ends at 9 tokens but q has 8 rows"):
        vision_fa4_forward(q, k, v, torch.tensor([0, 4, 9], dtype=torch.int32), bsz=1, seq_len=8)
    with pytest.raises(SeqlensError, match="integer tensor"):
        vision_fa4_forward(q, k, v, torch.tensor([0.0, 8.0]), bsz=1, seq_len=8)
    assert not fake.calls


def test_fa4_window():
    assert window_bounds(None) == (None, None)
    assert window_bounds((-1, -1)) == (None, None)
    assert window_bounds((64, 0)) == (64, 0)
    assert window_bounds((-1, 32)) == (None, 32)
