"""A fused, capture-safe rotary embedding for ViT attention (one Triton kernel for q and k).

SGLang's ViT graph mode applies the rotary with ``apply_rotary_pos_emb_native_eager``: unfused fp32
PyTorch (casts, two multiplies, a rotate-half concatenation, an add, a cast back, for q and for k:
~20 kernels and ~10 fp32 passes over q and k per layer), because its torch.compile'd version would
compile inside a CUDA-graph capture. On 1080p/4K images that made graph towers slower than eager
(issue #18). This kernel reads q, k (bf16/fp16, any token stride, heads packed within a token as in
SGLang's views of its qkv projection) and cos, sin once and writes new contiguous q, k: the same
arithmetic (fp32 products and sum, one rounding to the input dtype), so the result is within bf16
rounding of SGLang's compiled rotary and its eager one. A program takes one token with all its q and k
heads (cos/sin read once per token; :mod:`.rotary_triton`).

Semantics: ``apply_rotary(q, k, cos, sin)`` == ``apply_rotary_pos_emb_native_eager(q, k, cos, sin,
unsqueeze_dim=1)`` for q (tokens, heads, d), k (tokens, kv_heads, d), cos/sin (tokens, d):
``x * cos + rotate_half(x) * sin`` with ``rotate_half(x) = cat(-x[d/2:], x[:d/2])``.
:func:`supported` says whether a call has that shape; anything else is the caller's to route.

Compiled at the startup warmup (:func:`warm`, one kernel per head dim and dtype pair; the family
``vit_rotary`` of :mod:`sglang_fa4.kernels.warmup`) and launched
through a cached handle (:mod:`sglang_fa4.kernels.triton_handles`): no compile on the request path,
a few microseconds of host time per layer. Triton and torch are imported lazily.
"""

from __future__ import annotations

from sglang_fa4.kernels import compile_events
from sglang_fa4.kernels.triton_handles import KernelHandles, int_kind, interpreting

#: tokens per program (each with all its q and k heads; 1 token x 8 warps measured fastest on the H200:
#: results/h200/vit_rotary.md)
BLOCK_T = 1
NUM_WARPS = 8
_DTYPES = ("bfloat16", "float16")
_TABLE_DTYPES = ("bfloat16", "float16", "float32")


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _make_kernel():
    from sglang_fa4.kernels.vit import rotary_triton  # imports Triton

    return rotary_triton.vit_rotary


HANDLES = KernelHandles("vit_rotary", _make_kernel)
_warmed: set = set()  # launch_key()s of the calls warm() made


def launch_key(q, k, cos, sin) -> tuple:
    """Everything the compiled kernel of a call depends on: head dim, head counts, dtypes, the kind
    of each token stride (Triton specializes them, which is what lets the rows load as vectors)
    and the 16-byte alignment of each input."""
    return (q.shape[-1], q.shape[-2], k.shape[-2], q.dtype, cos.dtype, sin.dtype,
            int_kind(q.stride(0)), int_kind(k.stride(0)), int_kind(cos.stride(0)), int_kind(sin.stride(0)),
            *(not t.data_ptr() % 16 for t in (q, k, cos, sin)))


def is_warm(q, k, cos, sin) -> bool:
    """Whether :func:`warm` resolved the kernel this call launches (a hook inside a CUDA-graph
    capture must launch only those: anything else goes to SGLang's rotary, never to a compile)."""
    return launch_key(q, k, cos, sin) in _warmed


_dtype_sets: tuple = ()  # (q/k dtypes, cos/sin dtypes) as torch dtypes, built once


def _dtypes() -> tuple:
    global _dtype_sets
    if not _dtype_sets:
        import torch

        _dtype_sets = (frozenset(getattr(torch, n) for n in _DTYPES), frozenset(getattr(torch, n) for n in _TABLE_DTYPES))
    return _dtype_sets


def supported(q, k, cos, sin, unsqueeze_dim: int = 1) -> bool:
    """Whether (q, k, cos, sin) is a call this kernel computes exactly as the native rotary: q/k
    (tokens, heads, d) of one 16-bit float dtype on one CUDA device (or CPU under the interpreter),
    contiguous last dims, cos/sin (tokens, d), d even."""
    if unsqueeze_dim != 1 or q.dim() != 3 or k.dim() != 3 or cos.dim() != 2 or sin.dim() != 2:
        return False
    tokens, _, d = q.shape
    if d % 2 or k.shape[0] != tokens or k.shape[2] != d or cos.shape != sin.shape or cos.shape[0] != tokens or cos.shape[1] != d:
        return False
    qk_dtypes, table_dtypes = _dtypes()
    if q.dtype != k.dtype or q.dtype not in qk_dtypes or cos.dtype not in table_dtypes or sin.dtype not in table_dtypes:
        return False
    device = q.device
    if k.device != device or cos.device != device or sin.device != device:
        return False
    # heads packed within a token (stride d: SGLang's views of its qkv projection, or contiguous):
    # the kernel takes the head stride as a compile-time constant
    return (q.stride(-1) == 1 and k.stride(-1) == 1 and cos.stride(-1) == 1 and sin.stride(-1) == 1
            and q.stride(1) == d and k.stride(1) == d)


def usable(q, k, cos, sin, unsqueeze_dim: int = 1) -> bool:
    """A call the ViT graph path may hand this kernel: warmed at startup (:func:`is_warm`), of a
    supported shape, on a CUDA device (or any device under TRITON_INTERPRET, CPU tests)."""
    return ((q.is_cuda or interpreting()) and supported(q, k, cos, sin, unsqueeze_dim) and is_warm(q, k, cos, sin))


def apply_rotary(q, k, cos, sin, checked: bool = False):
    """Rotary-embedded (q, k), new contiguous tensors of q's shape and dtype. Raises ValueError on a
    call :func:`supported` rejects (``checked``: the caller just asked :func:`usable`)."""
    import torch

    if not checked and not supported(q, k, cos, sin):
        raise ValueError(
            f"vit_rotary: needs q (tokens, heads, d), k (tokens, kv_heads, d) of one bf16/fp16 dtype with "
            f"heads packed (head stride d) and cos/sin (tokens, d), d even, unit last strides, one device; got q {tuple(q.shape)} {q.dtype}, "
            f"k {tuple(k.shape)} {k.dtype}, cos {tuple(cos.shape)} {cos.dtype}, sin {tuple(sin.shape)} {sin.dtype}")
    tokens, heads, d = q.shape
    kv_heads = k.shape[1]
    qo = torch.empty((tokens, heads, d), dtype=q.dtype, device=q.device)
    ko = torch.empty((tokens, kv_heads, d), dtype=k.dtype, device=k.device)
    if tokens == 0:
        return qo, ko
    half = d // 2
    args = (q, k, cos, sin, qo, ko, tokens, q.stride(0), k.stride(0), cos.stride(0), sin.stride(0),
            q.stride(1), k.stride(1), heads, _pow2(heads), kv_heads, _pow2(kv_heads), half, max(16, _pow2(half)),
            BLOCK_T)
    # plain integer maths: triton.cdiv / next_power_of_2 are constexpr functions (tens of us per
    # host call, measured here with Triton 3.8)
    grid = (-(-tokens // BLOCK_T),)
    # the launch key fixes the specialization when the inputs are 16-byte aligned (the outputs are
    # fresh allocations): a memo, so a repeated call skips the handle's own key
    key = launch_key(q, k, cos, sin)
    memo = (key, BLOCK_T, NUM_WARPS) if all(key[-4:]) else None
    HANDLES.launch(grid, args, q.device.index or 0, memo, num_warps=NUM_WARPS)
    return qo, ko


def warm(head_dim: int, heads: int, kv_heads: int, dtype: str = "bfloat16", table_dtypes=("bfloat16", "float32"),
         device=None) -> int:
    """Resolve (compile, or load from Triton's disk cache) the kernels a tower of this head dim,
    heads and dtype will launch: one per cos/sin dtype in ``table_dtypes`` (Qwen2.5-VL hands the
    layers bf16 tables, others may hand fp32). Returns how many were newly resolved."""
    import torch

    before = compile_events.count("triton")
    dt = getattr(torch, dtype)
    g = torch.Generator(device="cpu").manual_seed(0)
    for table in table_dtypes:
        tokens = 40
        # q and k as SGLang hands them: views into one fused qkv projection
        qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=g).to(device=device, dtype=dt)
        q = qkv[:, : heads * head_dim].view(tokens, heads, head_dim)
        k = qkv[:, heads * head_dim: (heads + kv_heads) * head_dim].view(tokens, kv_heads, head_dim)
        cos = torch.randn(tokens, head_dim, generator=g).to(device=device, dtype=getattr(torch, table))
        sin = cos.clone()
        for qq, kk in ((q, k), (q.contiguous(), k.contiguous())):  # views of one projection, or contiguous
            apply_rotary(qq, kk, cos, sin)
            _warmed.add(launch_key(qq, kk, cos, sin))
    return compile_events.count("triton") - before


def warm_shape(shape, device) -> str:
    """The warmup registry's entry (family ``vit_rotary``): :func:`warm` for a
    :class:`~sglang_fa4.kernels.vit.shape.VitShape`."""
    new = warm(shape.head_dim, shape.heads, shape.kv_heads, shape.dtype, device=device)
    return f"{new} resolved" if new else "cached"
