"""Paired-comparison statistics for benchmark rounds (pure Python).

Each round times every backend once, in an order that alternates between rounds so that no
backend always runs first (or always right after another one). For a pair (a, b) the per-round
ratio is time_b / time_a (> 1: a faster); we report its median and how many rounds each wins.
"""

from __future__ import annotations

from typing import Sequence


def median(xs: Sequence[float]) -> float:
    s = sorted(float(x) for x in xs)
    if not s:
        raise ValueError("median of an empty sequence")
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def round_order(names: Sequence[str], r: int) -> list[str]:
    """Order of the backends in round r: a rotation by r // 2, reversed on odd rounds. For every
    pair, rounds 2j and 2j+1 run them in opposite orders, so each goes first equally often."""
    names = list(names)
    if not names:
        return []
    k = (r // 2) % len(names)
    order = names[k:] + names[:k]
    return order[::-1] if r % 2 else order


def paired(times_a: Sequence[float], times_b: Sequence[float]) -> dict:
    """Summary of rounds timed in pairs: ratio = b / a per round (a's speed-up over b)."""
    if len(times_a) != len(times_b):
        raise ValueError("paired samples need the same number of rounds")
    pairs = [(float(a), float(b)) for a, b in zip(times_a, times_b) if a > 0 and b > 0]
    if not pairs:
        raise ValueError("no valid rounds")
    ratios = [b / a for a, b in pairs]
    return {
        "rounds": len(pairs),
        "median_ratio": median(ratios),
        "min_ratio": min(ratios),
        "max_ratio": max(ratios),
        "wins_a": sum(1 for a, b in pairs if a < b),
        "wins_b": sum(1 for a, b in pairs if b < a),
    }


def all_pairs(per_backend: dict[str, Sequence[float]]) -> list[dict]:
    """Every unordered pair of backends that has times: [{a, b, **paired(a, b)}]."""
    names = [n for n, t in per_backend.items() if t]
    out = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            out.append({"a": a, "b": b, **paired(per_backend[a], per_backend[b])})
    return out

