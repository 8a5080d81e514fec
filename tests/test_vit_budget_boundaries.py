"""The ViT budget layouts at their edges (sglang_fa4/integration/vit_budget_layouts.py): a batch of
exactly one budget's tokens, exactly the segment capacity, a segment of exactly max_seqlen, and
padding remainders that do not divide into the pad chunks -- each with its off-by-one neighbour."""

from __future__ import annotations

import pytest

from sglang_fa4.integration.vit_budget_layouts import (
    FULL_PAD_CHUNKS, PAD_SEGMENT_TOKENS, LayoutDoesNotFit, budgets_holding, capture_layout, full_pad_segment,
    pad_layout, pick_budget, segment_capacity,
)
from sglang_fa4.testing import lengths, offsets

BUDGETS = (256, 1024, 4096)


def test_exactly_one_budgets_tokens_runs_in_that_budget():
    for budget in BUDGETS:
        assert pick_budget(budget, BUDGETS) == budget
        assert budgets_holding(budget, BUDGETS)[0] == budget
        nxt = pick_budget(budget + 1, BUDGETS)
        assert nxt == (None if budget == BUDGETS[-1] else BUDGETS[BUDGETS.index(budget) + 1])


def test_a_full_budget_has_no_padding_segment():
    cap = segment_capacity(256)
    out = pad_layout(offsets([100, 156]), 256, cap, max_seqlen=256)
    assert out == [0, 100, 256] + [256] * (cap - 2)
    assert len(out) == cap + 1
    one_short = pad_layout(offsets([100, 155]), 256, cap, max_seqlen=256)
    assert one_short[:4] == [0, 100, 255, 256] and lengths(one_short)[2] == 1


def test_exactly_the_segment_capacity_fits_and_one_more_does_not():
    budget = 256
    cap = segment_capacity(budget)
    exact = [budget // cap] * (cap - 1)
    exact.append(budget - sum(exact))  # cap segments, ending exactly at the budget: no padding
    out = pad_layout(offsets(exact), budget, cap, max_seqlen=budget)
    assert out == offsets(exact) and len(out) == cap + 1
    with pytest.raises(LayoutDoesNotFit, match=f"{cap + 1} segments exceed the budget's capacity {cap}"):
        pad_layout(offsets([1] * cap + [budget - cap]), budget, cap, max_seqlen=budget)
    # cap - 1 real segments 10 tokens short of the budget: the padding takes the last slot
    short = [1] * (cap - 2) + [budget - 10 - (cap - 2)]
    out = pad_layout(offsets(short), budget, cap, max_seqlen=budget)
    assert out == offsets(short) + [budget] and len(out) == cap + 1


def test_a_segment_of_exactly_max_seqlen_fits():
    cap = segment_capacity(1024, 64)
    assert pad_layout(offsets([64, 64]), 1024, cap, max_seqlen=64)[:3] == [0, 64, 128]
    with pytest.raises(LayoutDoesNotFit, match="a 65-token segment exceeds the budget's max_seqlen 64"):
        pad_layout(offsets([64, 65]), 1024, cap, max_seqlen=64)


@pytest.mark.parametrize("pad", [1, 2, 3, 5, 6, 7, 9, 13, 255, 1021, 1023])
def test_full_padding_remainders_split_into_at_most_the_chunk_count(pad):
    budget = 4096
    tokens = budget - pad
    seg = full_pad_segment(budget, tokens)
    cap = 4 + FULL_PAD_CHUNKS  # 2 real segments, the pad chunks, 2 spare
    out = pad_layout(offsets([tokens - 100, 100]), budget, cap, max_seqlen=budget, pad_segment=seg)
    pads = [n for n in lengths(out)[2:] if n]
    assert sum(pads) == pad and 1 <= len(pads) <= FULL_PAD_CHUNKS
    assert max(pads) == seg and max(pads) - min(pads) <= seg  # even chunks, the remainder last
    assert len(out) == cap + 1


@pytest.mark.parametrize("pad", [1, 63, 64, 65, 100, 129])
def test_windowed_padding_remainders_use_pad_segments(pad):
    budget = 1024
    cap = segment_capacity(budget, 64)
    out = pad_layout(offsets([budget - pad]), budget, cap, max_seqlen=budget)
    pads = lengths(out)[1:]
    pads = pads[:next((i for i, n in enumerate(pads) if n == 0), len(pads))]
    assert sum(pads) == pad and all(n == PAD_SEGMENT_TOKENS for n in pads[:-1]) and 0 < pads[-1] <= PAD_SEGMENT_TOKENS
    # a max_seqlen below the pad segment caps the padding segments too
    small = pad_layout(offsets([8]), 64, segment_capacity(64, 8), max_seqlen=8)
    assert max(lengths(small)) == 8 and small[-1] == 64


def test_capture_layout_when_the_segment_does_not_divide_the_budget():
    out = capture_layout(1000, segment_capacity(1000), 64)
    assert lengths(out)[:16] == [64] * 15 + [40] and out[16:] == [1000] * (len(out) - 16)
    assert max(lengths(capture_layout(48, segment_capacity(48), 64))) == 48  # a segment longer than the budget
