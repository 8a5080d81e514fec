"""The hook functions the plugin registers on SGLang: thin adapters from SGLang's call signatures to
the logic in selection.py, vision_fa4.py, vit_graph_runners.py, vit_graph_outputs.py,
qwen3_vit_pos_embed.py and
startup/warmup.py (the budget hooks are in vit_budgets.py). SGLang is imported only inside them."""

from __future__ import annotations

import logging

from sglang_fa4 import selection
from sglang_fa4.environ import envs
from sglang_fa4.integration import vision_fa4, vit_graph_runners

logger = logging.getLogger("sglang_fa4")

VISION = "sglang.srt.layers.attention.vision"
DETERMINE_BACKEND = f"{VISION}.VisionAttention._determine_attention_backend"
FA4_FORWARD = f"{VISION}.VisionFlash4Attention.forward"

_logged_choices: set[tuple] = set()


def _vision():
    from sglang.srt.layers.attention import vision

    return vision


def determine_attention_backend(original, self, passed_backend):
    """AROUND VisionAttention._determine_attention_backend: upstream resolves first (keeping its
    errors and non-CUDA defaults), then on CUDA our selection decides."""
    upstream = original(self, passed_backend)
    vision = _vision()
    if not vision.is_cuda():
        return upstream
    try:
        server_arg = vision.get_mm().mm_attention_backend
    except ValueError:  # no server args published (upstream tolerated it, so do we)
        server_arg = None
    capability = tuple(vision.get_device_capability())
    choice = selection.select_mm_attention_backend(server_arg, passed_backend, capability, "cuda")
    key = (choice.backend, choice.reason, upstream)
    if key not in _logged_choices:
        _logged_choices.add(key)
        extra = "" if choice.backend == upstream else f" (SGLang alone would pick {upstream})"
        logger.info("sglang-fa4: ViT attention backend %s: %s%s", choice.backend, choice.reason, extra)
    return choice.backend


def fa4_forward(self, q, k, v, cu_seqlens, bsz, seq_len, softmax_scale=None, forward_metadata=None, **kwargs):
    """REPLACE VisionFlash4Attention.forward."""
    return vision_fa4.vision_fa4_forward(
        q,
        k,
        v,
        cu_seqlens,
        bsz,
        seq_len,
        softmax_scale=softmax_scale,
        forward_metadata=forward_metadata,
        resolve_tensor=_vision().resolve_seqlens,
        **kwargs,
    )


GENERIC_RUNNER_CLASS = "sglang.srt.multimodal.vit_cuda_graph_runner.ViTCudaGraphRunner"
GENERIC_RUNNER = f"{GENERIC_RUNNER_CLASS}._create_graph"
INTERNVL_RUNNER = "sglang.srt.multimodal.internvl_vit_cuda_graph_runner.InternViTCudaGraphRunner"


def generic_runner_create_graph(original, self, graph_key, position_embeddings=None,
                                rotary_pos_emb_cos=None, rotary_pos_emb_sin=None):
    """AROUND ViTCudaGraphRunner._create_graph: for fa4, warm every layout, then capture with the
    [cu_seqlens, max_seqlen] layout."""
    if self._attn_backend != selection.FA4:
        return original(self, graph_key, position_embeddings, rotary_pos_emb_cos, rotary_pos_emb_sin)
    vit_graph_runners.warm_generic_runner(self, graph_key, position_embeddings, rotary_pos_emb_cos, rotary_pos_emb_sin)
    with vit_graph_runners.runner_layout_as_fa3(self):
        return original(self, graph_key, position_embeddings, rotary_pos_emb_cos, rotary_pos_emb_sin)


def internvl_runner_step(original, self, key):
    """AROUND InternViTCudaGraphRunner._warmup_once / _capture_graph: fa4 uses the fa3 layout (one
    uniform layout per graph, so the runner's own eager warmup already compiles it)."""
    if self._attn_backend != selection.FA4:
        return original(self, key)
    with vit_graph_runners.runner_layout_as_fa3(self):
        return original(self, key)


def generic_runner_replay_owned(original, self, graph_key, *args, **kwargs):
    """AROUND ViTCudaGraphRunner.replay: the output owns its memory (a later replay of the same
    graph must not rewrite what SGLang's embedding cache holds)."""
    from sglang_fa4.integration.vit_graph_outputs import owned

    return owned(original(self, graph_key, *args, **kwargs), self.block_output.get(graph_key))


def internvl_runner_run_owned(original, self, x):
    """AROUND InternViTCudaGraphRunner.run: the output owns its memory (see above); on a runner
    sealed by the startup capture, a shape without a graph runs eagerly instead of capturing one."""
    from sglang_fa4.integration import internvl_graphs
    from sglang_fa4.integration.vit_graph_outputs import owned

    state = internvl_graphs.startup_state(self)
    if state is not None and state.sealed and self._graph_key(x) not in self.graphs:
        return internvl_graphs.run_eagerly(self, state, x)
    return owned(original(self, x), *self.out.values())


MODEL_RUNNER_LOAD_MODEL = "sglang.srt.model_executor.model_runner.ModelRunner.load_model"


def preload_fa4_before_load_model(self, *args, **kwargs):
    """BEFORE ModelRunner.load_model: when this process's ViT attention will be fa4 (a multimodal
    model; --mm-attention-backend, else the per-GPU default), start importing flash_attn.cute in
    the background so that it overlaps weight loading (the warmup after load_model waits for it).
    Returns None: SGLang's arguments are unchanged."""
    if not envs.SGLANG_FA4_PRELOAD.get() or not getattr(getattr(self, "model_config", None), "is_multimodal", False):
        return None
    vision = _vision()
    if not vision.is_cuda():
        return None
    server_arg = getattr(getattr(self, "server_args", None), "mm_attention_backend", None)
    choice = selection.select_mm_attention_backend(server_arg, None, tuple(vision.get_device_capability()), "cuda")
    if choice.backend == selection.FA4:
        from sglang_fa4.startup import fa4_preload

        fa4_preload.start()
    return None


def warm_fa4_after_load_model(result, self, *args, **kwargs):
    """AFTER ModelRunner.load_model (every scheduler process, before CUDA-graph capture and
    serving): compile the loaded model's FA4 ViT kernel variants. Returns None: SGLang keeps
    load_model's own result."""
    from sglang_fa4.startup import warmup
    warmup.warm_model(getattr(self, "model", None))
    return None


QWEN2_5_VIT_FORWARD = "sglang.srt.models.qwen2_5_vl.Qwen2_5_VisionTransformer.forward"


def qwen2_5_vit_forward(original, self, x, grid_thw):
    """AROUND Qwen2_5_VisionTransformer.forward: the ONE hook on it, serving both the host-metadata
    eager forward and the budget graphs' routing (two AROUND hooks on one target nest, and the inner
    one's ``original`` is SGLang's syncing forward: an above-budget batch skipped the no-sync path).

    * graph mode (``enable_cg``), a batch the budget graphs hold (or no sealed budgets): upstream's
      graph path;
    * graph mode, a batch above the budgets (decided from ``grid_thw``, host data): eager;
    * eager: with SGLANG_FA4_VIT_HOST_METADATA on CUDA/CPU, the forward with host-computed layouts
      and max_seqlen (no device sync); otherwise upstream's (with ``enable_cg`` off for the call).

    In graph mode SGLANG_VIT_ENABLE_CUDA_GRAPH stays set, so VisionAttention keeps SGLang's graph-mode
    rotary for the eager call (unset, it would compile Inductor's rotary on the request path)."""
    from sglang_fa4.integration import vit_budgets

    graph_mode = self.enable_cg
    if graph_mode:
        state = vit_budgets.budget_state(getattr(self, "cuda_graph_runner", None))
        if state is None or not state.sealed or not vit_budgets.exceeds_budgets(state, grid_thw):
            return original(self, x, grid_thw)
        state.eager_runs += 1
    if envs.SGLANG_FA4_VIT_HOST_METADATA.get() and self.device.type in ("cuda", "cpu"):
        from sglang_fa4.integration import qwen2_5_vit_forward as vit_forward

        return vit_forward.eager_forward(self, x, grid_thw, _vision().VisionAttentionMetadata)
    if not graph_mode:  # NPU wants host cu_seqlens: upstream's forward
        return original(self, x, grid_thw)
    self.enable_cg = False  # the forward reads it per call; the ViT runs on one thread
    try:
        return original(self, x, grid_thw)
    finally:
        self.enable_cg = True


QWEN3_VIT_POS_EMBED = "sglang.srt.models.qwen3_vl.Qwen3VLMoeVisionModel.fast_pos_embed_interpolate"


def qwen3_vit_graph_pos_embed(original, self, grid_thw):
    """AROUND Qwen3VLMoeVisionModel.fast_pos_embed_interpolate, whose one caller is the graph
    path (``_prepare_graph_inputs``): the position embeddings the eager forward computes for the
    same grid (qwen3_vit_pos_embed.py), not upstream's pixel-centre / host-numpy ones."""
    from sglang_fa4.integration import qwen3_vit_pos_embed

    return qwen3_vit_pos_embed.eager_pos_embeds(self, grid_thw)


QWEN3_VIT_VECTORIZED_POS_EMBED = "sglang.srt.models.qwen3_vl.Qwen3VLMoeVisionModel._use_vectorized_pos_embed"


def qwen3_vit_pos_embed_batch_invariant(original, self, num_images):
    """AROUND Qwen3VLMoeVisionModel._use_vectorized_pos_embed: under SGLang's batch-invariant mode
    (``--enable-deterministic-inference``) always the per-image loop. Upstream switches to its
    vectorized interpolation at 6 images: another computation (its 4-term weighted sum is one
    reduction over every image's tokens), "the same result" by upstream's word, not bitwise by
    construction, so an image's position embeddings could depend on how many images share its ViT
    call (the H200 servers showed images of 7- to 13-image calls differing from the same image
    alone; this removes one difference between those calls, not all: server.md). The loop computes
    each image on its own: the same bits in any batch. Applies to the eager forward and, through
    qwen3_vit_pos_embed, the graph path."""
    from sglang.srt.batch_invariant_ops import is_batch_invariant_mode_enabled

    if is_batch_invariant_mode_enabled():
        return False
    return original(self, num_images)
