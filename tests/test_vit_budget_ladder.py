"""Issue #18 item 2: the dense budget ladder (pure) and the opt-in shared capture pool."""

import pytest
import torch

from sglang_fa4.integration import vit_budgets
from sglang_fa4.integration.vit_budget_layouts import MIN_SEGMENT_TOKENS, dense_ladder, pick_budget


def test_dense_ladder_pads_at_most_one_step():
    ladder = dense_ladder()
    assert ladder[0] == 512 and ladder[-1] == 8192 and list(ladder) == sorted(set(ladder))
    assert all(b % 64 == 0 and b % MIN_SEGMENT_TOKENS == 0 for b in ladder)
    assert all(b <= a * 1.07 or b - a == 64 for a, b in zip(ladder, ladder[1:]))
    # the pictures of issue #18's table: padded tokens / real tokens
    for tokens in (784, 1024, 3520, 4784, 8160):  # Qwen3-VL 448/720p/1080p, Qwen2.5-VL 448/720p
        assert pick_budget(tokens, ladder) / tokens <= 1.07
    for tokens in range(1024, 8193, 4):
        assert pick_budget(tokens, ladder) <= max(tokens * 1.07, tokens + 64)


@pytest.mark.parametrize("kwargs", [dict(lo=500), dict(step=1.0), dict(hi=256), dict(quantum=6, lo=12, hi=24)])
def test_dense_ladder_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError, match="dense_ladder"):
        dense_ladder(**kwargs)


def test_shared_pool_passes_one_pool_to_every_capture(monkeypatch):
    seen = []

    class FakeGraphCtx:
        def __init__(self, g, pool=None, stream=None, **kw):
            seen.append(pool)

    monkeypatch.setattr(torch.cuda, "graph", FakeGraphCtx)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: ("pool", 1))
    with vit_budgets.shared_graph_pool(True):
        torch.cuda.graph("g1")
        torch.cuda.graph("g2")
        torch.cuda.graph("g3", pool="own")  # an explicit pool is kept
    torch.cuda.graph("after")
    with vit_budgets.shared_graph_pool(False):
        torch.cuda.graph("off")
    assert seen == [("pool", 1), ("pool", 1), "own", None, None]
    assert torch.cuda.graph is FakeGraphCtx
