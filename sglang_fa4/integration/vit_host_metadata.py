"""Qwen2.5-VL's ViT layouts computed on the host, moved to the device in one non-blocking copy.

SGLang's eager Qwen2.5-VL ViT forward builds its window permutation, rotary position ids and the
two cu_seqlens sets partly on the device and then reads max_seqlen back with ``.item()`` (twice),
besides several pageable (blocking) host->device copies. Everything it needs follows from
``grid_thw``, which is host data, so it is all computed here with torch on the CPU:

- ``window_index``: the merge-unit groups (``spatial_merge_size**2`` patches each) in window order
  (per image, per frame, windows row-major, cells row-major inside a window), and its inverse;
- ``cu_full``: one segment per image or video (all its frames), in SGLang's exact layout
  ``[0, 0, c1, c2, ...]`` (its leading duplicated 0 is an empty first segment);
- ``cu_window``: one segment per non-empty window (what ``unique_consecutive`` leaves);
- ``max_full`` / ``max_window``: Python ints;
- ``pos_ids``: the (row, col) rotary position of every patch, already in window order.

``to_device`` packs the integer tensors into one int32 buffer, copies it through pinned memory
with ``non_blocking=True`` (:func:`pinned_copy`, also the ViT budgets' layout upload) and splits
it into views: a forward then costs one H2D copy and no sync.
"""

from __future__ import annotations

import array
from dataclasses import dataclass
from functools import lru_cache
from itertools import accumulate
from typing import Optional, Sequence, Union

import torch

GridLike = Union[torch.Tensor, Sequence[Sequence[int]]]


@dataclass(frozen=True)
class ViTGeometry:
    spatial_merge_size: int
    window_size: int  # in pixels, like the HF config
    patch_size: int

    @property
    def merge_unit(self) -> int:
        return self.spatial_merge_size * self.spatial_merge_size

    @property
    def window_cells(self) -> int:
        """Window side in merged cells (4 for Qwen2.5-VL: 112 px / 2 / 14)."""
        return self.window_size // self.spatial_merge_size // self.patch_size

    @classmethod
    def of(cls, vit) -> "ViTGeometry":
        return cls(int(vit.spatial_merge_size), int(vit.window_size), int(vit.patch_size))


@dataclass(frozen=True)
class HostLayout:
    """Everything the eager forward needs, as CPU tensors and Python ints."""

    window_index: torch.Tensor  # int32 (groups,)
    reverse_index: torch.Tensor  # int32 (groups,), window_index's inverse permutation
    cu_full: torch.Tensor  # int32 (images + 2,)
    seq_lens_full: torch.Tensor  # int32 (images + 1,)
    cu_window: torch.Tensor  # int32 (windows + 1,)
    seq_lens_window: torch.Tensor  # int32 (windows,)
    pos_ids: torch.Tensor  # int32 (tokens, 2), window order
    max_full: int
    max_window: int
    max_grid: int  # rotary table length: the largest h or w
    tokens: int

    def sections(self) -> tuple[torch.Tensor, ...]:
        return (self.window_index, self.reverse_index, self.cu_full, self.seq_lens_full,
                self.cu_window, self.seq_lens_window, self.pos_ids)


@dataclass(frozen=True)
class DeviceLayout:
    """HostLayout's tensors as views of one buffer on the device; the ints stay host ints."""

    window_index: torch.Tensor
    reverse_index: torch.Tensor
    cu_full: torch.Tensor
    seq_lens_full: torch.Tensor
    cu_window: torch.Tensor
    seq_lens_window: torch.Tensor
    pos_ids: torch.Tensor
    max_full: int
    max_window: int
    max_grid: int
    tokens: int


def grid_rows(grid_thw: GridLike) -> list[tuple[int, int, int]]:
    """(t, h, w) per image as Python ints. A CPU tensor or list is host data; a device tensor
    would cost one read here (SGLang passes the processor's CPU tensor)."""
    rows = grid_thw.tolist() if isinstance(grid_thw, torch.Tensor) else grid_thw
    out = []
    for row in rows:
        t, h, w = (int(v) for v in row)
        out.append((t, h, w))
    return out


@lru_cache(maxsize=512)
def _frame_plan(h: int, w: int, merge: int, window_cells: int):
    """One frame of h x w patches: (cell order in window order, cells per window, pos ids of the
    frame's patches in that order). Cached per shape: callers must not modify the tensors."""
    lh, lw = h // merge, w // merge
    rows = torch.arange(lh).repeat_interleave(lw)
    cols = torch.arange(lw).repeat(lh)
    windows_per_row = -(-lw // window_cells)
    window_of_cell = (rows // window_cells) * windows_per_row + cols // window_cells
    # a stable sort keeps row-major order inside each window
    order = torch.argsort(window_of_cell, stable=True)
    cells_per_window = [n for n in torch.bincount(window_of_cell).tolist() if n]
    # patch (row, col) of every cell's merge x merge patches, cells row-major, patches row-major
    inner = torch.arange(merge)
    prow = (torch.arange(lh) * merge)[:, None, None, None] + inner[None, None, :, None]
    pcol = (torch.arange(lw) * merge)[None, :, None, None] + inner[None, None, None, :]
    pos = torch.stack(torch.broadcast_tensors(prow, pcol), dim=-1).reshape(lh * lw, merge * merge, 2)
    return order, cells_per_window, pos[order].reshape(-1, 2)


def host_layout(grid_thw: GridLike, geometry: ViTGeometry) -> HostLayout:
    """All of the forward's index and length data for `grid_thw`, on the host."""
    merge, unit, wc = geometry.spatial_merge_size, geometry.merge_unit, geometry.window_cells
    index_parts, pos_parts = [], []
    window_sizes: list[int] = []
    full_sizes: list[int] = []
    base = 0
    max_grid = 0
    for t, h, w in grid_rows(grid_thw):
        order, cells_per_window, pos = _frame_plan(h, w, merge, wc)
        cells = (h // merge) * (w // merge)
        frame_base = base + cells * torch.arange(t)
        index_parts.append((order[None, :] + frame_base[:, None]).reshape(-1))
        pos_parts.append(pos.repeat(t, 1))
        window_sizes.extend(n * unit for n in cells_per_window * t)
        full_sizes.append(t * h * w)
        base += t * cells
        max_grid = max(max_grid, h, w)
    if not full_sizes:
        raise ValueError("grid_thw is empty: no image to encode")
    window_index = torch.cat(index_parts).to(torch.int32)
    reverse_index = torch.empty_like(window_index)
    reverse_index[window_index.long()] = torch.arange(window_index.numel(), dtype=torch.int32)
    # SGLang's full layout starts with two zeros (an empty first segment); keep it bit for bit
    cu_full = torch.tensor([0, *accumulate(full_sizes, initial=0)], dtype=torch.int32)
    cu_window = torch.tensor(list(accumulate(window_sizes, initial=0)), dtype=torch.int32)
    return HostLayout(
        window_index=window_index,
        reverse_index=reverse_index,
        cu_full=cu_full,
        seq_lens_full=cu_full[1:] - cu_full[:-1],
        cu_window=cu_window,
        seq_lens_window=cu_window[1:] - cu_window[:-1],
        pos_ids=torch.cat(pos_parts).to(torch.int32),
        max_full=max(full_sizes),
        max_window=max(window_sizes),
        max_grid=max_grid,
        tokens=sum(full_sizes),
    )


def pinned_copy(src: torch.Tensor, device=None, *, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """A host tensor onto ``device`` (or into ``out``, e.g. a captured graph's static tensor)
    without blocking the host: staged in pinned memory for a CUDA target (a pageable copy would
    wait for all queued GPU work; the caching host allocator keeps the pinned block alive until
    the copy is done)."""
    target = out.device if out is not None else torch.device(device)
    if target.type == "cuda" and not src.is_pinned():
        src = src.pin_memory()
    if out is None:
        return src.to(target, non_blocking=True)
    return out.copy_(src, non_blocking=True)


def upload_ints(dst: torch.Tensor, values: Sequence[int]) -> torch.Tensor:
    """Host ints into the device tensor ``dst`` (a graph's static cu_seqlens) by :func:`pinned_copy`;
    an int32 target takes them as an array buffer, without a per-element conversion (torch.tensor
    of a 300-entry window layout took ~75 us of each replay's host time, this ~10 us)."""
    if dst.dtype == torch.int32:
        src = torch.frombuffer(array.array("i", values), dtype=torch.int32)
    else:
        src = torch.tensor(values, dtype=dst.dtype)
    return pinned_copy(src, out=dst)


def to_device(layout: HostLayout, device: Union[str, torch.device]) -> DeviceLayout:
    """One int32 buffer with every section, moved by :func:`pinned_copy`: a forward costs one
    H2D copy and no sync; on the CPU, views of it."""
    sections = layout.sections()
    sizes = [s.numel() for s in sections]
    packed = pinned_copy(torch.cat([s.reshape(-1) for s in sections]), device)
    views = [view.view(s.shape) for view, s in zip(packed.split(sizes), sections)]
    return DeviceLayout(*views, max_full=layout.max_full, max_window=layout.max_window,
                        max_grid=layout.max_grid, tokens=layout.tokens)
