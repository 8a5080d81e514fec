"""Routing of short-segment layouts (ViT windows) away from FA4 on SM90."""

import pytest
import torch

from sglang_fa4.kernels import settings
from sglang_fa4.kernels.vit import short_windows as short_segments
from sglang_fa4.testing import attention_fp32, cu_seqlens, rel_err


class FakeQ:
    def __init__(self, d=80, cuda=True):
        self.shape = (100, 16, d)
        self.is_cuda = cuda


def route(arch=90, q=None, max_seqlen=64, window=(None, None), sinks=None):
    return short_segments.should_route(arch, q or FakeQ(), max_seqlen, window, sinks,
                                       settings.settings().short_route_max_seqlen)


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


def test_threshold_from_env(monkeypatch, reload_settings):
    monkeypatch.setenv("SGLANG_FA4_SHORT_SEQLEN_ROUTE_MAX", "128")
    reload_settings()
    assert route(max_seqlen=128) and not route(max_seqlen=129)
    monkeypatch.setenv("SGLANG_FA4_SHORT_SEQLEN_ROUTE_MAX", "0")
    assert route(max_seqlen=8)  # read once: the settings in use until they are read again
    reload_settings()
    assert not route(max_seqlen=8)


def test_cpu_tensors_never_reach_the_fa2_op(monkeypatch):
    """fa4_call on CPU inputs goes to the kernel cache, never to the CUDA-only FA2 op."""
    from sglang_fa4.kernels import varlen
    seen = []

    class Cache:
        arch = 90

        def __call__(self, q, *args):
            seen.append(q.shape)
            return q

    monkeypatch.setattr("sglang_fa4.kernels.fa4.cache._cache", Cache())
    monkeypatch.setattr(short_segments, "fa2_varlen_attention", lambda *a, **k: pytest.fail("routed a CPU call"))
    q = torch.randn(8, 2, 16)
    varlen.fa4_varlen_attention(q, q, q, torch.tensor([0, 8], dtype=torch.int32), 8)
    assert seen == [q.shape]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fa2_route_matches_fp32_reference():
    torch.manual_seed(0)
    seqlens = [64] * 30 + [16, 48, 32]
    cu = cu_seqlens(seqlens, device="cuda")
    q, k, v = (torch.randn(sum(seqlens), 16, 80, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = torch.full_like(q, float("nan"))
    short_segments.fa2_varlen_attention(q, k, v, cu, 64, None, out=out)
    ref = attention_fp32(q, k, v, cu)
    assert torch.isfinite(out).all() and rel_err(out, ref) < 1e-2


def test_short_attention_picks_the_kernel(monkeypatch):
    calls = []
    monkeypatch.setattr(short_segments.short_window_kernel, "launch_checked", lambda *a, **k: calls.append("triton"))
    monkeypatch.setattr(short_segments, "fa2_varlen_attention", lambda *a, **k: calls.append("fa2"))
    checks = short_segments.check_tensors  # the real input checks, less the CUDA-device one (CPU test)
    monkeypatch.setattr(short_segments, "check_tensors", lambda *a, require_cuda: checks(*a, require_cuda=False))
    cu = torch.tensor([0, 8], dtype=torch.int32)
    for d, max_seqlen in ((64, 64), (80, 8), (128, 64), (72, 64), (80, 65), (96, 64)):
        q = torch.randn(8, 2, d, dtype=torch.bfloat16)
        short_segments.short_attention(q, q, q, cu, max_seqlen, None)
    assert calls == ["triton", "triton", "triton", "triton", "fa2", "fa2"]
    q = torch.randn(8, 2, 160, dtype=torch.bfloat16)[..., ::2]  # a strided last dim: the Triton kernel needs it contiguous
    short_segments.short_attention(q, q, q, cu, 8, None)
    assert calls[-1] == "fa2"


INTERPRETED = """
import json, torch
from sglang_fa4.kernels.vit.short_window_kernel import short_window_attention
from sglang_fa4.testing import attention_fp32, cu_seqlens, rel_err
torch.manual_seed(0)
out_json = {}
for d, heads, kv_heads in ((64, 2, 2), (72, 2, 2), (80, 4, 2), (128, 2, 1)):
    seqlens = [64, 16, 0, 48, 4, 64]
    cu = cu_seqlens(seqlens)
    t = sum(seqlens)
    q = torch.randn(t, heads, d, dtype=torch.float16)
    k, v = (torch.randn(t, kv_heads, d, dtype=torch.float16) for _ in range(2))
    out = torch.full_like(q, float("nan"))
    short_window_attention(q, k, v, cu, 64, out=out)
    out_json[d] = {"finite": bool(torch.isfinite(out).all()), "rel_err": rel_err(out, attention_fp32(q, k, v, cu))}
print(json.dumps(out_json))
"""


def test_short_window_kernel_in_the_triton_interpreter():
    """The Triton kernel's arithmetic on the CPU (TRITON_INTERPRET=1, fp16): windows of 4-64 tokens,
    an empty segment, grouped kv heads; every row written, error at fp16 rounding."""
    import json
    import os
    import subprocess
    import sys

    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", INTERPRETED], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    for d, r in result.items():
        assert r["finite"] and r["rel_err"] < 2e-3, (d, r)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_short_window_kernel_on_gpu():
    from sglang_fa4.kernels.vit.short_window_kernel import short_window_attention

    torch.manual_seed(0)
    seqlens = [64] * 40 + [4, 16, 0, 36]
    cu = cu_seqlens(seqlens, device="cuda")
    q, k, v = (torch.randn(sum(seqlens), 16, 80, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = torch.full_like(q, float("nan"))
    short_window_attention(q, k, v, cu, 64, out=out)
    ref = short_segments.fa2_varlen_attention(q.float().half(), k.half(), v.half(), cu, 64, None).float()
    assert torch.isfinite(out).all()
    assert rel_err(out, ref) < 1e-2


# The short-window route checks its inputs like FA4's route does (a layout of short segments must
# not turn a malformed call into a silently wrong one).
def _bad_call(**over):
    import torch

    t, h, d = 8, 2, 64
    args = {"q": torch.randn(t, h, d, dtype=torch.bfloat16), "k": torch.randn(t, h, d, dtype=torch.bfloat16),
            "v": torch.randn(t, h, d, dtype=torch.bfloat16), "cu": torch.tensor([0, 4, 8], dtype=torch.int32)}
    args.update(over)
    return args


@pytest.mark.parametrize("case, message", [
    ("fp32", "must all be bfloat16 or all float16"),
    ("heads", "must be a multiple of k/v heads"),
    ("cu_int64", "1-D int32"),
    ("cu_2d", "1-D int32"),
    ("kv_tokens", "must share tokens and heads"),
    ("cpu", "must be CUDA tensors"),
])
def test_short_route_rejects_bad_input(case, message):
    import torch

    from sglang_fa4.kernels.inputs import FA4InputError

    over = {
        "fp32": {n: torch.randn(8, 2, 64) for n in ("q", "k", "v")},
        "heads": {"q": torch.randn(8, 3, 64, dtype=torch.bfloat16)},
        "cu_int64": {"cu": torch.tensor([0, 4, 8])},
        "cu_2d": {"cu": torch.tensor([[0, 4, 8]], dtype=torch.int32)},
        "kv_tokens": {"v": torch.randn(6, 2, 64, dtype=torch.bfloat16)},
        "cpu": {},
    }[case]
    a = _bad_call(**over)
    with pytest.raises(FA4InputError, match=message):
        short_segments.short_attention(a["q"], a["k"], a["v"], a["cu"], 4, None)


def test_out_of_the_wrong_shape_is_an_error():
    import torch

    from sglang_fa4.kernels.inputs import FA4InputError
    from sglang_fa4.kernels.inputs import check_out_shape

    q = torch.randn(8, 2, 64, dtype=torch.bfloat16)
    check_out_shape(torch.empty(8, 2, 64, dtype=torch.bfloat16), 8, 2, 64, torch.bfloat16, q)
    for bad in (torch.empty(8, 2, 32, dtype=torch.bfloat16), torch.empty(8, 2, 64), "not a tensor"):
        with pytest.raises(FA4InputError, match="out must be"):
            check_out_shape(bad, 8, 2, 64, torch.bfloat16, q)


def test_short_window_launch_memo_and_checks(monkeypatch):
    """The short-window kernel's hot path hands the cached launch a memo of exactly what fixes the
    specialization (dtype, the four stride tuples, heads per kv head, head dim, warps) when every
    pointer is 16-byte aligned, none otherwise; its public entry rejects mixed dtypes and int64
    cu_seqlens (the memo relies on both)."""
    from sglang_fa4.kernels.vit import short_window_kernel as sw

    seen = []
    monkeypatch.setattr(sw.HANDLES, "launch", lambda grid, args, dev, memo=None, **o: seen.append((grid, memo, args)))
    q = torch.randn(40, 4, 80, dtype=torch.bfloat16)
    k = v = torch.randn(40, 2, 80, dtype=torch.bfloat16)
    cu = torch.tensor([0, 30, 40], dtype=torch.int32)
    out = sw.short_window_attention(q, k, v, cu, 30)
    grid, memo, args = seen[-1]
    assert grid == (2, 4) and out.shape == q.shape
    assert memo == (torch.bfloat16, q.stride(), k.stride(), v.stride(), out.stride(), 2, 80, 4)
    assert args[5:13] == (320, 80, 160, 80, 160, 80, 320, 80) and args[14:] == (2, 80, 128, 64, True)
    buf = torch.empty(40 * 4 * 80 + 1, dtype=torch.bfloat16)
    misaligned = buf[1:].view(40, 4, 80)  # 2 bytes off: Triton keys it differently
    sw.short_window_attention(q, k, v, cu, 30, out=misaligned)
    assert seen[-1][1] is None
    with pytest.raises(ValueError, match="one dtype"):
        sw.short_window_attention(q, k.half(), v, cu, 30)
    with pytest.raises(ValueError, match="int32"):
        sw.short_window_attention(q, k, v, cu.long(), 30)


def _sm90_global_accesses(head_dim: int, align8: bool) -> dict:
    """The short-window kernel compiled for sm_90 on this machine (Triton's own ptxas, no GPU), as
    Triton specializes a contiguous (tokens, 16, head_dim) call: 16-byte aligned pointers, token
    strides % 16, head strides % 16 only when head_dim is. Counts of each global load/store form."""
    import re
    from collections import Counter

    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget

    from sglang_fa4.kernels.vit import short_window_kernel as sw

    fn = sw._kernel()
    names = list(fn.arg_names)
    ints = [n for n in names if n.startswith("stride_")]
    sig = {n: "*bf16" for n in ("Q", "K", "V", "O")} | {"CU": "*i32", "qk_scale": "fp32"} | {n: "i32" for n in ints}
    consts = {"KV_GROUP": 1, "HEAD_DIM": head_dim, "BLOCK_D": max(16, 1 << (head_dim - 1).bit_length()),
              "BLOCK_S": sw.BLOCK_S, "ALIGN8": align8}
    sig.update({n: "constexpr" for n in consts})
    divisible = [n for n in names[:5]] + [n for n in ints if n.endswith("t") or head_dim % 16 == 0]
    src = triton.compiler.ASTSource(fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in consts.items()},
                                    attrs={(names.index(n),): [["tt.divisibility", 16]] for n in divisible})
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"]
    return Counter(re.findall(r"(?:ld|st)\.global[^\s]*", ptx))


def test_short_window_kernel_d72_loads_16_byte_vectors():
    """d=72: Triton knows no divisibility of a head stride of 72, so without the host-checked hint
    every q/k/v element was its own 2-byte load (the kernel ran 4x slower than at d=80 on the H200);
    with it, 16-byte vectors like d=80."""
    hinted, plain, d80 = _sm90_global_accesses(72, True), _sm90_global_accesses(72, False), _sm90_global_accesses(80, True)
    assert plain["ld.global.b16"] > 0
    assert hinted["ld.global.b16"] == 0 and hinted["ld.global.v4.b32"] == d80["ld.global.v4.b32"] > 0
    assert hinted["st.global.v4.b32"] > 0
