"""FlashAttention-3's Hopper forward as a benchmark baseline, without sgl-kernel.

SGLang's own Hopper defaults -- ``fa3`` for the ViT and for the language model with an fp8_e4m3 KV
cache -- run FA3 from sgl-kernel, a wheel built for one torch that the GPU machine cannot install.
``benchmark/fa3_build/build.sh`` compiles the few FA3 kernels our comparisons need from FA3's pinned
sources into ``.fa3/libfa3fwd.so`` behind a plain C ABI (``benchmark/fa3_build/fa3_capi.cu``); this
module loads it with ctypes and hands it tensor data pointers, so nothing couples it to torch's ABI.

What the build has (anything else raises :class:`Fa3Unavailable` before launching):

* :func:`paged_fp8` -- SGLang's fa3 call on an E4M3 paged KV cache: E4M3 q / K / V pages, bf16
  out, page table + cache_seqlens + cu_seqlens_q, k/v (and q) descales of shape (batch, Hkv),
  causal, head dim 128 or 256.  :func:`paged_bf16` -- the same call on a bf16 cache.  Both with
  FA3's split-KV as SGLang gets it: ``num_splits=0`` (SGLang's value) lets FA3 choose
  (``get_num_splits``, then its varlen scheduler per batch) and run its combine; :func:`plan`
  tells the choice without launching.
* :func:`varlen_bf16` -- the ViT call: bf16 varlen self-attention, non-causal, equal q/kv heads,
  head dim <= 128 (FA3 rounds 72 and 80 up to its 96 kernel).
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

LIB_NAME = "libfa3fwd.so"
#: Where build.sh writes the library: <repo>/.fa3/ (git-ignored; carried to the GPU machine).
DEFAULT_PATH = Path(__file__).resolve().parents[2] / ".fa3" / LIB_NAME


class Fa3Unavailable(RuntimeError):
    """The FA3 library is absent, not loadable here, or lacks the asked-for kernel."""


_FIELDS = (
    "struct_size dtype q k v out lse q_row_stride q_head_stride k_row_stride k_head_stride k_batch_stride "
    "v_row_stride v_head_stride v_batch_stride o_row_stride o_head_stride cu_seqlens_q cu_seqlens_k seqused_k "
    "page_table page_table_batch_stride q_descale k_descale v_descale q_descale_batch_stride "
    "q_descale_head_stride k_descale_batch_stride k_descale_head_stride v_descale_batch_stride "
    "v_descale_head_stride batch max_seqlen_q max_seqlen_k total_q total_k num_heads num_heads_k head_dim "
    "page_size num_pages max_pages_per_seq causal softmax_scale workspace workspace_ints stream "
    "num_splits pack_gqa oaccum lseaccum oaccum_floats lseaccum_floats"
).split()


class _Args(ctypes.Structure):
    """Mirror of ``struct fa3_args`` (every field 64-bit; the library checks the size)."""

    _fields_ = [(n, ctypes.c_double if n == "softmax_scale" else ctypes.c_int64) for n in _FIELDS]


_LIB: dict[str, Any] = {}


def load(path: str | Path | None = None):
    """The loaded library (cached per path); :class:`Fa3Unavailable` when it is absent or unusable."""
    p = str(Path(path) if path else DEFAULT_PATH)
    if p in _LIB:
        return _LIB[p]
    if not Path(p).is_file():
        raise Fa3Unavailable(f"{p} not built (bash benchmark/fa3_build/build.sh)")
    try:
        lib = ctypes.CDLL(p)
    except OSError as exc:
        raise Fa3Unavailable(f"{p} does not load: {exc}") from None
    lib.fa3_fwd.argtypes = [ctypes.POINTER(_Args), ctypes.c_char_p, ctypes.c_int64]
    lib.fa3_fwd.restype = ctypes.c_int
    if not hasattr(lib, "fa3_plan"):
        raise Fa3Unavailable(f"{p} predates split-KV (no fa3_plan): rebuild with benchmark/fa3_build/build.sh")
    lib.fa3_plan.argtypes = [ctypes.POINTER(_Args), ctypes.POINTER(ctypes.c_int64), ctypes.c_char_p, ctypes.c_int64]
    lib.fa3_plan.restype = ctypes.c_int
    lib.fa3_args_size.restype = ctypes.c_int64
    lib.fa3_workspace_ints.argtypes = [ctypes.c_int64]
    lib.fa3_workspace_ints.restype = ctypes.c_int64
    lib.fa3_kernels.restype = ctypes.c_char_p
    if lib.fa3_args_size() != ctypes.sizeof(_Args):
        raise Fa3Unavailable(f"{p}: fa3_args is {lib.fa3_args_size()} bytes, this module has {ctypes.sizeof(_Args)}")
    _LIB[p] = lib
    return lib


def available(path: str | Path | None = None) -> bool:
    try:
        load(path)
        return True
    except Fa3Unavailable:
        return False


def kernels(path: str | Path | None = None) -> list[str]:
    """Names of the kernels the library was built with."""
    return load(path).fa3_kernels().decode().split()


def build_source(path: str | Path | None = None) -> str | None:
    """"flash-attention <commit12> (nvcc <version>)" from the BUILD_INFO beside the library, or None."""
    info = Path(path or DEFAULT_PATH).with_name("BUILD_INFO")
    try:
        lines = info.read_text().splitlines()
    except OSError:
        return None
    commit = lines[0].split()[1][:12] if lines and len(lines[0].split()) > 1 else "?"
    nvcc = next((ln for ln in lines if ln.startswith("nvcc ")), "")
    return f"flash-attention {commit}" + (f" ({nvcc})" if nvcc else "")


def workspace(batch: int, device, path: str | Path | None = None):
    """The int32 scratch one call needs (allocate once and pass it to keep calls allocation-free)."""
    import torch

    return torch.empty(int(load(path).fa3_workspace_ints(batch)), dtype=torch.int32, device=device)


class Fa3Plan(tuple):
    """What FA3 decides for one call: (num_splits, pack_gqa, oaccum floats, lseaccum floats, built)."""

    __slots__ = ()
    num_splits = property(lambda s: s[0])
    pack_gqa = property(lambda s: s[1])
    oaccum_floats = property(lambda s: s[2])
    lseaccum_floats = property(lambda s: s[3])
    built = property(lambda s: s[4])


def _args(fields: dict) -> _Args:
    return _Args(struct_size=ctypes.sizeof(_Args), **{"pack_gqa": -1, **fields})


def _plan(lib, fields: dict) -> Fa3Plan:
    out = (ctypes.c_int64 * 5)()
    err = ctypes.create_string_buffer(256)
    if lib.fa3_plan(ctypes.byref(_args(fields)), out, err, len(err)) != 0:
        raise Fa3Unavailable(f"fa3_plan: {err.value.decode()}")
    return Fa3Plan((int(out[0]), bool(out[1]), int(out[2]), int(out[3]), bool(out[4])))


def _launch(lib, fields: dict) -> None:
    err = ctypes.create_string_buffer(256)
    if lib.fa3_fwd(ctypes.byref(_args(fields)), err, len(err)) != 0:
        raise Fa3Unavailable(f"fa3_fwd: {err.value.decode()}")


class Scratch:
    """The buffers one call site reuses (allocated on first use, grown when a call needs more, never
    inside a CUDA-graph capture: warm the call once before capturing it): the scheduler's int32
    workspace and the fp32 split partials."""

    def __init__(self):
        self.ws = self.oaccum = self.lseaccum = None

    def fields(self, lib, fields: dict, device) -> dict:
        import torch

        need_ws = int(lib.fa3_workspace_ints(fields["batch"]))
        if self.ws is None or self.ws.numel() < need_ws:
            self.ws = torch.empty(need_ws, dtype=torch.int32, device=device)
        fields = dict(fields, workspace=self.ws.data_ptr(), workspace_ints=self.ws.numel())
        p = _plan(lib, fields)
        if not p.built:
            return fields  # fa3_fwd names the missing kernel
        if p.oaccum_floats:
            if self.oaccum is None or self.oaccum.numel() < p.oaccum_floats:
                self.oaccum = torch.empty(p.oaccum_floats, dtype=torch.float32, device=device)
            if self.lseaccum is None or self.lseaccum.numel() < p.lseaccum_floats:
                self.lseaccum = torch.empty(p.lseaccum_floats, dtype=torch.float32, device=device)
            fields.update(oaccum=self.oaccum.data_ptr(), lseaccum=self.lseaccum.data_ptr(),
                          oaccum_floats=self.oaccum.numel(), lseaccum_floats=self.lseaccum.numel())
        return fields


def _common(lib, q, out, lse, ws, batch, device) -> tuple[Any, Any, dict]:
    import torch

    total_q, heads, d = q.shape
    if out is None:
        out = torch.empty(total_q, heads, d, dtype=torch.bfloat16, device=device)
    if lse is None:
        lse = torch.empty(heads, total_q, dtype=torch.float32, device=device)
    if out.dtype != torch.bfloat16 or out.stride(-1) != 1 or tuple(out.shape) != (total_q, heads, d):
        raise ValueError("out must be bf16 (total_q, heads, d) with a contiguous last dim")
    if q.stride(-1) != 1:
        raise ValueError("q must have a contiguous last dim")
    fields = dict(
        q=q.data_ptr(), out=out.data_ptr(), lse=lse.data_ptr(), q_row_stride=q.stride(0), q_head_stride=q.stride(1),
        o_row_stride=out.stride(0), o_head_stride=out.stride(1), total_q=total_q, num_heads=heads, head_dim=d,
        batch=batch, stream=torch.cuda.current_stream(device).cuda_stream,
    )
    if ws is not None:  # a bare workspace tensor (the one-split callers): no split partials
        fields.update(workspace=ws.data_ptr(), workspace_ints=ws.numel())
    return out, lse, fields


def _paged_fields(q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, max_seqlen_q, k_descale,
                  v_descale, q_descale, softmax_scale, causal, num_splits, pack_gqa) -> dict:
    import torch

    batch = page_table.shape[0]
    f = dict(
        dtype=1 if q.dtype == torch.float8_e4m3fn else 0, k=k_cache.data_ptr(), v=v_cache.data_ptr(),
        k_row_stride=k_cache.stride(1), k_head_stride=k_cache.stride(2), k_batch_stride=k_cache.stride(0),
        v_row_stride=v_cache.stride(1), v_head_stride=v_cache.stride(2), v_batch_stride=v_cache.stride(0),
        cu_seqlens_q=cu_seqlens_q.data_ptr(), seqused_k=cache_seqlens.data_ptr(),
        page_table=page_table.data_ptr(), page_table_batch_stride=page_table.stride(0),
        max_seqlen_q=int(max_seqlen_q), num_heads_k=k_cache.shape[2], page_size=k_cache.shape[1],
        num_pages=k_cache.shape[0], max_pages_per_seq=page_table.shape[1], total_k=batch * k_cache.shape[1],
        causal=int(bool(causal)), softmax_scale=softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5,
        num_splits=int(num_splits or 0), pack_gqa=-1 if pack_gqa is None else int(bool(pack_gqa)),
    )
    for name, t in (("q", q_descale), ("k", k_descale), ("v", v_descale)):
        if t is not None:
            if t.dtype != torch.float32 or tuple(t.shape) != (batch, k_cache.shape[2]):
                raise ValueError(f"{name}_descale must be float32 (batch, Hkv)")
            f.update({f"{name}_descale": t.data_ptr(), f"{name}_descale_batch_stride": t.stride(0),
                      f"{name}_descale_head_stride": t.stride(1)})
    return f


def _paged(dtype, q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, max_seqlen_q, *, k_descale=None,
           v_descale=None, q_descale=None, softmax_scale=None, causal=True, out=None, lse=None, ws=None,
           scratch: Scratch | None = None, num_splits: int = 0, pack_gqa=None, path=None):
    import torch

    lib = load(path)
    if q.dtype != dtype or k_cache.dtype != dtype or v_cache.dtype != dtype:
        raise ValueError(f"q, k_cache and v_cache must be {dtype}")
    if dtype == torch.bfloat16 and (k_descale is not None or v_descale is not None or q_descale is not None):
        raise ValueError("descales are for E4M3 caches")
    out, lse, f = _common(lib, q, out, lse, ws, page_table.shape[0], q.device)
    f.update(_paged_fields(q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, max_seqlen_q, k_descale,
                           v_descale, q_descale, softmax_scale, causal, num_splits, pack_gqa))
    if ws is None:
        f = (scratch or Scratch()).fields(lib, f, q.device)
    _launch(lib, f)
    return out


def paged_fp8(q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, max_seqlen_q: int, **kw):
    """FA3's forward on an E4M3 paged KV cache, called as SGLang's fa3 backend calls
    ``flash_attn_with_kvcache`` (q (total_q, H, d) E4M3; k/v_cache (pages, page_size, Hkv, d) E4M3;
    page_table int32 (batch, pages per seq); cache_seqlens int32 (batch,)). Returns bf16 ``out``.
    Keywords: k/v/q_descale (float32 (batch, Hkv)), softmax_scale, causal, out, lse; ``scratch``
    (a :class:`Scratch` the call site keeps: graph-capturable once warmed) or ``ws`` (a bare
    workspace: one split only); ``num_splits`` (0: FA3 decides, SGLang's call) and ``pack_gqa``
    (None: FA3 decides)."""
    import torch

    return _paged(torch.float8_e4m3fn, q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, max_seqlen_q,
                  **kw)


def paged_bf16(q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, max_seqlen_q: int, **kw):
    """:func:`paged_fp8` on a bf16 cache (SGLang's fa3 call with the default KV dtype): no descales."""
    import torch

    return _paged(torch.bfloat16, q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, max_seqlen_q, **kw)


def plan(q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, max_seqlen_q: int, *, causal: bool = True,
         num_splits: int = 0, pack_gqa=None, path=None) -> Fa3Plan:
    """What FA3 decides for this paged call (split count, pack_gqa, partial sizes, whether this
    build has the kernel), launching nothing."""
    import torch

    lib = load(path)
    ws = torch.empty(int(lib.fa3_workspace_ints(page_table.shape[0])), dtype=torch.int32, device=q.device)
    _, _, f = _common(lib, q, None, None, ws, page_table.shape[0], q.device)
    f.update(_paged_fields(q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, max_seqlen_q, None, None,
                           None, None, causal, num_splits, pack_gqa))
    return _plan(lib, f)


def varlen_bf16(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int, *,
                softmax_scale: float | None = None, out=None, lse=None, ws=None, path=None):
    """FA3's bf16 varlen forward, non-causal (the ViT call): q/k/v (total, H, d). Returns ``out``."""
    import torch

    lib = load(path)
    if q.dtype != torch.bfloat16 or k.dtype != torch.bfloat16 or v.dtype != torch.bfloat16:
        raise ValueError("q, k and v must be bf16")
    batch = cu_seqlens_q.shape[0] - 1
    if ws is None:
        ws = workspace(batch, q.device)
    out, lse, f = _common(lib, q, out, lse, ws, batch, q.device)
    f.update(
        dtype=0, k=k.data_ptr(), v=v.data_ptr(), k_row_stride=k.stride(0), k_head_stride=k.stride(1),
        v_row_stride=v.stride(0), v_head_stride=v.stride(1), cu_seqlens_q=cu_seqlens_q.data_ptr(),
        cu_seqlens_k=cu_seqlens_k.data_ptr(), max_seqlen_q=int(max_seqlen_q), max_seqlen_k=int(max_seqlen_k),
        num_heads_k=k.shape[1], total_k=k.shape[0], causal=0,
        softmax_scale=softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5,
    )
    _launch(lib, f)
    return out


#: what sgl-kernel's flash_attn_with_kvcache takes beyond paged_fp8's arguments, with the values
#: that leave its result unchanged (anything else is refused: this build has no such kernel)
_KVCACHE_NEUTRAL = {
    "k": (None,), "v": (None,), "qv": (None,), "rotary_cos": (None,), "rotary_sin": (None,),
    "cache_batch_idx": (None,), "cache_leftpad": (None,), "rotary_seqlens": (None,),
    "window_size": ((-1, -1), [-1, -1], None), "attention_chunk": (None, 0), "softcap": (0.0, None),
    "scheduler_metadata": (None,), "only_qv": (False,), "return_softmax_lse": (False,), "sinks": (None,),
}
#: arguments without an effect on this build's kernels (no new k/v to append, no rotary, no SM margin)
_KVCACHE_HINTS = ("cu_seqlens_k_new", "sm_margin", "rotary_interleaved")
_KVCACHE_USED = ("q", "k_cache", "v_cache", "cache_seqlens", "page_table", "cu_seqlens_q", "max_seqlen_q",
                 "q_descale", "k_descale", "v_descale", "softmax_scale", "causal", "out", "num_splits", "pack_gqa")


def _neutral(value, allowed) -> bool:
    if value is None:
        return None in allowed
    return not hasattr(value, "shape") and any(n is not None and value == n for n in allowed)


def sgl_kernel_kvcache(impl=None):
    """A function with sgl-kernel's ``flash_attn_with_kvcache`` signature (positional order as
    SGLang's ``flash_attention_v3`` wrapper passes it) running :func:`paged_fp8` (or ``impl``, of
    paged_fp8's signature: a torch model in CPU tests). What the build lacks (appending k/v, rotary,
    windows, softcap, LSE, sinks, precomputed scheduler metadata) raises :class:`Fa3Unavailable`
    naming it; ``num_splits`` (SGLang passes 0: FA3 decides) and ``pack_gqa`` go to FA3 as given.
    One :class:`Scratch` per returned function: SGLang warms each decode graph before capturing it."""
    run = impl or paged_fp8
    scratch = Scratch()
    names = ("q", "k_cache", "v_cache", "k", "v", "qv", "rotary_cos", "rotary_sin", "cache_seqlens",
             "cache_batch_idx", "cache_leftpad", "page_table", "cu_seqlens_q", "cu_seqlens_k_new", "max_seqlen_q",
             "rotary_seqlens", "q_descale", "k_descale", "v_descale", "softmax_scale", "causal", "window_size",
             "attention_chunk", "softcap", "rotary_interleaved", "scheduler_metadata", "num_splits", "pack_gqa")

    def flash_attn_with_kvcache(*args, **kwargs):
        if len(args) > len(names):
            raise TypeError(f"flash_attn_with_kvcache takes at most {len(names)} positional arguments")
        call = dict(zip(names, args))
        for key in kwargs:
            if key in call:
                raise TypeError(f"flash_attn_with_kvcache got multiple values for {key}")
        call.update(kwargs)
        for key, value in call.items():
            if key in _KVCACHE_NEUTRAL:
                if not _neutral(value, _KVCACHE_NEUTRAL[key]):
                    raise Fa3Unavailable(f"the FA3 build has no kernel for {key}={_describe(value)}")
            elif key not in _KVCACHE_USED and key not in _KVCACHE_HINTS:
                raise TypeError(f"flash_attn_with_kvcache got an unexpected argument {key}")
        if call.get("page_table") is None or call.get("cu_seqlens_q") is None:
            raise Fa3Unavailable("the FA3 build runs the paged varlen call only (page_table and cu_seqlens_q)")
        return run(call["q"], call["k_cache"], call["v_cache"], call["page_table"], call["cache_seqlens"],
                   call["cu_seqlens_q"], call["max_seqlen_q"], k_descale=call.get("k_descale"),
                   v_descale=call.get("v_descale"), q_descale=call.get("q_descale"),
                   softmax_scale=call.get("softmax_scale"), causal=bool(call.get("causal", False)),
                   out=call.get("out"), num_splits=int(call.get("num_splits") or 0), pack_gqa=call.get("pack_gqa"),
                   **({} if impl is not None else {"scratch": scratch}))

    return flash_attn_with_kvcache


def _describe(value) -> str:
    shape = getattr(value, "shape", None)
    return f"<tensor {tuple(shape)}>" if shape is not None else repr(value)[:60]
