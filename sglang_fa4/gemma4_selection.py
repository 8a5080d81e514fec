"""Gemma-4 on an FP8 E4M3 KV cache on Hopper: when the plugin may give it fa4 with our route (a pure rule).

SGLang (0.5.22+) accepts ``fa4`` for Gemma-4 but picks ``triton`` on Hopper
(``arg_groups/model_overrides/gemma4.py``). With ``SGLANG_FA4_FP8_KV_UPGRADE`` on, SM90,
``--kv-cache-dtype fp8_e4m3`` and no attention backend given, that ``triton`` becomes ``fa4`` --
whose FP8 KV calls the plugin routes to sglang-fa4's kernels -- only if the route runs every layer
of the model (:func:`missing`): each layer type's head dim is one the FP8 KV kernels run, a head
dim over 256 is also one the route takes with a bf16 q (SGLang casts q to the pool's E4M3 only up
to 256), no attention logit softcap, no sinks, and, where a vision tower makes image prefills
possible, the route runs SGLang's bidirectional image mask. Anything missing keeps SGLang's backend
with one reason. An explicit ``--attention-backend fa4`` on such a model is refused at backend
init with the same reasons (``integration/gemma4_fp8_kv``).

Imports neither torch nor SGLang (doctor uses it): the kernels' head dims are read from their source
when the kernel package is not imported (:func:`route_caps`).
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from packaging.version import Version

from sglang_fa4.environ import EnvRegistry, envs
from sglang_fa4.llm_selection import FP8_KV_DTYPE, LlmBackendChoice, upgrade_gate

FA4 = "fa4"
#: SGLang's Gemma-4 default on Hopper, the one this rule replaces.
TRITON = "triton"
GEMMA4_ARCHS = ("Gemma4ForConditionalGeneration", "Gemma4ForCausalLM", "Gemma4UnifiedForConditionalGeneration")
#: First SGLang whose Gemma-4 check accepts fa4 (0.5.20/0.5.21's ``arg_groups/model_hook.py`` allow
#: only trtllm_mha, triton, ascend, intel_xpu, intel_amx, aiter).
FA4_ACCEPTED_SINCE = "0.5.22"
#: SGLang's fa4 path casts q to the pool's E4M3 (``prepare_paged_mha_query``) only up to this head dim.
SGLANG_FP8_QUERY_MAX_HEAD_DIM = 256

#: Whether the route runs Gemma-4's image prefill: SGLang's fa4 backend hands it a ``mask_mod``
#: (``make_image_mask_mod``) with ``aux_tensors`` = (image token ranges, cu_seqlens_q), causal off,
#: so image tokens attend to each other both ways. The split-KV kernel takes those ranges as
#: per-row key bounds (its IMAGE specialization), the route recognises SGLang's callback and reads
#: its window (``llm_fp8_kv.image_mask_window``), checked against SGLang 0.5.23's real callback and
#: against fp32 with the ranges (tests/test_llm_fp8_kv_route.py, tests/test_fp8_paged_d512.py) and
#: on an H100 (benchmark/results/h100/fp8_decode_correctness_d512.json).
IMAGE_PREFILL_MASKS = True

_KERNEL_HEAD_DIMS_SOURCE = Path(__file__).resolve().parent / "kernels" / "fp8_paged_kv" / "decode.py"


@dataclass(frozen=True)
class LayerKind:
    """One Gemma-4 attention layer type as SGLang runs it (per tensor-parallel rank 1)."""

    name: str  # "sliding" / "full"
    head_dim: int
    v_head_dim: int
    q_heads: int
    kv_heads: int
    window: Optional[int] = None  # the left window SGLang passes (config sliding_window - 1); None: full


@dataclass(frozen=True)
class Gemma4Facts:
    """What the rule needs to know about a Gemma-4 model (from its SGLang-resolved HF config)."""

    architecture: str
    layers: tuple[LayerKind, ...]
    softcap: float = 0.0  # attention logit softcap (Gemma-4: none; final_logit_softcapping is not it)
    sinks: bool = False
    image_inputs: bool = False  # a vision tower: image prefills take SGLang's bidirectional image mask
    k_eq_v: bool = False  # attention_k_eq_v (full layers reuse K as V; SGLang still stores both)


@dataclass(frozen=True)
class RouteCaps:
    """What the FP8 KV route runs today."""

    head_dims: tuple[int, ...]  # sglang_fa4.kernels.fp8_paged_kv.HEAD_DIMS
    bf16_query_head_dims: tuple[int, ...]  # integration.llm_fp8_kv.BF16_QUERY_HEAD_DIMS
    image_prefill_masks: bool  # IMAGE_PREFILL_MASKS


def kernel_head_dims() -> tuple[int, ...]:
    """``fp8_paged_kv.HEAD_DIMS``: the imported value when the kernel package is loaded, else the
    literal in its source (doctor imports no torch; a test keeps the two equal)."""
    loaded = sys.modules.get("sglang_fa4.kernels.fp8_paged_kv")
    if loaded is not None:
        return tuple(loaded.HEAD_DIMS)
    tree = ast.parse(_KERNEL_HEAD_DIMS_SOURCE.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "HEAD_DIMS" for t in node.targets):
            try:
                return tuple(ast.literal_eval(node.value))
            except ValueError:
                break
    from sglang_fa4.kernels import fp8_paged_kv  # not a literal: import it (torch)

    return tuple(fp8_paged_kv.HEAD_DIMS)


def route_caps() -> RouteCaps:
    """Today's capabilities, read where they are defined (so the rule follows the kernels)."""
    from sglang_fa4.integration.llm_fp8_kv import BF16_QUERY_HEAD_DIMS

    return RouteCaps(kernel_head_dims(), tuple(BF16_QUERY_HEAD_DIMS), bool(IMAGE_PREFILL_MASKS))


def missing(facts: Gemma4Facts, caps: RouteCaps) -> list[str]:
    """What the route lacks to run every layer of this model; empty: it runs them all."""
    out = []
    for dim in sorted({d for layer in facts.layers for d in (layer.head_dim, layer.v_head_dim)}):
        if dim not in caps.head_dims:
            out.append(f"head dim {dim} not run by the FP8 KV kernels ({', '.join(map(str, caps.head_dims))})")
        elif dim > SGLANG_FP8_QUERY_MAX_HEAD_DIM and dim not in caps.bf16_query_head_dims:
            out.append(f"head dim {dim}: SGLang hands these layers a bf16 q, which the route does not take")
    for layer in facts.layers:
        if layer.v_head_dim != layer.head_dim:
            out.append(f"{layer.name} layers: v head dim {layer.v_head_dim} differs from head dim {layer.head_dim}")
    if facts.softcap and facts.softcap > 0:
        out.append(f"attention logit softcap {facts.softcap}")
    if facts.sinks:
        out.append("attention sinks")
    if facts.image_inputs and not caps.image_prefill_masks:
        out.append("image prefill masks (SGLang's bidirectional image mask_mod) not run by the route")
    return out


def _accepts_fa4(sglang_version: Optional[str]) -> bool:
    return sglang_version is not None and Version(sglang_version) >= Version(FA4_ACCEPTED_SINCE)


def gemma4_upgrade(
    upstream: str,
    *,
    sglang_version: Optional[str],
    capability: Optional[tuple[int, int]],
    kv_cache_dtype: Optional[str],
    explicit_backend: bool,
    deterministic: bool,
    facts: Optional[Gemma4Facts],
    caps: RouteCaps,
    registry: EnvRegistry = envs,
) -> LlmBackendChoice:
    """SGLang declared ``upstream`` as Gemma-4's attention backend; return what the server gets."""

    def keep(why: str) -> LlmBackendChoice:
        return LlmBackendChoice(upstream, False, f"SGLang's Gemma-4 choice {upstream}: {why}")

    why = upgrade_gate(upstream, TRITON, capability=capability, kv_cache_dtype=kv_cache_dtype,
                       explicit_backend=explicit_backend, registry=registry)
    if why:
        return keep(why)
    if not _accepts_fa4(sglang_version):
        return keep(f"SGLang {sglang_version} accepts no fa4 for Gemma-4 (from {FA4_ACCEPTED_SINCE})")
    if deterministic:
        return keep("deterministic inference is on")
    if facts is None:
        return keep("the model's attention layers are unknown")
    lacking = missing(facts, caps)
    if lacking:
        return keep("; ".join(lacking))
    shapes = ", ".join(f"{layer.name} d{layer.head_dim}" for layer in facts.layers)
    return LlmBackendChoice(FA4, True, f"SM90 + {FP8_KV_DTYPE} KV cache, Gemma-4 ({shapes}): fa4 with sglang-fa4's "
                                       "FP8 KV route (SGLANG_FA4_FP8_KV_UPGRADE=1)")


# ---- facts from a config ------------------------------------------------------------------------


def facts_from_config(hf_config, sinks: bool = False) -> Optional[Gemma4Facts]:
    """Gemma-4's layer types read off its HF config as SGLang resolved it (``head_dim`` = the full
    layers', ``swa_head_dim`` / ``swa_num_key_value_heads`` = the sliding layers'; SGLang's
    ``utils/hf_transformers/config.py``). None for another architecture or without head dims."""
    archs = list(getattr(hf_config, "architectures", None) or [])
    arch = next((a for a in archs if a in GEMMA4_ARCHS), None)
    if arch is None:
        return None
    text = getattr(hf_config, "text_config", None) or hf_config
    full_d = getattr(text, "head_dim", None)
    if not full_d:
        return None
    hq = int(getattr(text, "num_attention_heads", 0) or 0)
    types = list(getattr(text, "layer_types", None) or [])
    layers = []
    if "sliding_attention" in types:
        swa_d = int(getattr(text, "swa_head_dim", None) or full_d)
        window = getattr(text, "sliding_window", None)
        layers.append(LayerKind(
            "sliding", swa_d, int(getattr(text, "swa_v_head_dim", None) or swa_d),
            int(getattr(text, "swa_num_attention_heads", None) or hq),
            int(getattr(text, "swa_num_key_value_heads", None) or getattr(text, "num_key_value_heads", 0) or 0),
            None if window is None else int(window) - 1))  # gemma4_causal: sliding_window - 1
    if "full_attention" in types or not types:
        layers.append(LayerKind("full", int(full_d), int(getattr(text, "v_head_dim", None) or full_d), hq,
                                int(getattr(text, "num_key_value_heads", 0) or 0)))
    return Gemma4Facts(
        architecture=arch, layers=tuple(layers),
        softcap=float(getattr(text, "attn_logit_softcapping", None) or 0.0), sinks=bool(sinks),
        image_inputs=arch != "Gemma4ForCausalLM" and getattr(hf_config, "vision_config", None) is not None,
        k_eq_v=bool(getattr(text, "attention_k_eq_v", False)),
    )


# ---- doctor -------------------------------------------------------------------------------------

#: Gemma-4 releases whose verdict doctor prints (their attention layers as SGLang runs them at TP 1).
KNOWN_MODELS = {
    "gemma-4-31B-it": Gemma4Facts(
        "Gemma4ForConditionalGeneration",
        (LayerKind("sliding", 256, 256, 32, 16, 1023), LayerKind("full", 512, 512, 32, 4)),
        image_inputs=True, k_eq_v=True),
    "gemma-4-26B-A4B-it": Gemma4Facts(
        "Gemma4ForConditionalGeneration",
        (LayerKind("sliding", 256, 256, 16, 8, 1023), LayerKind("full", 512, 512, 16, 2)),
        image_inputs=True, k_eq_v=True),
}


def describe_rule(capability: Optional[tuple[int, int]], sglang_version: Optional[str],
                  caps: Optional[RouteCaps] = None, registry: EnvRegistry = envs) -> dict:
    """For doctor: the rule, and today's verdict for the known Gemma-4 releases on this GPU (for the
    newest supported SGLang when none is installed), with what the route lacks for each."""
    from sglang_fa4.features import SUPPORTED_SGLANG_VERSIONS

    caps = caps or route_caps()
    version = sglang_version or SUPPORTED_SGLANG_VERSIONS[-1]
    rule = ("SM90 + --kv-cache-dtype fp8_e4m3 + SGLANG_FA4_FP8_KV_UPGRADE=1, no --attention-backend: SGLang's "
            f"Gemma-4 triton becomes fa4 (SGLang {FA4_ACCEPTED_SINCE}+) when the FP8 KV route runs every layer (each "
            f"head dim in the kernels' {{{', '.join(map(str, caps.head_dims))}}}, over "
            f"{SGLANG_FP8_QUERY_MAX_HEAD_DIM} also with a bf16 q; no softcap, no sinks; image prefill masks where "
            "there is a vision tower); an explicit fa4 for a Gemma-4 it cannot run is refused at startup")
    verdicts = {}
    for name, facts in KNOWN_MODELS.items():
        choice = gemma4_upgrade(TRITON, sglang_version=version, capability=capability,
                                kv_cache_dtype=FP8_KV_DTYPE, explicit_backend=False, deterministic=False,
                                facts=facts, caps=caps, registry=registry)
        verdicts[name] = {"backend": choice.backend, "upgrade": choice.upgraded, "reason": choice.reason,
                          "missing": missing(facts, caps)}
    return {"rule": rule, "sglang": version if sglang_version else f"{version} (none installed)",
            "models": verdicts}
