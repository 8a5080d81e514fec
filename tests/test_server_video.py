"""The server check's video request (benchmark/serve_check/video.py, client.video_request) against
the REAL SGLang 0.5.20 and 0.5.23 on the CPU, with decord (the decoder the GPU machine gets in the
.video bundle): the preflight check_server.py runs in the server's Python (SGLang's own
video_decoder module reads the clip, or the reason it cannot is recorded); SGLang's decoder returns
the frames the clip was made from; the client's openai message goes through SGLang's chat-content
handling, the checkpoints' chat template and SGLang's own Qwen-VL multimodal processor (what the
tokenizer manager runs per request) to the video-token count and patch grid the geometry predicts."""

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from sglang_fa4.environ import envs
from sglang_harness import run_with_sglang, target_dir

ROOT = Path(__file__).resolve().parents[1]
SERVE = ROOT / "benchmark" / "serve_check"
sys.path[:0] = [str(SERVE)]
import video  # noqa: E402

_decord = importlib.util.find_spec("decord")
DECORD_DIR = str(Path(_decord.origin).parents[1]) if _decord else ""


@pytest.fixture(autouse=True)
def _needs_decord():
    """Skip without decord (fail under CI's SGLANG_FA4_REQUIRE_SGLANG=1, like a missing SGLang)."""
    if _decord is None:
        msg = "decord is not installed (tests/requirements-sglang.txt pins it; run tests/setup_env.sh)"
        if envs.SGLANG_FA4_REQUIRE_SGLANG.get():
            pytest.fail(msg + "; SGLANG_FA4_REQUIRE_SGLANG=1 makes that a failure", pytrace=False)
        pytest.skip(msg)


def test_preflight_reads_the_clip_or_says_why(sglang_version, tmp_path):
    base = f"{target_dir(sglang_version)}{os.pathsep}{DECORD_DIR}"
    ok = video.preflight(base)
    assert ok["ok"], ok
    assert ok["backend"] == "decord" and ok["decoder"].startswith("decord 0.6.0")
    assert (ok["frames"], ok["fps"], ok["shape"]) == (video.FRAMES, float(video.FPS), [video.HEIGHT, video.WIDTH])
    # a decord that cannot load (as on a machine without it): the reason names SGLang's decoder
    planted = tmp_path / "decord"
    planted.mkdir()
    (planted / "__init__.py").write_text("raise ImportError('planted: no FFmpeg here')\n")
    bad = video.preflight(f"{tmp_path}{os.pathsep}{base}")
    assert bad["ok"] is False and "found no torchcodec and cannot import decord" in bad["why"]
    assert "planted" in bad["why"]
    assert "sglang is not on this PYTHONPATH" in video.preflight(str(tmp_path / "nothing"))["why"]


def test_sglang_decodes_and_processes_the_video_request(sglang_version, tmp_path):
    out = run_with_sglang(sglang_version, f"""
import asyncio, argparse, sys, warnings
warnings.simplefilter("ignore")
sys.path[:0] = [{str(SERVE)!r}, {str(ROOT / "benchmark" / "release")!r}]
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
msg = req.messages({{}})[0]
res = {{"backend": vd._BACKEND}}
# SGLang's loader on the request's URL (base64 data URL -> bytes -> decoder), sampled like Qwen-VL
dec = load_video(msg["content"][0]["video_url"]["url"], use_gpu=False)
idx = [0, 4, 8, 13, 17, 22, 26, 31]
frames = dec.get_frames_at(idx)
res["decoded"] = {{"type": type(dec).__name__, "shape": list(frames.shape), "dtype": str(frames.dtype),
                  "psnr_own": [psnr(f, video.frame(i)) for f, i in zip(frames, idx)],
                  "psnr_next": [psnr(f, video.frame(i + 4)) for f, i in zip(frames[:-1], idx)]}}
fmt = detect_jinja_template_content_format(checkpoints.CHAT_TEMPLATE)
res["content_format"] = fmt
for m in checkpoints.MODELS:
    d = str(checkpoints.write_checkpoint(m, {str(tmp_path)!r} + "/" + m, 4))
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
    res[m] = {{"videos": len(videos), "images": len(images), "prompt_has_video_pad": "<|video_pad|>" in prompt,
              "video_pad": sum(1 for t in ids if t == client.VIDEO_PAD),
              "image_pad": sum(1 for t in ids if t == client.IMAGE_PAD),
              "grids": [[int(x) for x in g] for it in items if getattr(it, "video_grid_thw", None) is not None
                        for g in it.video_grid_thw],
              "modalities": [str(it.modality) for it in items], "video_processor": type(proc.video_processor).__name__}}
emit(res)
""", env={"SGLANG_IS_FLASHINFER_AVAILABLE": "false"}, timeout=600)
    assert out["backend"] == "decord"
    dec = out["decoded"]
    assert dec["type"] == "VideoDecoderWrapper" and dec["shape"] == [8, video.HEIGHT, video.WIDTH, 3]
    assert dec["dtype"] == "uint8"
    assert min(dec["psnr_own"]) > 30, dec["psnr_own"]      # H.264 at crf 23 of the frames it was made from
    assert max(dec["psnr_next"]) < 20, dec["psnr_next"]    # and not of the frame 0.5 s later
    assert out["content_format"] == "openai"
    for m, proc in (("qwen2_5_vl", "Qwen2VLVideoProcessor"), ("qwen3_vl", "Qwen3VLVideoProcessor")):
        r = out[m]
        assert (r["videos"], r["images"], r["prompt_has_video_pad"]) == (1, 0, True)
        assert r["video_processor"] == proc
        assert r["modalities"] == ["Modality.VIDEO"] and r["image_pad"] == 0
        assert r["grids"] == [list(video.expected_video_grid(m))], r["grids"]
        assert r["video_pad"] == video.expected_video_tokens(m)
