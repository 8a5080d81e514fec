"""What sglang-fa4 changes in SGLang, and from which SGLang version upstream already has it.

The plugin hooks a feature on a supported version only where upstream lacks it: decided by the
installed SGLang's code where integration/upstream_code.py can read it, with ``upstream_since`` as
the cross-check (and the answer where no detector applies). doctor and the support matrix in
docs/environment.md are read from this table (a test keeps the doc equal to it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from packaging.version import Version

# The supported window: SGLang versions the plugin knows hook for hook (every release from 0.5.20 to
# 0.5.23); anything else gets a warning and no hooks.
SUPPORTED_SGLANG_VERSIONS = ("0.5.20", "0.5.21", "0.5.22", "0.5.23")


@dataclass(frozen=True)
class Feature:
    name: str
    summary: str
    upstream_since: Optional[str]  # first SGLang release that has it; None: only sglang-fa4

    def upstream_has(self, sglang_version: str) -> bool:
        return self.upstream_since is not None and Version(sglang_version) >= Version(self.upstream_since)


FEATURES = (
    Feature(
        "backend_default_table",
        "ViT attention default per compute capability: sm_103 (B300) gets fa4, not triton_attn",
        "0.5.21",
    ),
    Feature(
        "backend_default_env_override",
        "SGLANG_FA4_MM_ATTENTION_BACKEND_DEFAULT replaces the per-GPU default",
        None,
    ),
    Feature(
        "fa4_list_seqlens",
        "fa4 accepts the graph runners' [cu_seqlens, max_seqlen] list, chosen by argument type",
        "0.5.21",
    ),
    Feature(
        "vit_graph_runners_fa4",
        "SGLANG_VIT_ENABLE_CUDA_GRAPH=1 with fa4: the generic and InternVL ViT graph runners pass "
        "[cu_seqlens, max_seqlen] and compile every layout (windowed and full) before capture",
        "0.5.21",
    ),
    Feature(
        "vit_graph_outputs_owned",
        "ViT CUDA-graph runners (generic, InternVL, budget replay) return outputs that own their memory: "
        "a later replay never rewrites an embedding SGLang still holds (any attention backend)",
        None,
    ),
    Feature(
        "fa4_checked_forward",
        "fa4 forward: clear errors for malformed seqlens, window_size and sinks passed to FA4, "
        "the cached-kernel launch path",
        None,
    ),
    Feature(
        "fa4_startup_warmup",
        "at model load, compile exactly the FA4 kernel variants the ViT will hit (FA4's persistent "
        "kernel cache on, so a restart compiles nothing; flash_attn.cute imported in the background "
        "while weights load); warn on any FA4 compile after warmup",
        None,
    ),
    Feature(
        "vit_graph_budgets",
        "SGLANG_VIT_ENABLE_CUDA_GRAPH=1 with fa4 (opt out: SGLANG_FA4_VIT_GRAPH_BUDGETS_ENABLE=0): the generic "
        "ViT graph runner replays startup graphs over token budgets (padded layouts, eager above the largest; "
        "memory bounded by SGLANG_FA4_VIT_GRAPH_MEMORY_MB) and flags any capture after startup",
        None,
    ),
    Feature(
        "vit_graph_internvl_startup",
        "SGLANG_VIT_ENABLE_CUDA_GRAPH=1: the InternVL ViT runner (InternVL, InternS1) captures one graph per "
        "tile count of the config at model load, none on the request path, and flags any later capture",
        None,
    ),
    Feature(
        "vit_graph_rotary_fused",
        "SGLANG_VIT_ENABLE_CUDA_GRAPH=1: ViT attention's rotary is one fused Triton kernel for q and k "
        "(compiled at the startup warmup, cached launch) instead of SGLang's unfused fp32 graph-mode rotary",
        None,
    ),
    Feature(
        "vit_host_metadata",
        "Qwen2.5-VL eager ViT forward: window/full layouts and max_seqlen from host data, one "
        "non-blocking H2D copy, no device->host sync (SGLANG_FA4_VIT_HOST_METADATA)",
        None,
    ),
    Feature(
        "llm_fp8_kv_upgrade",
        "SGLANG_FA4_FP8_KV_UPGRADE=1: on SM90 with --kv-cache-dtype fp8_e4m3 and no --attention-backend, SGLang's fa3 "
        "becomes fa4 (SM90 FP8 kernel) for head dims the kernel runs, equal K/V head dims, no softcap, not MLA, "
        "not deterministic; Gemma-4's triton default (SGLang 0.5.22+) becomes fa4 where the FP8 KV route runs every "
        "layer, else one log line naming what is missing",
        None,
    ),
    Feature(
        "llm_fa4_fp8_kv_sm90",
        "SGLang's fa4 LLM attention on an fp8_e4m3 KV pool on SM90 (FA4 refuses FP8 there): extend and decode run "
        "sglang-fa4's SM90 FP8 kernel, q cast like the fa3 path, the pool's scales as descales; a Gemma-4 the route "
        "cannot run every layer of is refused at backend init",
        None,
    ),
    Feature(
        "vit_graph_eager_pos_embed",
        "SGLANG_VIT_ENABLE_CUDA_GRAPH=1: Qwen3-VL's graph path adds the eager forward's (HF's) position "
        "embeddings, not pixel-centre ones; no device sync (SGLANG_FA4_VIT_GRAPH_EAGER_POS_EMBED, any backend)",
        None,
    ),
    Feature(
        "vit_pos_embed_batch_invariant",
        "--enable-deterministic-inference: Qwen3-VL's position embeddings per image in any batch (upstream's "
        "vectorized path from 6 images rounds differently), eager and graph (SGLANG_FA4_VIT_POS_EMBED_BATCH_INVARIANT)",
        None,
    ),
)

FEATURES_BY_NAME = {f.name: f for f in FEATURES}

