"""GPU (SM90): the FP8 forward against an fp32 reference on the dequantized inputs, the Triton
quantize/pack kernels against their torch references, graph capture.  Skips without an SM90 GPU or
the CUTLASS DSL (CI is CPU-only).  The full matrix and timings: benchmark/release/check_fp8_attention.py."""

from __future__ import annotations

import pytest
import torch

from sglang_fa4.kernels import compile_events
from sglang_fa4.testing import attention_fp32, cu_seqlens, rel_err

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9, reason="needs an SM90 GPU"
    ),
]

BAR = 3e-2


@pytest.fixture(scope="module")
def fp8():
    pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl")
    pytest.importorskip("triton", reason="needs triton")
    from sglang_fa4.kernels.fp8_sm90 import launch, vt_pack
    from sglang_fa4.kernels.vit import fp8_quantize as quantize

    return launch, quantize, vt_pack


@pytest.mark.parametrize(
    "lens,hq,hkv,d,causal",
    [
        ([256], 2, 2, 128, False),
        ([1000, 3000], 4, 4, 128, False),  # last q block ends 56 rows in: the fully-OOB Q half case
        ([513, 2049], 8, 2, 128, True),
        ([300, 0, 1, 64], 4, 4, 64, False),
        ([1000, 300], 4, 4, 96, True),
    ],
)
def test_fp8_forward_matches_fp32_reference(fp8, lens, hq, hkv, d, causal):
    launch, _, vt_pack = fp8
    torch.manual_seed(0)
    c = cu_seqlens(lens, device="cuda")
    t = sum(lens)
    q = (torch.randn(t, hq, d, device="cuda") * 2).to(torch.float8_e4m3fn)
    k = (torch.randn(t, hkv, d, device="cuda") * 2).to(torch.float8_e4m3fn)
    v = torch.randn(t, hkv, d, device="cuda").to(torch.float8_e4m3fn)
    qd = torch.full((len(lens), hkv), 0.5, device="cuda")
    out = torch.full((t, hq, d), float("nan"), dtype=torch.bfloat16, device="cuda")
    launch.fp8_varlen_attention(q, k, v, c, c, max(lens), max(lens), q_descale=qd, k_descale=0.25,
                                v_descale=2.0, causal=causal, out=out)
    ref = attention_fp32(q.float() * 0.5, k.float() * 0.25, v.float() * 2.0, c, scale=d ** -0.5, causal=causal)
    o = out.float()
    assert torch.isfinite(o).all()
    assert rel_err(o, ref) <= BAR


@pytest.mark.parametrize("lens,max_seqlen,d", [
    ([3000, 100, 5] + [0] * 60, 4096, 80),  # a ViT budget graph's layout: padding, then empty slots
    ([0, 2049], 2049, 72),  # Qwen2.5-VL's eager full layout starts with an empty segment
])
def test_vit_fp8_path_on_budget_layouts_matches_fp32(fp8, lens, max_seqlen, d):
    """vit_attn_dtype.fp8_attention (token-chunked quantize + FP8 forward, both on their linear
    grids) against fp32 attention on the bf16 inputs, output and every V^T column poisoned first."""
    from sglang_fa4.kernels.vit import attn_dtype as vit_attn_dtype
    from sglang_fa4.kernels.vit import fp8_quantize_chunked as quantize_chunked

    _, quantize, _ = fp8
    torch.manual_seed(1)
    c = cu_seqlens(lens, device="cuda")
    t = sum(lens)
    q, k, v = (torch.randn(t, 4, d, device="cuda").bfloat16() for _ in range(3))
    out = vit_attn_dtype.fp8_attention(q, k, v, c, max_seqlen)
    ref = attention_fp32(q, k, v, c, scale=d ** -0.5)
    assert torch.isfinite(out).all()
    assert rel_err(out, ref) <= 7.5e-2  # E4M3 q/k/v/P at logit std 1: ~5e-2 (fp8_error_budget.md)
    got = quantize_chunked.quantize_qkv_chunked(q, k, v, c, c, max_seqlen)
    for x in (got.q, got.k, got.vt):
        x.view(torch.uint8).fill_(0x7F)  # E4M3 NaN: every byte the kernel reads must be rewritten
    got.descale.fill_(float("nan"))
    got = quantize_chunked.quantize_qkv_chunked(q, k, v, c, c, max_seqlen, out=got)
    want = quantize.quantize_qkv_reference(q, k, v, c, c)
    assert torch.equal(got.vt, want.vt) and torch.equal(got.descale, want.descale)
    assert torch.equal(got.k.view(torch.uint8), want.k.view(torch.uint8))
    assert torch.equal(got.q.view(torch.uint8), want.q.view(torch.uint8))


def test_quantize_and_pack_match_references(fp8):
    _, quantize, vt_pack = fp8
    lens = [5, 0, 300, 1, 77]
    c = cu_seqlens(lens, device="cuda")
    t = sum(lens)
    q, k, v = (torch.randn(t, h, 80, device="cuda").bfloat16() for h in (8, 2, 2))
    got = quantize.quantize_qkv(q, k, v, c)
    ref = quantize.quantize_qkv_reference(q, k, v, c, c)
    torch.testing.assert_close(got.descale, ref.descale)
    assert torch.equal(got.q.view(torch.uint8), ref.q.view(torch.uint8))
    assert torch.equal(got.k.view(torch.uint8), ref.k.view(torch.uint8))
    assert torch.equal(got.vt, ref.vt)
    v8 = (torch.randn(t, 2, 96, device="cuda") * 50).to(torch.float8_e4m3fn)
    assert torch.equal(vt_pack.pack_vt(v8, c, max(lens)), vt_pack.pack_vt_reference(v8.view(torch.uint8), c))


def test_graph_capture_replays_the_same_output(fp8):
    launch, quantize, _ = fp8
    c = cu_seqlens([700, 300], device="cuda")
    q = torch.randn(1000, 4, 128, device="cuda").bfloat16()
    res = quantize.quantize_qkv(q, q, q, c)
    out = torch.empty(1000, 4, 128, dtype=torch.bfloat16, device="cuda")

    def call():
        launch.fp8_varlen_attention(res.q, res.k, None, c, c, 700, 700, descale=res.descale, vt=res.vt, out=out)

    call()
    torch.cuda.synchronize()
    eager = out.clone()
    compiles = compile_events.count("fp8_forward")
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        call()
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        call()
    out.zero_()
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
    assert compile_events.count("fp8_forward") == compiles  # no compile on the captured path


#: The d=128 non-causal kernel's configs under test: the table's (persistent CTAs, narrow first key
#: tiles, split K / V^T barriers) and the plain one-level kernel of the same 192-key tiles.
D128_FULL_CONFIGS = {"persistent": None,
                     "not_persistent": dict(persistent=False, pingpong=False, stages=4)}


def d128_full_config(name):
    from sglang_fa4.kernels.fp8_sm90.kernel_config import default_config
    from sglang_fa4.kernels.fp8_sm90.layout import Fp8Variant

    changes = D128_FULL_CONFIGS[name]
    return None if changes is None else default_config(Fp8Variant(128, False, False)).replace(**changes)


def _segments(n, hi, seed):
    g = torch.Generator().manual_seed(seed)
    lens = [int(x) for x in torch.randint(0, hi + 1, (n,), generator=g)]
    lens[1], lens[2] = 0, 1
    return lens


@pytest.mark.parametrize("config", sorted(D128_FULL_CONFIGS))
@pytest.mark.parametrize("lens_q,lens_k,hq,hkv", [
    ([1000, 3000], [1000, 3000], 4, 4),  # partial halves at both sequence ends
    (_segments(60, 300, 0), _segments(60, 300, 0), 4, 4),  # <= 128 sequences: longest-first table
    (_segments(300, 70, 1), _segments(300, 70, 1), 2, 2),  # > 128: index order
    ([100, 700, 0, 300], [900, 1700, 5, 64], 8, 2),  # GQA, seqlen_q != seqlen_k
    ([3000, 2000, 1290, 640], [0, 5000, 0, 3000], 8, 8),  # q rows without keys between tiles with keys
    ([8192], [8192], 2, 2),
    # the narrow first key tile at every width (keys mod 192: 1, 64, 65, 96, 97 and a full tile)
    ([3, 200, 64, 500, 97, 130, 0, 1, 300], [1, 256, 257, 480, 97, 576, 0, 1000, 4096], 8, 2),
])
def test_d128_full_forward_matches_fp32_reference(fp8, config, lens_q, lens_k, hq, hkv):
    """The d=128 non-causal kernel (persistent CTAs, persistent_entry.py; and without them): every
    (q tile, head) written once and right, into a NaN-poisoned output, and the same output from a
    CUDA-graph replay."""
    launch = fp8[0]
    kernel_config = d128_full_config(config)
    torch.manual_seed(0)
    cq, ck = cu_seqlens(lens_q, device="cuda"), cu_seqlens(lens_k, device="cuda")
    tq, tk = sum(lens_q), sum(lens_k)
    q = (torch.randn(tq, hq, 128, device="cuda") * 2).to(torch.float8_e4m3fn)
    k = (torch.randn(tk, hkv, 128, device="cuda") * 2).to(torch.float8_e4m3fn)
    v = torch.randn(tk, hkv, 128, device="cuda").to(torch.float8_e4m3fn)
    out = torch.full((tq, hq, 128), float("nan"), dtype=torch.bfloat16, device="cuda")

    def call():
        launch.fp8_varlen_attention(q, k, v, cq, ck, max(lens_q), max(lens_k), out=out, kernel_config=kernel_config)

    call()
    torch.cuda.synchronize()
    ref = attention_fp32(q, k, v, cq, ck, scale=128 ** -0.5)  # q rows without keys: zero
    o = out.float()
    assert torch.isfinite(o).all()
    assert rel_err(o, ref) <= BAR
    eager = out.clone()
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        call()
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)


NAN_CHILD = r"""
import sys, torch
from sglang_fa4.kernels.fp8_sm90 import launch
d, causal, where = int(sys.argv[1]), sys.argv[2] == "1", sys.argv[3]
g = torch.Generator(device="cuda").manual_seed(3)
n, bad = 2048, 700
q, k, v = ((torch.randn(n, h, d, device="cuda", generator=g) * 2).to(torch.float8_e4m3fn) for h in (8, 2, 2))
nan = torch.full((1,), float("nan"), device="cuda").to(torch.float8_e4m3fn)
{"q": q, "k": k, "v": v}[where][bad:bad + 1] = nan  # one token's row of NaN (every head)
cu = torch.tensor([0, n], dtype=torch.int32, device="cuda")
for _ in range(3):
    o = launch.fp8_varlen_attention(q, k, v, cu, cu, n, n, causal=causal)
torch.cuda.synchronize()
# rows that never see the NaN: every other query (a NaN q row), the queries before it (causal k)
clean = (torch.arange(n, device="cuda") != bad) if where == "q" else (torch.arange(n, device="cuda") < bad)
print("CLEAN_ROWS_FINITE", bool(torch.isfinite(o[clean].float()).all()) if where == "q" or causal else None)
"""


@pytest.mark.parametrize("d,causal,where", [(64, True, "k"), (128, False, "q"), (128, True, "k"), (256, True, "q"),
                                             (256, True, "k"), (256, False, "k")])
def test_nan_inputs_finish(fp8, d, causal, where):
    """A NaN in q or k (S = NaN in some lanes, masked 0 in others) must not hang the kernel: the
    branch behind forward.pin_wait was skipped by NaN lanes and split a warp, which hung the d=256
    96-key kernel on the H200.  Each case runs in a child process with a deadline; rows that do not
    see the NaN stay finite (causal: queries before the NaN key; a NaN q row: every other row)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    try:
        proc = subprocess.run([sys.executable, "-c", NAN_CHILD, str(d), str(int(causal)), where],
                              capture_output=True, text=True, timeout=120, env=env, cwd=root)
    except subprocess.TimeoutExpired:
        pytest.fail(f"d={d} causal={causal}: a NaN in {where} hung the FP8 kernel (120 s)")
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("CLEAN_ROWS_FINITE")][-1]
    assert line.split()[1] in ("True", "None"), line
