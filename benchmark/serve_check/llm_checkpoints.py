"""Checkpoint directories (no weights) for the LLM serving harness (benchmark/release/serve_llm.py):
the public config.json values of gemma-4-31B-it and Llama-3.1-8B-Instruct (the Llama-3-8B attention
shape, 32 q / 8 kv heads, d128, with Llama-3.1's 128k context so an 8k-in / 1k-out request fits),
the decoder cut to ``layers`` layers where asked, and a byte-level BPE tokenizer made here with
the ``tokenizers`` library holding the model's special tokens at the ids its config names (the
model's vocabulary stays the config's: the tokenizer only produces ids below it).

Gemma-4 keeps its 5:1 sliding:full layer pattern (the last layer full) at any layer count, so a cut
model still runs both the d256 sliding and the d512 full layers. It is served text-only: its
config.json declares ``language_model_only`` (SGLang 0.5.23's ModelConfig reads the checkpoint's own
declaration beside the ``--language-model-only`` flag, which it refuses for Gemma-4), so the server is
not multimodal and loads no image processor (text prompts only; the vision tower is still built, with
dummy weights, and never called).

Usage: python benchmark/serve_check/llm_checkpoints.py OUT_DIR [--gemma4-layers 12] [--llama-layers 32]
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

MODELS = ("gemma4_31b", "llama3_8b")


def gemma4_layer_types(n: int) -> list[str]:
    """Gemma-4's pattern: every sixth layer full attention, and the last one."""
    return ["full_attention" if (i + 1) % 6 == 0 or i == n - 1 else "sliding_attention" for i in range(n)]


# config.json of google/gemma-4-31B-it (public values; text_config.num_hidden_layers cut below)
GEMMA4_31B = {
    "architectures": ["Gemma4ForConditionalGeneration"],
    "model_type": "gemma4",
    "torch_dtype": "bfloat16",
    "text_config": {
        "model_type": "gemma4_text", "hidden_size": 5376, "intermediate_size": 21504, "num_hidden_layers": 60,
        "num_attention_heads": 32, "num_key_value_heads": 16, "head_dim": 256, "global_head_dim": 512,
        "num_global_key_value_heads": 4, "attention_k_eq_v": True, "sliding_window": 1024,
        "layer_types": gemma4_layer_types(60), "rms_norm_eps": 1e-6, "vocab_size": 262144,
        "max_position_embeddings": 262144, "hidden_size_per_layer_input": 0, "final_logit_softcapping": 30.0,
        "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0,
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
        },
    },
    "vision_config": {"model_type": "gemma4_vision"},
    "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0,
    # not in the public config: the checkpoint's own text-only declaration (see the module docstring)
    "language_model_only": True,
}

# config.json of meta-llama/Llama-3.1-8B-Instruct (public values)
LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128009, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072, "mlp_bias": False,
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "pretraining_tp": 1,
    "rms_norm_eps": 1e-5,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
    "vocab_size": 128256,
}

#: special tokens per model, at the ids the real tokenizers give them (the first added gets BOS)
SPECIALS = {
    "gemma4_31b": {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3},
    "llama3_8b": {"<|begin_of_text|>": 128000, "<|end_of_text|>": 128001, "<|eot_id|>": 128009},
}
BOS = {"gemma4_31b": "<bos>", "llama3_8b": "<|begin_of_text|>"}
EOS = {"gemma4_31b": "<eos>", "llama3_8b": "<|eot_id|>"}
PAD = {"gemma4_31b": "<pad>", "llama3_8b": "<|end_of_text|>"}
FULL_LAYERS = {"gemma4_31b": 60, "llama3_8b": 32}


def text_config(config: dict) -> dict:
    return config.get("text_config", config)


def model_config(model: str, layers: int | None = None) -> dict:
    """``model``'s public config with ``layers`` decoder layers (None: all of them)."""
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; known: {MODELS}")
    config = copy.deepcopy(GEMMA4_31B if model == "gemma4_31b" else LLAMA3_8B)
    text = text_config(config)
    n = FULL_LAYERS[model] if layers is None else int(layers)
    if not 1 <= n <= FULL_LAYERS[model]:
        raise ValueError(f"{model}: layers must be in 1..{FULL_LAYERS[model]}, got {layers}")
    if model == "gemma4_31b" and n < 6:
        raise ValueError(f"gemma4_31b: at least 6 layers, so the cut model keeps both layer types "
                         f"(5 sliding d256 + 1 full d512), got {n}")
    text["num_hidden_layers"] = n
    if "layer_types" in text:
        text["layer_types"] = gemma4_layer_types(n)
    return config


def layer_counts(config: dict) -> dict[str, int]:
    """How many layers of each attention type the config has."""
    text = text_config(config)
    types = text.get("layer_types") or ["full_attention"] * text["num_hidden_layers"]
    return {t: types.count(t) for t in sorted(set(types))}


def _byte_alphabet() -> list[str]:
    from tokenizers import pre_tokenizers

    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, n = [], 0
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + n))
            n += 1
    assert set(chars) == set(pre_tokenizers.ByteLevel.alphabet()), "byte-level alphabet mismatch"
    return chars


def build_tokenizer(model: str):
    """Byte-level BPE without merges: every byte one token (the lowest ids the specials leave
    free), fillers up to the highest special id (never produced by encoding), the specials at their
    ids; BOS prepended to every encoding, as the real tokenizers do."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    specials = SPECIALS[model]
    taken = set(specials.values())
    vocab, i = {}, 0
    for ch in _byte_alphabet():
        while i in taken:
            i += 1
        vocab[ch] = i
        i += 1
    vocab.update(specials)  # in the model at their ids; add_special_tokens then marks them special
    top = max(max(taken), i - 1)
    used = set(vocab.values())
    for j in range(top + 1):
        if j not in used:
            vocab[f"<filler_{j}>"] = j
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True, trim_offsets=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(name, special=True, normalized=False) for name in specials])
    for name, sid in specials.items():
        if tok.token_to_id(name) != sid:
            raise AssertionError(f"{model}: {name} got id {tok.token_to_id(name)}, expected {sid}")
    bos = BOS[model]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, specials[bos])])
    return tok


def tokenizer_config(model: str) -> dict:
    added = {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False, "special": True} for t, i in SPECIALS[model].items()}
    return {"tokenizer_class": "PreTrainedTokenizerFast", "added_tokens_decoder": added,
            "bos_token": BOS[model], "eos_token": EOS[model], "pad_token": PAD[model],
            "add_bos_token": True, "model_max_length": 131072, "clean_up_tokenization_spaces": False}


def write_checkpoint(model: str, out_dir, layers: int | None = None) -> Path:
    """``model``'s directory (config, generation config, tokenizer) in ``out_dir``; returns it."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = model_config(model, layers)
    vocab = text_config(config)["vocab_size"]
    if max(SPECIALS[model].values()) >= vocab:
        raise ValueError(f"{model}: special ids do not fit the vocabulary of {vocab}")
    (out / "config.json").write_text(json.dumps(config, indent=2))
    ids = SPECIALS[model]
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": ids[BOS[model]], "eos_token_id": ids[EOS[model]], "pad_token_id": ids[PAD[model]],
         "do_sample": False}, indent=2))
    build_tokenizer(model).save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(model), indent=2))
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": BOS[model], "eos_token": EOS[model], "pad_token": PAD[model]}, indent=2))
    return out


# ---- memory (the planner's estimate; what SGLang allocates is read from each server's log) ----

def param_count(config: dict) -> int:
    """Parameters of the language model (Gemma-4's vision tower, ~0.4B at its defaults, not counted)."""
    t = text_config(config)
    h, inter, vocab = t["hidden_size"], t["intermediate_size"], t["vocab_size"]
    hq = t["num_attention_heads"]
    total = vocab * h * (1 if t.get("tie_word_embeddings", config.get("tie_word_embeddings")) else 2)
    types = t.get("layer_types") or ["full_attention"] * t["num_hidden_layers"]
    for lt in types:
        if "global_head_dim" in t and lt == "full_attention":
            d, hkv, kv_proj = t["global_head_dim"], t["num_global_key_value_heads"], 1 if t.get("attention_k_eq_v") else 2
        else:
            d, hkv, kv_proj = t.get("head_dim", h // hq), t["num_key_value_heads"], 2
        total += h * hq * d * 2 + h * hkv * d * kv_proj + 3 * h * inter
    return total


def kv_bytes_per_token(config: dict, kv_bytes: int) -> dict[str, int]:
    """KV bytes per token per pool: 'full' (full-attention layers), 'swa' (sliding layers; each
    holds at most window tokens of a request). SGLang stores K and V for every layer."""
    t = text_config(config)
    out = {"full": 0, "swa": 0}
    types = t.get("layer_types") or ["full_attention"] * t["num_hidden_layers"]
    for lt in types:
        if "global_head_dim" in t and lt == "full_attention":
            d, hkv = t["global_head_dim"], t["num_global_key_value_heads"]
        else:
            d, hkv = t.get("head_dim", t["hidden_size"] // t["num_attention_heads"]), t["num_key_value_heads"]
        out["swa" if lt == "sliding_attention" else "full"] += 2 * hkv * d * kv_bytes
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--gemma4-layers", type=int, default=12)
    ap.add_argument("--llama-layers", type=int, default=32)
    a = ap.parse_args(argv)
    print(write_checkpoint("gemma4_31b", Path(a.out_dir) / "gemma4_31b", a.gemma4_layers))
    print(write_checkpoint("llama3_8b", Path(a.out_dir) / "llama3_8b", a.llama_layers))


if __name__ == "__main__":
    main()
