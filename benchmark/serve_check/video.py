"""The server check's test video: a short synthetic clip (moving colour gradients and a moving
square, every frame different), its expected frames, and the request that carries it.

The clip is committed (``clip.mp4``, H.264, ~100 KB) so every server of every run gets the same
bytes; this module regenerates it with PyAV (``av==18.1.0``, needed only to regenerate, never on
the GPU machine):
    python benchmark/serve_check/video.py [OUT.mp4]
``frame(i)`` is the picture the encoder was given, for checking what a decoder returns.
"""

from __future__ import annotations

import base64
import json
import math
import os
import subprocess
import sys
from pathlib import Path

CLIP = Path(__file__).with_name("clip.mp4")
WIDTH, HEIGHT, FPS, SECONDS = 640, 360, 8, 4
FRAMES = FPS * SECONDS


def frame(i: int, width: int = WIDTH, height: int = HEIGHT):
    """Frame ``i`` (HxWx3 uint8): three sinusoidal gradients whose phase moves with ``i`` and a
    bright square crossing the picture (smooth content: it compresses to a small file, and
    frames sampled a second apart still differ)."""
    import numpy as np

    t = i / FPS
    y = np.linspace(0.0, 1.0, height, dtype=np.float32)[:, None]
    x = np.linspace(0.0, 1.0, width, dtype=np.float32)[None, :]
    chans = [0.5 + 0.45 * np.sin(2 * math.pi * (x * (1 + c) + y * (2 - c) + 0.35 * t * (c + 1)))
             for c in range(3)]
    img = np.broadcast_arrays(*chans)
    img = np.stack(img, axis=-1)
    side = height // 4
    x0 = int((width - side) * i / max(FRAMES - 1, 1))
    y0 = int((height - side) * (0.5 + 0.4 * math.sin(2 * math.pi * t / SECONDS)))
    img[y0:y0 + side, x0:x0 + side] = (0.95, 0.95, 0.2)
    return (np.clip(img, 0.0, 1.0) * 255).round().astype(np.uint8)


def write_clip(path: Path = CLIP) -> Path:
    """Encode FRAMES frames at FPS with libx264 (yuv420p, a keyframe every FPS frames, no
    B-frames, one thread: the same bytes on every run of this function with the same PyAV)."""
    import av

    with av.open(str(path), "w", format="mp4") as out:
        st = out.add_stream("libx264", rate=FPS, options={"crf": "23", "preset": "medium", "bf": "0",
                                                        "g": str(FPS), "threads": "1"})
        st.width, st.height, st.pix_fmt = WIDTH, HEIGHT, "yuv420p"
        for i in range(FRAMES):
            for pkt in st.encode(av.VideoFrame.from_ndarray(frame(i), format="rgb24")):
                out.mux(pkt)
        for pkt in st.encode():
            out.mux(pkt)
    return path


def data_url(path: Path = CLIP) -> str:
    """The clip as the ``video_url`` SGLang's openai front end takes: a base64 data URL (SGLang
    decodes it to bytes and hands them to its video decoder)."""
    return "data:video/mp4;base64," + base64.b64encode(Path(path).read_bytes()).decode()


def _round(x: float, f: int) -> int:
    return max(f, round(x / f) * f)


def expected_video_grid(model: str) -> tuple[int, int, int]:
    """(t, h, w) patch grid of the clip after SGLang's Qwen-VL video path, from the geometry alone
    (not the processors' code): SGLang samples 2 frames per second (at least 4, an even count),
    resizes each frame to multiples of 28 within 128..768 x 28x28 pixels; the model's video
    processor then rounds to its own patch x merge size (28 Qwen2.5-VL, 32 Qwen3-VL) and pairs
    frames (temporal patch 2)."""
    n = FRAMES / FPS * 2.0
    n = min(max(n, 4), FRAMES)
    n = int(n // 2 * 2)
    lo, hi = 128 * 28 * 28, 768 * 28 * 28
    h, w = _round(HEIGHT, 28), _round(WIDTH, 28)
    if not lo <= h * w <= hi:
        raise ValueError(f"{WIDTH}x{HEIGHT} needs SGLang's min/max-pixel rescale: not modelled here")
    patch, factor = {"qwen2_5_vl": (14, 28), "qwen3_vl": (16, 32)}[model]
    h, w = _round(h, factor), _round(w, factor)
    return n // 2, h // patch, w // patch


def expected_video_tokens(model: str) -> int:
    """<|video_pad|> tokens the prompt holds for the clip (the grid merged 2x2)."""
    t, h, w = expected_video_grid(model)
    return t * h * w // 4


# Runs in the SERVER's Python (its PYTHONPATH): SGLang's own video decoder module, loaded from
# its file (its package __init__ would import torch and all of SGLang: seconds per call on the
# GPU machine), decodes the clip's bytes as SGLang does for a base64 data URL.
_PREFLIGHT = r"""
import importlib.util, json, os, sys
out = {}
try:
    spec = importlib.util.find_spec("sglang")
    if spec is None:
        raise ImportError("sglang is not on this PYTHONPATH")
    root = list(spec.submodule_search_locations)[0]
    qwen_vl = os.path.join(root, "srt", "multimodal", "processors", "qwen_vl.py")
    if "def preprocess_video" not in open(qwen_vl).read():
        raise RuntimeError("this SGLang's Qwen-VL processor has no video path (preprocess_video)")
    path = os.path.join(root, "srt", "utils", "video_decoder.py")
    m = importlib.util.spec_from_file_location("_sglang_video_decoder", path)
    vd = importlib.util.module_from_spec(m)
    m.loader.exec_module(vd)
    out["backend"] = vd._BACKEND
    try:
        mod = importlib.import_module(vd._BACKEND)
    except ImportError as exc:
        raise ImportError(f"SGLang's video decoder (sglang/srt/utils/video_decoder.py) found no torchcodec "
                          f"and cannot import decord: {exc}") from None
    out["decoder"] = f"{vd._BACKEND} {getattr(mod, '__version__', '?')} ({os.path.dirname(mod.__file__)})"
    d = vd.VideoDecoderWrapper(open(sys.argv[1], "rb").read())
    out.update(frames=len(d), fps=float(d.avg_fps), shape=list(d.frame_shape))
    out["ok"] = True
except Exception as exc:
    out.update(ok=False, why=f"{type(exc).__name__}: {exc}"[:500])
print(json.dumps(out))
"""


def preflight(pythonpath: str, clip: Path = CLIP, python: str = sys.executable, timeout: float = 120) -> dict:
    """Can this SGLang (on ``pythonpath``) take the clip? Its Qwen-VL processor must have a video
    path and its video decoder (torchcodec, else decord) must read the clip's bytes with the
    clip's frame count. ``{"ok": True, "decoder", "frames", "fps", "shape"}`` or
    ``{"ok": False, "why"}``."""
    env = {**os.environ, "PYTHONPATH": pythonpath}
    try:
        p = subprocess.run([python, "-c", _PREFLIGHT, str(clip)], env=env, capture_output=True, text=True,
                           timeout=timeout)
        out = json.loads(p.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, IndexError, ValueError) as exc:
        return {"ok": False, "why": f"preflight failed: {type(exc).__name__}: {exc}"[:500]}
    if out.get("ok") and (out["frames"], out["shape"]) != (FRAMES, [HEIGHT, WIDTH]):
        out.update(ok=False, why=f"decoder read {out['frames']} frames of {out['shape']}, the clip has "
                                 f"{FRAMES} of {[HEIGHT, WIDTH]}")
    return out


if __name__ == "__main__":
    p = write_clip(Path(sys.argv[1]) if len(sys.argv) > 1 else CLIP)
    print(p, p.stat().st_size, "bytes")
