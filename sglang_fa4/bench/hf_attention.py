"""Route a transformers vision tower's attention through our backends.

transformers (5.x) looks attention up by name in `ALL_ATTENTION_FUNCTIONS`
(`config._attn_implementation`). Qwen2.5-VL / Qwen3-VL vision attention makes ONE varlen call
with `cu_seq_lens_q` / `max_length_q` when the name contains "flash"; any other name splits the
sequence on the host (`lengths.tolist()`, a sync per layer, one call per segment). So every backend
is registered under a "flash..." name and receives the packed sequence:

    flash_sglang_fa4          sglang_fa4.kernels.varlen.fa4_varlen_attention
    flash_sglang_triton_attn  SGLang's context_attention_fwd
    flash_sglang_sdpa         torch SDPA, dense batched per segment length (SdpaVarlen)

The model is built with attn_implementation="sdpa" and then pointed at one of these names with
`use_backend(model, backend)`: setting the config attribute directly skips transformers'
flash-attention package checks, which do not apply to these functions.

SDPA needs the segment lengths on the host. `register_layout(cu_seqlens)` records them (once,
before timing or capture) keyed by the tensor's storage; an unregistered cu_seqlens falls back to
a host read (correct, but it syncs and cannot be graph-captured).
"""

from __future__ import annotations

from typing import Any

NAMES = {
    "fa4": "flash_sglang_fa4",
    "triton_attn": "flash_sglang_triton_attn",
    "sdpa": "flash_sglang_sdpa",
}

_sdpa_impls: dict[tuple, Any] = {}
_triton_lens: dict[tuple, Any] = {}


def _key(cu) -> tuple:
    return (cu.data_ptr(), cu.numel(), str(cu.device))


def register_layout(cu_seqlens) -> None:
    """Precompute the host-side data (SDPA groups, Triton seq_lens) for this cu_seqlens tensor."""
    from .layouts import seqlens_from_cu
    from .sdpa_varlen import SdpaVarlen

    key = _key(cu_seqlens)
    seqlens = seqlens_from_cu(cu_seqlens.tolist())
    _sdpa_impls[key] = SdpaVarlen(seqlens, cu_seqlens.device)
    _triton_lens[key] = (cu_seqlens[1:] - cu_seqlens[:-1]).to(cu_seqlens.dtype)


def clear_layouts() -> None:
    _sdpa_impls.clear()
    _triton_lens.clear()


def _unpack(query, key, value):
    # transformers passes (1, heads, seq, d); our kernels take (seq, heads, d)
    q = query[0].transpose(0, 1)
    k = key[0].transpose(0, 1)
    v = value[0].transpose(0, 1)
    return q.contiguous(), k.contiguous(), v.contiguous()


def _max_len(cu, max_length):
    if max_length is None:
        return int((cu[1:] - cu[:-1]).max().item())
    return int(max_length)


def fa4_attention(module, query, key, value, attention_mask=None, scaling=None, dropout=0.0, **kwargs):
    from sglang_fa4.kernels.varlen import fa4_varlen_attention

    cu = kwargs["cu_seq_lens_q"]
    q, k, v = _unpack(query, key, value)
    out = fa4_varlen_attention(q, k, v, cu, _max_len(cu, kwargs.get("max_length_q")), softmax_scale=scaling)
    return out.unsqueeze(0), None


def triton_attention(module, query, key, value, attention_mask=None, scaling=None, dropout=0.0, **kwargs):
    from .backends import triton_context_attention_fwd

    cu = kwargs["cu_seq_lens_q"]
    q, k, v = _unpack(query, key, value)
    seq_lens = _triton_lens.get(_key(cu))
    if seq_lens is None:
        seq_lens = (cu[1:] - cu[:-1]).to(cu.dtype)
    out = q.new_empty(q.shape)
    triton_context_attention_fwd()(
        q, k, v, out, cu, seq_lens, _max_len(cu, kwargs.get("max_length_q")), is_causal=False, sm_scale=scaling
    )
    return out.unsqueeze(0), None


def sdpa_attention(module, query, key, value, attention_mask=None, scaling=None, dropout=0.0, **kwargs):
    from .layouts import seqlens_from_cu
    from .sdpa_varlen import SdpaVarlen

    cu = kwargs["cu_seq_lens_q"]
    q, k, v = _unpack(query, key, value)
    impl = _sdpa_impls.get(_key(cu))
    if impl is None:
        impl = SdpaVarlen(seqlens_from_cu(cu.tolist()), cu.device)
    return impl(q, k, v, scale=scaling).unsqueeze(0), None


FUNCTIONS = {"fa4": fa4_attention, "triton_attn": triton_attention, "sdpa": sdpa_attention}


def register_all() -> None:
    from transformers import AttentionInterface

    for backend, name in NAMES.items():
        AttentionInterface.register(name, FUNCTIONS[backend])


def use_backend(model, backend: str) -> None:
    """Point every attention module of `model` (sharing its config) at `backend`."""
    register_all()
    model.config._attn_implementation = NAMES[backend]
    for m in model.modules():
        cfg = getattr(m, "config", None)
        if cfg is not None and cfg is not model.config:
            cfg._attn_implementation = NAMES[backend]
