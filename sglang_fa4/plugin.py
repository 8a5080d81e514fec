"""The SGLang general plugin (entry point ``sglang.srt.plugins`` -> ``sglang_fa4``).

SGLang calls ``register()`` once in every server process; it checks the environment, detects the
installed SGLang version and registers, through SGLang's HookRegistry, the hooks for the features
that version lacks (features.py; the registrars are in integration/registration.py). Unknown
versions get one warning and no hooks. Importing this module (doctor does) imports neither torch
nor SGLang.

Never silently off: SGLang's ``load_plugins()`` (0.5.20 and 0.5.23) catches every ``Exception`` from
``register()`` and serves without the plugin, its traceback buried in the log. So ``register()``
raises no ``Exception``: a malformed variable of ours is one ERROR line (the variable, the value,
what is accepted) and runs at its default; a feature that fails to register is one ERROR line and
the other features stay. With ``SGLANG_FA4_PLUGIN_STRICT=1`` any of these stops the start with
:class:`PluginStartRefused`, a ``SystemExit``, which that loader does not catch.
"""

from __future__ import annotations

import logging
import pkgutil
from dataclasses import dataclass, field
from typing import Optional

from sglang_fa4 import features
from sglang_fa4.environ import envs
from sglang_fa4.integration import upstream_code
from sglang_fa4.sglang_version import installed_sglang_version

logger = logging.getLogger("sglang_fa4")


class PluginStartRefused(SystemExit):
    """SGLANG_FA4_PLUGIN_STRICT=1 and the plugin failed: stop the server start. A SystemExit, so
    SGLang's plugin loader (``except Exception``) lets it through; the interpreter prints the
    message and exits 1, no traceback."""


class UnsupportedSGLangVersion(PluginStartRefused):
    pass


@dataclass
class Plan:
    sglang_version: Optional[str]
    supported: bool
    hooked: list[str] = field(default_factory=list)  # feature names we add
    upstream: list[str] = field(default_factory=list)  # feature names SGLang already has
    message: str = ""
    failed: dict[str, str] = field(default_factory=dict)  # feature -> why it did not register
    targets: list[str] = field(default_factory=list)  # SGLang targets our hooks were registered on


def _feature_needed(feature: features.Feature) -> bool:
    # the env override only changes anything when it is set
    if feature.name == "backend_default_env_override":
        return bool(envs.SGLANG_FA4_MM_ATTENTION_BACKEND_DEFAULT.get())
    if feature.name == "fa4_startup_warmup":
        return bool(envs.SGLANG_FA4_WARMUP.get())
    if feature.name == "vit_graph_budgets":  # on by default, replacing SGLang's ViT graphs when they are on
        return bool(envs.SGLANG_FA4_VIT_GRAPH_BUDGETS_ENABLE.get()) and bool(envs.SGLANG_VIT_ENABLE_CUDA_GRAPH.get())
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


def environment_errors() -> dict[str, str]:
    """Variable -> one line for each malformed variable of ours: the variable, the value, what it
    accepts, and what happens (the plugin logs exactly these, doctor prints them). From now on, in
    this process, each such variable reads as its default (none stops the plugin unless strict)."""
    problems = envs.problems(owners=("sglang-fa4",))  # the test suite's own variables are not the server's
    envs.fall_back_to_defaults(problems)
    strict = envs.SGLANG_FA4_PLUGIN_STRICT.get()  # itself at its default if malformed
    lines = {}
    for problem in problems:
        var = getattr(envs, problem.name)
        default = var.format(var.default) or '""'
        then = ("SGLANG_FA4_PLUGIN_STRICT=1: the server does not start" if strict
                else f"{problem.name} runs at its default ({default})")
        lines[problem.name] = f"sglang-fa4: {problem.message}; {then}"
    return lines


def _log_environment_errors(errors: dict[str, str]) -> None:
    """ERROR lines for ``errors``, once per server: the process that logs them names the variables
    in SGLANG_FA4_ENV_ERRORS_REPORTED, which SGLang's scheduler and other child processes inherit
    (they load plugins again) and so do not repeat."""
    reported_var = envs.SGLANG_FA4_ENV_ERRORS_REPORTED
    reported = {name for name in reported_var.get().split(",") if name}
    for name, line in errors.items():
        if name in reported:
            logger.debug("%s (logged by the parent process)", line)
        else:
            logger.error("%s", line)
    if errors:
        reported_var.set(",".join(sorted(reported | set(errors))))


class _Recorder:
    """SGLang's HookRegistry, recording the targets registered through it."""

    def __init__(self, registry, targets: list[str]):
        self._registry, self._targets = registry, targets

    def register(self, target, hook, hook_type, *args, **kwargs):
        self._registry.register(target, hook, hook_type, *args, **kwargs)
        self._targets.append(target)


def unresolvable_targets(targets: list[str]) -> dict[str, str]:
    """The targets SGLang's HookRegistry.apply_hooks could not resolve (module.attr, as it does),
    each with why; strict mode checks them, since apply_hooks logs such a failure and goes on."""
    missing = {}
    for target in dict.fromkeys(targets):
        obj_path, _, attr = target.rpartition(".")
        try:
            if not hasattr(pkgutil.resolve_name(obj_path), attr):
                missing[target] = f"SGLang cannot resolve it: {obj_path} has no {attr}"
        except Exception as exc:  # an import error of SGLang's own module is the answer here
            missing[target] = f"SGLang cannot resolve it: {type(exc).__name__}: {exc}"
    return missing


_registered_plan: Optional[Plan] = None


def register() -> Plan:
    """Entry point. Idempotent: a second call in the same process registers nothing. Raises no
    ``Exception`` (see the module docstring); strict mode raises :class:`PluginStartRefused`."""
    global _registered_plan
    if _registered_plan is not None:
        return _registered_plan
    errors = environment_errors()
    strict = envs.SGLANG_FA4_PLUGIN_STRICT.get()
    if errors and strict:
        for line in errors.values():
            logger.error("%s", line)
        raise PluginStartRefused("\n".join(errors.values()))
    _log_environment_errors(errors)
    envs.default_for_outside_readers(errors)
    from sglang_fa4.kernels import settings

    settings.reload()  # the routing variables, read once for the process (after the fallbacks above)
    try:
        plan = _register(strict)
    except PluginStartRefused:
        raise
    except Exception as exc:  # before any hook: SGLang runs without the plugin, said in one line
        message = f"sglang-fa4: not registered ({type(exc).__name__}: {exc}); SGLang runs without sglang-fa4"
        if strict:
            message += " -- SGLANG_FA4_PLUGIN_STRICT=1: the server does not start"
            logger.error("%s", message)
            raise PluginStartRefused(message) from exc
        logger.error("%s", message)
        logger.debug("sglang-fa4: registration traceback", exc_info=True)
        plan = Plan(None, False, message=message)
    _registered_plan = plan
    return plan


def _register(strict: bool) -> Plan:
    plan = make_plan(installed_sglang_version())
    if not plan.supported:
        if strict:
            message = f"sglang-fa4: {plan.message} -- SGLANG_FA4_PLUGIN_STRICT=1: the server does not start"
            logger.error("%s", message)
            raise UnsupportedSGLangVersion(message)
        logger.warning("sglang-fa4: %s", plan.message)
        return plan
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from sglang_fa4.integration.registration import REGISTRARS
    from sglang_fa4.startup.fa4_env import configure_fa4_disk_cache

    # FA4 reads its persistent-cache variables once, when flash_attn.cute is imported: set them
    # now, before anything imports it (no FA4 import here).
    try:
        cache_dir = configure_fa4_disk_cache()
    except Exception as exc:
        plan.failed["fa4_kernel_cache"] = f"{type(exc).__name__}: {exc}"
        cache_dir = None
    registry = _Recorder(HookRegistry, plan.targets)
    done = set()
    for name in plan.hooked:
        try:
            for registrar in REGISTRARS[name]:
                if registrar not in done:
                    registrar(registry, HookType)
                    done.add(registrar)
        except Exception as exc:
            plan.failed[name] = f"{type(exc).__name__}: {exc}"
            logger.debug("sglang-fa4: %s registration traceback", name, exc_info=True)
    if strict:
        for target, why in unresolvable_targets(plan.targets).items():
            plan.failed[f"hook target {target}"] = why
    for name, why in plan.failed.items():
        then = "SGLANG_FA4_PLUGIN_STRICT=1: the server does not start" if strict else "the other features stay active"
        logger.error("sglang-fa4: %s failed (%s); %s", name, why, then)
    if plan.failed and strict:
        raise PluginStartRefused("sglang-fa4: " + "; ".join(f"{n} failed ({w})" for n, w in plan.failed.items())
                                 + " -- SGLANG_FA4_PLUGIN_STRICT=1: the server does not start")
    plan.hooked = [name for name in plan.hooked if name not in plan.failed]
    logger.info(
        "sglang-fa4: SGLang %s; hooked: %s; already upstream: %s",
        plan.sglang_version,
        ", ".join(plan.hooked) or "nothing",
        ", ".join(plan.upstream) or "nothing",
    )
    if cache_dir:
        logger.info("sglang-fa4: FA4 persistent kernel cache in %s", cache_dir)
    return plan
