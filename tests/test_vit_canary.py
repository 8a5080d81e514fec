"""The canary stress's own logic (benchmark/release/check_vit_canary.py), with fake towers on the CPU: a graph
path whose outputs are views of a static buffer (the aliasing class of bug) is caught when the held
outputs are re-checked at the end of the pass, not when they are returned; results beyond bf16
rounding, non-finite values, forwards that raise, compiles or captures after startup and memory that
grows after the first pass all fail the run; a clean path passes with bitwise-equal references."""

from __future__ import annotations

import random
import time

import pytest
import torch

from benchmark.release import check_vit_canary as canary  # noqa: E402

WIDTH = 4


def fake_grid_of(w, h, frames):
    return (max(1, (frames + 1) // 2), max(1, h // 28) * 2, max(1, w // 28) * 2)


def requests(n, max_tokens=10240, seed=0):
    rng = random.Random(seed)
    return [canary.random_request(rng, i, fake_grid_of, max_tokens) for i in range(n)]


def embed(req):
    """The 'tower': a deterministic function of the request (bf16, like the ViTs)."""
    gen = torch.Generator().manual_seed(req.seed)
    return torch.randn(req.tokens // 64, WIDTH, generator=gen).to(torch.bfloat16)


class Tower:
    """graph(): the graph path; eager(): a fresh tensor. ``alias``: graph outputs are views of one
    static buffer that the next call rewrites, as a replay rewrites a captured graph's output."""

    def __init__(self, alias=False, noise=0.0, nan_at=None, raise_at=None, alias_ref=False):
        self.static = torch.zeros(1 << 14, WIDTH, dtype=torch.bfloat16)
        self.alias, self.noise, self.nan_at, self.raise_at, self.alias_ref = alias, noise, nan_at, raise_at, alias_ref
        self.ref_static = torch.zeros_like(self.static)

    def __call__(self, req):
        if req.index == self.raise_at:
            raise RuntimeError("capture after startup")
        out = embed(req)
        if self.noise:
            out = (out.float() * (1 + self.noise)).to(torch.bfloat16)
        if req.index == self.nan_at:
            out[0, 0] = float("nan")
        if self.alias:
            self.static[: out.shape[0]].copy_(out)
            out = self.static[: out.shape[0]]
        ref = embed(req)
        if self.alias_ref:
            self.ref_static[: ref.shape[0]].copy_(ref)
            ref = self.ref_static[: ref.shape[0]]
        return {"graph": out, "refs": {"eager": (ref, None)}, "path": "replay"}


def test_requests_cover_every_kind_within_the_token_bound():
    reqs = requests(60, max_tokens=6000)
    assert {r.kind for r in reqs} == set(canary.KINDS)
    assert all(r.tokens <= 6000 for r in reqs)
    with pytest.raises(ValueError, match="'large' request of at most 1000 tokens"):
        canary.random_request(random.Random(0), 1, fake_grid_of, 1000)
    assert all(len(r.grids) >= 2 for r in reqs if r.kind == "batch")
    assert all(r.grids[0][0] >= 2 for r in reqs if r.kind == "video")  # several frames
    assert [r.grids for r in requests(20, seed=3)] == [r.grids for r in requests(20, seed=3)]


def test_clean_graph_path_passes_bitwise():
    mem = iter([{"allocated_mib": 100.0, "reserved_mib": 400.0}] * 3)
    out = canary.stress(requests(50), Tower(), counters=lambda: {"fa4_compiles": 0, "graph_captures": 0},
                        memory=lambda: next(mem), pass_size=20)
    assert out["ok"], out
    assert out["forwards"] == out["completed"] == 50 and len(out["passes"]) == 3
    assert out["mismatches"] == out["non_finite"] == out["changed_after_return"] == out["raised"] == 0
    assert sum(p["bitwise_equal"]["eager"] for p in out["passes"]) == 50
    assert out["memory_flat"] and out["allocated_drift_mib"] == [0.0, 0.0]


def test_aliased_outputs_are_caught_at_the_end_of_the_pass_not_on_return():
    out = canary.stress(requests(20), Tower(alias=True))
    assert out["mismatches"] == 0  # each output was right when it was returned ...
    assert out["changed_after_return"] >= 15  # ... and later replays rewrote almost all of them
    assert out["recheck_mismatches"] >= 15 and not out["ok"]
    assert out["passes"][0]["bad_rows"][0]["changed_after_return"]


def test_an_aliased_reference_is_caught_too():
    out = canary.stress(requests(20), Tower(alias_ref=True))
    assert out["changed_after_return"] >= 15 and not out["ok"]
    assert out["passes"][0]["bad_rows"][0]["refs_changed"] == ["eager"]


def test_bf16_rounding_is_the_bar():
    a = torch.randn(64, WIDTH).to(torch.bfloat16)
    one_ulp = (a.view(torch.int16) + 1).view(torch.bfloat16)  # every element one bf16 ulp away
    assert canary.compare(a, a)["bitwise"] and canary.compare(a, a)["ok"]
    near = canary.compare(one_ulp, a)
    assert near["ok"] and not near["bitwise"] and near["beyond_bf16"] == 0
    far = canary.compare((a.float() * 1.03).to(torch.bfloat16), a)
    assert not far["ok"] and far["beyond_bf16"] > 0
    # a rel. error bar instead (Qwen3-VL's tower-level reference)
    assert canary.compare((a.float() * 1.03).to(torch.bfloat16), a, rel_tol=0.1)["ok"]
    assert not canary.compare(a[:10], a)["ok"]  # shape mismatch


def test_mismatches_non_finite_and_raises_fail_the_run():
    out = canary.stress(requests(10), Tower(noise=0.05))
    assert out["mismatches"] == 10 and out["mismatches_by_ref"] == {"eager": 10} and not out["ok"]
    out = canary.stress(requests(10), Tower(nan_at=7))
    assert out["non_finite"] == 1 and out["mismatches"] == 1 and not out["ok"]
    out = canary.stress(requests(10), Tower(raise_at=3))
    assert out["raised"] == 1 and out["completed"] == 9 and not out["ok"]
    assert "capture after startup" in out["passes"][0]["raised"][0]


def test_compiles_or_captures_after_startup_fail_the_run():
    count = {"n": 0}

    def forward(req):
        if req.index == 12:
            count["n"] += 1  # one capture in the second pass
        return Tower()(req)

    out = canary.stress(requests(20), forward, counters=lambda: {"graph_captures": count["n"]}, pass_size=10)
    assert out["after_startup"] == {"graph_captures": 1} and not out["ok"]
    assert [p["counters"]["graph_captures"] for p in out["passes"]] == [0, 1]


def test_memory_growing_after_the_first_pass_fails():
    values = iter([100.0, 100.0, 120.0])
    out = canary.stress(requests(30), Tower(), memory=lambda: {"allocated_mib": next(values), "reserved_mib": 0},
                        pass_size=10)
    assert out["allocated_drift_mib"] == [0.0, 20.0] and not out["memory_flat"] and not out["ok"]


def test_deadline_stops_between_passes():
    out = canary.stress(requests(30), Tower(), deadline=time.monotonic() - 1, pass_size=10)
    assert out["planned"] == 30 and out["forwards"] == 10 and len(out["passes"]) == 1


def test_trained_scale_init_keeps_unit_variance():
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj, self.norm, self.pos_embed = torch.nn.Linear(512, 256), torch.nn.LayerNorm(256), torch.nn.Embedding(64, 256)

    blk = Block()
    canary.init_trained_scale_(blk, seed=0)
    blk.requires_grad_(False)
    y = blk.proj(torch.randn(256, 512))
    assert 0.8 < float(y.std()) < 1.2  # N(0, 1/fan_in) weights: a projection keeps unit variance
    assert float(blk.norm.weight.min()) == float(blk.norm.weight.max()) == 1.0 and float(blk.norm.bias.abs().max()) == 0
    assert float(blk.proj.bias.std()) < 0.05 and 0.4 < float(blk.pos_embed.weight.std()) < 0.6


@pytest.mark.parametrize("n,size,passes", [(25, 10, 3), (9, 10, 1)])
def test_passes_slice_the_requests(n, size, passes):
    out = canary.stress(requests(n), Tower(), pass_size=size)
    assert len(out["passes"]) == passes and out["forwards"] == n and out["ok"]
