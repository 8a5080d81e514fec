"""The host-metadata Qwen2.5-VL ViT forward against the REAL SGLang 0.5.20 / 0.5.23 (CPU).

One subprocess per version (vision imports take ~10 s) computes:
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

import json
import random

import pytest

from sglang_harness import ROOT, SUPPORTED_VERSIONS, require_version, run_with_sglang

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


SNIPPET = """
import sys, warnings
warnings.simplefilter("ignore")
sys.path.insert(0, BENCH)
from types import SimpleNamespace
from unittest import mock
import torch
import check_vit_no_sync as tower

from sglang_towers import init_sglang  # on the path check_vit_no_sync sets
init_sglang("sdpa")
from sglang.srt.layers.attention import vision
from sglang.srt.models import qwen2_5_vl
from sglang.srt.models.utils import RotaryPosMixin, permute_inv
from sglang_fa4.integration import vit_host_metadata as hm

Q = qwen2_5_vl.Qwen2_5_VisionTransformer
# before the plugin wraps it; in a dict, since applying a hook rebinds module globals that hold
# the original (HookRegistry's _propagate_patch)
UPSTREAM = {"forward": Q.forward}

# ---- layouts: SGLang's own code vs host_layout ----
def upstream_layout(grid, merge, window, patch):
    unit = merge * merge
    fake = SimpleNamespace(spatial_merge_size=merge, window_size=window, patch_size=patch,
                           spatial_merge_unit=unit, rot_pos_ids=RotaryPosMixin.rot_pos_ids,
                           device=torch.device("cpu"), rotary_pos_emb=lambda p: p.unsqueeze(-1))
    g = torch.tensor(grid)
    window_index, cu_w = Q.get_window_index(fake, g)
    cu_w = torch.unique_consecutive(torch.tensor(cu_w, dtype=torch.int32))
    # an identity rotary table makes rot_pos_emb return the position ids themselves
    pos = Q.rot_pos_emb(fake, g)
    pos = pos.reshape(pos.shape[0] // unit, unit, -1)[window_index].reshape(-1, 2)
    # the full layout, spelled as Qwen2_5_VisionTransformer.forward builds it
    cu_f = torch.cat([torch.tensor([0], dtype=torch.int32), (g[:, 0] * g[:, 1] * g[:, 2]).cumsum(dim=0).to(torch.int32)])
    cu_f = torch.cat([cu_f.new_zeros(1), cu_f])
    mf = vision.prepare_vision_attention_metadata(cu_f, device="cpu")
    mw = vision.prepare_vision_attention_metadata(cu_w, device="cpu")
    return {"window_index": window_index.tolist(), "reverse_index": permute_inv(window_index).tolist(),
            "cu_full": mf.cu_seqlens.tolist(), "seq_lens_full": mf.seq_lens.tolist(), "max_full": mf.max_seqlen,
            "cu_window": mw.cu_seqlens.tolist(), "seq_lens_window": mw.seq_lens.tolist(),
            "max_window": mw.max_seqlen, "pos_ids": pos.tolist(), "tokens": int(g.prod(dim=1).sum())}

def ours(grid, merge, window, patch):
    lay = hm.host_layout(grid, hm.ViTGeometry(merge, window, patch))
    return {k: (v.tolist() if isinstance(v, torch.Tensor) else v) for k, v in vars(lay).items()}

layouts = {"cases": 0, "mismatches": [], "list_vs_tensor": []}
for merge, window, patch in GEOMETRIES:
    for grid in GRIDS:
        grid = [[t, h * merge // 2, w * merge // 2] for t, h, w in grid]  # h, w multiples of merge
        up, mine = upstream_layout(grid, merge, window, patch), ours(torch.tensor(grid), merge, window, patch)
        layouts["cases"] += 1
        bad = [k for k in up if up[k] != mine[k] or type(mine[k]) is not type(up[k])]
        if bad:
            layouts["mismatches"].append({"geometry": [merge, window, patch], "grid": grid, "fields": bad})
        if ours(grid, merge, window, patch) != mine:
            layouts["list_vs_tensor"].append(grid)

# ---- the real tower: upstream forward vs the hooked one ----
plugin_info = tower.load_plugin()
config = {**tower.TOWER_7B, "depth": 4, "hidden_size": 128, "num_heads": 2, "intermediate_size": 256,
          "out_hidden_size": 64, "fullatt_block_indexes": [1, 3]}
vit = tower.build_tower(config, "cpu", torch.float32)

phase = {"name": None}
calls = {"upstream": [], "hooked": []}
reads = {"upstream": [], "hooked": []}
real_attn_forward = vision.VisionAttention.forward

def recording_attn_forward(self, x, cu_seqlens=None, position_embeddings=None, forward_metadata=None, **kw):
    md = forward_metadata
    calls[phase["name"]].append({
        "cu": md.cu_seqlens.tolist(), "seq_lens": md.seq_lens.tolist(), "max_seqlen": md.max_seqlen,
        "max_type": type(md.max_seqlen).__name__, "cu_dtype": str(md.cu_seqlens.dtype),
        "cu_is_metadata_cu": cu_seqlens is md.cu_seqlens})
    return real_attn_forward(self, x, cu_seqlens=cu_seqlens, position_embeddings=position_embeddings,
                             forward_metadata=forward_metadata, **kw)

real_item, real_int = torch.Tensor.item, torch.Tensor.__int__
def probe(kind, real):
    def read(self):
        if phase["name"]:
            reads[phase["name"]].append({"how": kind, "dtype": str(self.dtype), "numel": self.numel()})
        return real(self)
    return read

tower_out = {"plugin": plugin_info, "cases": []}
with torch.inference_mode(), \\
     mock.patch.object(vision.VisionAttention, "forward", recording_attn_forward), \\
     mock.patch.object(torch.Tensor, "item", probe("item", real_item)), \\
     mock.patch.object(torch.Tensor, "__int__", probe("int", real_int)):
    for i, grid in enumerate(TOWER_GRIDS):
        x, grid_thw = tower.tower_input(config, grid, "cpu", torch.float32, seed=i)
        for name in calls:
            calls[name].clear(); reads[name].clear()
        phase["name"] = "upstream"
        ref = UPSTREAM["forward"](vit, x, grid_thw)
        phase["name"] = "hooked"
        got = vit(x, grid_thw)
        phase["name"] = None
        tower_out["cases"].append({
            "grid": grid, "shape": list(got.shape), "ref_shape": list(ref.shape),
            "bitwise": bool(torch.equal(got, ref)), "max_abs_diff": (got - ref).abs().max().item(),
            "calls": {k: list(v) for k, v in calls.items()}, "reads": {k: list(v) for k, v in reads.items()}})

    # the CUDA-graph path is upstream's, untouched
    vit.enable_cg = True
    with mock.patch.object(vit, "forward_with_cuda_graph", lambda x, grid_thw: "graph path", create=True):
        tower_out["enable_cg"] = vit(x, grid_thw)
    vit.enable_cg = False

emit({"layouts": layouts, "tower": tower_out, "forward_wrapped": Q.forward is not UPSTREAM["forward"]})
"""

TOWER_GRIDS = [[[1, 16, 20], [2, 8, 12]], [[1, 14, 22]], [[3, 10, 6], [1, 4, 4], [1, 32, 32]]]


@pytest.fixture(scope="module", params=SUPPORTED_VERSIONS)
def run(request):
    require_version(request.param)
    prelude = (f"BENCH = {str(ROOT / 'benchmark' / 'release')!r}\nGEOMETRIES = {GEOMETRIES!r}\n"
               f"GRIDS = {json.dumps(random_grids())}\nTOWER_GRIDS = {json.dumps(TOWER_GRIDS)}\n")
    return run_with_sglang(request.param, prelude + SNIPPET, env={"SGLANG_FA4_VIT_HOST_METADATA": None})


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
