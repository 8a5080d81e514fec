"""The token-chunked two-pass FP8 quantize kernel against the per-sequence kernel, bitwise, in
Triton's CPU interpreter (TRITON_INTERPRET=1); prints "ok". Run as a plain child process (no SGLang)
by tests/test_vit_attn_dtype.py."""

import torch
from sglang_fa4.kernels.vit.fp8_quantize import Fp8QKV, quantize_qkv
from sglang_fa4.kernels.vit.fp8_quantize_chunked import quantize_qkv_chunked
from sglang_fa4.testing import cu_seqlens
torch.manual_seed(0)
cases = ((80, 2, 2, [300, 5, 0, 530], 0, None), (72, 4, 2, [17, 260], 7, None),
         (80, 2, 1, [600, 40, 40] + [0] * 6, 0, 1024), (80, 1, 1, [0, 700], 0, 700))
for d, hq, hkv, lens, extra, max_seqlen in cases:
    total = sum(lens)
    c = cu_seqlens(lens)
    q = (torch.randn(total + extra, hq, d) * 3).to(torch.bfloat16)
    k = (torch.randn(total + extra, hkv, d) * 3).to(torch.bfloat16)
    v = torch.randn(total + extra, hkv, d).to(torch.bfloat16)
    b = quantize_qkv(q, k, v, c, c)
    out = Fp8QKV(*(torch.full_like(x.view(torch.uint8), 0x7F).view(x.dtype) for x in b[:3]),
                 torch.full_like(b.descale, float('nan')), d)
    a = quantize_qkv_chunked(q, k, v, c, c, max_seqlen or max(lens), out=out)
    for x, y in ((a.q, b.q), (a.k, b.k)):
        assert torch.equal(x[:total].view(torch.uint8), y[:total].view(torch.uint8))
    assert torch.equal(a.vt, b.vt) and torch.equal(a.descale, b.descale)
    assert a.descale.min() > 0 and a.q.shape[-1] == 96
print('ok')
