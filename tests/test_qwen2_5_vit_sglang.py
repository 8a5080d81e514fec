"""The host-metadata Qwen2.5-VL ViT forward against the REAL SGLang 0.5.20 / 0.5.23 (CPU).

One subprocess per version (vision imports take ~10 s; tests/sglang_scripts/qwen2_5_vit_host_metadata.py)
computes:
- ``layouts``: for many random grids (several images, videos with t > 1, sizes that are no multiple
  of the window) and four tower geometries, SGLang's own layout code (``get_window_index`` +
  ``unique_consecutive``, ``rot_pos_emb``, ``permute_inv``, the forward's full cu_seqlens expression,
  ``prepare_vision_attention_metadata``) next to ``vit_host_metadata.host_layout``;
- ``tower``: a real ``Qwen2_5_VisionTransformer`` (4 blocks, 2 of them full attention, sdpa backend,
  random weights) run by upstream's forward (kept before the plugin wrapped it) and by the hooked
  one, with every ``VisionAttention.forward`` call recorded and ``Tensor.item`` / ``int(tensor)``
  probed. On a CPU nothing is a device sync, so "no sync" is asserted as what would be one on a GPU:
  no scalar read of a tensor at all in the hooked forward (upstream makes at least the two
  ``seq_lens.max().item()`` calls), and ``max_seqlen`` reaching the attention as a Python int.
"""

from __future__ import annotations

import random

import pytest

from sglang_harness import ROOT, SUPPORTED_VERSIONS, require_version, run_file

pytestmark = pytest.mark.sglang

# (spatial_merge_size, window_size px, patch_size): Qwen2.5-VL's, patch 16, 8-cell windows, no merge
GEOMETRIES = [(2, 112, 14), (2, 128, 16), (2, 224, 14), (1, 56, 14)]


def random_grids(seed: int = 0, cases: int = 30) -> list[list[list[int]]]:
    rng = random.Random(seed)
    out = [[[1, 16, 20], [2, 8, 12]], [[1, 16, 16]], [[1, 2, 2]], [[4, 14, 22]]]
    while len(out) < cases:
        images = []
        for _ in range(rng.randint(1, 4)):
            t = rng.choice([1, 1, 1, 2, 3])
            images.append([t, 2 * rng.randint(1, 35), 2 * rng.randint(1, 35)])
        out.append(images)
    return out



TOWER_GRIDS = [[[1, 16, 20], [2, 8, 12]], [[1, 14, 22]], [[3, 10, 6], [1, 4, 4], [1, 32, 32]]]


@pytest.fixture(scope="module", params=SUPPORTED_VERSIONS)
def run(request):
    require_version(request.param)
    params = {"geometries": GEOMETRIES, "grids": random_grids(),
              "tower_grids": TOWER_GRIDS}
    return run_file(request.param, "qwen2_5_vit_host_metadata.py", params,
                    env={"SGLANG_FA4_VIT_HOST_METADATA": None})


def test_host_layouts_equal_sglangs_own(run):
    layouts = run["layouts"]
    assert layouts["cases"] == len(GEOMETRIES) * len(random_grids())
    assert layouts["mismatches"] == []
    assert layouts["list_vs_tensor"] == []  # a list grid gives the same layout as a tensor one


def test_hooked_forward_equals_upstream(run):
    assert run["forward_wrapped"] and run["tower"]["plugin"]["forward_hooked"]
    assert "vit_host_metadata" in run["tower"]["plugin"]["hooked"]
    for case in run["tower"]["cases"]:
        assert case["shape"] == case["ref_shape"]
        assert case["bitwise"], (case["grid"], case["max_abs_diff"])


def test_attention_gets_upstreams_metadata_with_host_max_seqlen(run):
    for case in run["tower"]["cases"]:
        up, hooked = case["calls"]["upstream"], case["calls"]["hooked"]
        assert len(up) == len(hooked) == 4  # one per block
        for a, b in zip(up, hooked):
            assert (b["cu"], b["seq_lens"], b["max_seqlen"]) == (a["cu"], a["seq_lens"], a["max_seqlen"])
            assert b["max_type"] == "int" and b["cu_dtype"] == "torch.int32" and b["cu_is_metadata_cu"]
        # blocks 1 and 3 are full attention: SGLang's [0, 0, ...] layout; 0 and 2 windowed
        assert hooked[1]["cu"][:2] == [0, 0] and hooked[1]["cu"] == hooked[3]["cu"]
        assert hooked[0]["cu"] == hooked[2]["cu"] != hooked[1]["cu"]


def test_hooked_forward_reads_no_tensor_scalar(run):
    for case in run["tower"]["cases"]:
        # the probe works: upstream reads max_seqlen with .item() on the int32 seq_lens (twice)
        upstream_max_reads = [r for r in case["reads"]["upstream"] if r["how"] == "item" and r["dtype"] == "torch.int32"]
        assert len(upstream_max_reads) >= 2
        assert case["reads"]["hooked"] == []


def test_cuda_graph_path_stays_upstreams(run):
    assert run["tower"]["enable_cg"] == "graph path"
