"""Qwen3-VL's graph-path position embeddings, made equal to its eager forward's.

SGLang 0.5.20 / 0.5.23's Qwen3-VL tower (``Qwen3VLMoeVisionModel``, also Qwen3.5's, Qwen3-Omni's and
Cosmos3's) computes its interpolated position embeddings two ways:

- eager ``forward``: ``fast_pos_embed_interpolate_from_list`` (fewer than 6 images) or
  ``fast_pos_embed_interpolate_vectorized``, both with linspace coordinates (align_corners=True,
  like HF's Qwen3-VL), whatever ``--enable-precise-embedding-interpolation`` says;
- graph mode (``_prepare_graph_inputs``, SGLANG_VIT_ENABLE_CUDA_GRAPH=1): ``fast_pos_embed_interpolate``,
  which with that flag off (the default) samples pixel centres instead, so the graph tower's output
  differs from the eager one's (and from HF's) far beyond bf16 rounding. With the flag on it uses
  numpy linspace on the host: the same coordinates, computed by another implementation.

:func:`eager_pos_embeds` returns what the eager forward computes for the same grid: the tower's own
``from_list`` below the vectorized threshold (device ops only, no device->host read, no host
wait), else :func:`_vectorized_without_sync`, upstream's vectorized computation with its host-side
index planning done on the host (upstream reads ``torch.unique`` back and sizes
``repeat_interleave`` on the device, and copies from pageable memory: all host waits on a GPU).
"""

from __future__ import annotations

from typing import Sequence, Union

import torch

from sglang_fa4.integration.vit_host_metadata import grid_rows, pinned_copy

GridLike = Union[torch.Tensor, Sequence[Sequence[int]]]


def checked_grid(grid_thw: GridLike, merge: int) -> list[list[int]]:
    """``grid_thw`` as [[t, h, w], ...] Python ints (a device tensor costs the one read that
    upstream's graph path already made), each checked: what the interpolation can tile."""
    rows = grid_rows(grid_thw)
    if not rows:
        raise ValueError("Qwen3-VL position embeddings: grid_thw is empty")
    for i, (t, h, w) in enumerate(rows):
        if t < 1 or h < 1 or w < 1 or h % merge or w % merge:
            raise ValueError(f"Qwen3-VL position embeddings: grid_thw[{i}] = {[t, h, w]} needs t, h, w >= 1 "
                             f"and h, w multiples of spatial_merge_size {merge}")
    return [[t, h, w] for t, h, w in rows]


def eager_pos_embeds(tower, grid_thw: GridLike) -> torch.Tensor:
    """The position embeddings ``tower``'s eager forward adds for ``grid_thw`` (same rows, order,
    dtype and device), chosen by the tower's own rule (``_use_vectorized_pos_embed``)."""
    grid = checked_grid(grid_thw, int(tower.spatial_merge_size))
    if tower._use_vectorized_pos_embed(len(grid)):
        return _vectorized_without_sync(tower, grid)
    return tower.fast_pos_embed_interpolate_from_list(grid)


def _host_plan(grid: list[list[int]], merge: int):
    """Integer indices, all from host data: per base token (one frame of every image, row-major)
    its row and column into the linspace tables of the unique heights / widths; and, per output
    token (frames repeated, merge x merge cells contiguous), the base token it copies."""
    uniq_h = sorted({h for _, h, _ in grid})
    uniq_w = sorted({w for _, _, w in grid})
    h_start = dict(zip(uniq_h, [sum(uniq_h[:i]) for i in range(len(uniq_h))]))
    w_start = dict(zip(uniq_w, [sum(uniq_w[:i]) for i in range(len(uniq_w))]))
    h_pick, w_pick, source = [], [], []
    base = 0
    for t, h, w in grid:
        rows = torch.arange(h).repeat_interleave(w)
        cols = torch.arange(w).repeat(h)
        h_pick.append(rows + h_start[h])
        w_pick.append(cols + w_start[w])
        # output order of one frame: cell rows, cell cols, then the merge x merge patches
        r = torch.arange(h // merge)[:, None, None, None] * merge + torch.arange(merge)[None, None, :, None]
        c = torch.arange(w // merge)[None, :, None, None] * merge + torch.arange(merge)[None, None, None, :]
        frame = (r * w + c).reshape(-1) + base
        source.append(frame.repeat(t))
        base += h * w
    return uniq_h, uniq_w, [torch.cat(h_pick), torch.cat(w_pick), torch.cat(source)]


def _vectorized_without_sync(tower, grid: list[list[int]]) -> torch.Tensor:
    """``fast_pos_embed_interpolate_vectorized``'s result, bitwise: the linspace tables are built
    on the device exactly as upstream builds them, and every floating-point op below is upstream's,
    in its order, on the same shapes (only the integer index planning moved to the host, and the
    temporal repeat + merge reorder became one gather: exact copies either way)."""
    side = int(tower.num_grid_per_side)
    device, dtype = tower.device, tower.dtype
    uniq_h, uniq_w, plan = _host_plan(grid, int(tower.spatial_merge_size))
    sizes = [p.numel() for p in plan]
    h_pick, w_pick, source = pinned_copy(torch.cat(plan), device).split(sizes)

    # as upstream: linspace per unique size, default dtype, on the device
    h_idxs = torch.cat([torch.linspace(0, side - 1, h, device=device) for h in uniq_h])[h_pick]
    w_idxs = torch.cat([torch.linspace(0, side - 1, w, device=device) for w in uniq_w])[w_pick]
    h_floor = h_idxs.to(torch.long)
    w_floor = w_idxs.to(torch.long)
    h_ceil = torch.clamp(h_floor + 1, max=side - 1)
    w_ceil = torch.clamp(w_floor + 1, max=side - 1)
    dh = h_idxs - h_floor
    dw = w_idxs - w_floor
    w11 = dh * dw
    w10 = dh - w11
    w01 = dw - w11
    w00 = 1 - dh - w01
    row_f, row_c = h_floor * side, h_ceil * side
    corners = torch.stack([row_f + w_floor, row_f + w_ceil, row_c + w_floor, row_c + w_ceil], dim=0)
    weights = torch.stack([w00, w01, w10, w11], dim=0).to(dtype=dtype)
    base_embeds = (tower.pos_embed(corners) * weights[:, :, None]).sum(dim=0)
    return base_embeds[source]
