"""Qwen3-VL's position embeddings inside a REAL SGLang release, for tests/test_qwen3_vit_pos_embed.py
(run by tests/sglang_harness.py's ``run_script``; see that test's docstring for what is compared).

SGLang's ``Qwen3VLMoeVisionModel`` is built without ``__init__`` (its rotary needs a GPU op): the
position embeddings need only ``pos_embed``, ``patch_embed``'s dtype and the grid geometry (48 x 48
table, merge 2). Upstream's real ``forward`` (eager) and ``_prepare_graph_inputs`` (graph mode) run
up to the rotary, recording the position embeddings each adds.
"""

from __future__ import annotations

import types
import warnings

import torch
from torch import nn

C = 32


class Stop(Exception):
    pass


class PatchEmbed(nn.Module):
    """dtype/device come from patch_embed.proj.weight; x is already embedded."""

    def __init__(self, device):
        super().__init__()
        self.proj = nn.Linear(2, C, dtype=torch.bfloat16, device=device)

    def forward(self, x):
        return x.to(torch.bfloat16)


def tower(Tower, align, device="cpu"):
    t = Tower.__new__(Tower)
    nn.Module.__init__(t)
    t.num_grid_per_side, t.spatial_merge_size, t.align_corners = 48, 2, align
    t.pos_embed = nn.Embedding(48 * 48, C, dtype=torch.bfloat16, device=device)
    if device != "meta":
        torch.manual_seed(0)
        nn.init.normal_(t.pos_embed.weight)
    t.patch_embed = PatchEmbed(device)
    return t


def recorded(t, run, names):
    """(name, value) of the one function among ``names`` that ``run`` called on ``t`` (stopped at
    the rotary)."""
    got = {}
    for name in names:
        fn = getattr(t, name)

        def rec(*a, _fn=fn, _name=name, **k):
            got[_name] = _fn(*a, **k)
            return got[_name]

        setattr(t, name, rec)

    def stop(*a, **k):
        raise Stop

    t.rot_pos_emb = stop
    try:
        run()
    except Stop:
        pass
    for name in list(names) + ["rot_pos_emb"]:
        delattr(t, name)
    (name, value), = got.items()
    return name, value


def tokens(grid):
    return sum(a * b * c for a, b, c in grid)


EAGER = ["fast_pos_embed_interpolate_from_list", "fast_pos_embed_interpolate_vectorized"]
GRAPH = ["fast_pos_embed_interpolate", "fast_pos_embed_interpolate_vectorized"]


def run(grids: dict) -> dict:
    warnings.simplefilter("ignore")
    from sglang.srt.models import qwen3_vl as q

    Tower = q.Qwen3VLMoeVisionModel
    upstream = {"graph": Tower.fast_pos_embed_interpolate}  # in a dict: applying a hook rebinds module globals
    import sglang.srt.plugins as plugins
    from sglang.srt.plugins.hook_registry import HookRegistry

    plugins.load_plugins()
    import sglang_fa4.plugin

    out = {"patched": Tower.fast_pos_embed_interpolate is not upstream["graph"]
                      and "sglang.srt.models.qwen3_vl.Qwen3VLMoeVisionModel.fast_pos_embed_interpolate"
                      in HookRegistry._patched,
           "plan": sglang_fa4.plugin._registered_plan.hooked, "cases": {}}
    for align in (False, True):
        t = tower(Tower, align)
        for label, grid in grids.items():
            x = torch.randn(tokens(grid), C).to(torch.bfloat16)
            g = torch.tensor(grid, dtype=torch.int32)
            eager_fn, eager = recorded(t, lambda: t.forward(x.clone(), g), EAGER)
            _, graph = recorded(t, lambda: t._prepare_graph_inputs(x.clone(), g), GRAPH)
            t.fast_pos_embed_interpolate = types.MethodType(upstream["graph"], t)  # the hook bypassed
            _, bare = recorded(t, lambda: t._prepare_graph_inputs(x.clone(), g), GRAPH)
            ref = eager.float()
            out["cases"][f"{label}, align_corners={align}"] = {
                "eager_fn": eager_fn, "shape": list(graph.shape), "tokens": tokens(grid),
                "dtype": [str(graph.dtype), str(bare.dtype)], "device": str(graph.device),
                "hooked_equal": torch.equal(graph, eager), "bare_equal": torch.equal(bare, eager),
                "bare_rel_err": float((bare.float() - ref).norm() / ref.norm())}

    # SGLang's batch-invariant mode (--enable-deterministic-inference): per image in any batch
    import sglang.srt.batch_invariant_ops.batch_invariant_ops as bio

    out["vectorized_hooked"] = ("sglang.srt.models.qwen3_vl.Qwen3VLMoeVisionModel._use_vectorized_pos_embed"
                                in HookRegistry._patched)
    grid = grids["7 images"]
    t = tower(Tower, False)
    x = torch.randn(tokens(grid), C).to(torch.bfloat16)
    bio._batch_invariant_MODE = True
    try:
        eager_fn, eager = recorded(t, lambda: t.forward(x.clone(), torch.tensor(grid, dtype=torch.int32)), EAGER)
        _, graph = recorded(t, lambda: t._prepare_graph_inputs(x.clone(), torch.tensor(grid, dtype=torch.int32)), GRAPH)
        alone, start = [], 0
        for g1 in grid:
            n = tokens([g1])
            _, one = recorded(t, lambda: t.forward(x[start:start + n].clone(), torch.tensor([g1], dtype=torch.int32)),
                              EAGER)
            alone.append(torch.equal(one, eager[start:start + n]))
            start += n
    finally:
        bio._batch_invariant_MODE = False
    off_fn, _ = recorded(t, lambda: t.forward(x.clone(), torch.tensor(grid, dtype=torch.int32)), EAGER)
    out["batch_invariant"] = {"eager_fn": eager_fn, "graph_equal": torch.equal(graph, eager), "alone_equal": alone,
                              "mode_off_eager_fn": off_fn}

    meta = tower(Tower, False, "meta")
    out["meta"] = {label: list(meta.fast_pos_embed_interpolate(torch.tensor(grid)).shape)
                   for label, grid in grids.items()}
    try:
        Tower.fast_pos_embed_interpolate_vectorized(meta, grids["7 images"])
        out["meta_upstream_vectorized"] = "ran"
    except Exception as e:  # noqa: BLE001 - which error is the result
        out["meta_upstream_vectorized"] = type(e).__name__
    return out
