"""Compile-once, launch-directly path of the SM90 FP8 attention forward.

Each :class:`~sglang_fa4.kernels.fp8_sm90.layout.Fp8Variant` (head dim, causal, local) is compiled
once with fake tensors (dynamic sizes and strides) into a TVM-FFI function that takes torch
tensors and launches on the current torch stream; a call then costs the argument checks below plus
that function.  No host syncs: ``max_seqlen_q``/``max_seqlen_k`` are host ints (they size grids).
With ``out`` (and ``vt``/``descale`` from :func:`sglang_fa4.kernels.vit.quantize_qkv`)
nothing is allocated, so the call captures in CUDA graphs; without them the allocations come
from torch's caching allocator, which graph capture also handles.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Callable, Optional

import torch

from sglang_fa4.kernels import compile_events
from sglang_fa4.kernels.compile_events import KernelFamily
from sglang_fa4.kernels.inputs import FA4InputError, check_scalars
from sglang_fa4.kernels.fp8_sm90.layout import (
    SUPPORTED_HEAD_DIMS,
    Fp8Variant,
    all_variants,
    grid_check,
    normalize_window,
    variant_for,
)

_lock = threading.Lock()
_compiled: dict = {}  # variant, or (variant, config) for a config other than the table's -> kernel


class Fp8AttentionError(FA4InputError):
    """Arguments the SM90 FP8 forward cannot take (the message names what is wrong); an
    FA4InputError (and a ValueError) like every route's."""


# ----------------------------------------------------------------------------------------------
# Compilation
# ----------------------------------------------------------------------------------------------


def _fake_args(variant: Fp8Variant):
    import cutlass
    import cutlass.cute as cute

    d = variant.head_dim

    def fake(dtype, shape, leading, div):
        stride = tuple(1 if i == leading else cute.sym_int64(divisibility=div) for i in range(len(shape)))
        align = max(div * dtype.width // 8, 1) if leading is not None else dtype.width // 8
        return cute.runtime.make_fake_tensor(dtype, shape, stride=stride, assumed_align=align)

    sym = cute.sym_int
    q = fake(cutlass.Uint8, (sym(), sym(), d), 2, 16)
    k = fake(cutlass.Uint8, (sym(), sym(), d), 2, 16)
    vt = fake(cutlass.Uint8, (sym(), d, sym()), 2, 16)
    o = fake(cutlass.BFloat16, (sym(), sym(), d), 2, 8)
    cu_q = fake(cutlass.Int32, (sym(),), 0, 1)
    cu_k = fake(cutlass.Int32, (sym(),), 0, 1)
    desc = fake(cutlass.Float32, (3, sym(), sym()), 2, 1)
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    scalars = (cutlass.Float32(1.0), cutlass.Int32(0), cutlass.Int32(0), cutlass.Int32(1), cutlass.Int32(1))
    return (q, k, vt, o, cu_q, cu_k, desc, *scalars, stream)


_num_sms: dict = {}


def device_sm_count() -> int:
    """SMs of the current CUDA device (cached per device), or schedule.DEFAULT_NUM_SMS without a GPU
    (cross-compiles): the persistent kernel's grid is at most this many CTAs, baked into its
    compile (a host-side constant; the grid is then computed from the shapes alone)."""
    from sglang_fa4.kernels.fp8_sm90.schedule import DEFAULT_NUM_SMS

    if not torch.cuda.is_available():
        return DEFAULT_NUM_SMS
    index = torch.cuda.current_device()
    n = _num_sms.get(index)
    if n is None:
        n = _num_sms[index] = int(torch.cuda.get_device_properties(index).multi_processor_count)
    return n


def compile_variant(variant: Fp8Variant, options: str = "--enable-tvm-ffi", config=None):
    """cute.compile one variant with ``config`` (a kernel_config.Fp8KernelConfig; None: the table's
    default).  No GPU needed when CUTE_DSL_ARCH is set: cross-compiles."""
    from sglang_fa4.kernels import dsl_versions

    dsl_versions.require("fp8_sm90")  # a DSL that cannot build it: our message, not the DSL's
    import cutlass.cute as cute

    from sglang_fa4.kernels.fp8_sm90.forward import Fp8AttentionForwardSm90

    kernel = Fp8AttentionForwardSm90(variant.head_dim, causal=variant.causal, local=variant.local, config=config,
                                     num_sms=device_sm_count())
    return cute.compile(kernel, *_fake_args(variant), options=options)


def compiled_kernel(variant: Fp8Variant, config=None) -> Callable:
    """The compiled kernel of ``variant`` with ``config`` (kernel_config.Fp8KernelConfig; None: the
    table's), compiled on first use (a compile event for the JIT monitor)."""
    key = variant if config is None else (variant, config)
    fn = _compiled.get(key)
    if fn is not None:
        return fn
    event = None
    with _lock:
        fn = _compiled.get(key)
        if fn is None:
            t0 = time.perf_counter()
            fn = compile_variant(variant, config=config)
            event = {
                "variant": variant.as_dict(),
                "seconds": time.perf_counter() - t0,
                "capturing": torch.cuda.is_available() and torch.cuda.is_current_stream_capturing(),
            }
            if config is not None:
                event["config"] = dataclasses.asdict(config)
            _compiled[key] = fn
    if event is not None:  # outside the lock (a listener may raise: the kernel is kept)
        compile_events.record("fp8_forward", event)
    return fn


def warm_variant(variant: Fp8Variant, device=None) -> str:
    """The warmup registry's entry (family ``fp8_forward``): compile ``variant`` with the table's
    config now (no GPU tensors needed: CuTe DSL on fake tensors; the first call then only loads
    the module)."""
    before = compile_events.count("fp8_forward")
    compiled_kernel(variant)
    return "compiled" if compile_events.count("fp8_forward") > before else "cached"


#: the warmup registry's FP8 forward family (:mod:`sglang_fa4.kernels.warmup`)
FAMILIES = (KernelFamily("fp8_forward", "fp8_forward", warm_variant),)


# ----------------------------------------------------------------------------------------------
# Argument checks (CPU-testable: they run before anything touches a GPU)
# ----------------------------------------------------------------------------------------------

_FP8 = torch.float8_e4m3fn


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise Fp8AttentionError(msg)


def check_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, out=None, vt=None) -> tuple[int, int, int, int, int]:
    """Validate shapes/dtypes/layouts; returns (batch, Hq, Hkv, d, total_k)."""
    for name, t in (("q", q), ("k", k)) + ((("v", v),) if v is not None else ()):
        _need(isinstance(t, torch.Tensor), f"{name} must be a torch.Tensor, got {type(t).__name__}")
        _need(t.dtype == _FP8, f"{name} must be torch.float8_e4m3fn, got {t.dtype}")
        _need(t.dim() == 3, f"{name} must be (tokens, heads, head_dim), got shape {tuple(t.shape)}")
        _need(t.stride(-1) == 1, f"{name} must be contiguous in its head dim (stride {t.stride()})")
        _need(
            all(s % 16 == 0 for s in t.stride()[:2]) and t.data_ptr() % 16 == 0,
            f"{name}'s token/head strides and data pointer must be multiples of 16 bytes (TMA), "
            f"got strides {t.stride()}",
        )
    total_q, hq, d = q.shape
    total_k, hkv, dk = k.shape
    _need(dk == d, f"q and k head dims differ: {d} vs {dk}")
    if v is not None:
        _need(tuple(v.shape) == tuple(k.shape), f"v must have k's shape {tuple(k.shape)}, got {tuple(v.shape)}")
    _need(
        d in SUPPORTED_HEAD_DIMS,
        f"head dim {d} is not supported by the SM90 FP8 kernel (supported {SUPPORTED_HEAD_DIMS}; "
        "zero-pad to the next one, quantize_qkv does it)",
    )
    _need(hq > 0, f"q heads (0): q {tuple(q.shape)} must have at least one head")
    _need(hkv > 0 and hq % hkv == 0, f"q heads ({hq}) must be a multiple of kv heads ({hkv})")
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        _need(isinstance(cu, torch.Tensor), f"{name} must be a torch.Tensor")
        _need(cu.dtype == torch.int32, f"{name} must be int32, got {cu.dtype}")
        _need(cu.dim() == 1 and cu.shape[0] >= 2, f"{name} must be 1-D with batch+1 >= 2 entries")
        _need(cu.is_contiguous(), f"{name} must be contiguous")
    _need(
        cu_seqlens_q.shape[0] == cu_seqlens_k.shape[0],
        f"cu_seqlens_q and cu_seqlens_k must have the same length, got {cu_seqlens_q.shape[0]} and "
        f"{cu_seqlens_k.shape[0]}",
    )
    batch = cu_seqlens_q.shape[0] - 1
    if out is not None:
        _need(out.dtype == torch.bfloat16, f"out must be bfloat16, got {out.dtype}")
        _need(tuple(out.shape) == (total_q, hq, d), f"out must have shape {(total_q, hq, d)}, got {tuple(out.shape)}")
        _need(out.stride(-1) == 1, "out must be contiguous in its head dim")
    if vt is not None:
        _need(vt.dtype == torch.uint8, f"vt must be the uint8 buffer from pack_vt/quantize_qkv, got {vt.dtype}")
        _need(vt.dim() == 3 and vt.shape[0] == hkv and vt.shape[1] == d, f"vt must be (Hkv, d, cols), got {tuple(vt.shape)}")
        _need(vt.stride(-1) == 1 and vt.stride(1) % 16 == 0, "vt rows must be contiguous with a 16-byte-aligned stride")
    devices = {t.device for t in (q, k, v, cu_seqlens_q, cu_seqlens_k, out, vt) if t is not None}
    _need(len(devices) == 1, f"all tensors must be on one device, got {sorted(map(str, devices))}")
    return batch, hq, hkv, d, total_k


def check_device(device: torch.device) -> None:
    """The tensors' device must be an SM90 (Hopper) CUDA GPU: the kernel is built for sm_90a."""
    _need(device.type == "cuda", f"fp8_varlen_attention needs CUDA tensors, got {device}")
    index = device.index if device.index is not None else torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    _need(
        major == 9,
        f"the FP8 forward is built for SM90 (Hopper); {device} is sm_{major}{minor} (use bf16/fp16 "
        "q/k/v there: FA4)",
    )


def resolve_descale(descale, q_descale, k_descale, v_descale, batch: int, hkv: int, device) -> torch.Tensor:
    """The kernel's (3, batch, Hkv) float32 descales: ``descale`` as given (checked), or built from
    the three per-tensor ones (all None: unscaled E4M3).  Giving some of q/k/v_descale but not all,
    or ``descale`` with any of them, is an error: a forgotten descale silently scales the output.
    Runs on every call: the valid ``descale`` path formats no message (host time)."""
    others = (q_descale, k_descale, v_descale)
    if descale is not None and others == (None, None, None):
        if not (
            isinstance(descale, torch.Tensor)
            and descale.dtype is torch.float32
            and descale.shape == (3, batch, hkv)
            and descale.device == device
            and descale.is_contiguous()
        ):
            _check_descale(descale, batch, hkv, device)
        return descale
    given = [n for n, x in zip(("q_descale", "k_descale", "v_descale"), others) if x is not None]
    _need(descale is None, f"give either descale or q/k/v_descale, not both (got descale and {', '.join(given)})")
    _need(
        len(given) in (0, 3),
        f"q_descale, k_descale and v_descale go together (got only {', '.join(given)}); pass all three "
        "(quantize_qkv returns them) or none for unscaled E4M3",
    )
    return descale_tensor(q_descale, k_descale, v_descale, batch, hkv, device)


def _check_descale(descale, batch: int, hkv: int, device) -> None:
    _need(isinstance(descale, torch.Tensor), f"descale must be a torch.Tensor, got {type(descale).__name__}")
    _need(
        descale.dtype == torch.float32 and tuple(descale.shape) == (3, batch, hkv),
        f"descale must be float32 (3, batch, Hkv) = {(3, batch, hkv)}, got {descale.dtype} {tuple(descale.shape)}",
    )
    _need(descale.device == torch.device(device), f"descale must be on {device}, got {descale.device}")
    _need(descale.is_contiguous(), "descale must be contiguous")


def descale_tensor(q_descale, k_descale, v_descale, batch: int, hkv: int, device) -> torch.Tensor:
    """(3, batch, Hkv) float32 from per-(batch, kv head) descales; a scalar or 1-element tensor
    broadcasts; None means 1."""
    rows = []
    for name, x in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
        if x is None:
            rows.append(torch.ones((batch, hkv), dtype=torch.float32, device=device))
            continue
        if not isinstance(x, torch.Tensor):
            # a fill kernel, not a host-to-device copy: capturable in a CUDA graph
            rows.append(torch.full((batch, hkv), float(x), dtype=torch.float32, device=device))
            continue
        _need(x.dtype == torch.float32, f"{name} must be float32, got {x.dtype}")
        _need(x.device == torch.device(device), f"{name} must be on {device}, got {x.device}")
        _need(
            x.numel() == 1 or tuple(x.shape) == (batch, hkv),
            f"{name} must be a scalar or (batch, num_kv_heads) = {(batch, hkv)}, got {tuple(x.shape)}",
        )
        rows.append(x.reshape(()).expand(batch, hkv) if x.numel() == 1 else x)
    return torch.stack(rows).contiguous()


# ----------------------------------------------------------------------------------------------
# The call
# ----------------------------------------------------------------------------------------------


_checked: dict = {}
_windows: dict = {}


def _tsig(t):
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device)


def _signature(q, k, v, cu_q, cu_k, out, vt) -> tuple:
    """Everything check_inputs looks at except data pointers."""
    return (_tsig(q), _tsig(k), _tsig(v), _tsig(cu_q), _tsig(cu_k), _tsig(out), _tsig(vt))



def fp8_varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: Optional[torch.Tensor],
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: Optional[int],
    max_seqlen_k: Optional[int],
    *,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    descale: Optional[torch.Tensor] = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size=(None, None),
    out: Optional[torch.Tensor] = None,
    vt: Optional[torch.Tensor] = None,
    kernel_config=None,
) -> torch.Tensor:
    """Attention over E4M3 q (total_q, Hq, d), k/v (total_k, Hkv, d) -> bf16 (total_q, Hq, d).

    softmax(q k^T * softmax_scale * q_descale * k_descale) (v * v_descale), per (batch, kv head)
    descales.  ``vt`` (the permuted V^T from :func:`pack_vt` or ``quantize_qkv``) may replace ``v``;
    ``descale`` (3, batch, Hkv) float32 may replace the three descales; give all three, or
    ``descale``, or none (unscaled E4M3).  ``kernel_config``: a
    :class:`~sglang_fa4.kernels.fp8_sm90.kernel_config.Fp8KernelConfig` other than the table's
    (benchmarks; None in use).  SM90 only.  Bad arguments raise
    :class:`Fp8AttentionError` naming what is wrong.
    """
    # Host time matters (a ViT calls this 24-32 times per image): the full checks run once per
    # tensor-metadata signature; later calls with the same signature only re-check pointer alignment.
    # Every check runs before the GPU is asked what it is (check_device).
    check_scalars(max_seqlen_q, softmax_scale, q)
    sig = _signature(q, k, v, cu_seqlens_q, cu_seqlens_k, out, vt)
    checked = _checked.get(sig)
    if checked is None:
        checked = check_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, out, vt)
        _need(v is not None or vt is not None, "give v or vt")
        check_device(q.device)
        if len(_checked) > 4096:
            _checked.clear()
        _checked[sig] = checked
    else:
        _need(
            not ((q.data_ptr() | k.data_ptr() | (vt.data_ptr() if vt is not None else 0)) & 15),
            "q, k and vt data pointers must be 16-byte aligned (TMA)",
        )
    batch, hq, hkv, d, total_k = checked
    max_q = grid_check(max_seqlen_q, q.shape[0])
    if max_seqlen_k is None:
        max_seqlen_k = total_k
    wkey = (bool(causal), tuple(window_size) if window_size is not None else None, d)
    resolved = _windows.get(wkey)
    if resolved is None:
        c, loc, left, right = normalize_window(causal, window_size)
        resolved = (variant_for(d, c, (left, right) if loc else (None, 0) if c else None), left, right)
        _windows[wkey] = resolved
    variant, left, right = resolved
    if softmax_scale is None:
        softmax_scale = d ** -0.5
    descale = resolve_descale(descale, q_descale, k_descale, v_descale, batch, hkv, q.device)
    if vt is None:
        from sglang_fa4.kernels.fp8_sm90.vt_pack import pack_vt

        vt = pack_vt(v, cu_seqlens_k, max_seqlen_k)
    if out is None:
        out = torch.empty(q.shape, dtype=torch.bfloat16, device=q.device)
    fn = compiled_kernel(variant, kernel_config)
    fn(
        q.view(torch.uint8),
        k.view(torch.uint8),
        vt,
        out,
        cu_seqlens_q,
        cu_seqlens_k,
        descale,
        float(softmax_scale) * 1.4426950408889634,
        int(left),
        int(right),
        hq // hkv,
        max_q,
    )
    return out
