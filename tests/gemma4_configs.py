"""Gemma-4 config.json files of the released shapes (and small ones) for the tests that resolve
them through SGLang: the 31B and the 26B-A4B MoE as their -it checkpoints ship them
(Gemma4ForConditionalGeneration, a vision tower, ``head_dim`` = the sliding layers' 256,
``global_head_dim`` = the full layers' 512), a small text-only one of the same layer types, and a
small one whose full layers are d256 too."""

from __future__ import annotations


def layer_types(n: int) -> list:
    """Gemma-4's 5:1 sliding:full pattern (the last layer full)."""
    return ["full_attention" if (i + 1) % 6 == 0 or i == n - 1 else "sliding_attention" for i in range(n)]


ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0}}


def gemma4(text: dict, vision: bool = True) -> dict:
    cfg = {"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4", "torch_dtype": "bfloat16",
           "text_config": {"model_type": "gemma4_text", "rope_parameters": ROPE, "rms_norm_eps": 1e-6,
                           "vocab_size": 262144, "max_position_embeddings": 262144, "hidden_size_per_layer_input": 0,
                           "final_logit_softcapping": 30.0, "torch_dtype": "bfloat16", **text}}
    if vision:
        cfg["vision_config"] = {"model_type": "gemma4_vision"}
    return cfg


MODELS = {
    # gemma-4-31B-it: 60 layers (50 sliding d256 32q/16kv, window 1024; 10 full d512 32q/4kv), K reused as V
    "gemma4_31b": gemma4({"hidden_size": 5376, "intermediate_size": 21504, "num_hidden_layers": 60,
                          "num_attention_heads": 32, "num_key_value_heads": 16, "head_dim": 256,
                          "global_head_dim": 512, "num_global_key_value_heads": 4, "attention_k_eq_v": True,
                          "sliding_window": 1024, "layer_types": layer_types(60)}),
    # gemma-4-26B-A4B-it: 30 layers, 16 q heads; sliding d256 8 kv, full d512 2 kv; 128 experts, top 8
    "gemma4_26b_a4b": gemma4({"hidden_size": 2816, "intermediate_size": 2112, "num_hidden_layers": 30,
                              "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256,
                              "global_head_dim": 512, "num_global_key_value_heads": 2, "attention_k_eq_v": True,
                              "sliding_window": 1024, "layer_types": layer_types(30), "enable_moe_block": True,
                              "num_experts": 128, "top_k_experts": 8, "moe_intermediate_size": 704}),
    # small, text only (no vision tower): the 31B's layer types at 6 layers
    "gemma4_small": gemma4({"hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 6,
                            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 256,
                            "global_head_dim": 512, "num_global_key_value_heads": 1, "attention_k_eq_v": True,
                            "sliding_window": 512, "layer_types": layer_types(6)}, vision=False),
    # small, text only, full layers d256 as well: every head dim one the kernels run today
    "gemma4_small_d256": gemma4({"hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 6,
                                 "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 256,
                                 "global_head_dim": 256, "num_global_key_value_heads": 1, "attention_k_eq_v": True,
                                 "sliding_window": 512, "layer_types": layer_types(6)}, vision=False),
}
