"""The SGLang general plugin (entry point ``sglang.srt.plugins`` -> ``sglang_fa4``).

SGLang calls ``register()`` once in every server process; it checks the environment (a malformed
value fails here, naming the variable), detects the installed SGLang version and registers, through
SGLang's HookRegistry, the hooks for the features that version lacks (features.py; the registrars
are in integration/registration.py). Unknown versions get one warning and no hooks. Importing this
module (doctor does) imports neither torch nor SGLang.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Optional

from sglang_fa4 import features
from sglang_fa4.integration import upstream_code
from sglang_fa4.environ import EnvValueError, envs
from sglang_fa4.sglang_version import installed_sglang_version

logger = logging.getLogger("sglang_fa4")


class UnsupportedSGLangVersion(RuntimeError):
    pass


@dataclass
class Plan:
    sglang_version: Optional[str]
    supported: bool
    hooked: list[str] = field(default_factory=list)  # feature names we add
    upstream: list[str] = field(default_factory=list)  # feature names SGLang already has
    message: str = ""


def _feature_needed(feature: features.Feature) -> bool:
    # the env override only changes anything when it is set
    if feature.name == "backend_default_env_override":
        return bool(envs.SGLANG_FA4_MM_ATTENTION_BACKEND_DEFAULT.get())
    if feature.name == "fa4_startup_warmup":
        return bool(envs.SGLANG_FA4_WARMUP.get())
    if feature.name == "vit_graph_budgets":
        return bool(envs.SGLANG_FA4_VIT_GRAPH_BUDGETS_ENABLE.get())
    if feature.name == "vit_graph_internvl_startup":
        return bool(envs.SGLANG_FA4_VIT_GRAPH_INTERNVL_STARTUP.get())
    if feature.name == "llm_fp8_kv_upgrade":
        return bool(envs.SGLANG_FA4_FP8_KV_UPGRADE.get())
    if feature.name == "llm_fa4_fp8_kv_sm90":
        return bool(envs.SGLANG_FA4_FP8_KV_ROUTE.get())
    if feature.name == "vit_graph_rotary_fused":  # launches only what the warmup compiled
        return bool(envs.SGLANG_FA4_WARMUP.get())
    if feature.name == "vit_host_metadata":
        return bool(envs.SGLANG_FA4_VIT_HOST_METADATA.get())
    if feature.name == "vit_graph_eager_pos_embed":
        return bool(envs.SGLANG_FA4_VIT_GRAPH_EAGER_POS_EMBED.get())
    if feature.name == "vit_pos_embed_batch_invariant":
        return bool(envs.SGLANG_FA4_VIT_POS_EMBED_BATCH_INVARIANT.get())
    return True


def make_plan(sglang_version: Optional[str]) -> Plan:
    if sglang_version is None:
        return Plan(None, False, message="SGLang is not installed")
    if sglang_version not in features.SUPPORTED_SGLANG_VERSIONS:
        supported = ", ".join(features.SUPPORTED_SGLANG_VERSIONS)
        return Plan(
            sglang_version,
            False,
            message=f"sglang-fa4 has no hook set for SGLang {sglang_version} (supported: {supported}); "
            "SGLang runs unchanged",
        )
    plan = Plan(sglang_version, True)
    for feature in features.FEATURES:
        if upstream_code.upstream_has(feature, sglang_version):  # the installed SGLang's code decides
            plan.upstream.append(feature.name)
        elif _feature_needed(feature):
            plan.hooked.append(feature.name)
    return plan


_registered_plan: Optional[Plan] = None


def register() -> Plan:
    """Entry point. Idempotent: a second call in the same process registers nothing."""
    global _registered_plan
    if _registered_plan is not None:
        return _registered_plan
    errors = envs.validate()
    if errors:
        raise EnvValueError("sglang-fa4: bad environment: " + "; ".join(errors))
    plan = make_plan(installed_sglang_version())
    if not plan.supported:
        if envs.SGLANG_FA4_PLUGIN_STRICT.get():
            raise UnsupportedSGLangVersion(plan.message)
        logger.warning("sglang-fa4: %s", plan.message)
        _registered_plan = plan
        return plan
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from sglang_fa4.integration.registration import REGISTRARS
    from sglang_fa4.startup.fa4_env import configure_fa4_disk_cache

    # FA4 reads its persistent-cache variables once, when flash_attn.cute is imported: set them
    # now, before anything imports it (no FA4 import here).
    cache_dir = configure_fa4_disk_cache()
    done = set()
    for name in plan.hooked:
        for registrar in REGISTRARS[name]:
            if registrar not in done:
                registrar(HookRegistry, HookType)
                done.add(registrar)
    logger.info(
        "sglang-fa4: SGLang %s; hooked: %s; already upstream: %s",
        plan.sglang_version,
        ", ".join(plan.hooked) or "nothing",
        ", ".join(plan.upstream) or "nothing",
    )
    if cache_dir:
        logger.info("sglang-fa4: FA4 persistent kernel cache in %s", cache_dir)
    _registered_plan = plan
    return plan
