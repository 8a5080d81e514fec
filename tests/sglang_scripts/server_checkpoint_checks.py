"""The server check's checkpoint directories (benchmark/serve_check/checkpoints.py) inside a REAL SGLang
release, for tests/test_server_checkpoints.py: each function is one subprocess's check and returns
its JSON result. ``serve`` and ``release`` are benchmark/serve_check and benchmark/release (put first
on sys.path, where the check's modules live)."""

from __future__ import annotations

import json
import sys
import warnings


def _setup(serve: str, release: str) -> None:
    warnings.simplefilter("ignore")
    sys.path[:0] = [serve, release]


def tokenizer_and_processor(serve: str, release: str, tmp: str) -> dict:
    """Each model's checkpoint written under ``tmp``, loaded back through transformers' Auto classes
    (the tokenizers/transformers this SGLang version pins)."""
    _setup(serve, release)
    import checkpoints
    from PIL import Image
    from transformers import AutoConfig, AutoProcessor, AutoTokenizer

    res = {}
    for m in checkpoints.MODELS:
        d = checkpoints.write_checkpoint(m, tmp + "/" + m, 4)
        cfg = json.loads((d / "config.json").read_text())
        tok = AutoTokenizer.from_pretrained(str(d))
        ids_by_token = {t: tok.convert_tokens_to_ids(t) for t in checkpoints.SPECIAL_TOKENS}
        text = "<|im_start|>user\nHello, wörld 123!<|vision_start|><|image_pad|><|vision_end|><|im_end|>"
        enc = tok.encode(text, add_special_tokens=False)
        proc = AutoProcessor.from_pretrained(str(d))
        msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi"}]}]
        prompt = proc.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        pads = {}
        for w, h in ((448, 448), (1280, 720)):
            o = proc(text=[prompt], images=[Image.new("RGB", (w, h), (9, 99, 199))], return_tensors="pt")
            pads[f"{w}x{h}"] = int((o["input_ids"][0] == cfg.get("image_token_id")).sum())
        hf = AutoConfig.from_pretrained(str(d))
        res[m] = {"ids": ids_by_token, "config_ids": checkpoints.config_token_ids(cfg),
                  "roundtrip": tok.decode(enc) == text, "specials_single": [i for i in enc if i >= 151643],
                  "prompt": prompt, "pads": pads, "processor": type(proc).__name__,
                  "hf_layers": (getattr(hf, "text_config", None) or hf).num_hidden_layers}
    return res


def sglang_reads_the_checkpoints(serve: str, release: str, tmp: str) -> dict:
    """SGLang's ServerArgs (from the CLI parser), ModelConfig and its own Qwen-VL multimodal processor
    on each model's checkpoint written under ``tmp``."""
    _setup(serve, release)
    # kept in this order: SGLang's modules import each other on first use
    import argparse
    import asyncio

    import checkpoints
    import check_server
    import client
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.runtime_context import publish
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.managers.multimodal_processor import import_processors, get_mm_processor
    from sglang.srt.utils.hf_transformers_utils import get_processor
    from sglang.srt.multimodal.transport import determine_tensor_transport_mode
    from sglang.srt.managers.io_struct import GenerateReqInput
    import sglang.srt.multimodal.processors.base_processor as bp

    bp._is_cpu = True   # 0.5.20 runs the fast image processor on cuda:<gpu> in the tokenizer process
    import_processors("sglang.srt.multimodal.processors")
    res = {}
    for m in checkpoints.MODELS:
        d = str(checkpoints.write_checkpoint(m, tmp + "/" + m, 4))
        p = argparse.ArgumentParser()
        ServerArgs.add_cli_args(p)
        sa = ServerArgs.from_cli_args(p.parse_args(check_server.server_args(d, 30123)))
        args = {k: getattr(sa, k) for k in ("attention_backend", "mm_attention_backend", "sampling_backend",
                "enable_deterministic_inference", "disable_radix_cache", "load_format", "chunked_prefill_size")}
        sa.device = "cpu"   # publishing resolves the device; this machine has no GPU
        publish(sa, role="tokenizer")
        mc = ModelConfig.from_server_args(sa)
        proc = get_processor(d)
        mm = get_mm_processor(mc.hf_config, sa, proc, determine_tensor_transport_mode(), model_config=mc)
        prompt = proc.tokenizer.apply_chat_template(
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}, {"type": "text", "text": "Hi"}]}],
            add_generation_prompt=True, tokenize=False)
        pads = {}
        for w, h in ((448, 448), (1280, 720), (640, 960)):
            url = client.data_url(client.make_image(w, h, 7, "PNG"), "PNG")
            o = asyncio.run(mm.process_mm_data_async(image_data=[url], audio_data=None, input_text=prompt,
                            request_obj=GenerateReqInput(text=prompt, image_data=[url]), max_req_input_len=100000))
            ids = o["input_ids"] if isinstance(o, dict) else o.input_ids
            pads[f"{w}x{h}"] = sum(1 for t in ids if t == client.IMAGE_PAD)
        res[m] = {"args": args, "arch": mc.hf_config.architectures, "multimodal": mc.is_multimodal,
                  "layers": mc.num_hidden_layers, "mm_processor": type(mm).__name__, "pads": pads}
    return res


def check_plugin_hooks(serve: str, release: str) -> dict:
    """The check's own plugin registered and applied through SGLang's HookRegistry; its hook run on a
    tiny module after the dummy loader."""
    _setup(serve, release)
    import torch
    import logging
    import io
    import check_plugin
    from sglang.srt.plugins.hook_registry import HookRegistry

    check_plugin.register()
    HookRegistry.apply_hooks()
    from sglang.srt.model_loader.loader import DummyModelLoader

    buf = io.StringIO()
    check_plugin.logger.addHandler(logging.StreamHandler(buf))

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(64, 64)
            self.input_layernorm = torch.nn.LayerNorm(64)

    m = Tiny()
    check_plugin.after_dummy_load(m, None)
    return {"patched": check_plugin.LOADER_TARGET in HookRegistry._patched,
            "wrapped": DummyModelLoader.load_model.__qualname__, "log": buf.getvalue(),
            "norm": [float(m.input_layernorm.weight.min()), float(m.input_layernorm.bias.abs().max())],
            "bias": float(m.proj.bias.abs().max()), "std": float(m.proj.weight.std())}
