"""Work schedule of the persistent SM90 FP8 forward (switch ``persist``, :mod:`.persistent_entry`)
in plain Python: the Python twin of what every CTA computes on the device, for CPU tests.

The persistent kernel launches ``persistent_grid`` CTAs (at most one per SM); CTA ``c`` works on the
work slots ``c, c + grid, c + 2 grid, ...`` of ``work_slots`` = ``tile_slots`` x heads, in that order.
A slot is (kv head, tile slot, q head within the kv head's group), the q head fastest: the CTAs of
one wave work on neighbouring q tiles of one sequence and the q heads that share one kv head, so
they read the same K/V (L2 reuse), and the heads are outermost, so a wave spans few sequences.

Tile slots number the q tiles of all sequences of one head (128 rows each):

* sorted order (``batch <= LPT_MAX_SEQS``): sequences by key length, longest first (ties by index:
  stable), their tiles numbered without gaps; the last slots (past the total) are empty.  Longest
  first because with a static stride the last wave should hold the cheapest tiles (a q tile of a
  non-causal sequence costs its key length).  Every CTA ranks the sequences in shared memory at its
  start (``LPT_MAX_SEQS`` entries of two int32 arrays; O(batch) compares a thread).
* index order (more sequences): the non-persistent kernel's numbering (``layout.locate_tile``:
  sequence b's tiles from (cu[b] - cu[0]) // 128 + b, gaps between sequences are empty slots).

Either way ``tile_slots`` = total_q // 128 + batch slots per head cover every tile, from the shapes
alone (a host int, no device read).
"""

from __future__ import annotations

from typing import NamedTuple

from sglang_fa4.kernels.fp8_sm90.layout import TILE_M, locate_tile

#: Sequences up to which the persistent kernel orders tiles longest-first (its shared-memory table).
LPT_MAX_SEQS = 128
#: SMs assumed when no GPU is visible (cross-compiles): the H100 / H200 count.
DEFAULT_NUM_SMS = 132


class WorkTile(NamedTuple):
    valid: bool
    batch: int
    m_block: int
    head: int


def tile_slots(total_q: int, batch: int, tile_m: int = TILE_M) -> int:
    """Tile slots per head (both orders fit in it)."""
    return int(total_q) // tile_m + int(batch)


def persistent_grid(total_q: int, batch: int, num_heads: int, num_sms: int, tile_m: int = TILE_M) -> int:
    """CTAs the persistent kernel launches: one per SM, fewer if there is less work."""
    return min(tile_slots(total_q, batch, tile_m) * int(num_heads), int(num_sms))


def lpt_table(cu_seqlens_q, cu_seqlens_k, tile_m: int = TILE_M) -> tuple[list[int], list[int]]:
    """(perm, first): sorted position p holds sequence perm[p], whose tiles are slots
    first[p] .. first[p + 1] - 1; first[batch] is the number of tiles.  The device computes the
    same thing by ranking: sequence i's position is the number of sequences before it in the order
    (longer keys, or equal keys and a smaller index), first[] the sum of their tile counts."""
    cq = [int(x) for x in cu_seqlens_q]
    ck = [int(x) for x in cu_seqlens_k]
    batch = len(cq) - 1
    keys = [ck[i + 1] - ck[i] for i in range(batch)]
    tiles = [-(-(cq[i + 1] - cq[i]) // tile_m) for i in range(batch)]
    perm = [0] * batch
    first = [0] * (batch + 1)
    for i in range(batch):
        before = [j for j in range(batch) if keys[j] > keys[i] or (keys[j] == keys[i] and j < i)]
        rank = len(before)
        perm[rank] = i
        first[rank] = sum(tiles[j] for j in before)
        if rank == batch - 1:
            first[batch] = first[rank] + tiles[i]
    return perm, first


def lpt_locate(first: list[int], batch: int, slot: int) -> int:
    """The sorted position whose tiles hold ``slot``: the last p < batch with first[p] <= slot (a
    binary search on the device; sequences without q tiles share their first[] with the next)."""
    lo, hi = 0, batch
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if first[mid] <= slot:
            lo = mid
        else:
            hi = mid
    return lo


def work_tile(w: int, cu_seqlens_q, cu_seqlens_k, total_q: int, qhead_per_kvhead: int, table=None,
              tile_m: int = TILE_M) -> WorkTile:
    """What work slot ``w`` is (the device's ``PersistentEntry.work_tile``); ``total_q`` is the q
    tensor's rows, ``table`` caches ``lpt_table``."""
    cq = [int(x) for x in cu_seqlens_q]
    batch = len(cq) - 1
    slots = tile_slots(total_q, batch, tile_m)
    g = int(qhead_per_kvhead)
    j = w % g
    rest = w // g
    slot = rest % slots
    head = (rest // slots) * g + j
    if batch <= LPT_MAX_SEQS:
        perm, first = table if table is not None else lpt_table(cq, cu_seqlens_k, tile_m)
        p = lpt_locate(first, batch, slot)
        return WorkTile(slot < first[batch], perm[p], slot - first[p], head)
    b, m = locate_tile(cq, slot, tile_m)
    return WorkTile(m * tile_m < cq[b + 1] - cq[b], b, m, head)


def cta_work(cu_seqlens_q, cu_seqlens_k, num_heads: int, qhead_per_kvhead: int, num_sms: int,
             total_q=None, tile_m: int = TILE_M) -> list[list[WorkTile]]:
    """Each CTA's work slots in its order (invalid ones included: the CTA skips them); ``total_q``
    (the q tensor's rows) defaults to cu_seqlens_q[-1]."""
    cq = [int(x) for x in cu_seqlens_q]
    batch = len(cq) - 1
    total_q = cq[-1] if total_q is None else int(total_q)
    grid = persistent_grid(total_q, batch, num_heads, num_sms, tile_m)
    n = tile_slots(total_q, batch, tile_m) * int(num_heads)
    table = lpt_table(cq, cu_seqlens_k, tile_m) if batch <= LPT_MAX_SEQS else None
    return [[work_tile(w, cq, cu_seqlens_k, total_q, qhead_per_kvhead, table, tile_m)
             for w in range(c, n, grid)] for c in range(grid)]
