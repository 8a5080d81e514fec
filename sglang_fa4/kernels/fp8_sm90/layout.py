"""Pure-Python facts of the SM90 FP8 forward: supported shapes, the key permutation that lets P's
accumulator registers feed the second GEMM directly, the V^T column layout, and the variant key.

Nothing here imports cutlass or triton, so CPU tests can check it.

Why a key permutation: FP8 WGMMA takes its A operand from registers in a layout that differs
from the accumulator layout of the first GEMM (for k=32 a thread holds 4 consecutive keys of one
row per register; the accumulator gives it keys {2q, 2q+1, 8+2q, 9+2q} of each 16). Instead of
shuffling registers across the quad (FA3's ``permute_Cregs_fp8``), the kernel packs the four
accumulator values it already holds into one register, which the MMA reads as keys 4q..4q+3, and
V^T's key columns are stored permuted the same way (``KEY_PERM``) by the V^T pack step.  The
contraction over keys does not care about their order as long as P and V agree.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

#: Head dims (of q/k and of v, which must match) the kernel is compiled for.
SUPPORTED_HEAD_DIMS = (64, 96, 128, 192, 256)
#: Rows of q per CTA (two consumer warpgroups of 64 rows) and the usual keys per K/V tile (each
#: kernel's own: kernel_config.DEFAULT_CONFIGS).
TILE_M = 128
TILE_N = 128
#: Sequence b's V^T columns start at VT_ALIGN * ceil(cu_k[b] / VT_ALIGN) + VT_ALIGN * b: a multiple of
#: 16 because a TMA box's innermost start coordinate must be 16-byte aligned (the likely cause of
#: the "illegal instruction" seen on the H200 for a sequence starting at key 1000), and at least
#: roundup16(seqlen) columns after the previous start, so the permutation of a partial last
#: 16-key group never spills into the next sequence.
VT_ALIGN = 16
#: P is computed as exp2(s - max + P_LOG2_OFFSET): values up to 2^8 = 256 (E4M3 max 448) so small
#: probabilities stay normal numbers in E4M3 (FA3's Max_offset = 8); the row sum uses the same
#: scaled P, so the factor cancels.
P_LOG2_OFFSET = 8.0
#: Largest head dim whose O is accumulated in two levels (fp32 O + each tile's fp32 P V); above it
#: the two accumulators (d registers a thread) do not fit a consumer's 240 beside S, and the PV
#: GEMM accumulates into O itself (consumer_mainloop_wide).
TWO_LEVEL_MAX_HEAD_DIM = 128
#: Shared memory an SM90 CTA may use (227 KiB).
SM90_SMEM_BYTES = 227 * 1024
def narrow_widths(tile_n: int) -> tuple:
    """First-tile QK^T widths below a key tile of ``tile_n`` (the narrow first tile, first_key_tile.py): those
    of 64 and 96 that divide it (an MMA of width W partitions the K stage into tile_n / W column
    blocks, the first one used)."""
    return tuple(w for w in (64, 96) if w < tile_n and tile_n % w == 0)


#: The kernel's argument for an unbounded window side (a side this large or larger is unbounded);
#: every API takes None (or SGLang's -1) instead: normalize_window.
WINDOW_UNBOUNDED = 1 << 28


def key_perm(slot: int) -> int:
    """The key (0..15, within a group of 16) whose value sits in V^T column ``slot`` of the group.

    Slot l = 4q + i is what the FP8 MMA reads as key 4q+i from thread q's register; that register
    holds the accumulator values of keys 8*(i//2) + 2q + (i%2).
    """
    if not 0 <= slot < 16:
        raise ValueError(f"slot must be in [0, 16), got {slot}")
    q, i = divmod(slot, 4)
    return 8 * (i // 2) + 2 * q + (i % 2)


KEY_PERM = tuple(key_perm(s) for s in range(16))


def vt_source_key(slot: int) -> int:
    """Key index (within its sequence) stored at V^T slot ``slot`` (within the same sequence)."""
    return 16 * (slot // 16) + KEY_PERM[slot % 16]


def vt_column_offset(cu_seqlen_k_b: int, b: int) -> int:
    """First V^T column of sequence ``b`` (16-aligned; see VT_ALIGN)."""
    return VT_ALIGN * (-(-int(cu_seqlen_k_b) // VT_ALIGN)) + VT_ALIGN * b


def vt_columns(total_k: int, batch: int) -> tuple[int, int]:
    """(logical columns, row stride) of the V^T buffer for ``batch`` sequences: room for every
    sequence's aligned start plus its rounded-up length (a multiple of 16 either way)."""
    cols = VT_ALIGN * (-(-int(total_k) // VT_ALIGN)) + VT_ALIGN * (batch + 1)
    return cols, cols


def vt_region_end(cu_seqlen_k_next: int, b: int, batch: int, cols: int) -> int:
    """End (exclusive) of sequence ``b``'s columns: the next sequence's start, or ``cols`` for the
    last.  The pack kernels write every column of [start, end), zeros past the keys, so the whole
    buffer holds finite values (the MMA multiplies masked P = 0 by whatever a tile reads)."""
    return cols if b == batch - 1 else vt_column_offset(cu_seqlen_k_next, b + 1)


def head_dim_stages(head_dim: int) -> int:
    """K/V^T pipeline stages at this head dim: Q (TILE_M x d) + stages x (K + V^T, 2 x TILE_N x d
    bytes) within shared memory -- 4 up to d=128 (160 KiB), 3 at d=192 (168 KiB), 2 at d=256 (160
    KiB; 3 would leave 3 KiB)."""
    return 4 if head_dim <= 128 else 3 if head_dim <= 192 else 2


def stages_that_fit(head_dim: int, tile_n: int) -> int:
    """K/V^T stages of ``tile_n`` keys that fit beside Q and 4 KiB of barriers / spare (no cap)."""
    return (SM90_SMEM_BYTES - TILE_M * head_dim - 4096) // (2 * tile_n * head_dim)


def tile_stages(head_dim: int, tile_n: int) -> int:
    """K/V^T stages for a key tile of ``tile_n`` keys: as many as fit beside Q
    and 4 KiB of barriers / spare, at most 4 -- 4 at d=128 for 192 keys (208 KiB), 3 for 224."""
    fits = stages_that_fit(head_dim, tile_n)
    if fits < 2:
        raise ValueError(f"a key tile of {tile_n} at head dim {head_dim}: two K/V^T stages do not fit shared memory")
    return min(4, fits)


def persistent_stages(head_dim: int, tile_n: int, q_buffers: int = 2) -> int:
    """K/V^T stages of the persistent kernel: as many as fit beside ``q_buffers`` Q buffers
    (TILE_M x d bytes each), the bf16 O staging buffers (TILE_M x d x 2 bytes, the TMA-store
    epilogue) and 2 KiB of barriers + the longest-first table, at most 4 -- or, for key tiles
    under 192, as many as hold 768 keys (what 4 stages of 192 keys hold).  3 at d=128 with 192-key
    tiles and two Q buffers."""
    spare = SM90_SMEM_BYTES - q_buffers * TILE_M * head_dim - 2 * TILE_M * head_dim - 2048
    fits = spare // (2 * tile_n * head_dim)
    if fits < 2:
        raise ValueError(f"persistent kernel, key tile {tile_n} at head dim {head_dim}: two K/V^T stages do not fit")
    return min(max(4, 768 // tile_n), fits)


def padded_head_dim(head_dim: int) -> int:
    """The head dim the FP8 kernel runs at: the next supported one (72, 80 -> 96)."""
    for d in SUPPORTED_HEAD_DIMS:
        if head_dim <= d:
            return d
    raise ValueError(
        f"FP8 SM90 attention supports head dims up to {SUPPORTED_HEAD_DIMS[-1]}, got {head_dim}"
    )


class Fp8Variant(NamedTuple):
    """What selects one compiled FP8 kernel (everything else is a runtime argument)."""

    head_dim: int
    causal: bool
    local: bool  # a window side is bounded (sizes are runtime values)

    def as_dict(self) -> dict:
        return self._asdict()

    def describe(self) -> str:
        kind = "causal" if self.causal else "local" if self.local else "full"
        return f"fp8 e4m3 d={self.head_dim} {kind}"


def normalize_window(causal: bool, window_size) -> tuple[bool, bool, int, int]:
    """(causal, local, left, right) for the kernel: unbounded sides as WINDOW_UNBOUNDED (its
    argument encoding; nothing outside the launch sees it).

    ``window_size`` is (left, right) in the one convention of every route
    (:func:`sglang_fa4.kernels.inputs.window_bounds`): None -- or SGLang's negative -1 -- is
    unbounded.  A window with an unbounded left side and right side 0 is plain causal attention.
    """
    from sglang_fa4.kernels.inputs import window_bounds

    left, right = window_bounds(window_size)
    if causal:
        if right not in (None, 0):
            raise ValueError(f"causal=True with a right window of {right}: use one or the other")
        right = 0
    if left is None and right == 0:
        return True, False, WINDOW_UNBOUNDED, 0
    if left is None and right is None:
        return False, False, WINDOW_UNBOUNDED, WINDOW_UNBOUNDED
    left = WINDOW_UNBOUNDED if left is None else min(left, WINDOW_UNBOUNDED)
    right = WINDOW_UNBOUNDED if right is None else min(right, WINDOW_UNBOUNDED)
    return False, True, left, right


def variant_for(head_dim: int, causal: bool, window_size=None) -> Fp8Variant:
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(
            f"FP8 SM90 attention: head dim {head_dim} is not supported (supported: "
            f"{SUPPORTED_HEAD_DIMS}; pad q/k/v with zeros to the next one, e.g. with "
            "sglang_fa4.kernels.vit.quantize_qkv)"
        )
    causal, local, _, _ = normalize_window(causal, window_size)
    return Fp8Variant(head_dim, causal, local)


def all_variants(head_dims=SUPPORTED_HEAD_DIMS) -> list[Fp8Variant]:
    """Every variant, for a startup warmup."""
    return [
        Fp8Variant(d, c, l) for d in head_dims for (c, l) in ((False, False), (True, False), (False, True))
    ]


def num_m_blocks(max_seqlen_q: int) -> int:
    return max(1, -(-int(max_seqlen_q) // TILE_M))


def grid_check(max_seqlen_q: Optional[int], total_q: int) -> int:
    """max_seqlen_q as a host int (the grid size); None means total_q (always enough)."""
    if max_seqlen_q is None:
        return max(int(total_q), 1)
    if not isinstance(max_seqlen_q, int):
        raise TypeError(
            f"max_seqlen must be a Python int (it sizes the grid; a tensor would sync), got "
            f"{type(max_seqlen_q).__name__}"
        )
    if max_seqlen_q < 0:
        raise ValueError(f"max_seqlen must be >= 0, got {max_seqlen_q}")
    return max(max_seqlen_q, 1)


def pow2_at_least(n: int) -> int:
    """The smallest power of two >= n, in plain integer maths (``triton.next_power_of_2`` is a
    constexpr function: tens of microseconds per host call in recent Triton)."""
    return 1 << max(n - 1, 0).bit_length()


def locate_tile(cu_seqlens_q, tile: int, tile_m: int = TILE_M) -> tuple[int, int]:
    """(sequence, m block) the FP8 forward's CTA ``tile`` works on (the Python twin of
    ``KernelEntry.locate_tile``): sequence b's q tiles are numbered from
    first(b) = (cu[b] - cu[0]) // tile_m + b (increasing in b, and first(b+1) - first(b) >=
    ceil(len_b / tile_m)); the CTA takes the last sequence whose first(b) <= tile (a binary search
    on the device). A number between two sequences' tiles gets an m block past its sequence's rows:
    that CTA does nothing."""
    cu = [int(c) for c in cu_seqlens_q]
    first = lambda b: (cu[b] - cu[0]) // tile_m + b  # noqa: E731
    lo, hi = 0, len(cu) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if first(mid) <= tile:
            lo = mid
        else:
            hi = mid
    return lo, tile - first(lo)


def tile_grid(total_q: int, batch: int, tile_m: int = TILE_M) -> int:
    """CTAs per head the FP8 forward launches (forward.py's grid): total_q // tile_m + batch,
    enough for locate_tile's numbering whatever the layout and max_seqlen."""
    return int(total_q) // tile_m + batch
