"""The server check's video request inside a REAL SGLang release, for tests/test_server_video.py:
SGLang's video decoder on the request's clip, then the client's openai message through SGLang's
chat-content handling, the checkpoints' chat template and SGLang's Qwen-VL multimodal processor.
Params: ``serve``, ``release`` (benchmark/serve_check and benchmark/release: the check's modules),
``tmp`` (where the checkpoints go)."""

from emit import emit, params

import asyncio, argparse, sys, warnings
warnings.simplefilter("ignore")
P = params()
sys.path[:0] = [P["serve"], P["release"]]
import numpy as np
import checkpoints, check_server, client, video
from sglang.srt.server_args import ServerArgs
from sglang.srt.runtime_context import publish
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.managers.multimodal_processor import import_processors, get_mm_processor
from sglang.srt.utils.hf_transformers_utils import get_processor
from sglang.srt.multimodal.transport import determine_tensor_transport_mode
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.parser.jinja_template_utils import (detect_jinja_template_content_format,
                                                    process_content_for_template_format)
from sglang.srt.utils.common import load_video
import sglang.srt.multimodal.processors.base_processor as bp
import sglang.srt.multimodal.processors.qwen_vl as qv
import sglang.srt.utils.video_decoder as vd
# no GPU here: SGLang pins decoded frames for the H2D copy unless it runs on the CPU engine
bp._is_cpu = True
qv.is_cpu = lambda: True
vd._is_cpu_engine = lambda: True
import_processors("sglang.srt.multimodal.processors")

def psnr(a, b):
    d = a.astype(np.float64) - b.astype(np.float64)
    return float(10 * np.log10(255.0 ** 2 / max(np.mean(d * d), 1e-12)))

req = client.video_request()
msg = req.messages({})[0]
res = {"backend": vd._BACKEND}
# SGLang's loader on the request's URL (base64 data URL -> bytes -> decoder), sampled like Qwen-VL
dec = load_video(msg["content"][0]["video_url"]["url"], use_gpu=False)
idx = [0, 4, 8, 13, 17, 22, 26, 31]
frames = dec.get_frames_at(idx)
res["decoded"] = {"type": type(dec).__name__, "shape": list(frames.shape), "dtype": str(frames.dtype),
                  "psnr_own": [psnr(f, video.frame(i)) for f, i in zip(frames, idx)],
                  "psnr_next": [psnr(f, video.frame(i + 4)) for f, i in zip(frames[:-1], idx)]}
fmt = detect_jinja_template_content_format(checkpoints.CHAT_TEMPLATE)
res["content_format"] = fmt
for m in checkpoints.MODELS:
    d = str(checkpoints.write_checkpoint(m, P["tmp"] + "/" + m, 4))
    p = argparse.ArgumentParser(); ServerArgs.add_cli_args(p)
    sa = ServerArgs.from_cli_args(p.parse_args(check_server.server_args(d, 30123)))
    sa.device = "cpu"
    publish(sa, role="tokenizer")
    mc = ModelConfig.from_server_args(sa)
    proc = get_processor(d)
    mm = get_mm_processor(mc.hf_config, sa, proc, determine_tensor_transport_mode(), model_config=mc)
    images, videos, audios, modalities = [], [], [], []
    processed = process_content_for_template_format(dict(msg), fmt, images, videos, audios, modalities)
    prompt = proc.tokenizer.apply_chat_template([processed], add_generation_prompt=True, tokenize=False)
    o = asyncio.run(mm.process_mm_data_async(image_data=images or None, audio_data=None, input_text=prompt,
                    request_obj=GenerateReqInput(text=prompt, video_data=videos), max_req_input_len=100000))
    ids = o["input_ids"] if isinstance(o, dict) else o.input_ids
    items = o["mm_items"] if isinstance(o, dict) else o.mm_items
    res[m] = {"videos": len(videos), "images": len(images), "prompt_has_video_pad": "<|video_pad|>" in prompt,
              "video_pad": sum(1 for t in ids if t == client.VIDEO_PAD),
              "image_pad": sum(1 for t in ids if t == client.IMAGE_PAD),
              "grids": [[int(x) for x in g] for it in items if getattr(it, "video_grid_thw", None) is not None
                        for g in it.video_grid_thw],
              "modalities": [str(it.modality) for it in items], "video_processor": type(proc.video_processor).__name__}
emit(res)
