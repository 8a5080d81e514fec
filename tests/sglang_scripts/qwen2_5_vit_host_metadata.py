"""The host-metadata Qwen2.5-VL ViT forward inside a REAL SGLang release, for
tests/test_qwen2_5_vit_sglang.py (see its docstring): SGLang's own layout code next to
``vit_host_metadata.host_layout`` for many grids and geometries, and a real 4-block tower run by
upstream's forward and by the hooked one, attention calls and tensor scalar reads recorded."""

from emit import emit, params

_P = params()
GEOMETRIES, GRIDS, TOWER_GRIDS = _P["geometries"], _P["grids"], _P["tower_grids"]

import warnings
warnings.simplefilter("ignore")
from types import SimpleNamespace
from unittest import mock
import torch
from benchmark.release import check_vit_no_sync as tower

from benchmark.sglang_on_gpu.sglang_towers import init_sglang
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
with torch.inference_mode(), \
     mock.patch.object(vision.VisionAttention, "forward", recording_attn_forward), \
     mock.patch.object(torch.Tensor, "item", probe("item", real_item)), \
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
