"""ViT CUDA-graph outputs own their memory (sglang_fa4.integration.vit_graph_outputs): hold what one call
returned, run other images through the same graph, and the held output is unchanged.

SGLang's embedding cache keeps what the tower returns and reads it again later (a cache hit, the
next chunk of a chunked prefill), so an output that is a view of a graph's static buffer is rewritten
by the next request of the same layout or budget: one request's image features silently become
another's. Checked on the real SGLang 0.5.20 / 0.5.23 runners (generic: Qwen2.5-VL-like with windows
and an output permutation, Qwen3-VL-like with deepstack mergers; InternVL), with CUDA graphs faked so
that a replay rewrites the captured output tensor in place, as a real graph does.
"""

import pytest

from sglang_fa4.integration.vit_graph_outputs import owned, shares_storage
from sglang_harness import run_file


def test_owned_copies_only_views_of_static_memory():
    import torch

    static = torch.randn(8, 4)
    fresh = torch.randn(3, 4)
    view = static[:3]
    assert shares_storage(view, [None, static]) and not shares_storage(fresh, [static])
    copy = owned(view, None, static)
    assert copy is not view and torch.equal(copy, view) and not shares_storage(copy, [static])
    assert owned(fresh, static) is fresh  # already its own memory: no copy
    assert owned(static, static) is not static


# tests/sglang_scripts/vit_graph_outputs_generic.py holds every output of many calls through each graph
# path and counts the held outputs whose values changed since they were returned.
_generic_runs: dict = {}  # one subprocess per SGLang version serves every (tower, path) case


def generic_hold(version: str) -> dict:
    if version not in _generic_runs:
        _generic_runs[version] = run_file(version, "vit_graph_outputs_generic.py", env={
            "SGLANG_VIT_ENABLE_CUDA_GRAPH": "1", "SGLANG_FA4_VIT_GRAPH_BUDGETS_ENABLE": "1",
            "SGLANG_FA4_VIT_GRAPH_BUDGETS": "128,32,64"})
    return _generic_runs[version]


@pytest.mark.parametrize("path", ["exact", "budgets"])
@pytest.mark.parametrize("tower", ["qwen25", "qwen3"])
def test_generic_runner_outputs_survive_later_replays(sglang_version, tower, path):
    r = generic_hold(sglang_version)[f"{tower}_{path}"]
    assert r["max_err"] < 1e-4, r  # each output was right when it was returned
    if path == "exact":
        assert r["graphs"] == 3, r  # 3 layouts, 24 calls: each graph replayed for other images
    else:
        assert r["replays"] >= 12, r  # most calls replayed a shared budget graph
    assert r["changed"] == 0, r  # ... and no later replay changed a held output


# tests/sglang_scripts/vit_graph_outputs_internvl.py: the same on SGLang's InternVL runner
def test_internvl_runner_outputs_survive_later_replays(sglang_version):
    out = run_file(sglang_version, "vit_graph_outputs_internvl.py", env={"SGLANG_VIT_ENABLE_CUDA_GRAPH": "1"})
    assert out["graphs"] == 3 and out["max_err"] < 1e-4, out
    assert out["changed"] == 0, out
