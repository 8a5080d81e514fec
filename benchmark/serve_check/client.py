"""The client side of the server check: images made here (and the committed test clip), requests
through the real ``openai`` client (chat completions, base64 data URLs), greedy decoding with the
output token ids returned (SGLang's ``return_token_ids``), concurrency through threads. Loopback
only."""

from __future__ import annotations

import base64
import io
import math
import random
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

SIZES = {"448": (448, 448), "720p": (1280, 720), "1080p": (1920, 1080), "4k": (3840, 2160)}
IMAGE_PAD = 151655
VIDEO_PAD = 151656


def make_image(width: int, height: int, seed: int, fmt: str = "PNG") -> bytes:
    """A deterministic picture: colour gradients plus seeded blocky noise (compresses well enough
    for a 4K PNG, differs per seed)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    y = np.linspace(0.0, 1.0, height, dtype=np.float32)[:, None]
    x = np.linspace(0.0, 1.0, width, dtype=np.float32)[None, :]
    phase = rng.uniform(0, 2 * math.pi, size=3)
    chans = [0.5 + 0.5 * np.sin(2 * math.pi * (x * (1 + c) + y * (2 - c)) + phase[c]) for c in range(3)]
    img = np.stack(chans, axis=-1)
    block = 16
    noise = rng.uniform(-0.25, 0.25, size=(height // block + 1, width // block + 1, 3)).astype(np.float32)
    noise = noise.repeat(block, axis=0).repeat(block, axis=1)[:height, :width]
    arr = (np.clip(img + noise, 0.0, 1.0) * 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr, "RGB").save(buf, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buf.getvalue()


def data_url(payload: bytes, fmt: str) -> str:
    mime = "image/png" if fmt == "PNG" else "image/jpeg"
    return f"data:{mime};base64,{base64.b64encode(payload).decode()}"


@dataclass
class Request:
    """One chat request: images (width, height, seed, format), a text prompt."""

    name: str
    images: list[tuple[int, int, int, str]]
    text: str
    videos: list[str] = field(default_factory=list)  # data URLs

    def messages(self, cache: dict) -> list[dict]:
        content = []
        for spec in self.images:
            if spec not in cache:
                cache[spec] = data_url(make_image(*spec), spec[3])
            content.append({"type": "image_url", "image_url": {"url": cache[spec]}})
        for url in self.videos:
            content.append({"type": "video_url", "video_url": {"url": url}})
        content.append({"type": "text", "text": self.text})
        return [{"role": "user", "content": content}]


def fixed_requests() -> list[Request]:
    """Single images at the four sizes (PNG up to 720p, JPEG above), then three images of
    different sizes in one request."""
    reqs = []
    for i, (name, (w, h)) in enumerate(SIZES.items()):
        fmt = "PNG" if w * h <= 1280 * 720 else "JPEG"
        reqs.append(Request(f"single-{name}", [(w, h, 100 + i, fmt)], "Describe the picture."))
    reqs.append(Request("three-images", [(448, 448, 200, "PNG"), (1280, 720, 201, "JPEG"), (640, 960, 202, "PNG")],
                        "Compare the three pictures."))
    return reqs


def video_request() -> Request:
    """The committed test clip (serve_check/video.py: 4 s, 640x360, 8 fps, H.264) as one
    ``video_url`` part (base64 data URL, the form SGLang's openai front end passes to its video
    decoder as bytes) and a prompt."""
    import video

    return Request("single-video", [], "Describe the video.", videos=[video.data_url()])


def random_requests(n: int, seed: int) -> list[Request]:
    """``n`` requests of 1-3 random-size images (mostly up to 1080p, a few larger), PNG or JPEG,
    one of a few prompts."""
    rng = random.Random(seed)
    prompts = ["What is in the image?", "Describe it briefly.", "List the colours.", "Count the shapes."]
    reqs = []
    for i in range(n):
        images = []
        for j in range(rng.choice((1, 1, 1, 2, 3))):
            if rng.random() < 0.1:
                w, h = rng.randint(1920, 3000), rng.randint(1080, 1800)
            else:
                w, h = rng.randint(160, 1920), rng.randint(160, 1080)
            images.append((w, h, 1000 + 10 * i + j, rng.choice(("PNG", "JPEG"))))
        reqs.append(Request(f"random-{i:02d}", images, rng.choice(prompts)))
    return reqs


class Client:
    def __init__(self, base_url: str, model: str, max_tokens: int = 4, timeout: float = 120.0):
        from openai import OpenAI

        self.oa = OpenAI(base_url=base_url, api_key="EMPTY", timeout=timeout, max_retries=0)
        self.model = model
        self.max_tokens = max_tokens
        self.images: dict = {}

    def prepare(self, reqs: list[Request]) -> None:
        """Encode every image up front (so request timing excludes picture making)."""
        for r in reqs:
            r.messages(self.images)

    def send(self, req: Request, max_tokens: int | None = None) -> dict:
        """One greedy request; returns ok/error, output and prompt token ids, latency."""
        t0 = time.perf_counter()
        try:
            resp = self.oa.chat.completions.create(
                model=self.model, messages=req.messages(self.images), temperature=0.0,
                max_tokens=max_tokens or self.max_tokens,
                extra_body={"ignore_eos": True, "return_token_ids": True},
            )
            dt = time.perf_counter() - t0
            choice = resp.choices[0]
            extra = choice.model_extra or {}
            out_ids = extra.get("response_token_ids") or extra.get("token_ids")
            prompt_ids = extra.get("prompt_token_ids") or []
            return {"name": req.name, "ok": out_ids is not None, "latency_s": dt, "output_ids": out_ids,
                    "text": choice.message.content, "prompt_tokens": len(prompt_ids),
                    "image_tokens": sum(1 for t in prompt_ids if t == IMAGE_PAD),
                    "video_tokens": sum(1 for t in prompt_ids if t == VIDEO_PAD),
                    "usage_prompt_tokens": getattr(resp.usage, "prompt_tokens", None),
                    **({} if out_ids is not None else {"error": "no token ids in the response"})}
        except Exception as exc:  # noqa: BLE001 - recorded per request
            return {"name": req.name, "ok": False, "latency_s": time.perf_counter() - t0,
                    "error": f"{type(exc).__name__}: {exc}"[:2000]}

    def send_concurrently(self, reqs: list[Request], workers: int, seed: int) -> list[dict]:
        """All of ``reqs`` in a random order through ``workers`` threads; results in ``reqs``
        order."""
        order = list(range(len(reqs)))
        random.Random(seed).shuffle(order)
        with ThreadPoolExecutor(workers) as pool:
            futures = {i: pool.submit(self.send, reqs[i]) for i in order}
            return [futures[i].result() for i in range(len(reqs))]

    def ttft(self, req: Request, rounds: int) -> dict:
        """Time to the first token: end-to-end latency of a 1-token request (HTTP, processor,
        ViT, prefill, one sample), ``rounds`` times after one unmeasured request."""
        warm = self.send(req, max_tokens=1)
        times, errors = [], []
        for _ in range(rounds):
            r = self.send(req, max_tokens=1)
            (times if r["ok"] else errors).append(r["latency_s"] if r["ok"] else r.get("error"))
        return {"name": req.name, "warm_ok": warm["ok"], "ms": [t * 1e3 for t in times],
                "median_ms": statistics.median(times) * 1e3 if times else None, "errors": errors}
