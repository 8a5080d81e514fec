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
from sglang_harness import run_file, target_dir

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
    out = run_file(sglang_version, "server_video_request.py",
                   {"serve": str(SERVE), "release": str(ROOT / "benchmark" / "release"), "tmp": str(tmp_path)},
                   env={"SGLANG_IS_FLASHINFER_AVAILABLE": "false"}, timeout=600)
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
