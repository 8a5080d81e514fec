"""Sequence layouts for the attention benchmarks: which segments one varlen call holds.

A layout is a name and a list of segment lengths (tokens). Besides the synthetic ones
("8x4096", "700x64", ...) this module computes the real layouts a Qwen2.5-VL / Qwen3-VL vision
tower sees for a given picture: the processor's resize to a multiple of patch * merge, the patch
grid, and Qwen2.5-VL's window partition (our own implementation of the rule in transformers'
`get_vision_window_index`: windows of `window_size // spatial_merge_size // patch_size` merged units
a side, laid out row-major per frame, the last row/column of windows cut short at the image edge;
with the 7B config, 112 // 2 // 14 = 4 merged units = 8x8 patches = 64 tokens per full window).

Pure Python: no torch here, so CI can test it.
"""

from __future__ import annotations

import math
import re
from itertools import accumulate
from dataclasses import dataclass, field

# Qwen2.5-VL-7B-Instruct's preprocessor limits (min_pixels / max_pixels on the hub) and Qwen3-VL's
# (shortest_edge / longest_edge, which are pixel counts too).
QWEN25_MIN_PIXELS = 3136
QWEN25_MAX_PIXELS = 12845056
QWEN3_MIN_PIXELS = 65536
QWEN3_MAX_PIXELS = 16777216

# Pictures used by both benchmarks: name -> (width, height, frames).
PICTURES: dict[str, tuple[int, int, int]] = {
    "448": (448, 448, 1),
    "720p": (1280, 720, 1),
    "1080p": (1920, 1080, 1),
    "4k": (3840, 2160, 1),
    "video32": (640, 360, 32),
}


@dataclass(frozen=True)
class Layout:
    name: str
    seqlens: tuple[int, ...]
    note: str = field(default="", compare=False)

    @property
    def total(self) -> int:
        return sum(self.seqlens)

    @property
    def max_seqlen(self) -> int:
        return max(self.seqlens)

    @property
    def segments(self) -> int:
        return len(self.seqlens)

    @property
    def uniform(self) -> bool:
        return len(set(self.seqlens)) == 1

    def cu_seqlens(self) -> list[int]:
        return cu_from_seqlens(self.seqlens)

    def attn_flops(self, heads: int, head_dim: int) -> int:
        """Non-causal forward: QK^T and PV, 2 FLOPs per multiply-add each."""
        return 4 * heads * head_dim * sum(n * n for n in self.seqlens)

    def io_bytes(self, heads: int, head_dim: int, elem_bytes: int = 2) -> int:
        """Bytes of q, k, v read and o written once: the HBM floor's numerator."""
        return 4 * self.total * heads * head_dim * elem_bytes


def cu_from_seqlens(seqlens) -> list[int]:
    lengths = [int(n) for n in seqlens]
    if any(n < 0 for n in lengths):
        raise ValueError(f"negative segment length {min(lengths)}")
    return list(accumulate(lengths, initial=0))


def seqlens_from_cu(cu) -> list[int]:
    cu = [int(x) for x in cu]
    return [b - a for a, b in zip(cu[:-1], cu[1:])]


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """The Qwen-VL processors' resize: both sides a multiple of `factor`, pixel count within bounds,
    aspect ratio kept as well as possible. Python's round() (half to even), as the processors use."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError("aspect ratio over 200")
    h = round(height / factor) * factor
    w = round(width / factor) * factor
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


@dataclass(frozen=True)
class VisionGeometry:
    """The patch geometry of one Qwen vision tower."""

    patch_size: int
    spatial_merge_size: int = 2
    temporal_patch_size: int = 2
    window_size: int | None = None  # pixels; None: no windowed blocks (Qwen3-VL)
    min_pixels: int = QWEN25_MIN_PIXELS
    max_pixels: int = QWEN25_MAX_PIXELS

    @property
    def factor(self) -> int:
        return self.patch_size * self.spatial_merge_size

    def grid_thw(self, width: int, height: int, frames: int = 1) -> tuple[int, int, int]:
        """(t, h, w) in patches, as the processor reports grid_thw."""
        h, w = smart_resize(height, width, self.factor, self.min_pixels, self.max_pixels)
        t = max(1, math.ceil(frames / self.temporal_patch_size))
        return t, h // self.patch_size, w // self.patch_size

    def full_seqlens(self, grid_thw) -> list[int]:
        """Full-attention segments: one per frame of each image/video (h * w patches each)."""
        out = []
        for t, h, w in grid_thw:
            out.extend([h * w] * t)
        return out

    def window_seqlens(self, grid_thw) -> list[int]:
        """Windowed-attention segments (Qwen2.5-VL), in the order of the permuted token sequence."""
        if self.window_size is None:
            raise ValueError("this geometry has no window attention")
        side = self.window_size // self.spatial_merge_size // self.patch_size  # merged units
        unit = self.spatial_merge_size**2
        out = []
        for t, h, w in grid_thw:
            rows = _cut(h // self.spatial_merge_size, side)
            cols = _cut(w // self.spatial_merge_size, side)
            frame = [r * c * unit for r in rows for c in cols]
            out.extend(frame * t)
        return out


def _cut(n: int, side: int) -> list[int]:
    """Split n units into runs of `side`, the last one short (never empty)."""
    return [side] * (n // side) + ([n % side] if n % side else [])


QWEN25_VL = VisionGeometry(patch_size=14, window_size=112)
QWEN3_VL = VisionGeometry(patch_size=16, min_pixels=QWEN3_MIN_PIXELS, max_pixels=QWEN3_MAX_PIXELS)

# The mixed-size batch: eight images of different sizes in one call (tokens per image).
MIXED_SEQLENS = (1024, 4784, 256, 2304, 576, 1600, 64, 4096)

SYNTHETIC = ("8x4096", "1x16384", "64x1024", "4x1024", "1x256", "700x64", "180x64", "mixed")
QWEN_WINDOWED = ("win448", "win720p", "win1080p", "win4k")
DEFAULT_KERNEL_LAYOUTS = SYNTHETIC + QWEN_WINDOWED
QUICK_KERNEL_LAYOUTS = ("8x4096", "64x1024", "700x64", "win720p")

_NxL = re.compile(r"^(\d+)x(\d+)$")


def kernel_layout(name: str) -> Layout:
    """A layout by name: 'NxL' (N segments of L tokens), 'mixed', or 'win<picture>' (Qwen2.5-VL's
    windowed blocks for one picture of PICTURES)."""
    m = _NxL.match(name)
    if m:
        n, length = int(m.group(1)), int(m.group(2))
        if n < 1 or length < 1:
            raise ValueError(f"layout {name!r}: counts must be positive")
        return Layout(name, (length,) * n, note=f"{n} segments of {length} tokens")
    if name == "mixed":
        return Layout(name, MIXED_SEQLENS, note="8 images of different sizes")
    if name.startswith("win") and name[3:] in PICTURES:
        width, height, frames = PICTURES[name[3:]]
        grid = QWEN25_VL.grid_thw(width, height, frames)
        seqlens = tuple(QWEN25_VL.window_seqlens([grid]))
        return Layout(name, seqlens, note=f"Qwen2.5-VL windows of {width}x{height}, grid {grid}")
    raise ValueError(f"unknown layout {name!r} (NxL, mixed, or win + one of {sorted(PICTURES)})")

