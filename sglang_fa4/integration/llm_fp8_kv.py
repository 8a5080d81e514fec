"""SGLang's LLM attention with an FP8 E4M3 KV cache on Hopper (issue #17): the hooks.

* ``default_attn_backend``: AROUND ``get_default_attn_backend`` (SGLang's server-args resolution,
  called only when no ``--attention-backend`` was given): the fa3 -> fa4 upgrade of
  :mod:`sglang_fa4.llm_selection`, when ``SGLANG_FA4_FP8_KV_UPGRADE`` is on.
* ``prepare_paged_mha_query``: AROUND ``FlashAttentionBackend.prepare_paged_mha_query``: SGLang casts
  q to the KV dtype and hands out the pool's ``k_scale``/``v_scale`` as descales for fa3 and for fa4
  decode, but not for fa4 extend (FA4's own FP8 path is SM100-only there); on our route extend
  gets the same treatment as decode. Over head dim 256 (Gemma-4's 512) SGLang keeps q bf16 and
  passes no descales at all: the route takes that bf16 q (:data:`BF16_QUERY_HEAD_DIMS`) and the
  hook adds the pool's descales.
* ``flash_attn_with_kvcache``: AROUND SGLang's ``flash_attn_with_kvcache`` dispatcher (the one
  call site of FA for paged MHA in ``flashattention_backend``, extend and decode): ``ver=4`` with an
  E4M3 cache on an SM90 GPU goes to :func:`sglang_fa4.kernels.fp8_paged_kv.paged_kv_attention`;
  everything else (other versions, bf16 caches, other GPUs) calls SGLang's code unchanged.
  Decode and short extends run the paged split-KV kernel that reads the pool in place, which also
  returns the LSE SGLang's cascade attention asks for (``return_softmax_lse``: such a call always
  takes that kernel), and so do all calls at head dim 512 (prefills included).
  Gemma-4's image prefill (SGLang 0.5.22+: its image ``mask_mod`` with the per-row image ranges)
  runs the split-KV kernel with the ranges (:func:`image_mask_window`).
  A feature the FP8 kernels lack (softcap, sinks, score mods, other mask mods, ...) raises
  :class:`FP8KVRouteError` naming it: FA4 itself would only fail with an SM100 assert.
"""

from __future__ import annotations

import inspect
import logging
from typing import Optional

from sglang_fa4 import llm_selection

logger = logging.getLogger("sglang_fa4")

DEFAULT_ATTN_BACKEND = "sglang.srt.arg_groups.model_override_base.get_default_attn_backend"
FA_DISPATCH = "sglang.kernels.ops.attention.flash_attention.flash_attn_with_kvcache"
FA_BACKEND = "sglang.srt.layers.attention.flashattention_backend.FlashAttentionBackend"
PREPARE_QUERY = f"{FA_BACKEND}.prepare_paged_mha_query"

_logged: set = set()

#: head dims whose layers SGLang hands the route a bf16 q; the route takes bf16 q for these and
#: E4M3 q elsewhere. SGLang 0.5.20-0.5.23's ``prepare_paged_mha_query`` casts q to the pool's E4M3
#: and passes ``layer.k_scale``/``v_scale`` as (batch, kv heads) descales only when
#: ``layer.head_dim <= 256``: Gemma-4's full-attention layers (512) reach fa4 with q in the model's
#: dtype (bf16) and no descales, decode and extend alike, though the pool holds K / k_scale (our
#: hook below adds the descales back). The split-KV kernel runs 512 at every call size.
BF16_QUERY_HEAD_DIMS: tuple = (512,)


class FP8KVRouteError(NotImplementedError):
    """fa4 on an FP8 KV cache on SM90 was asked for something the SM90 FP8 kernel does not do."""


# ------------------------------------------------------------------------------------------------
# Selection (server args)
# ------------------------------------------------------------------------------------------------


def model_facts(model_config, use_mla: bool) -> Optional[llm_selection.LlmModelFacts]:
    """What the rule needs, read off SGLang's ModelConfig (None when it has no head dim)."""
    head_dim = getattr(model_config, "head_dim", None)
    if not head_dim:
        return None
    text = getattr(model_config, "hf_text_config", None) or getattr(model_config, "hf_config", None)
    softcap = getattr(text, "attn_logit_softcapping", None) or 0.0
    archs = getattr(getattr(model_config, "hf_config", None), "architectures", None) or []
    if any(a.startswith("Grok") for a in archs) and not softcap:
        softcap = 30.0  # SGLang's grok.py: attn_logit_softcapping defaults to 30
    swa = tuple(
        d for d in (getattr(model_config, "swa_head_dim", None), getattr(model_config, "swa_v_head_dim", None))
        if d and d != head_dim
    )
    return llm_selection.LlmModelFacts(
        head_dim=int(head_dim),
        v_head_dim=int(getattr(model_config, "v_head_dim", None) or head_dim),
        softcap=float(softcap),
        use_mla=bool(use_mla),
        swa_head_dims=swa,
    )


def default_attn_backend(original, server_args, use_mla_backend, model_config):
    """AROUND get_default_attn_backend(server_args, use_mla_backend, model_config)."""
    upstream = original(server_args, use_mla_backend, model_config)
    from sglang.srt.arg_groups.model_override_base import resolving_view
    from sglang.srt.runtime_context import get_platform

    cfg = resolving_view(server_args)
    platform = get_platform()
    capability = (9, 0) if getattr(platform, "is_sm90", False) else None
    choice = llm_selection.fp8_kv_upgrade(
        upstream,
        capability=capability,
        kv_cache_dtype=getattr(cfg, "kv_cache_dtype", None),
        explicit_backend=bool(getattr(cfg, "prefill_attention_backend", None)
                              or getattr(cfg, "decode_attention_backend", None)),
        deterministic=bool(getattr(cfg, "enable_deterministic_inference", False)),
        model=model_facts(model_config, use_mla_backend),
    )
    if capability is not None and getattr(cfg, "kv_cache_dtype", None) == llm_selection.FP8_KV_DTYPE:
        key = (choice.backend, choice.reason)
        if key not in _logged:
            _logged.add(key)
            logger.info("sglang-fa4: LLM attention backend %s: %s", choice.backend, choice.reason)
    return choice.backend


# ------------------------------------------------------------------------------------------------
# Runtime route
# ------------------------------------------------------------------------------------------------

_sm90_devices: dict = {}


def is_sm90(device) -> bool:
    """A CUDA device of compute capability 9.x (cached per device index)."""
    if getattr(device, "type", None) != "cuda":
        return False
    import torch

    if not torch.cuda.is_available():
        return False

    index = device.index if device.index is not None else torch.cuda.current_device()
    hit = _sm90_devices.get(index)
    if hit is None:
        hit = _sm90_devices[index] = torch.cuda.get_device_capability(index)[0] == 9
    return hit


def backend_routes_fp8(backend) -> bool:
    """This FlashAttentionBackend's paged MHA calls take the FP8 route."""
    import torch

    return (
        getattr(backend, "fa_impl_ver", None) == 4
        and getattr(backend, "kv_cache_dtype_str", None) == llm_selection.FP8_KV_DTYPE
        and getattr(backend, "kv_cache_dtype", None) is torch.float8_e4m3fn
        and not getattr(backend, "use_mla", False)
        and is_sm90(torch.device(getattr(backend, "device", "cpu")))
    )


def prepare_paged_mha_query(original, self, q, q_rope, k_rope, layer, *, logical_batch_size, kv_head_num,
                            is_prefill):
    """AROUND FlashAttentionBackend.prepare_paged_mha_query: on the FP8 route, extend casts q and
    passes the pool's descales exactly as decode (and SGLang's fa3 path) does; at the head dims
    SGLang leaves q bf16 (:data:`BF16_QUERY_HEAD_DIMS`) q stays bf16 and the pool's descales are
    passed too (SGLang drops them there, but its pool write divides K and V by them at every head
    dim, and its triton backend applies them)."""
    wide = getattr(layer, "head_dim", None) in BF16_QUERY_HEAD_DIMS
    routed = (is_prefill or wide) and backend_routes_fp8(self)
    if is_prefill and routed:
        is_prefill = False
    q, q_rope, k_rope, k_descale, v_descale = original(self, q, q_rope, k_rope, layer,
                                                       logical_batch_size=logical_batch_size,
                                                       kv_head_num=kv_head_num, is_prefill=is_prefill)
    if routed and wide and k_descale is None and getattr(layer, "k_scale", None) is not None:
        k_descale = layer.k_scale.expand((logical_batch_size, kv_head_num))
        v_descale = layer.v_scale.expand((logical_batch_size, kv_head_num))
    return q, q_rope, k_rope, k_descale, v_descale


# Arguments the route honours; any other argument must keep its default (checked by value).
_USED = {"q", "k_cache", "v_cache", "page_table", "cache_seqlens", "cu_seqlens_q", "max_seqlen_q",
         "k_descale", "v_descale", "q_descale", "softmax_scale", "causal", "window_size", "out", "ver",
         "return_softmax_lse", "mask_mod", "aux_tensors"}
# Accepted and ignored: split/scheduling hints of FA3/FA4 that do not change the result.
_IGNORED = {"cu_seqlens_k_new", "num_splits", "pack_gqa", "scheduler_metadata", "sm_margin", "max_seqlen_k",
            "rotary_interleaved", "only_qv"}
_NEUTRAL = {"softcap": (0.0, None), "attention_chunk": (None, 0)}

_signatures: dict = {}

#: SGLang 0.5.22+'s Gemma-4 image prefill with fa4 (``models/gemma4_mm.prepare_attn_masks``,
#: ``FlashAttentionBackend.forward_extend``): ``mask_mod=make_image_mask_mod(window_left)`` (a cached
#: ``cute.jit`` callback), ``aux_tensors=[image_token_ranges, cu_seqlens_q]`` -- per query row its
#: image's inclusive absolute key positions (begin, end), -1 for text -- and ``causal=False``,
#: ``window_size=(-1, -1)``, the callback doing both: keep ``kv <= pos or begin <= kv <= end``, and
#: ``kv >= pos - window_left`` when window_left >= 0. The split-KV kernel takes the ranges as they are.
IMAGE_MASK_MODULE = "sglang.kernels.ops.attention.flash_attention_v4"
IMAGE_MASK_QUALNAME = "make_image_mask_mod.<locals>.image_mask"


def image_mask_window(mask_mod) -> Optional[int]:
    """The ``window_left`` SGLang built its image mask callback with (-1: none); None when
    ``mask_mod`` is any other callback."""
    fn = getattr(mask_mod, "__wrapped__", mask_mod)  # cute.jit's wrapper keeps the function there
    if getattr(fn, "__module__", None) != IMAGE_MASK_MODULE or getattr(fn, "__qualname__", None) != IMAGE_MASK_QUALNAME:
        return None
    try:
        window = inspect.getclosurevars(fn).nonlocals.get("window_left")
    except TypeError:
        return None
    return window if isinstance(window, int) and not isinstance(window, bool) else None


def _image_call(call: dict):
    """(image_ranges, causal, window_size) of a call with SGLang's image mask (the route's causal mask
    widened by the ranges); (None, causal, window) without a mask_mod. Anything else is refused."""
    mask_mod, aux = call.get("mask_mod"), call.get("aux_tensors")
    causal, window = bool(call.get("causal", False)), call.get("window_size", (-1, -1))
    if mask_mod is None:
        if aux is not None:
            raise FP8KVRouteError(f"aux_tensors={_short(aux)} without SGLang's image mask_mod: the FP8 KV route "
                                  "does not take it")
        return None, causal, window
    window_left = image_mask_window(mask_mod)
    if window_left is None:
        raise FP8KVRouteError(
            f"fa4 with an fp8_e4m3 KV cache on SM90 runs sglang-fa4's FP8 kernel, which takes only SGLang's "
            f"Gemma-4 image mask as mask_mod, not {_short(mask_mod)} (use --attention-backend triton for this model)")
    if not (isinstance(aux, (list, tuple)) and len(aux) == 2 and aux[1] is call.get("cu_seqlens_q")):
        raise FP8KVRouteError("SGLang's image mask_mod comes with aux_tensors=[image_token_ranges, cu_seqlens_q] "
                              f"(the call's own cu_seqlens_q), got {_short(aux)}")
    if causal or tuple(window) != (-1, -1):
        raise FP8KVRouteError(f"SGLang's image mask_mod comes with causal=False, window_size=(-1, -1) (the mask "
                              f"is both), got causal={causal}, window_size={window}")
    return aux[0], True, ((window_left, 0) if window_left >= 0 else (-1, -1))


def _bind(original, args, kwargs) -> dict:
    sig = _signatures.get(original)
    if sig is None:
        sig = _signatures[original] = inspect.signature(original)
    return dict(sig.bind(*args, **kwargs).arguments)


def flash_attn_with_kvcache(original, *args, **kwargs):
    """AROUND SGLang's flash_attn_with_kvcache(q, k_cache, v_cache, ..., ver=3)."""
    import torch

    k_cache = args[1] if len(args) > 1 else kwargs.get("k_cache")
    if (
        kwargs.get("ver", 3) != 4
        or getattr(k_cache, "dtype", None) is not torch.float8_e4m3fn
        or not is_sm90(k_cache.device)
    ):
        return original(*args, **kwargs)
    return route_fp8(_bind(original, args, kwargs))


def route_fp8(call: dict):
    """Run one bound flash_attn_with_kvcache call on the SM90 FP8 kernel."""
    for name, value in call.items():
        if name in _USED or name in _IGNORED:
            continue
        if name in _NEUTRAL:
            if value in _NEUTRAL[name]:
                continue
        elif value is None:
            continue
        raise FP8KVRouteError(
            f"fa4 with an fp8_e4m3 KV cache on SM90 runs sglang-fa4's FP8 kernel, which does not support "
            f"{name}={_short(value)} (use --attention-backend fa3 or triton for this model/mode)"
        )
    if call.get("page_table") is None or call.get("cu_seqlens_q") is None:
        raise FP8KVRouteError("the FP8 KV route needs page_table and cu_seqlens_q (SGLang's paged varlen call)")
    import torch

    q = call["q"]
    head_dim = q.shape[-1]
    if head_dim in BF16_QUERY_HEAD_DIMS:
        if q.dtype is not torch.bfloat16:
            raise FP8KVRouteError(
                f"q is {q.dtype} at head_dim {head_dim} on an fp8_e4m3 KV cache: SGLang hands these layers a "
                f"bf16 q (it casts q only up to head dim 256), and the route takes bf16 q at head dims "
                f"{', '.join(map(str, BF16_QUERY_HEAD_DIMS))}"
            )
    elif q.dtype is not call["k_cache"].dtype:
        raise FP8KVRouteError(
            f"q is {q.dtype} at head_dim {head_dim} on an fp8_e4m3 KV cache: it must be cast like SGLang's fa3 "
            "path (the plugin's prepare_paged_mha_query hook does it; is the feature llm_fa4_fp8_kv_sm90 hooked?)"
        )
    if call.get("q_descale") is not None:
        raise FP8KVRouteError("q_descale is not passed by SGLang's fp8_e4m3 path; the route does not take it")
    image_ranges, causal, window = _image_call(call)
    from sglang_fa4.kernels.fp8_paged_kv import paged_kv_attention

    max_q = call.get("max_seqlen_q")
    # (out, lse (Hq, total_q)) with return_softmax_lse, as FA's varlen call returns them
    return paged_kv_attention(
        q, call["k_cache"], call["v_cache"], call["page_table"], call["cache_seqlens"], call["cu_seqlens_q"],
        None if max_q is None else int(max_q), k_descale=call.get("k_descale"), v_descale=call.get("v_descale"),
        softmax_scale=call.get("softmax_scale"), causal=causal, window_size=window, out=call.get("out"),
        return_lse=bool(call.get("return_softmax_lse")), image_ranges=image_ranges,
    )


def _short(value) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_short(v) for v in value) + "]"
    shape = getattr(value, "shape", None)
    return f"<tensor {tuple(shape)}>" if shape is not None else repr(value)[:60]


BACKEND_INIT = f"{FA_BACKEND}.__init__"


def layer_shape(backend, images: bool = False):
    """What the route compiles per, read off a FlashAttentionBackend (None without a head dim);
    ``images``: the model is multimodal (image prefills with SGLang's image mask)."""
    from sglang_fa4.startup.variants import LlmAttentionShape

    head_dim = int(getattr(backend, "head_dim", 0) or 0)
    if not head_dim:
        return None
    window = getattr(backend, "sliding_window_size", None) if getattr(backend, "has_swa", False) else None
    return LlmAttentionShape(head_dim=head_dim, q_heads=int(getattr(backend, "num_attention_heads", 0) or 0),
                             kv_heads=int(getattr(backend, "num_kv_heads", 0) or 0),
                             page_size=int(getattr(backend, "page_size", 1) or 1), sliding_window=window,
                             q_dtype="bfloat16" if head_dim in BF16_QUERY_HEAD_DIMS else "float8_e4m3fn",
                             images=images)


def warm_fp8_after_backend_init(result, self, *args, **kwargs):
    """AFTER FlashAttentionBackend.__init__ (every scheduler process, before CUDA-graph capture and
    serving): on the FP8 route, compile what it will launch -- the split-KV decode kernel, the FP8
    forward's variants (10-20 s each on an H200, otherwise paid by the first request with
    --disable-cuda-graph) and the page gather -- now, as startup work for the JIT monitor."""
    from sglang_fa4.environ import envs

    if not envs.SGLANG_FA4_WARMUP.get() or not backend_routes_fp8(self):
        return None
    model_runner = args[0] if args else kwargs.get("model_runner")
    multimodal = getattr(getattr(model_runner, "model_config", None), "is_multimodal", False) is True
    shapes = [layer_shape(self, images=multimodal), sliding_layer_shape(self, model_runner, images=multimodal)]
    import torch

    from sglang_fa4.startup import warmup

    for shape in shapes:
        if shape is not None:
            warmup.warm_llm_fp8_kv(shape, torch.device(getattr(self, "device", "cuda")))
    return None


def sliding_layer_shape(backend, model_runner, images: bool = False):
    """The sliding-window layers' own shape where a hybrid model gives them another head dim or kv
    head count than the backend's (Gemma-4: SGLang's ``head_dim`` / kv heads are the full layers',
    ``swa_head_dim`` / ``get_swa_num_kv_heads`` the sliding ones'); None where they share it."""
    from sglang_fa4.startup.variants import LlmAttentionShape

    config = getattr(model_runner, "model_config", None)
    window = getattr(backend, "sliding_window_size", None) if getattr(backend, "has_swa", False) else None
    swa_dim = int(getattr(config, "swa_head_dim", 0) or 0)
    if config is None or window is None or not swa_dim:
        return None
    tp = int(getattr(model_runner, "tp_size", 1) or 1)
    get_kv = getattr(config, "get_swa_num_kv_heads", None)
    kv = int(get_kv(tp)) if callable(get_kv) else int(getattr(backend, "num_kv_heads", 0) or 0)
    if swa_dim == int(getattr(backend, "head_dim", 0) or 0) and kv == int(getattr(backend, "num_kv_heads", 0) or 0):
        return None
    return LlmAttentionShape(head_dim=swa_dim, q_heads=int(getattr(backend, "num_attention_heads", 0) or 0),
                             kv_heads=kv, page_size=int(getattr(backend, "page_size", 1) or 1),
                             sliding_window=window,
                             q_dtype="bfloat16" if swa_dim in BF16_QUERY_HEAD_DIMS else "float8_e4m3fn",
                             images=images)
