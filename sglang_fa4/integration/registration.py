"""Which hooks each feature registers on SGLang's HookRegistry (the targets name SGLang's classes and
private methods, so they live here, with the hook bodies)."""

from __future__ import annotations

from typing import Callable

from sglang_fa4.integration import gemma4_fp8_kv, hooks, internvl_graphs, llm_fp8_kv, vit_budgets, vit_graph_rotary


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
    registry.register(hooks.MODEL_RUNNER_LOAD_MODEL, hooks.preload_fa4_before_load_model, hook_type.BEFORE)
    registry.register(hooks.MODEL_RUNNER_LOAD_MODEL, hooks.warm_fa4_after_load_model, hook_type.AFTER)


def _register_vit_graph_rotary(registry, hook_type) -> None:
    registry.register(vit_graph_rotary.ROTARY_NATIVE_EAGER, vit_graph_rotary.around_native_eager, hook_type.AROUND)


def _register_vit_graph_budgets(registry, hook_type) -> None:
    runner = hooks.GENERIC_RUNNER_CLASS
    registry.register(f"{runner}.run", vit_budgets.run_around, hook_type.AROUND)
    registry.register(f"{runner}.create_graph", vit_budgets.create_graph_around, hook_type.AROUND)
    registry.register(hooks.MODEL_RUNNER_LOAD_MODEL, vit_budgets.capture_budgets_after_load_model, hook_type.AFTER)


def _register_vit_graph_internvl_startup(registry, hook_type) -> None:
    registry.register(f"{hooks.INTERNVL_RUNNER}.create_graph", internvl_graphs.create_graph_around, hook_type.AROUND)
    # AFTER hooks run in registration order: features register in FEATURES order, this one after
    # fa4_startup_warmup's (FA4 kernels compiled first)
    registry.register(hooks.MODEL_RUNNER_LOAD_MODEL, internvl_graphs.capture_after_load_model, hook_type.AFTER)


def _register_qwen2_5_vit_forward(registry, hook_type) -> None:
    # one AROUND hook for both features that need it (budget routing, host metadata): not REPLACE,
    # the CUDA-graph path and non-CUDA devices call the original
    registry.register(hooks.QWEN2_5_VIT_FORWARD, hooks.qwen2_5_vit_forward, hook_type.AROUND)


def _register_llm_fp8_kv_upgrade(registry, hook_type) -> None:
    registry.register(llm_fp8_kv.DEFAULT_ATTN_BACKEND, llm_fp8_kv.default_attn_backend, hook_type.AROUND)
    # Gemma-4's default (triton on Hopper) is a model-override declaration, not get_default_attn_backend's
    registry.register(gemma4_fp8_kv.COLLECT_OVERRIDES, gemma4_fp8_kv.collect_model_overrides, hook_type.AROUND)


def _register_llm_fa4_fp8_kv_sm90(registry, hook_type) -> None:
    registry.register(llm_fp8_kv.FA_DISPATCH, llm_fp8_kv.flash_attn_with_kvcache, hook_type.AROUND)
    registry.register(llm_fp8_kv.PREPARE_QUERY, llm_fp8_kv.prepare_paged_mha_query, hook_type.AROUND)
    # AFTER hooks run in registration order: a Gemma-4 the route cannot run is refused before any warmup
    registry.register(llm_fp8_kv.BACKEND_INIT, gemma4_fp8_kv.refuse_unrunnable_gemma4, hook_type.AFTER)
    registry.register(llm_fp8_kv.BACKEND_INIT, llm_fp8_kv.warm_fp8_after_backend_init, hook_type.AFTER)


def _register_vit_graph_eager_pos_embed(registry, hook_type) -> None:
    registry.register(hooks.QWEN3_VIT_POS_EMBED, hooks.qwen3_vit_graph_pos_embed, hook_type.AROUND)


def _register_vit_pos_embed_batch_invariant(registry, hook_type) -> None:
    registry.register(hooks.QWEN3_VIT_VECTORIZED_POS_EMBED, hooks.qwen3_vit_pos_embed_batch_invariant,
                      hook_type.AROUND)


# feature -> what registers it. A registrar shared by features is called once.
REGISTRARS: dict[str, tuple[Callable, ...]] = {
    "backend_default_table": (_register_backend_selection,),
    "backend_default_env_override": (_register_backend_selection,),
    "fa4_list_seqlens": (_register_fa4_forward,),
    "fa4_checked_forward": (_register_fa4_forward,),
    "vit_graph_runners_fa4": (_register_vit_graph_runners,),
    "vit_graph_outputs_owned": (_register_vit_graph_outputs_owned,),
    "fa4_startup_warmup": (_register_startup_warmup,),
    "vit_graph_budgets": (_register_vit_graph_budgets, _register_qwen2_5_vit_forward),
    "vit_host_metadata": (_register_qwen2_5_vit_forward,),
    "vit_graph_internvl_startup": (_register_vit_graph_internvl_startup,),
    "llm_fp8_kv_upgrade": (_register_llm_fp8_kv_upgrade,),
    "llm_fa4_fp8_kv_sm90": (_register_llm_fa4_fp8_kv_sm90,),
    "vit_graph_rotary_fused": (_register_vit_graph_rotary,),
    "vit_graph_eager_pos_embed": (_register_vit_graph_eager_pos_embed,),
    "vit_pos_embed_batch_invariant": (_register_vit_pos_embed_batch_invariant,),
}
