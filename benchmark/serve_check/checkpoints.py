"""Small Qwen2.5-VL / Qwen3-VL checkpoint directories that a real SGLang server can load with
``--load-format dummy``: the public ``config.json`` values of Qwen2.5-VL-7B-Instruct and
Qwen3-VL-8B-Instruct (vision tower at full size, special-token ids, vocabulary size, rotary
settings), with the language model cut to ``text_layers`` decoder layers; a byte-level BPE
tokenizer made here with the ``tokenizers`` library that holds every special token at the id the
config names; a chat template; the image (and, for Qwen3-VL, video) processor configs.

No weights: SGLang's dummy loader fills them. Usage:
    python benchmark/serve_check/checkpoints.py OUT_DIR [--text-layers 4]
writes OUT_DIR/qwen2_5_vl and OUT_DIR/qwen3_vl.
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

MODELS = ("qwen2_5_vl", "qwen3_vl")

# Qwen's special tokens, in id order from 151643 (the same block in Qwen2.5-VL and Qwen3-VL).
SPECIAL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
)
FIRST_SPECIAL_ID = 151643
SPECIAL_IDS = {tok: FIRST_SPECIAL_ID + i for i, tok in enumerate(SPECIAL_TOKENS)}

# config.json of Qwen/Qwen2.5-VL-7B-Instruct (public values; num_hidden_layers cut below)
QWEN2_5_VL_CONFIG = {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"],
    "model_type": "qwen2_5_vl",
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
    "vision_token_id": 151654,
    "image_token_id": 151655,
    "video_token_id": 151656,
    "hidden_act": "silu",
    "hidden_size": 3584,
    "initializer_range": 0.02,
    "intermediate_size": 18944,
    "max_position_embeddings": 128000,
    "max_window_layers": 28,
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
    "sliding_window": 32768,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.41.2",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 152064,
    "vision_config": {
        "depth": 32, "hidden_act": "silu", "hidden_size": 1280, "intermediate_size": 3420,
        "num_heads": 16, "in_chans": 3, "out_hidden_size": 3584, "patch_size": 14,
        "spatial_merge_size": 2, "spatial_patch_size": 14, "window_size": 112,
        "fullatt_block_indexes": [7, 15, 23, 31], "tokens_per_second": 2, "temporal_patch_size": 2,
    },
}

# config.json of Qwen/Qwen3-VL-8B-Instruct (public values; text_config.num_hidden_layers cut below)
QWEN3_VL_CONFIG = {
    "architectures": ["Qwen3VLForConditionalGeneration"],
    "model_type": "qwen3_vl",
    "image_token_id": 151655,
    "video_token_id": 151656,
    "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
    "tie_word_embeddings": False,
    "transformers_version": "4.57.0.dev0",
    "text_config": {
        "model_type": "qwen3_vl_text",
        "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 151643,
        "eos_token_id": 151645, "dtype": "bfloat16", "head_dim": 128, "hidden_act": "silu",
        "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 12288,
        "max_position_embeddings": 262144, "num_attention_heads": 32, "num_hidden_layers": 36,
        "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
        "rope_scaling": {"mrope_interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"},
        "rope_theta": 5000000, "use_cache": True, "vocab_size": 151936,
    },
    "vision_config": {
        "model_type": "qwen3_vl",
        "deepstack_visual_indexes": [8, 16, 24], "depth": 27, "hidden_act": "gelu_pytorch_tanh",
        "hidden_size": 1152, "in_channels": 3, "initializer_range": 0.02, "intermediate_size": 4304,
        "num_heads": 16, "num_position_embeddings": 2304, "out_hidden_size": 4096, "patch_size": 16,
        "spatial_merge_size": 2, "temporal_patch_size": 2,
    },
}

# Qwen2's pre-tokenizer split (words, single digits, punctuation runs, newlines, spaces)
QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")

CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]

# preprocessor_config.json (and Qwen3-VL's video_preprocessor_config.json), public values
PROCESSOR_FILES = {
    "qwen2_5_vl": {
        "preprocessor_config.json": {
            "min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "temporal_patch_size": 2,
            "merge_size": 2, "image_mean": CLIP_MEAN, "image_std": CLIP_STD,
            "image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2_5_VLProcessor",
        },
    },
    "qwen3_vl": {
        "preprocessor_config.json": {
            "size": {"longest_edge": 16777216, "shortest_edge": 65536}, "patch_size": 16,
            "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5, 0.5, 0.5],
            "image_std": [0.5, 0.5, 0.5], "processor_class": "Qwen3VLProcessor",
            "image_processor_type": "Qwen2VLImageProcessorFast",
        },
        "video_preprocessor_config.json": {
            "size": {"longest_edge": 25165824, "shortest_edge": 4096}, "patch_size": 16,
            "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5, 0.5, 0.5],
            "image_std": [0.5, 0.5, 0.5], "processor_class": "Qwen3VLProcessor",
            "video_processor_type": "Qwen3VLVideoProcessor",
        },
    },
}

# ChatML with Qwen-VL's vision placeholders: each image part becomes
# <|vision_start|><|image_pad|><|vision_end|> (the processor expands <|image_pad|> to the image's
# token count), each video part the same with <|video_pad|>.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' or part['type'] == 'image_url' or 'image' in part %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'video' or part['type'] == 'video_url' or 'video' in part %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in part %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def text_config(config: dict) -> dict:
    """The language-model part of a config (Qwen3-VL nests it, Qwen2.5-VL does not)."""
    return config.get("text_config", config)


def model_config(model: str, text_layers: int = 4) -> dict:
    """The public config of ``model`` with its language model cut to ``text_layers`` layers."""
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; known: {MODELS}")
    config = copy.deepcopy(QWEN2_5_VL_CONFIG if model == "qwen2_5_vl" else QWEN3_VL_CONFIG)
    text = text_config(config)
    deepstack = len(config["vision_config"].get("deepstack_visual_indexes", ()))
    if text_layers < max(1, deepstack):
        raise ValueError(f"{model} needs at least {max(1, deepstack)} language-model layers "
                         f"(its deepstack features go into the first {deepstack})")
    text["num_hidden_layers"] = text_layers
    if "max_window_layers" in text:
        text["max_window_layers"] = text_layers
    return config


def vocab_size(config: dict) -> int:
    return text_config(config)["vocab_size"]


def config_token_ids(config: dict) -> dict[str, int]:
    """The special-token ids a config names, by the token each one must be."""
    text = text_config(config)
    ids = {
        "<|endoftext|>": text["bos_token_id"],
        "<|im_end|>": text["eos_token_id"],
        "<|vision_start|>": config["vision_start_token_id"],
        "<|vision_end|>": config["vision_end_token_id"],
        "<|image_pad|>": config["image_token_id"],
        "<|video_pad|>": config["video_token_id"],
    }
    if "vision_token_id" in config:
        ids["<|vision_pad|>"] = config["vision_token_id"]
    return ids


def _byte_alphabet() -> list[str]:
    """The 256 characters of the byte-level alphabet (GPT-2's bytes_to_unicode), in byte order."""
    from tokenizers import pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    chars, n = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    out = [chars[b] for b in range(256)]
    assert set(out) == set(alphabet), "byte-level alphabet mismatch"
    return out


def build_tokenizer(n_vocab: int):
    """A byte-level BPE tokenizer (no merges: every byte is a token, ids 0..255), filler tokens
    up to id 151642 (never produced by encoding; they stand for Qwen's merged tokens), then
    Qwen's special tokens at 151643.. exactly as Qwen's tokenizer numbers them. ``n_vocab`` (the
    config's vocab_size) only bounds it: the ids must fit."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    last = FIRST_SPECIAL_ID + len(SPECIAL_TOKENS) - 1
    if last >= n_vocab:
        raise ValueError(f"special ids up to {last} do not fit a vocabulary of {n_vocab}")
    vocab = {ch: i for i, ch in enumerate(_byte_alphabet())}
    for i in range(len(vocab), FIRST_SPECIAL_ID):
        vocab[f"<|filler_{i}|>"] = i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False, trim_offsets=False),
    ])
    tok.decoder = decoders.ByteLevel()
    added = tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    assert added == len(SPECIAL_TOKENS)
    for t, i in SPECIAL_IDS.items():
        got = tok.token_to_id(t)
        if got != i:
            raise AssertionError(f"{t} got id {got}, expected {i}")
    return tok


def tokenizer_config() -> dict:
    added = {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False, "special": True} for t, i in SPECIAL_IDS.items()}
    return {
        "tokenizer_class": "Qwen2Tokenizer",
        "added_tokens_decoder": added,
        "additional_special_tokens": [t for t in SPECIAL_TOKENS if t not in ("<|endoftext|>", "<|im_end|>")],
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "errors": "replace",
        "model_max_length": 131072,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "chat_template": CHAT_TEMPLATE,
    }


def write_checkpoint(model: str, out_dir, text_layers: int = 4) -> Path:
    """Write ``model``'s checkpoint directory (no weights) into ``out_dir``; returns it."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = model_config(model, text_layers)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    text = text_config(config)
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": text["bos_token_id"], "eos_token_id": [text["eos_token_id"], 151643],
         "pad_token_id": 151643, "do_sample": False}, indent=2))
    tok = build_tokenizer(vocab_size(config))
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=2))
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
         "additional_special_tokens": tokenizer_config()["additional_special_tokens"]}, indent=2))
    for name, content in PROCESSOR_FILES[model].items():
        (out / name).write_text(json.dumps(content, indent=2))
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--text-layers", type=int, default=4)
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    args = ap.parse_args(argv)
    for model in args.models:
        print(write_checkpoint(model, Path(args.out_dir) / model, args.text_layers))


if __name__ == "__main__":
    main()
