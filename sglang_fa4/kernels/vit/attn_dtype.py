"""FP8 ViT attention: which precision a ViT attention call runs in, bf16 (FA4 and its short-window
route) or FP8, and the FP8 call itself (quantize on the device, the SM90 FP8 forward, bf16 out).

``SGLANG_FA4_VIT_ATTN_DTYPE=fp8`` (default ``bf16``) opts the fa4 ViT backend into the SM90 FP8
forward (:mod:`sglang_fa4.kernels.fp8_sm90`): q/k/v quantized on the device per (sequence, head)
by :mod:`.fp8_quantize_chunked`, the E4M3 forward, bf16 out. FP8 is used
per call only where it was measured faster than bf16, so ``fp8`` is never slower than ``bf16``:

Quantizing costs time linear in the tokens, while FP8 saves time quadratic in each segment's
length. For n segments of one length L, FP8 (quantize included) wins from one length ``L*`` on,
whatever n; :data:`FP8_MIN_SEGMENT` holds ``L*`` per head dim, measured on the H200
(``benchmark/release/check_vit_fp8.py``: a sweep of lengths, then the towers' speed with the derived
table; results in ``benchmark/results/h200/vit_fp8*.md``; today d80 alone, see its comment). For a general layout the call knows, on the host, T tokens
(q's rows), S segments (cu_seqlens' length - 1) and the longest segment M (max_seqlen), so the
attention work sum(len^2) is at least ``M^2 + (T - M)^2 / (S - 1)`` (the rest spread evenly);
FP8 is taken when that lower bound is at least ``L* * T`` -- exactly ``L >= L*`` for equal
segments, and never a loss for uneven ones (it underestimates FP8's gain). No device read: the
decision is host-only and the same for every replay of a captured graph (a budget graph's
max_seqlen is its budget, so its decision is the budget's).

Not routed to FP8 (stay bf16): head dims without a measured ``L*`` (all but d80; d64's FP8 kernel
alone is 0.8-0.9x FA4), attention sinks, sliding windows / causal, fp32 inputs, CPU tensors, GPUs
other than SM90. Qwen2.5-VL's 64-token window layers stay on the short-window route: measured
5-10x faster than the FP8 path there (its quantize alone costs more than the whole bf16 call).
Accuracy (benchmark/results/cpu/vit_fp8_accuracy.md, an fp32 emulation in SGLang's real towers):
E4M3 q/k dominate the error (rel. 0.1-0.2 per layer at trained-like logit scales: 3 mantissa bits
give q.k a logit error proportional to the logits, whatever the scales; K smoothing does not help
there), so the FP8 path is also an accuracy trade-off.
On SM100/SM103, FA4 4.0.0b36's own FP8 forward exists only behind its private ``_flash_attn_fwd``
(the public ``flash_attn_varlen_func`` takes no descales) and is neither validated nor measured
here: one log line, bf16.
"""

from __future__ import annotations

import logging
from typing import Optional

from sglang_fa4.kernels import fp8_sm90
from sglang_fa4.kernels.inputs import normalize_window

logger = logging.getLogger("sglang_fa4")

#: compute capabilities (major*10+minor) with a native FP8 forward wired in
FP8_ARCHS = (90,)
#: Head dim -> shortest segment length from which quantize + FP8 forward beat FA4 bf16 (H200,
#: 16 heads; benchmark/results/h200/vit_fp8-run1.md, graph replay). Measured, FP8 wins at one
#: length the Qwen ViTs run: d80 (Qwen2.5-VL, padded to 96) 1.08x at one 42196-token segment (a 4K
#: picture's full-attention layers), 0.50-0.82x from 1k to 16k-token segments (the FP8 forward alone
#: 0.91-1.34x, the quantize 0.04-0.36 ms on top); d72 (Qwen3-VL) 0.51-0.99x everywhere (no entry:
#: bf16); 64-token windows 0.10-0.18x (they stay on the short-window route). With this table the 4K
#: Qwen2.5-VL tower is 1.027x (SGLang 0.5.23) / 1.036x (0.5.20) in graph mode and 1.006x / 1.035x
#: eager, every other size runs exactly the bf16 path (vit_fp8-0.5.23.md, vit_fp8-0.5.20.md). Re-measure with
#: ``check_vit_fp8.py --sections crossover towers`` when the FP8 kernel or the quantize changes.
FP8_MIN_SEGMENT: dict[int, int] = {80: 42196}

_table: dict[int, int] = dict(FP8_MIN_SEGMENT)
_logged: set = set()


def min_segment_table() -> dict[int, int]:
    """The table in use (head dim -> L*)."""
    return dict(_table)


def set_min_segment_table(table: Optional[dict[int, int]]) -> dict[int, int]:
    """Replace the table (the measuring script installs the one it just measured; None restores
    :data:`FP8_MIN_SEGMENT`); returns the previous one."""
    global _table
    previous, _table = _table, dict(FP8_MIN_SEGMENT if table is None else table)
    for d, length in _table.items():
        if not (isinstance(d, int) and isinstance(length, int) and length > 0):
            raise ValueError(f"FP8 min-segment table entries must be int head dim -> positive int, got {d}: {length}")
    return previous


def fp8_enabled(arch: int, asked: bool) -> bool:
    """FP8 ``asked`` for (SGLANG_FA4_VIT_ATTN_DTYPE=fp8, :mod:`sglang_fa4.kernels.settings`) and
    available on ``arch``; on any other GPU one log line per process."""
    if not asked:
        return False
    if arch in FP8_ARCHS:
        return True
    if arch not in _logged:
        _logged.add(arch)
        why = ("FA4 4.0.0b36's FP8 forward is reachable only through its private _flash_attn_fwd and "
               "is not validated here" if arch // 10 in (10, 11) else "no FP8 attention forward for it")
        logger.warning("sglang-fa4: SGLANG_FA4_VIT_ATTN_DTYPE=fp8 is for SM90 (Hopper); this GPU is "
                       "sm_%d (%s): the ViT attention stays bf16", arch, why)
    return False


def work_lower_bound(max_seqlen: int, tokens: int, segments: int) -> float:
    """Smallest sum of squared segment lengths for ``tokens`` in ``segments`` segments, the longest
    ``max_seqlen`` long."""
    m = min(max_seqlen, tokens)
    rest = tokens - m
    return float(m) * m + (float(rest) * rest / (segments - 1) if segments > 1 and rest > 0 else 0.0)


def fp8_faster(head_dim: int, max_seqlen: Optional[int], tokens: int, segments: int) -> bool:
    """The table's verdict for a layout (host ints only)."""
    length = _table.get(head_dim)
    if length is None or max_seqlen is None or max_seqlen < length or tokens <= 0:
        return False
    return work_lower_bound(max_seqlen, tokens, max(segments, 1)) >= float(length) * tokens


def on_cuda(q) -> bool:
    return bool(getattr(q, "is_cuda", False))


def use_fp8(asked: bool, arch, q, cu_seqlens, max_seqlen: Optional[int], window_size=(None, None),
            sinks=None) -> bool:
    """Whether this ViT attention call runs FP8: ``asked`` (the setting), the call's kind (full,
    non-causal attention without sinks on 16-bit CUDA tensors), the GPU (``arch``: an int, or a
    callable asked only when everything else allows FP8) and the measured table. Host-only."""
    if not asked or sinks is not None or not on_cuda(q):
        return False
    import torch

    if q.dtype not in (torch.bfloat16, torch.float16) or normalize_window(window_size) != (False, None, None):
        return False
    if not fp8_faster(q.shape[-1], max_seqlen, q.shape[0], cu_seqlens.shape[0] - 1):
        return False
    return fp8_enabled(arch() if callable(arch) else arch, asked)


def fp8_attention(q, k, v, cu_seqlens, max_seqlen: int, softmax_scale: Optional[float] = None):
    """Quantize q/k/v on the device, run the SM90 FP8 forward
    (:func:`sglang_fa4.kernels.fp8_sm90.fp8_varlen_attention`, with E4M3 q/k), return bf16
    (tokens, heads, head_dim) (a view dropping the zero-padded head dims, e.g. 80 of 96)."""
    from sglang_fa4.kernels.vit.fp8_quantize_chunked import quantize_qkv_chunked  # imports Triton

    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    head_dim = q.shape[-1]
    qkv = quantize_qkv_chunked(q, k, v, cu_seqlens, cu_seqlens, max_seqlen)
    out = fp8_sm90.fp8_varlen_attention(
        qkv.q, qkv.k, None, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, descale=qkv.descale, vt=qkv.vt,
        softmax_scale=head_dim ** -0.5 if softmax_scale is None else softmax_scale,
    )
    return out if out.shape[-1] == head_dim else out[..., :head_dim]


def warm_shape(shape, device) -> str:
    """The warmup registry's entry (family ``fp8_vit``): one small FP8 attention call of a
    :class:`~sglang_fa4.kernels.vit.shape.VitShape` on ``device`` (two segments of random data,
    one over a quantize chunk), which compiles the Triton quantize kernels and loads the forward's
    module, so neither happens on the request path or in a graph capture; checked finite."""
    import torch

    lens = (300, 45)
    cu = torch.tensor([0, lens[0], sum(lens)], dtype=torch.int32, device=device)
    g = torch.Generator(device="cpu").manual_seed(0)
    dt = getattr(torch, shape.dtype)
    q, k, v = (torch.randn(sum(lens), h, shape.head_dim, generator=g).to(device=device, dtype=dt)
               for h in (shape.heads, shape.kv_heads, shape.kv_heads))
    with torch.no_grad():
        out = fp8_attention(q, k, v, cu, max(lens))
    if not bool(torch.isfinite(out).all()):
        raise RuntimeError("FP8 ViT attention returned non-finite values on random input")
    return "compiled/loaded"


def reset() -> None:
    """Forget the log-once set and any replaced table (tests)."""
    global _table
    _logged.clear()
    _table = dict(FP8_MIN_SEGMENT)
