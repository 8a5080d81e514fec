"""The layout maths of ViT graphs over token budgets (:mod:`sglang_fa4.integration.vit_budgets`):
which budget a batch runs in, and the fixed-length cu_seqlens a budget's graph is captured with
and replayed with. Pure Python (no torch, no SGLang).

Every cu_seqlens tensor of a budget has a FIXED length (a fixed address and shape): the real
boundaries, then the padding rows ``T..B`` as padding segments (every row is written by the
kernels, pad rows attend only to pad rows, so no garbage and no NaN reach a real row), then empty
segments ``[B, B, ...]``. The two layouts are sized apart: the full-attention one holds
``SGLANG_FA4_VIT_GRAPH_MAX_SEGMENTS`` images/frames and splits the padding into at most
``FULL_PAD_CHUNKS`` segments, because FA4's SM90 varlen scheduler launches about one extra tile
per segment and every tile scans the segment list (on the H200 the budget graph is within 1.03x
of SGLang's exact-layout graph at equal tokens, benchmark/results/h200/vit_graphs.md); the
windowed one (Qwen2.5-VL, short-window kernel: a program per segment, empty ones exit at once)
holds a slot per quarter window and pads with segments of at most ``PAD_SEGMENT_TOKENS``.
"""

from __future__ import annotations

import operator

from typing import Optional, Sequence

from sglang_fa4.environ import envs

#: windowed layouts: padding rows are split into segments of at most this many tokens (<= any window)
PAD_SEGMENT_TOKENS = 64
#: full-attention layouts: padding rows are split into at most this many segments (a chunk of P
#: rows costs P^2 attention work; each segment costs every tile a scan step)
FULL_PAD_CHUNKS = 4
#: smallest non-empty real segment (Qwen: a 2x2 spatial-merge unit); sizes the segment capacity
MIN_SEGMENT_TOKENS = 4
#: tokens per segment slot the fixed segment capacity is sized for without windows (images); with
#: windows, a quarter of the window (Qwen2.5-VL: 16 of 64; edge windows are smaller)
CAPACITY_TOKENS_PER_SEGMENT = 16
#: empty segments a real layout may carry (Qwen2.5-VL's full cu_seqlens starts [0, 0, ...])
SPARE_SEGMENTS = 2
#: real full-attention segments a budget below the largest holds at least (full_slots)
MIN_FULL_SLOTS = 4


class LayoutDoesNotFit(ValueError):
    """A layout cannot run in a budget (too many tokens or segments, or a segment longer than the
    budget's fixed max_seqlen): the batch runs eagerly."""


def budgets_from_env() -> tuple[int, ...]:
    """SGLANG_FA4_VIT_GRAPH_BUDGETS: sorted, unique, each a positive multiple of
    MIN_SEGMENT_TOKENS (environ.yaml types it; a malformed value fails at plugin registration)."""
    return envs.SGLANG_FA4_VIT_GRAPH_BUDGETS.get()


def dense_ladder(lo: int = 512, hi: int = 8192, step: float = 1.07, quantum: int = 64) -> tuple[int, ...]:
    """Budgets from ``lo`` to ``hi`` whose consecutive ratio is at most ``step`` (or one ``quantum``
    where ``step`` is smaller than a quantum), each a multiple of ``quantum``. Measured on the H200
    (vit_graphs*.md), a budget graph costs about the padded/real token ratio times the exact-layout
    graph (Qwen3-VL 448: 1.31x tokens, 1.22x time; Qwen2.5-VL 720p: 1.07x, 1.10x), so issue #18's
    1.10x bar needs steps of ~7%: 47 budgets for 512..8192 (the default ladder has 8, steps up to
    1.5x). Each budget keeps its static buffers; see SGLANG_FA4_VIT_GRAPH_SHARED_POOL."""
    if lo % quantum or hi % quantum or lo <= 0 or hi < lo or step <= 1.0 or quantum % MIN_SEGMENT_TOKENS:
        raise ValueError(f"dense_ladder: lo {lo} and hi {hi} multiples of quantum {quantum} (itself a multiple of "
                         f"{MIN_SEGMENT_TOKENS}), 0 < lo <= hi, step {step} > 1")
    out = [lo]
    while out[-1] < hi:
        nxt = int(out[-1] * step) // quantum * quantum
        out.append(min(hi, max(nxt, out[-1] + quantum)))
    return tuple(out)


def pick_budget(tokens: int, budgets: Sequence[int]) -> Optional[int]:
    """The smallest budget holding ``tokens``; None above the largest (run eagerly)."""
    for budget in sorted(budgets):
        if tokens <= budget:
            return budget
    return None


def budgets_holding(tokens: int, budgets: Sequence[int]) -> list[int]:
    """Every budget holding ``tokens``, smallest first: a batch whose layout does not fit the
    smallest (more segments than its slots) tries the next."""
    return [b for b in sorted(budgets) if tokens <= b]


def segment_capacity(budget: int, window_tokens: Optional[int] = None) -> int:
    """Segments every windowed cu_seqlens tensor of ``budget`` holds (fixed: one shape, one address;
    full-attention layouts use :func:`full_capacity`): one per
    ``window/4`` tokens (CAPACITY_TOKENS_PER_SEGMENT without windows; never under
    MIN_SEGMENT_TOKENS), plus SPARE_SEGMENTS empty ones. Sized for real layouts, not the worst case:
    every unused slot is an empty segment the kernels still schedule (measured on the H200 with a
    slot per 4 tokens: 2.8-3.6x the exact-layout attention time), and a layout of more, smaller
    segments runs eagerly instead."""
    per_slot = CAPACITY_TOKENS_PER_SEGMENT if window_tokens is None else window_tokens // 4
    return budget // max(MIN_SEGMENT_TOKENS, per_slot) + SPARE_SEGMENTS


def full_slots(budget: Optional[int] = None, largest: Optional[int] = None,
               max_segments: Optional[int] = None, tokens_per_slot: Optional[int] = None) -> int:
    """Real segments (images, video frames) the full-attention layout of ``budget`` holds: the
    largest budget (or any, without ``budget``/``largest``) holds ``max_segments``
    (SGLANG_FA4_VIT_GRAPH_MAX_SEGMENTS); a smaller one a slot per ``tokens_per_slot`` tokens
    (SGLANG_FA4_VIT_GRAPH_TOKENS_PER_SEGMENT_SLOT; 0: ``max_segments`` everywhere), at least
    MIN_FULL_SLOTS. Why: FA4's SM90 varlen grid is (total_q + segments * 127) / 128 tiles a head
    and every tile decodes the segment list, so 70 slots gave a 1024-token budget 77 tiles a head
    for 7 real ones (Qwen3-VL 448: 1.26-1.28x the exact-layout graph,
    ``git show 244b9bd:benchmark/results/h200/vit_graphs-dense-0.5.23.md``).
    A batch with more segments than a budget holds runs in the next budget that holds them
    (:func:`budgets_holding`), so the largest budget still takes any batch of up to
    ``max_segments`` segments."""
    if max_segments is None:
        max_segments = envs.SGLANG_FA4_VIT_GRAPH_MAX_SEGMENTS.get()  # >= 1 (environ.yaml)
    if max_segments < 1:
        raise ValueError(f"max_segments must be >= 1, got {max_segments}")
    if tokens_per_slot is None:
        tokens_per_slot = envs.SGLANG_FA4_VIT_GRAPH_TOKENS_PER_SEGMENT_SLOT.get()  # >= 0
    if tokens_per_slot < 0:
        raise ValueError(f"tokens_per_slot must be >= 0, got {tokens_per_slot}")
    if budget is None or largest is None or budget >= largest or tokens_per_slot == 0:
        return max_segments
    return min(max_segments, max(MIN_FULL_SLOTS, budget // tokens_per_slot))


def full_capacity(budget: Optional[int] = None, largest: Optional[int] = None,
                  max_segments: Optional[int] = None, tokens_per_slot: Optional[int] = None) -> int:
    """Segments every full-attention cu_seqlens tensor of ``budget`` holds: :func:`full_slots` real
    ones, FULL_PAD_CHUNKS padding, SPARE_SEGMENTS empty."""
    return full_slots(budget, largest, max_segments, tokens_per_slot) + FULL_PAD_CHUNKS + SPARE_SEGMENTS


def full_pad_segment(budget: int, tokens: int) -> int:
    """Padding segment length of a full-attention layout: the rows ``tokens..budget`` in at most
    FULL_PAD_CHUNKS segments."""
    return max(1, -(-(budget - tokens) // FULL_PAD_CHUNKS))


def pad_layout(cu: Sequence[int], budget: int, capacity: int, max_seqlen: int,
               pad_segment: int = PAD_SEGMENT_TOKENS) -> list[int]:
    """Fixed-length (``capacity + 1``) cu_seqlens for ``budget``: ``cu``, then the rows
    ``cu[-1]..budget`` as segments of at most ``min(pad_segment, max_seqlen)`` tokens, then empty
    segments ending at ``budget``. Raises LayoutDoesNotFit when ``cu`` does not fit."""
    # on every replay's host path: one map pass a check (a generator per element cost a Qwen2.5-VL
    # 720p window layout ~40 us here)
    cu = list(map(int, cu))
    lengths = list(map(operator.sub, cu[1:], cu[:-1]))
    if not cu or cu[0] != 0 or (lengths and min(lengths) < 0):
        raise LayoutDoesNotFit(f"not a cu_seqlens layout: {cu[:8]}...")
    tokens = cu[-1]
    if tokens > budget:
        raise LayoutDoesNotFit(f"{tokens} tokens exceed the budget {budget}")
    longest = max(lengths, default=0)
    if longest > max_seqlen:
        raise LayoutDoesNotFit(f"a {longest}-token segment exceeds the budget's max_seqlen {max_seqlen}")
    step = max(1, min(pad_segment, max_seqlen))
    out = cu
    out.extend(range(tokens + step, budget, step))
    if tokens < budget:
        out.append(budget)
    if len(out) - 1 > capacity:
        raise LayoutDoesNotFit(f"{len(out) - 1} segments exceed the budget's capacity {capacity}")
    out.extend([budget] * (capacity + 1 - len(out)))
    return out


def capture_layout(budget: int, capacity: int, segment: int) -> list[int]:
    """The layout a budget is captured with: segments of ``segment`` tokens (so the longest, the
    max_seqlen the graph bakes in, is ``min(segment, budget)``), then empty segments."""
    return pad_layout([0], budget, capacity, max_seqlen=min(segment, budget), pad_segment=segment)

