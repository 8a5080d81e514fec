"""The persistent FP8 forward's cross-tile overlap ('w:persist,w:xover', persistent_xover.py, and
its 'xover_pvfirst' order) in its Python twin (schedule.consumer_steps / producer_loads): the same
GEMMs, loads and stores as
the plain persistent loop, the same number of ping-pong turns, the data dependencies it must keep
(Q waited for before its QK^T and released after, O stored after the tile's last PV GEMM and before
the next tile's first, K/V^T stages consumed and released in the producer's order), and a
simulation of producer + both consumer warpgroups (TMA rings of 2 Q and S K/V^T stages, the named
barriers of the turns) that runs to the end without a deadlock or an over-arrived barrier."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from sglang_fa4.kernels.fp8_sm90.layout import TILE_M
from sglang_fa4.kernels.fp8_sm90.schedule import Step, consumer_steps, cta_work, producer_loads

LAYOUTS = [
    [5],
    [1, 1, 1],
    [22, 22, 22, 22],  # 8x4096 at 192 keys a tile
    [0],
    [0, 3, 0, 0, 2, 1, 0],  # tiles without keys (seqlen_k = 0) before, between and after others
    [3, 0],
    [1, 0, 1],
]
RANDOM = [[random.Random(s).choice([0, 1, 2, 5, 22]) for _ in range(random.Random(s + 100).randint(1, 9))]
          for s in range(40)]


@pytest.mark.parametrize("pv_first", [False, True])
@pytest.mark.parametrize("key_tiles", LAYOUTS + RANDOM)
def test_same_work_and_turns_as_the_plain_loop(key_tiles, pv_first):
    plain, xover = consumer_steps(key_tiles, False), consumer_steps(key_tiles, True, pv_first)
    assert Counter(plain) == Counter(xover)
    turns = sum(s.kind == "turn" for s in xover)
    assert turns == sum(key_tiles)  # a tile of n key tiles: n turns, its last PV in none
    kv = [(s.tile, s.block) for s in producer_loads(key_tiles) if s.kind == "kv_load"]
    for steps in (plain, xover):
        assert [(s.tile, s.block) for s in steps if s.kind == "kv_wait"] == kv
        assert [(s.tile, s.block) for s in steps if s.kind == "kv_release"] == kv
        assert [s.tile for s in steps if s.kind == "q_wait"] == list(range(len(key_tiles)))


@pytest.mark.parametrize("pv_first", [False, True])
@pytest.mark.parametrize("key_tiles", LAYOUTS + RANDOM)
def test_dependencies(key_tiles, pv_first):
    steps = consumer_steps(key_tiles, True, pv_first)
    at = {s: i for i, s in enumerate(steps)}
    for t, n in enumerate(key_tiles):
        qk = [at[Step("qk", t, b)] for b in range(n)]
        pv = [at[Step("pv", t, b)] for b in range(n)]
        assert all(at[Step("q_wait", t)] < i < at[Step("q_release", t)] for i in qk)
        assert all(at[Step("qk", t, b)] < at[Step("pv", t, b)] < at[Step("kv_release", t, b)] for b in range(n))
        # O: finished (last PV) before its epilogue reads it, read before the next tile's first PV
        assert all(i < at[Step("epilogue", t)] for i in pv)
        if t + 1 < len(key_tiles):
            nxt = [at[Step("pv", t + 1, b)] for b in range(key_tiles[t + 1])]
            assert all(at[Step("epilogue", t)] < i for i in nxt)
            # the Q ring: this tile's Q released before the next one is waited for
            assert at[Step("q_release", t)] < at[Step("q_wait", t + 1)]
        if n and t + 1 < len(key_tiles) and key_tiles[t + 1]:
            # the cross step: the next tile's first QK^T and this tile's last PV in one turn
            nb = key_tiles[t + 1] - 1
            turn = at[Step("turn", t + 1, nb)]
            first, second = sorted((at[Step("qk", t + 1, nb)], at[Step("pv", t, 0)]))
            assert turn < first < second and not any(s.kind == "turn" for s in steps[turn + 1:second])
            assert (steps[first].kind == "pv") == pv_first
            if pv_first:  # the epilogue in the cross step, while the next tile's S is in flight
                assert second < at[Step("epilogue", t)] < turn + 6
        # a consumer holds at most two K/V^T stages (the P operand's and the next S's)
    held = 0
    for s in steps:
        held += (s.kind == "kv_wait") - (s.kind == "kv_release")
        assert 0 <= held <= 2


def simulate(key_tiles, xover: bool, kv_stages: int, q_stages: int = 2, pv_first: bool = False,
             mufu_token: bool = False, mufu_opened: int = 1, consumers: int = 2):
    """Producer + ``consumers`` consumer warpgroups (3: "wg3", the turns a ring 0 -> 1 -> 2 -> 0)
    stepping whenever they can; returns the barriers' final (arrivals, waits).  A named barrier of
    2 x 128 threads completes once the warpgroup before has arrived, so at most one arrival may be
    pending (a second one would complete it alone).
    ``mufu_token``: a softmax step also takes this warpgroup's exp2 turn (warpgroup 1 opens
    warpgroup 0's first) and hands it to the other one; warpgroup 0 takes the last at the end."""
    prog = consumer_steps(key_tiles, xover, pv_first)
    loads = producer_loads(key_tiles)
    kv_index = {(s.tile, s.block): k for k, s in enumerate(x for x in loads if x.kind == "kv_load")}
    n = consumers
    pc = [0] * n
    lp = 0
    loaded_kv, loaded_q = set(), set()
    released_kv = Counter()
    released_q = Counter()
    arrivals, waits = [0] * n, [0] * n  # per barrier (warpgroup w's turn)
    arrivals[0] = 1  # the last warpgroup opens warpgroup 0's first turn
    final_wait_done = False
    mufu_arrivals, mufu_waits = [mufu_opened if mufu_token else 0, 0], [0, 0]
    mufu_final_done = not mufu_token

    def can(wg, s):
        if s.kind == "kv_wait":
            return kv_index[(s.tile, s.block)] in loaded_kv
        if s.kind == "q_wait":
            return s.tile in loaded_q
        if s.kind == "turn":
            return arrivals[wg] > waits[wg]
        if s.kind == "softmax" and mufu_token:
            return mufu_arrivals[wg] > mufu_waits[wg]
        return True

    while True:
        progressed = False
        if lp < len(loads):
            s = loads[lp]
            if s.kind == "q_load":
                ok = s.tile < q_stages or released_q[s.tile - q_stages] == n
                if ok:
                    loaded_q.add(s.tile)
            else:
                k = kv_index[(s.tile, s.block)]
                ok = k < kv_stages or released_kv[k - kv_stages] == n
                if ok:
                    loaded_kv.add(k)
            if ok:
                lp += 1
                progressed = True
        for wg in range(n):
            while pc[wg] < len(prog) and can(wg, prog[pc[wg]]):
                s = prog[pc[wg]]
                if s.kind == "turn":
                    waits[wg] += 1
                    nxt = (wg + 1) % n
                    arrivals[nxt] += 1  # the turn passed right after the GEMM issue
                    assert arrivals[nxt] - waits[nxt] <= 1, "a named barrier over-arrived"
                elif s.kind == "softmax" and mufu_token:
                    mufu_waits[wg] += 1
                    mufu_arrivals[1 - wg] += 1  # handed on after this warpgroup's exp2s
                    assert mufu_arrivals[1 - wg] - mufu_waits[1 - wg] <= 1, "the exp2 token over-arrived"
                elif s.kind == "kv_release":
                    released_kv[kv_index[(s.tile, s.block)]] += 1
                elif s.kind == "q_release":
                    released_q[s.tile] += 1
                pc[wg] += 1
                progressed = True
        if pc[0] == len(prog) and not final_wait_done and arrivals[0] > waits[0]:
            waits[0] += 1  # warpgroup 0 takes the turn left open after the last tile
            final_wait_done = True
            progressed = True
        if final_wait_done and not mufu_final_done and mufu_arrivals[0] > mufu_waits[0]:
            mufu_waits[0] += 1  # ... then the exp2 turn warpgroup 1 handed on after its last exp2s
            mufu_final_done = True
            progressed = True
        if not progressed:
            break
    assert pc == [len(prog)] * n and lp == len(loads), f"deadlock at {pc}, producer {lp}"
    assert final_wait_done and mufu_final_done
    assert mufu_arrivals == mufu_waits
    return arrivals, waits


@pytest.mark.parametrize("mufu_token", [False, True])
@pytest.mark.parametrize("kv_stages", [2, 3, 4])
@pytest.mark.parametrize("mode", ["plain", "xover", "xover_pvfirst"])
@pytest.mark.parametrize("key_tiles", LAYOUTS + RANDOM[:10])
def test_no_deadlock_and_barriers_balance(key_tiles, mode, kv_stages, mufu_token):
    arrivals, waits = simulate(key_tiles, mode != "plain", kv_stages, pv_first=mode == "xover_pvfirst",
                               mufu_token=mufu_token)
    assert arrivals == waits


@pytest.mark.parametrize("kv_stages", [2, 5, 7])
@pytest.mark.parametrize("key_tiles", LAYOUTS + RANDOM[:10])
def test_three_consumer_warpgroups_no_deadlock(key_tiles, kv_stages):
    """wg3: the plain persistent loop with three consumer warpgroups, the turn a ring of three named
    barriers (consumer_mainloop.pass_turn), every stage released by all three."""
    arrivals, waits = simulate(key_tiles, False, kv_stages, consumers=3)
    assert arrivals == waits and len(arrivals) == 3


@pytest.mark.parametrize("opened", [0, 2])
def test_the_simulation_catches_a_wrong_exp2_token_protocol(opened):
    """Without warpgroup 1's opening arrival both warpgroups wait at their first softmax forever;
    with two, a barrier over-arrives: either way the simulation fails (it can tell)."""
    with pytest.raises(AssertionError):
        simulate([3, 1], False, 3, mufu_token=True, mufu_opened=opened)

def _cu(lens):
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    return cu


def test_check_script_cases_cross_tile_boundaries():
    """The d128full quick-correctness cases of benchmark/release/check_fp8_attention.py give the persistent
    kernel's CTAs consecutive tiles of different key lengths (the cross step), tiles without keys
    after and before tiles with keys (the plain tail and the lone first QK^T), at 132 SMs."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "check_fp8_attention", Path(__file__).resolve().parents[1] / "benchmark" / "release" / "check_fp8_attention.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    seen = Counter()
    for name, lens_q, lens_k, hq, hkv, d, causal, data in bench.VARIANT_CASE_SETS["d128full"]:
        cu_q, cu_k = _cu(lens_q), _cu(lens_k)
        for cta in cta_work(cu_q, cu_k, hq, hq // hkv, 132):
            keys = [-(-(cu_k[t.batch + 1] - cu_k[t.batch]) // 192) for t in cta if t.valid]
            for a, b in zip(keys, keys[1:]):
                seen["cross, different keys" if a and b and a != b else "cross" if a and b
                     else "keys -> none" if a else "none -> keys" if b else "none -> none"] += 1
    assert seen["cross, different keys"] > 0 and seen["cross"] > 0
    assert seen["keys -> none"] > 0 and seen["none -> keys"] > 0
    assert TILE_M == 128
