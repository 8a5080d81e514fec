"""Which ViT budget graph a batch replays in: the smallest that holds it, or (opt-in,
``SGLANG_FA4_VIT_GRAPH_BUDGET_ROUTE=fastest``) the one measured fastest at startup.

Why the second exists: a budget graph's GEMMs run at the budget's row count, and cuBLAS picks its
kernel by shape, so a larger budget can replay faster than a smaller one. On the H200 Qwen3-VL's
448x448 picture (784 tokens) in the 832-token budget ran its GEMMs in 1.77 ms against 1.56 ms for
the exact 784-row layout (+14% for 6% more rows; other kernels were picked:
``git show 244b9bd:benchmark/results/h200/vit_graphs-dense-slots-0.5.23.md``, profile). With ``fastest``, the startup
times each captured budget's replay (CUDA events, after one warm replay; the graphs replay their
capture inputs) and a batch goes to the holding budget with the lowest time, ties to the smaller.
"""

from __future__ import annotations

import statistics
from typing import Callable, Mapping, Optional, Sequence

from sglang_fa4.bench.timing import event_time_ms
from sglang_fa4.environ import envs

#: timed replays per budget (after one warm replay)
TIMED_REPLAYS = 3


def route_fastest() -> bool:
    return envs.SGLANG_FA4_VIT_GRAPH_BUDGET_ROUTE.get() == "fastest"


def one_replay_ms(replay: Callable[[], None]) -> float:
    """Milliseconds of one graph replay between two CUDA events."""
    return event_time_ms(replay, 1)


def time_budgets(graphs: Mapping[int, object], timer: Callable[[Callable[[], None]], float] = one_replay_ms,
                 replays: int = TIMED_REPLAYS) -> dict[int, float]:
    """Median replay time per budget of ``graphs`` (budget -> an object with ``replay()``): one
    warm replay each, then ``replays`` rounds over all budgets (interleaved, so that clock or
    thermal drift spreads over every budget alike)."""
    if replays < 1:
        raise ValueError(f"replays must be >= 1, got {replays}")
    for g in graphs.values():
        g.replay()
    times: dict[int, list[float]] = {b: [] for b in graphs}
    for _ in range(replays):
        for b, g in graphs.items():
            times[b].append(float(timer(g.replay)))
    return {b: statistics.median(v) for b, v in times.items()}


def replay_order(holding: Sequence[int], replay_ms: Optional[Mapping[int, float]]) -> list[int]:
    """The budgets to try for a batch, best first: ``holding`` (ascending, each >= the batch's
    tokens) as is, or by measured replay time (ties and unmeasured budgets: the smaller first, an
    unmeasured one after every measured one) when ``replay_ms`` is given."""
    if not replay_ms:
        return list(holding)
    return sorted(holding, key=lambda b: (b not in replay_ms, replay_ms.get(b, 0.0), b))
