"""Qwen3-VL's graph-path position embeddings against the REAL SGLang 0.5.20 / 0.5.23 (CPU).

One subprocess per version (tests/sglang_scripts/qwen3_pos_embed_checks.py) builds SGLang's ``Qwen3VLMoeVisionModel`` without ``__init__`` (its
rotary needs a GPU op; the position embeddings need only ``pos_embed``, ``patch_embed``'s dtype and
the grid geometry: Qwen3-VL's 48 x 48 table, merge 2) and runs upstream's real ``forward`` (eager)
and ``_prepare_graph_inputs`` (graph mode) up to the rotary, recording the position embeddings each
adds, for 1, 3 and 7 images (the eager forward turns vectorized at 6) and videos, with
``--enable-precise-embedding-interpolation`` off (default) and on:

- plugin loaded by SGLang's loader: graph == eager, bitwise;
- upstream's graph function (kept before the hook was applied): differs with the flag off, so the
  comparison can fail;
- on the meta device (any read of a device value raises there, as a ``.item()`` / ``.tolist()``
  would sync a GPU) the hooked function runs for every grid and upstream's vectorized one raises.

Without SGLang: the sync-free vectorized computation against an independent fp32 reference
(``F.interpolate(align_corners=True)``), and on a GPU under ``set_sync_debug_mode("error")``.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sglang_fa4.integration.qwen3_vit_pos_embed import checked_grid, eager_pos_embeds
from sglang_harness import run_script

GRIDS = {
    "1 image": [[1, 16, 20]],
    "3 images": [[1, 16, 20], [2, 8, 12], [1, 14, 22]],
    "7 images": [[1, 8, 8], [1, 16, 20], [1, 8, 8], [3, 12, 16], [1, 96, 60], [1, 14, 22], [1, 2, 4]],
    "video": [[4, 12, 16]],
    "videos, 6": [[2, 8, 8]] * 4 + [[3, 20, 10], [1, 4, 4]],
}

_results: dict = {}


def checks(version: str) -> dict:
    """tests/sglang_scripts/qwen3_pos_embed_checks.py's results, one run per version for the module."""
    if version not in _results:
        _results[version] = run_script(version, "qwen3_pos_embed_checks", f"run({GRIDS!r})",
                                       env={"SGLANG_VIT_ENABLE_CUDA_GRAPH": None})
    return _results[version]


def test_graph_pos_embeds_equal_eager(sglang_version):
    out = checks(sglang_version)
    assert out["patched"] and "vit_graph_eager_pos_embed" in out["plan"]
    cases = out["cases"]
    assert len(cases) == 2 * len(GRIDS)
    for name, case in cases.items():
        assert case["hooked_equal"], name
        assert case["shape"] == [case["tokens"], 32] and case["dtype"] == ["torch.bfloat16"] * 2, name
        assert case["device"] == "cpu", name
        want_fn = "vectorized" if name.startswith(("7 images", "videos, 6")) else "from_list"
        assert case["eager_fn"].endswith(want_fn), name
        if "align_corners=False" in name:  # upstream's pixel centres: far from the eager values
            assert not case["bare_equal"] and case["bare_rel_err"] > 0.1, name
    # no device value read: the hooked path runs on meta tensors, upstream's vectorized one cannot
    assert out["meta"] == {label: [sum(t * h * w for t, h, w in grid), 32] for label, grid in GRIDS.items()}
    assert out["meta_upstream_vectorized"] != "ran"


def test_batch_invariant_mode_computes_each_image_alone(sglang_version):
    """Under --enable-deterministic-inference a 7-image call takes the per-image loop (upstream:
    vectorized from 6 images, other bf16 rounding), in the eager forward and the graph path alike,
    so each image's rows equal the image alone, bitwise; with the mode off upstream's rule stays."""
    out = checks(sglang_version)
    assert out["vectorized_hooked"] and "vit_pos_embed_batch_invariant" in out["plan"]
    bi = out["batch_invariant"]
    assert bi["eager_fn"].endswith("from_list") and bi["mode_off_eager_fn"].endswith("vectorized")
    assert bi["graph_equal"]
    assert bi["alone_equal"] == [True] * len(GRIDS["7 images"])


@pytest.mark.parametrize("grid, what", [
    ([], "empty"),
    ([[1, 15, 20]], "grid_thw\\[0\\]"),
    ([[1, 16, 20], [0, 8, 8]], "grid_thw\\[1\\]"),
])
def test_bad_grid_is_named(grid, what):
    with pytest.raises(ValueError, match=what):
        checked_grid(grid, 2)


class FakeTower(torch.nn.Module):
    """What eager_pos_embeds reads off SGLang's tower; from_list stands for SGLang's loop (never
    called here: the vectorized rule is forced on)."""

    def __init__(self, side=12, hidden=8, device="cpu", dtype=torch.float32):
        super().__init__()
        self.num_grid_per_side, self.spatial_merge_size = side, 2
        self.pos_embed = torch.nn.Embedding(side * side, hidden, device=device, dtype=dtype)
        torch.nn.init.normal_(self.pos_embed.weight)
        self.device, self.dtype = torch.device(device), dtype

    def _use_vectorized_pos_embed(self, n):
        return True

    def fast_pos_embed_interpolate_from_list(self, grid):
        raise AssertionError("not reached")


def reference(tower, grid):
    """Independent fp32 reference: bilinear interpolation of the position table with
    align_corners=True (HF's linspace coordinates), frames repeated, merge x merge cells
    contiguous in row-major cell order."""
    side, m = tower.num_grid_per_side, tower.spatial_merge_size
    table = tower.pos_embed.weight.detach().float().T.reshape(1, -1, side, side)
    parts = []
    for t, h, w in grid:
        img = F.interpolate(table, size=(h, w), mode="bilinear", align_corners=True)[0]  # C, h, w
        cells = img.reshape(-1, h // m, m, w // m, m).permute(1, 3, 2, 4, 0).reshape(h * w, -1)
        parts.append(cells.repeat(t, 1))
    return torch.cat(parts)


def test_vectorized_without_sync_matches_an_independent_reference():
    torch.manual_seed(0)
    tower = FakeTower()
    for grid in (GRIDS["7 images"], GRIDS["videos, 6"], [[1, 2, 2]], [[2, 30, 4], [1, 4, 30]]):
        got = eager_pos_embeds(tower, grid)
        want = reference(tower, grid)
        assert got.shape == want.shape and got.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_vectorized_without_sync_makes_no_sync_on_the_gpu():
    tower = FakeTower(side=48, hidden=64, device="cuda", dtype=torch.bfloat16)
    grid = GRIDS["7 images"]
    eager_pos_embeds(tower, grid)  # first call: allocator and pinned-memory warm
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = eager_pos_embeds(tower, torch.tensor(grid))  # a CPU grid, as SGLang passes it
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    assert got.is_cuda and got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), reference(tower, grid).cuda(), rtol=2e-2, atol=2e-2)
