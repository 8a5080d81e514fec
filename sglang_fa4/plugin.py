"""The SGLang general plugin (entry point ``sglang.srt.plugins`` -> ``sglang_fa4``).

SGLang calls ``register()`` once in every server process; it detects the installed SGLang version and
registers, through SGLang's HookRegistry, the hooks for the features that version lacks
(features.py). Unknown versions get one warning and no hooks.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Optional

from sglang_fa4 import features

from sglang_fa4.integration import hooks
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


def _register_backend_selection(registry, hook_type) -> None:
    registry.register(hooks.DETERMINE_BACKEND, hooks.determine_attention_backend, hook_type.AROUND)


def _register_fa4_forward(registry, hook_type) -> None:
    registry.register(hooks.FA4_FORWARD, hooks.fa4_forward, hook_type.REPLACE)


def _register_vit_graph_runners(registry, hook_type) -> None:
    registry.register(hooks.GENERIC_RUNNER, hooks.generic_runner_create_graph, hook_type.AROUND)
    registry.register(f"{hooks.INTERNVL_RUNNER}._warmup_once", hooks.internvl_runner_step, hook_type.AROUND)
    registry.register(f"{hooks.INTERNVL_RUNNER}._capture_graph", hooks.internvl_runner_step, hook_type.AROUND)


def _register_vit_graph_outputs_owned(registry, hook_type) -> None:
    registry.register(f"{hooks.GENERIC_RUNNER_CLASS}.replay", hooks.generic_runner_replay_owned, hook_type.AROUND)
    registry.register(f"{hooks.INTERNVL_RUNNER}.run", hooks.internvl_runner_run_owned, hook_type.AROUND)


def _register_startup_warmup(registry, hook_type) -> None:
    registry.register(hooks.MODEL_RUNNER_LOAD_MODEL, hooks.after_load_model, hook_type.AFTER)


def _register_vit_graph_budgets(registry, hook_type) -> None:
    from sglang_fa4.integration import vit_budgets
    runner = hooks.GENERIC_RUNNER_CLASS
    registry.register(f"{runner}.run", vit_budgets.run_around, hook_type.AROUND)
    registry.register(f"{runner}.create_graph", vit_budgets.create_graph_around, hook_type.AROUND)
    registry.register(hooks.QWEN2_5_VIT_FORWARD, vit_budgets.qwen2_5_forward_around, hook_type.AROUND)
    registry.register(hooks.MODEL_RUNNER_LOAD_MODEL, vit_budgets.after_load_model, hook_type.AFTER)


def _register_vit_host_metadata(registry, hook_type) -> None:
    # AROUND, not REPLACE: the CUDA-graph path and non-CUDA devices call the original
    registry.register(hooks.QWEN2_5_VIT_FORWARD, hooks.qwen2_5_vit_forward, hook_type.AROUND)


# feature -> what registers it. Features sharing a registrar are hooked once.
REGISTRARS: dict[str, Callable] = {
    "backend_default_table": _register_backend_selection,
    "backend_default_env_override": _register_backend_selection,
    "fa4_list_seqlens": _register_fa4_forward,
    "fa4_checked_forward": _register_fa4_forward,
    "vit_graph_runners_fa4": _register_vit_graph_runners,
    "vit_graph_outputs_owned": _register_vit_graph_outputs_owned,
    "fa4_startup_warmup": _register_startup_warmup,
    "vit_graph_budgets": _register_vit_graph_budgets,
    "vit_host_metadata": _register_vit_host_metadata,
}


def _feature_needed(feature: features.Feature) -> bool:
    # the env override only changes anything when it is set
    if feature.name == "backend_default_env_override":
        return bool(envs.SGLANG_FA4_MM_ATTENTION_BACKEND_DEFAULT.get())
    if feature.name == "fa4_startup_warmup":
        return bool(envs.SGLANG_FA4_WARMUP.get())
    if feature.name == "vit_graph_budgets":
        return bool(envs.SGLANG_FA4_VIT_GRAPH_BUDGETS_ENABLE.get())
    if feature.name == "vit_host_metadata":
        return bool(envs.SGLANG_FA4_VIT_HOST_METADATA.get())
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
        if feature.upstream_has(sglang_version):
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

    # FA4 reads its persistent-cache variables once, when flash_attn.cute is imported: set them
    # now, before anything imports it (no FA4 import here).
    from sglang_fa4.startup.warmup import configure_fa4_disk_cache

    cache_dir = configure_fa4_disk_cache()
    done = set()
    for name in plan.hooked:
        registrar = REGISTRARS[name]
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
