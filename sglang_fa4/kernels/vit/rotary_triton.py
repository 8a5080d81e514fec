"""The Triton kernel of :mod:`sglang_fa4.kernels.vit.rotary` (imported only when it is first launched:
this module imports Triton). ``rotate_heads`` is a module-level Triton function so that the kernel
calls it both compiled and under Triton's interpreter."""

import triton
import triton.language as tl


@triton.jit
def rotate_heads(X, XO, c1, c2, s1, s2, tok, tmask, stride_xt,
                 STRIDE_XH: tl.constexpr, HEADS: tl.constexpr, HEADS_PAD: tl.constexpr,
                 HALF: tl.constexpr, HALF_PAD: tl.constexpr):
    # every head of BLOCK tokens at once: (token, head, column of a half); cos/sin (token, 1, column)
    # broadcast over the heads.  The head stride is a constexpr (d in practice) so that the loads
    # of a half row are known aligned and contiguous: vector loads.
    h = tl.arange(0, HEADS_PAD)
    c = tl.arange(0, HALF_PAD)
    m = tmask[:, :, None] & (h < HEADS)[None, :, None] & (c < HALF)[None, None, :]
    src = X + tok[:, None, None] * stride_xt + (h * STRIDE_XH)[None, :, None] + c[None, None, :]
    x1 = tl.load(src, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=m, other=0.0).to(tl.float32)
    # SGLang's order of operations: x * cos + rotate_half(x) * sin, each product rounded to fp32
    o1 = x1 * c1 + (-x2) * s1
    o2 = x2 * c2 + x1 * s2
    dst = XO + tok[:, None, None] * (HEADS * 2 * HALF) + (h * (2 * HALF))[None, :, None] + c[None, None, :]
    tl.store(dst, o1.to(XO.dtype.element_ty), mask=m)
    tl.store(dst + HALF, o2.to(XO.dtype.element_ty), mask=m)


@triton.jit(do_not_specialize=["n_tokens"])
def vit_rotary(
    Q, K, COS, SIN, QO, KO,
    n_tokens,
    stride_qt, stride_kt, stride_ct, stride_st,
    STRIDE_QH: tl.constexpr, STRIDE_KH: tl.constexpr,
    HEADS: tl.constexpr, HEADS_PAD: tl.constexpr,
    KV_HEADS: tl.constexpr, KV_PAD: tl.constexpr,
    HALF: tl.constexpr,  # head_dim // 2
    HALF_PAD: tl.constexpr,  # its next power of two
    BLOCK: tl.constexpr,
):
    # program: BLOCK tokens, all their q and k heads (cos/sin read once per token)
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tok = rows.to(tl.int64)
    tmask = (rows < n_tokens)[:, None]
    cols = tl.arange(0, HALF_PAD)
    cm = tmask & (cols < HALF)[None, :]
    c_at = COS + tok[:, None] * stride_ct + cols[None, :]
    s_at = SIN + tok[:, None] * stride_st + cols[None, :]
    c1 = tl.load(c_at, mask=cm, other=0.0).to(tl.float32)[:, None, :]
    c2 = tl.load(c_at + HALF, mask=cm, other=0.0).to(tl.float32)[:, None, :]
    s1 = tl.load(s_at, mask=cm, other=0.0).to(tl.float32)[:, None, :]
    s2 = tl.load(s_at + HALF, mask=cm, other=0.0).to(tl.float32)[:, None, :]
    rotate_heads(Q, QO, c1, c2, s1, s2, tok, tmask, stride_qt, STRIDE_QH, HEADS, HEADS_PAD, HALF, HALF_PAD)
    rotate_heads(K, KO, c1, c2, s1, s2, tok, tmask, stride_kt, STRIDE_KH, KV_HEADS, KV_PAD, HALF, HALF_PAD)
