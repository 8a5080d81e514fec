"""Which LLM attention backend a Hopper server with an FP8 E4M3 KV cache gets: a pure function.

The FA3 -> FA4 native-FP8 upgrade (issue #17, after vLLM's rule): on SM90 with
``--kv-cache-dtype fp8_e4m3`` and no explicit attention backend, where SGLang itself picks ``fa3``
(Hopper, MHA, no speculative top-k > 1), the backend becomes ``fa4`` -- whose FP8 KV path the
plugin routes through sglang-fa4's SM90 FP8 kernel -- when the kernel supports the model:
head_dim in the kernel's set, v_head_dim == head_dim (and any sliding-window layers' head dims
the same), no attention logit softcap, not MLA, deterministic inference off.  Anything else keeps
SGLang's choice.  ``SGLANG_FA4_FP8_KV_UPGRADE`` switches it (off by default: FA3's FP8 forward
has not been measured on the same shapes, see docs/fp8-kv-cache.md).

Imports neither torch nor SGLang (doctor uses it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from sglang_fa4.environ import EnvRegistry, envs
from sglang_fa4.kernels.fp8_sm90 import SUPPORTED_HEAD_DIMS

FA4 = "fa4"
#: SGLang's own Hopper MHA default, the one the rule upgrades.
FA3 = "fa3"
FP8_KV_DTYPE = "fp8_e4m3"
#: Head dims the FP8 kernel runs natively (64/96/128/192/256, the issue's list). Read from the
#: kernel so the rule follows it.
FP8_KV_HEAD_DIMS = tuple(SUPPORTED_HEAD_DIMS)


@dataclass(frozen=True)
class LlmModelFacts:
    """What the rule needs to know about the model (from SGLang's ModelConfig)."""

    head_dim: int
    v_head_dim: int
    softcap: float = 0.0  # attention logit softcap; 0: none
    use_mla: bool = False
    swa_head_dims: tuple[int, ...] = ()  # head dims of sliding-window layers when they differ


@dataclass(frozen=True)
class LlmBackendChoice:
    backend: str
    upgraded: bool  # True: fa3 -> fa4 by this rule
    reason: str


def upgrade_gate(upstream: str, replaced: str, *, capability: Optional[tuple[int, int]],
                 kv_cache_dtype: Optional[str], explicit_backend: bool, registry: EnvRegistry = envs) -> str:
    """Why an FP8 KV upgrade of SGLang's ``replaced`` default keeps ``upstream`` before looking at the
    model (an explicit backend, another default, not SM90, not an fp8_e4m3 cache, the switch off);
    "" when none of these holds."""
    if explicit_backend:
        return "an attention backend was given explicitly (it always wins)"
    if upstream != replaced:
        return f"the FP8 upgrade replaces only SGLang's Hopper {replaced} default"
    if capability is None or capability[0] != 9:
        cc = "unknown" if capability is None else f"{capability[0]}.{capability[1]}"
        return f"not an SM90 GPU (compute capability {cc})"
    if kv_cache_dtype != FP8_KV_DTYPE:
        return f"--kv-cache-dtype is {kv_cache_dtype!r}, not {FP8_KV_DTYPE}"
    if not registry.SGLANG_FA4_FP8_KV_UPGRADE.get():
        return "SGLANG_FA4_FP8_KV_UPGRADE is off (the default until FA4-FP8 is measured at least as fast as FA3-FP8)"
    return ""


def fp8_kv_upgrade(
    upstream: str,
    *,
    capability: Optional[tuple[int, int]],
    kv_cache_dtype: Optional[str],
    explicit_backend: bool,
    deterministic: bool,
    model: Optional[LlmModelFacts],
    registry: EnvRegistry = envs,
) -> LlmBackendChoice:
    """SGLang picked ``upstream`` (no --attention-backend given); return what the server gets."""

    def keep(why: str) -> LlmBackendChoice:
        return LlmBackendChoice(upstream, False, f"SGLang's choice {upstream}: {why}")

    why = upgrade_gate(upstream, FA3, capability=capability, kv_cache_dtype=kv_cache_dtype,
                       explicit_backend=explicit_backend, registry=registry)
    if why:
        return keep(why)
    if deterministic:
        return keep("deterministic inference is on")
    if model is None:
        return keep("the model's attention shape is unknown")
    if model.use_mla:
        return keep("MLA attention (the FP8 kernel is MHA/GQA)")
    dims = (model.head_dim, *model.swa_head_dims)
    bad = [d for d in dims if d not in FP8_KV_HEAD_DIMS]
    if bad:
        return keep(f"head_dim {bad[0]} is not one the FP8 kernel runs ({', '.join(map(str, FP8_KV_HEAD_DIMS))})")
    if model.v_head_dim != model.head_dim:
        return keep(f"v_head_dim {model.v_head_dim} differs from head_dim {model.head_dim}")
    if model.softcap and model.softcap > 0:
        return keep(f"attention logit softcap {model.softcap}")
    return LlmBackendChoice(
        FA4, True,
        f"SM90 + {FP8_KV_DTYPE} KV cache, head_dim {model.head_dim}: fa4 with sglang-fa4's SM90 FP8 kernel "
        "(SGLANG_FA4_FP8_KV_UPGRADE=1)",
    )


def describe_rule(capability: Optional[tuple[int, int]], registry: EnvRegistry = envs) -> dict:
    """For doctor: what the rule does on this GPU, without a model."""
    on = bool(registry.SGLANG_FA4_FP8_KV_UPGRADE.get())
    dims = ", ".join(map(str, FP8_KV_HEAD_DIMS))
    if capability is None or capability[0] != 9:
        cc = "no GPU" if capability is None else f"compute capability {capability[0]}.{capability[1]}"
        return {"upgrade": False, "reason": f"{cc}: not SM90, SGLang's own choice"}
    if not on:
        return {"upgrade": False,
                "reason": "SGLANG_FA4_FP8_KV_UPGRADE is off (default): --kv-cache-dtype fp8_e4m3 keeps SGLang's "
                          "fa3; an explicit --attention-backend fa4 still runs the FP8 kernel"}
    return {"upgrade": True,
            "reason": f"--kv-cache-dtype fp8_e4m3 without --attention-backend: fa4 (SM90 FP8 kernel) for "
                      f"head_dim in {{{dims}}}, v_head_dim == head_dim, no softcap, not MLA, not deterministic; "
                      "otherwise SGLang's fa3"}
