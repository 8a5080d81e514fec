"""The attention backends the kernel benchmark compares, behind one interface.

`make_runner(name, problem)` returns a zero-argument callable that runs one varlen, non-causal
attention over the problem's q, k, v and returns the output tensor (the problem's `out` for
backends that write in place; a fresh tensor for `fa4_public`). Everything a backend needs
besides q/k/v (cu_seqlens, seq_lens, index tensors) is prepared once here, as a serving stack
would, so a call makes no host sync and can be graph-captured.

- fa4:         sglang_fa4.kernels.varlen.fa4_varlen_attention (our production path), out=
- fa4_public:  flash_attn.cute.flash_attn_varlen_func (the public API, allocates its output)
- triton_attn: SGLang's context_attention_fwd (the Triton ViT kernel), called as SGLang's
               VisionTritonAttention does: full cu_seqlens as b_start_loc, seq_lens, max_seqlen
- sdpa:        torch scaled_dot_product_attention, dense batched per segment length
- fa4_fp8:     (opt-in, SM90) bf16 q/k/v quantized to E4M3 (per-(segment, head) descales, V^T, head
               dim padded to 64/96/128, sglang_fa4.kernels.vit.quantize_qkv), then the SM90 FP8
               forward (sglang_fa4.kernels.fp8_sm90.fp8_varlen_attention): the timed call is both,
               what a caller holding bf16 tensors pays (benchmark/release/check_fp8_attention.py times the
               attention kernel alone)
- fa3:         (opt-in, SM90) FlashAttention-3's bf16 varlen forward -- what SGLang's Hopper ViT
               default (`fa3`, from sgl-kernel) runs -- built from FA3's pinned sources by
               benchmark/fa3_build/build.sh into .fa3/libfa3fwd.so (sglang_fa4.bench.fa3); skipped
               (BackendUnavailable) where that library is absent
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

BACKENDS = ("fa4", "fa4_public", "triton_attn", "sdpa")
#: Backends run only when asked for (--backends).
OPTIONAL_BACKENDS = ("fa4_fp8", "fa3")


class BackendUnavailable(RuntimeError):
    """The backend cannot run here (module missing, unsupported shape)."""


@dataclass
class Problem:
    q: Any
    k: Any
    v: Any
    out: Any
    cu_seqlens: Any  # int32 cuda, (segments + 1,)
    seqlens: list[int]
    max_seqlen: int


def make_problem(seqlens, heads: int, head_dim: int, dtype=None, device="cuda", generator=None) -> Problem:
    import torch

    from .layouts import cu_from_seqlens

    dtype = dtype or torch.bfloat16
    total = sum(seqlens)
    q, k, v = (
        torch.randn(total, heads, head_dim, device=device, dtype=dtype, generator=generator) for _ in range(3)
    )
    cu = torch.tensor(cu_from_seqlens(seqlens), dtype=torch.int32, device=device)
    return Problem(q, k, v, torch.empty_like(q), cu, list(seqlens), max(seqlens))


def triton_context_attention_fwd():
    """SGLang's Triton ViT attention kernel, from an installed SGLang or the device bundle."""
    try:
        from sglang.kernels.ops.attention.prefill_attention import context_attention_fwd
    except ImportError:
        try:
            from sglang.srt.layers.attention.triton_ops.prefill_attention import context_attention_fwd
        except ImportError as exc:
            raise BackendUnavailable(f"SGLang's context_attention_fwd not importable: {exc}") from None
    return context_attention_fwd


def make_runner(name: str, p: Problem) -> Callable[[], Any]:
    if name == "fa4":
        from sglang_fa4.kernels.varlen import fa4_varlen_attention

        q, k, v, out, cu, ms = p.q, p.k, p.v, p.out, p.cu_seqlens, p.max_seqlen
        return lambda: fa4_varlen_attention(q, k, v, cu, ms, out=out)
    if name == "fa4_public":
        try:
            from flash_attn.cute import flash_attn_varlen_func
        except ImportError as exc:
            raise BackendUnavailable(f"flash_attn.cute not importable: {exc}") from None
        q, k, v, cu, ms = p.q, p.k, p.v, p.cu_seqlens, p.max_seqlen

        def run_public():
            r = flash_attn_varlen_func(
                q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=ms, max_seqlen_k=ms
            )
            return r[0] if isinstance(r, tuple) else r

        return run_public
    if name == "triton_attn":
        fwd = triton_context_attention_fwd()
        q, k, v, out, cu, ms = p.q, p.k, p.v, p.out, p.cu_seqlens, p.max_seqlen
        seq_lens = (cu[1:] - cu[:-1]).to(dtype=cu.dtype)

        def run_triton():
            fwd(q, k, v, out, cu, seq_lens, ms, is_causal=False)
            return out

        return run_triton
    if name == "sdpa":
        from .sdpa_varlen import SdpaVarlen

        impl = SdpaVarlen(p.seqlens, p.q.device)
        q, k, v, out = p.q, p.k, p.v, p.out
        return lambda: impl(q, k, v, out=out)
    if name == "fa4_fp8":
        return _fp8_runner(p)
    if name == "fa3":
        return _fa3_runner(p)
    raise ValueError(f"unknown backend {name!r}; known: {BACKENDS + OPTIONAL_BACKENDS}")


def _fp8_runner(p: Problem) -> Callable[[], Any]:
    import torch

    if torch.cuda.get_device_capability(p.q.device)[0] != 9:
        raise BackendUnavailable("fa4_fp8 runs on SM90 (Hopper) only")
    try:
        from sglang_fa4.kernels.fp8_sm90 import fp8_varlen_attention
        from sglang_fa4.kernels.vit import quantize_qkv
    except ImportError as exc:
        raise BackendUnavailable(f"fa4_fp8 needs the CUTLASS DSL and triton: {exc}") from None
    d = p.q.shape[-1]
    res = quantize_qkv(p.q, p.k, p.v, p.cu_seqlens)
    out = torch.empty(res.q.shape, dtype=torch.bfloat16, device=p.q.device)
    cu, ms, scale = p.cu_seqlens, p.max_seqlen, d ** -0.5

    def run_fp8():
        # quantized in the call: the harness writes fresh bf16 data into p.q/k/v between runs
        r = quantize_qkv(p.q, p.k, p.v, cu)
        fp8_varlen_attention(r.q, r.k, None, cu, cu, ms, ms, descale=r.descale, softmax_scale=scale,
                             out=out, vt=r.vt)
        return out[..., :d]

    return run_fp8


def _fa3_runner(p: Problem) -> Callable[[], Any]:
    import torch

    from . import fa3

    if p.q.device.type != "cuda" or torch.cuda.get_device_capability(p.q.device) != (9, 0):
        raise BackendUnavailable("fa3 (this build) runs on SM90 (Hopper) only")
    try:
        fa3.load()
    except fa3.Fa3Unavailable as exc:
        raise BackendUnavailable(str(exc)) from None
    q, k, v, out, cu, ms = p.q, p.k, p.v, p.out, p.cu_seqlens, p.max_seqlen
    lse = torch.empty(q.shape[1], q.shape[0], dtype=torch.float32, device=q.device)
    ws = fa3.workspace(len(p.seqlens), q.device)

    def run_fa3():
        return fa3.varlen_bf16(q, k, v, cu, cu, ms, ms, out=out, lse=lse, ws=ws)

    return run_fa3


def sdpa_groups(seqlens) -> int:
    """How many dense SDPA calls the sdpa backend makes for a layout (1 = truly dense batched)."""
    return len({int(n) for n in seqlens if n})


def reference_fp32(p: Problem, q=None, k=None, v=None):
    """The fp32 reference output for (q, k, v) of the problem's layout (float32 SDPA per
    segment-length group, TF32 off)."""
    import torch

    from .sdpa_varlen import SdpaVarlen

    q, k, v = (t if t is not None else d for t, d in ((q, p.q), (k, p.k), (v, p.v)))
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        return SdpaVarlen(p.seqlens, q.device)(q.float(), k.float(), v.float())
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def rel_err(out, ref) -> float:
    from sglang_fa4.testing import rel_err as shared

    return shared(out, ref)
