"""The persistent FP8 forward's work schedule (sglang_fa4.kernels.fp8_sm90.schedule, the Python twin
of PersistentEntry.init_schedule / work_tile): across the CTAs of a launch every (q tile, head)
of a layout is worked on exactly once, whatever the layout -- random varlen layouts with empty and
1-token segments, a ViT budget graph's mostly empty segment slots, more sequences than the
longest-first table holds -- and in the intended order (longest sequences first within a head,
the q heads of one kv head side by side)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from sglang_fa4.kernels.fp8_sm90.layout import TILE_M
from sglang_fa4.kernels.fp8_sm90.schedule import (
    LPT_MAX_SEQS,
    cta_work,
    lpt_table,
    persistent_grid,
    tile_slots,
    work_tile,
)
from sglang_fa4.testing import offsets


def expected_tiles(lens_q, num_heads):
    return Counter((b, m, h) for h in range(num_heads) for b, n in enumerate(lens_q) for m in range(-(-n // TILE_M)))


def visited(cu_q, cu_k, num_heads, g, num_sms, total_q=None):
    per_cta = cta_work(cu_q, cu_k, num_heads, g, num_sms, total_q)
    return per_cta, Counter((t.batch, t.m_block, t.head) for cta in per_cta for t in cta if t.valid)


def random_lens(rng, n, hi, p_empty=0.2, p_one=0.1):
    out = []
    for _ in range(n):
        r = rng.random()
        out.append(0 if r < p_empty else 1 if r < p_empty + p_one else rng.randint(2, hi))
    return out


@pytest.mark.parametrize("seed", range(12))
def test_every_tile_once_random_varlen(seed):
    rng = random.Random(seed)
    n = rng.choice([1, 2, 3, 7, 40, LPT_MAX_SEQS, LPT_MAX_SEQS + 1, 300])
    lens_q = random_lens(rng, n, rng.choice([70, 300, 2000]))
    lens_k = lens_q if rng.random() < 0.5 else random_lens(rng, n, 900)
    hkv = rng.choice([1, 2, 4])
    g = rng.choice([1, 2, 4])
    num_sms = rng.choice([1, 7, 132, 5000])
    per_cta, seen = visited(offsets(lens_q), offsets(lens_k), hkv * g, g, num_sms)
    assert seen == expected_tiles(lens_q, hkv * g)  # each exactly once (Counter values all 1)
    assert len(per_cta) == persistent_grid(sum(lens_q), n, hkv * g, num_sms)
    assert all(per_cta)  # no CTA without a slot: the grid is at most the slot count


def test_vit_budget_graph_layout():
    """~70 segment slots, most empty, one picture of 42196 tokens and a few small ones."""
    lens = [0] * 70
    lens[0], lens[5], lens[6], lens[69] = 42196, 1, 4096, 300
    per_cta, seen = visited(offsets(lens), offsets(lens), 16, 1, 132)
    assert seen == expected_tiles(lens, 16)
    assert len(per_cta) == 132


def test_q_rows_beyond_the_last_sequence():
    """The grid counts the q tensor's rows (the kernel reads its shape), which may exceed cu[-1]."""
    lens = [129, 0, 1, 255]
    _, seen = visited(offsets(lens), offsets(lens), 3, 1, 132, total_q=sum(lens) + 500)
    assert seen == expected_tiles(lens, 3)


def test_longest_first_within_a_head_and_kv_heads_side_by_side():
    rng = random.Random(7)
    lens_q = random_lens(rng, 50, 1500)
    lens_k = random_lens(rng, 50, 5000)
    cu_q, cu_k = offsets(lens_q), offsets(lens_k)
    g, heads = 4, 8
    table = lpt_table(cu_q, cu_k)
    slots = tile_slots(sum(lens_q), len(lens_q))
    order = [work_tile(w, cu_q, cu_k, sum(lens_q), g, table) for w in range(slots * heads)]
    # slot w: q head fastest, g q heads of one kv head on one tile side by side
    for w in range(0, len(order), g):
        group = order[w : w + g]
        assert [t.head for t in group] == [group[0].head + j for j in range(g)]
        assert group[0].head % g == 0
        assert len({(t.valid, t.batch, t.m_block) for t in group}) == 1
    # within one kv head, the valid tiles come by non-increasing key length, then the empty slots
    for kvh in range(heads // g):
        tiles = order[kvh * slots * g : (kvh + 1) * slots * g : g]
        keys = [lens_k[t.batch] for t in tiles if t.valid]
        assert keys == sorted(keys, reverse=True)
        valid = [t.valid for t in tiles]
        assert valid == sorted(valid, reverse=True)  # no gaps before the end


def test_lpt_table_is_a_stable_sort_by_key_length():
    rng = random.Random(3)
    for _ in range(20):
        n = rng.randint(1, LPT_MAX_SEQS)
        lens_q = random_lens(rng, n, 600)
        lens_k = [rng.choice([0, 1, 64, 500, 500, 2000]) for _ in range(n)]
        perm, first = lpt_table(offsets(lens_q), offsets(lens_k))
        assert perm == sorted(range(n), key=lambda i: (-lens_k[i], i))
        tiles = [-(-lens_q[b] // TILE_M) for b in perm]
        assert first == [sum(tiles[:p]) for p in range(n + 1)]


def test_index_order_above_the_table():
    """More sequences than LPT_MAX_SEQS: the non-persistent kernel's numbering (gaps are empty)."""
    lens = [1, 0, 200] * ((LPT_MAX_SEQS // 3) + 5)
    cu = offsets(lens)
    order = [work_tile(w, cu, cu, sum(lens), 1) for w in range(tile_slots(sum(lens), len(lens)))]
    seqs = [t.batch for t in order if t.valid]
    assert seqs == sorted(seqs)  # sequence index order
    assert Counter((t.batch, t.m_block) for t in order if t.valid) == Counter(
        (b, m) for b, n in enumerate(lens) for m in range(-(-n // TILE_M)))


def test_grid_is_min_of_work_and_sms():
    assert persistent_grid(8 * 4096, 8, 16, 132) == 132
    assert tile_slots(8 * 4096, 8) == 264
    assert persistent_grid(100, 1, 1, 132) == 1
    assert persistent_grid(300, 2, 4, 132) == (300 // TILE_M + 2) * 4
