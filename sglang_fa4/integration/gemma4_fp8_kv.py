"""Gemma-4 on SGLang's fa4 backend with an FP8 E4M3 KV cache on Hopper: the hooks (the rule is
:mod:`sglang_fa4.gemma4_selection`).

* ``collect_model_overrides``: AROUND ``collect_model_override_declarations`` (SGLang 0.5.20-0.5.23,
  ``arg_groups/overrides.py``; ``model_hook`` calls it once per resolution). Gemma-4's default backend
  is a declaration of ``_gemma4_overrides`` in SGLang's override registry, a list of functions (a hook
  on the function itself would not reach the registered object), so the declarations are read after
  SGLang collects them: where Gemma-4's ``triton`` meets the rule, one more declaration says ``fa4``
  (the last writer wins). One startup line says what was chosen and why.
* ``refuse_unrunnable_gemma4``: AFTER ``FlashAttentionBackend.__init__``: fa4 on an fp8_e4m3 pool on
  SM90 (our route) for a Gemma-4 the route cannot run (an explicit ``--attention-backend fa4``)
  stops the start with :class:`~sglang_fa4.integration.llm_fp8_kv.FP8KVRouteError` naming what is
  missing, rather than failing at the first full-attention layer of the first request.
"""

from __future__ import annotations

import logging

from sglang_fa4 import gemma4_selection
from sglang_fa4.integration import llm_fp8_kv
from sglang_fa4.llm_selection import FP8_KV_DTYPE

logger = logging.getLogger("sglang_fa4")

COLLECT_OVERRIDES = "sglang.srt.arg_groups.overrides.collect_model_override_declarations"
#: the source name our declaration carries in SGLang's resolution record
SOURCE = "sglang_fa4.gemma4_fp8_kv"

_logged: set = set()


def _sinks(server_args) -> bool:
    try:
        from sglang.srt.arg_groups.model_override_base import model_config_of
    except ImportError:  # not every release has it; Gemma-4 has no sinks
        return False
    return bool(getattr(model_config_of(server_args), "has_attention_sinks", False))


def collect_model_overrides(original, architecture, server_args, hf_config):
    """AROUND collect_model_override_declarations(architecture, server_args, hf_config)."""
    declarations = original(architecture, server_args, hf_config)
    if architecture not in gemma4_selection.GEMMA4_ARCHS:
        return declarations
    upstream = None
    for _source, declared in declarations:
        upstream = declared.get("attention_backend", upstream)
    if upstream is None:  # SGLang declared no backend: one was given explicitly
        return declarations
    from sglang.srt.arg_groups.model_override_base import resolving_view
    from sglang.srt.runtime_context import get_platform

    from sglang_fa4.sglang_version import installed_sglang_version

    cfg = resolving_view(server_args)
    capability = (9, 0) if getattr(get_platform(), "is_sm90", False) else None
    kv = getattr(cfg, "kv_cache_dtype", None)
    # _gemma4_overrides also declares its default when only one of the split backends was given
    explicit = any(getattr(cfg, f, None) for f in
                   ("attention_backend", "prefill_attention_backend", "decode_attention_backend"))
    choice = gemma4_selection.gemma4_upgrade(
        upstream,
        sglang_version=installed_sglang_version(),
        capability=capability,
        kv_cache_dtype=kv,
        explicit_backend=explicit,
        deterministic=bool(getattr(cfg, "enable_deterministic_inference", False)),
        facts=gemma4_selection.facts_from_config(hf_config, sinks=_sinks(server_args)),
        caps=gemma4_selection.route_caps(),
    )
    if capability is not None and kv == FP8_KV_DTYPE and not explicit:  # an explicit choice needs no line
        key = (choice.backend, choice.reason)
        if key not in _logged:
            _logged.add(key)
            logger.info("sglang-fa4: Gemma-4 attention backend %s: %s", choice.backend, choice.reason)
    if choice.upgraded:
        declarations = [*declarations, (SOURCE, {"attention_backend": choice.backend})]
    return declarations


def refuse_unrunnable_gemma4(result, self, *args, **kwargs):
    """AFTER FlashAttentionBackend.__init__(model_runner, ...): on our FP8 KV route, a Gemma-4 whose
    layers the route cannot all run is refused here, at startup."""
    if not llm_fp8_kv.backend_routes_fp8(self):
        return None
    runner = args[0] if args else kwargs.get("model_runner")
    model_config = getattr(runner, "model_config", None)
    facts = gemma4_selection.facts_from_config(getattr(model_config, "hf_config", None),
                                               sinks=bool(getattr(model_config, "has_attention_sinks", False)))
    if facts is None:
        return None
    lacking = gemma4_selection.missing(facts, gemma4_selection.route_caps())
    if lacking:
        raise llm_fp8_kv.FP8KVRouteError(
            f"fa4 with an fp8_e4m3 KV cache on SM90 runs {facts.architecture} through sglang-fa4's FP8 KV route, "
            f"which cannot run every layer of this model: {'; '.join(lacking)}. Use --attention-backend triton "
            "(SGLang's Gemma-4 default on Hopper) or a bf16 KV cache."
        )
    return None
