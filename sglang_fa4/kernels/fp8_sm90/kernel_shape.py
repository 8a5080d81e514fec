"""The fixed shape of the SM90 FP8 attention kernel (:mod:`.forward`): 3 warpgroups -- one TMA
producer with few registers, two consumers of 64 query rows each -- and the E4M3 element type.
Imported by the kernel's modules (cutlass is imported here)."""

from __future__ import annotations

import cutlass

F8 = cutlass.Float8E4M3FN

NUM_THREADS = 384
PRODUCER_REGS = 24
CONSUMER_REGS = 240
WG_ROWS = 64  # query rows per consumer warpgroup


#: Named barriers PINGPONG_BAR (+0: warpgroup 0's GEMM turn, +1: warpgroup 1's); 0 is __syncthreads.
PINGPONG_BAR = 1
#: Named barriers ONES_BAR + consumer warpgroup: its block of ones is written (rowsum_mma).
ONES_BAR = 3
#: Named barriers ISSUED_BAR + consumer warpgroup: it has issued this turn's GEMMs (mufu_gate).
ISSUED_BAR = 5
#: Named barriers EPILOGUE_BAR + consumer warpgroup: its O staging buffer is free / written
#: (the persistent kernel's smem + TMA store of O).
EPILOGUE_BAR = 7
#: Named barriers MUFU_BAR + consumer warpgroup: its turn at the exp2 stream (mufu_token).
MUFU_BAR = 9
