"""The fixed shape of the SM90 FP8 attention kernel (:mod:`.forward`): one TMA producer warpgroup
with few registers and consumer warpgroups of 64 query rows each -- two (384 threads), or three in
the persistent kernel's ``wg3`` -- and the E4M3 element type.  Imported by the kernel's modules
(cutlass is imported here)."""

from __future__ import annotations

import cutlass

F8 = cutlass.Float8E4M3FN

NUM_THREADS = 384
PRODUCER_REGS = 24
CONSUMER_REGS = 240
WG_ROWS = 64  # query rows per consumer warpgroup


def num_threads(consumer_wgs: int) -> int:
    """Threads of a CTA: the producer warpgroup and ``consumer_wgs`` consumer warpgroups."""
    return 128 * (1 + consumer_wgs)


def consumer_regs(consumer_wgs: int) -> int:
    """The consumers' setmaxnreg: what the producer's PRODUCER_REGS leave of the SM's 64K registers,
    a multiple of 8, at most CONSUMER_REGS (240 with two consumer warpgroups, 160 with three)."""
    return min(CONSUMER_REGS, (65536 - 128 * PRODUCER_REGS) // (128 * consumer_wgs) // 8 * 8)


#: Named barriers PINGPONG_BAR + consumer warpgroup: its GEMM turn (a ring: each warpgroup opens the
#: next one's); 0 is __syncthreads.
PINGPONG_BAR = 1
#: Named barriers ONES_BAR + consumer warpgroup: its block of ones is written (rowsum_mma).
ONES_BAR = 4
#: Named barriers ISSUED_BAR + consumer warpgroup: it has issued this turn's GEMMs (mufu_gate).
ISSUED_BAR = 6
#: Named barriers EPILOGUE_BAR + consumer warpgroup: its O staging buffer is free / written
#: (the persistent kernel's smem + TMA store of O).
EPILOGUE_BAR = 8
#: Named barriers MUFU_BAR + consumer warpgroup: its turn at the exp2 stream (mufu_token).
MUFU_BAR = 11
