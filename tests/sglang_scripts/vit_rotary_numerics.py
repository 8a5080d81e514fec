"""The fused ViT rotary (Triton, interpreted on the CPU) against SGLang's native rotary, inside a
REAL SGLang release: for tests/test_vit_rotary.py."""

from emit import emit

import torch
from sglang.srt.layers.rotary_embedding.utils import apply_rotary_pos_emb_native_eager as native
from sglang_fa4.kernels.vit import rotary as vit_rotary

out = {}
g = torch.Generator().manual_seed(0)
for name, d, heads, kv, tokens, dtype, table, strided in [
        ("qwen2_5_bf16", 80, 4, 4, 37, torch.bfloat16, torch.bfloat16, True),
        ("qwen3_bf16_fp32_tables", 72, 3, 3, 21, torch.bfloat16, torch.float32, False),
        ("fp16_gqa", 64, 4, 2, 19, torch.float16, torch.float16, True),
        ("fp16_fp32_tables", 80, 2, 2, 33, torch.float16, torch.float32, False)]:
    qkv = (torch.randn(tokens, (heads + 2 * kv) * d, generator=g) * 3).to(dtype)
    if strided:
        q = qkv[:, : heads * d].view(tokens, heads, d)
        k = qkv[:, heads * d: (heads + kv) * d].view(tokens, kv, d)
    else:
        q = qkv[:, : heads * d].reshape(tokens, heads, d).contiguous()
        k = qkv[:, heads * d: (heads + kv) * d].reshape(tokens, kv, d).contiguous()
    ang = torch.rand(tokens, d // 2, generator=g) * 40
    cos = torch.cat([ang.cos(), ang.cos()], -1).to(table)
    sin = torch.cat([ang.sin(), ang.sin()], -1).to(table)
    q0, k0 = q.clone(), k.clone()
    fq, fk = vit_rotary.apply_rotary(q, k, cos, sin)
    nq, nk = native(q, k, cos, sin)
    row = {"shape_ok": fq.shape == nq.shape and fk.shape == nk.shape and fq.dtype == dtype,
           "inputs_unchanged": torch.equal(q, q0) and torch.equal(k, k0),
           "finite": bool(torch.isfinite(fq).all() and torch.isfinite(fk).all()),
           "bitwise": torch.equal(fq, nq) and torch.equal(fk, nk)}
    # one step of the output dtype at each element's magnitude
    step = 2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -10
    worst = 0.0
    for f, n in ((fq, nq), (fk, nk)):
        bound = n.float().abs().clamp_min(2.0 ** -14) * step * 1.01
        worst = max(worst, float(((f.float() - n.float()).abs() / bound).max()))
    row["worst_in_steps"] = worst
    out[name] = row
emit(out)
