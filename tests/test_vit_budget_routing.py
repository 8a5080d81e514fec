"""vit_budget_routing: the order a batch tries the budgets holding it, and the startup timing."""

from __future__ import annotations

import pytest

from sglang_fa4.integration import vit_budget_routing as routing


def test_replay_order_smallest_without_timings():
    assert routing.replay_order([832, 896, 960], None) == [832, 896, 960]
    assert routing.replay_order([832, 896, 960], {}) == [832, 896, 960]


def test_replay_order_by_measured_time_ties_and_unmeasured():
    ms = {832: 3.9, 896: 3.5, 960: 3.5, 1024: 4.2}
    assert routing.replay_order([832, 896, 960, 1024], ms) == [896, 960, 832, 1024]  # tie: the smaller
    assert routing.replay_order([832, 2048, 1024], ms) == [832, 1024, 2048]  # unmeasured last


class Graph:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def replay(self):
        self.log.append(self.name)


def test_time_budgets_warms_then_interleaves_and_takes_medians():
    log: list = []
    graphs = {64: Graph(64, log), 128: Graph(128, log)}
    samples = {64: iter([5.0, 1.0, 2.0]), 128: iter([3.0, 3.5, 9.0])}

    def timer(replay):
        replay()
        return next(samples[log[-1]])

    got = routing.time_budgets(graphs, timer=timer, replays=3)
    assert got == {64: 2.0, 128: 3.5}
    assert log == [64, 128] + [64, 128] * 3  # one warm replay each, then rounds over all budgets
    with pytest.raises(ValueError, match="replays"):
        routing.time_budgets(graphs, timer=timer, replays=0)


def test_route_switch(monkeypatch):
    monkeypatch.setenv("SGLANG_FA4_VIT_GRAPH_BUDGET_ROUTE", "fastest")
    assert routing.route_fastest()
    monkeypatch.setenv("SGLANG_FA4_VIT_GRAPH_BUDGET_ROUTE", "smallest")
    assert not routing.route_fastest()
