"""vit_host_metadata on its own (no SGLang): the layouts' invariants, an independent window
partition (bench/layouts.py), the one-buffer device copy, and the hook's deferral rules.
Equality with SGLang's own layout code and the real tower: test_qwen2_5_vit_sglang.py."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from sglang_fa4.integration import hooks
from sglang_fa4.bench.layouts import QWEN25_VL
from sglang_fa4.integration.vit_host_metadata import HostLayout, ViTGeometry, host_layout, to_device

QWEN = ViTGeometry(spatial_merge_size=2, window_size=112, patch_size=14)


def grids(seed=0, n=25):
    rng = random.Random(seed)
    out = [[[1, 16, 20], [2, 8, 12]], [[1, 2, 2]], [[3, 16, 16]]]
    while len(out) < n:
        out.append([[rng.choice([1, 1, 2, 3]), 2 * rng.randint(1, 40), 2 * rng.randint(1, 40)]
                    for _ in range(rng.randint(1, 4))])
    return out


@pytest.mark.parametrize("grid", grids())
def test_invariants(grid):
    lay = host_layout(torch.tensor(grid), QWEN)
    tokens = sum(t * h * w for t, h, w in grid)
    groups = tokens // 4
    assert lay.tokens == tokens and lay.pos_ids.shape == (tokens, 2)
    assert sorted(lay.window_index.tolist()) == list(range(groups))  # a permutation
    assert torch.equal(lay.window_index[lay.reverse_index.long()], torch.arange(groups, dtype=torch.int32))
    # SGLang's full layout: a leading empty segment, then one segment per image or whole video
    assert lay.cu_full.tolist()[:2] == [0, 0] and lay.cu_full[-1] == tokens
    assert lay.seq_lens_full.tolist() == [0] + [t * h * w for t, h, w in grid]
    assert lay.cu_window[0] == 0 and lay.cu_window[-1] == tokens and (lay.seq_lens_window > 0).all()
    assert type(lay.max_full) is int and lay.max_full == max(t * h * w for t, h, w in grid)
    assert type(lay.max_window) is int and lay.max_window == int(lay.seq_lens_window.max())
    assert lay.max_window <= 64 and lay.max_grid == max(max(h, w) for _, h, w in grid)
    for t in (lay.window_index, lay.reverse_index, lay.cu_full, lay.cu_window, lay.pos_ids):
        assert t.dtype == torch.int32


@pytest.mark.parametrize("grid", grids(seed=1))
def test_windows_match_the_bench_partition(grid):
    # bench/layouts.py cuts windows arithmetically, a separate implementation
    assert host_layout(grid, QWEN).seq_lens_window.tolist() == QWEN25_VL.window_seqlens(grid)


def test_windows_hold_their_own_cells_in_row_major_order():
    lay = host_layout([[1, 20, 28]], QWEN)  # 10 x 14 merged cells: 3 x 4 windows of <= 4 x 4
    lw, cells = 14, lay.window_index.tolist()
    start = 0
    for n in (lay.seq_lens_window // 4).tolist():
        chunk = cells[start:start + n]
        rows, cols = [c // lw for c in chunk], [c % lw for c in chunk]
        assert len({r // 4 for r in rows}) == 1 and len({c // 4 for c in cols}) == 1
        assert chunk == sorted(chunk)
        start += n
    # the rotary ids follow the window order: the second window's first patch is at the top-left
    # of its first cell
    second = int(lay.seq_lens_window[0])
    first_cell = cells[second // 4]
    assert lay.pos_ids[second].tolist() == [2 * (first_cell // lw), 2 * (first_cell % lw)]


def test_video_frames_repeat_the_frame_layout():
    one = host_layout([[1, 12, 16]], QWEN)
    three = host_layout([[3, 12, 16]], QWEN)
    g = one.window_index.numel()
    assert torch.equal(three.window_index, torch.cat([one.window_index + f * g for f in range(3)]))
    assert torch.equal(three.pos_ids, one.pos_ids.repeat(3, 1))
    assert three.seq_lens_window.tolist() == one.seq_lens_window.tolist() * 3


def test_list_grid_equals_tensor_grid():
    grid = [[2, 8, 12], [1, 30, 6]]
    a, b = host_layout(grid, QWEN), host_layout(torch.tensor(grid), QWEN)
    for name in HostLayout.__dataclass_fields__:
        x, y = getattr(a, name), getattr(b, name)
        assert torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y


def test_empty_grid_is_an_error():
    with pytest.raises(ValueError, match="empty"):
        host_layout([], QWEN)


def test_to_device_cpu_is_one_buffer_of_views():
    lay = host_layout([[1, 16, 20], [2, 8, 12]], QWEN)
    dev = to_device(lay, "cpu")
    pointers = {t.untyped_storage().data_ptr() for t in (dev.window_index, dev.cu_full, dev.pos_ids)}
    assert len(pointers) == 1
    for name in ("window_index", "reverse_index", "cu_full", "seq_lens_full", "cu_window", "seq_lens_window", "pos_ids"):
        assert torch.equal(getattr(dev, name), getattr(lay, name)), name
    assert (dev.max_full, dev.max_window, dev.max_grid, dev.tokens) == (lay.max_full, lay.max_window, lay.max_grid, lay.tokens)


def test_geometry_of_a_tower():
    vit = SimpleNamespace(spatial_merge_size=2, window_size=112, patch_size=14)
    assert ViTGeometry.of(vit) == QWEN and QWEN.window_cells == 4 and QWEN.merge_unit == 4


@pytest.mark.parametrize("enable_cg, device", [(True, "cuda"), (True, "cpu"), (False, "meta")])
def test_hook_defers_to_upstream(enable_cg, device):
    # the CUDA-graph path, and devices other than CUDA/CPU (NPU wants host cu_seqlens), stay upstream's
    vit = SimpleNamespace(enable_cg=enable_cg, device=torch.device(device))
    seen = []
    out = hooks.qwen2_5_vit_forward(lambda self, x, grid_thw: seen.append((self, x, grid_thw)) or "upstream",
                                    vit, "x", grid_thw="grid")
    assert out == "upstream" and seen == [(vit, "x", "grid")]


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_upload_ints_writes_the_values_in_place(dtype):
    # the budget replay's layout upload: into the graph's own static tensor, any int dtype,
    # values past int16 kept (a 4K window layout ends above 32767)
    from sglang_fa4.integration.vit_host_metadata import upload_ints

    dst = torch.full((5,), -7, dtype=dtype)
    values = [0, 64, 128, 40000, 42196]
    out = upload_ints(dst, values)
    assert out.data_ptr() == dst.data_ptr() and dst.tolist() == values and dst.dtype == dtype
    with pytest.raises((TypeError, OverflowError)):
        upload_ints(torch.zeros(1, dtype=torch.int32), [2 ** 40])  # not silently wrapped
