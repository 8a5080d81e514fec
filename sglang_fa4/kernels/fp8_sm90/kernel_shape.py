"""The fixed shape of the SM90 FP8 attention kernel (:mod:`.forward`): one TMA producer warpgroup
with few registers and two consumer warpgroups of 64 query rows each (384 threads), and the E4M3
element type.  Imported by the kernel's modules
(cutlass is imported here)."""

from __future__ import annotations

import cutlass

F8 = cutlass.Float8E4M3FN

NUM_THREADS = 384
PRODUCER_REGS = 24
CONSUMER_REGS = 240
WG_ROWS = 64  # query rows per consumer warpgroup


#: Named barriers PINGPONG_BAR + consumer warpgroup: its GEMM turn (each warpgroup opens the
#: other's); 0 is __syncthreads.
PINGPONG_BAR = 1
#: Named barriers ONES_BAR + consumer warpgroup: its block of ones is written (rowsum_mma).
ONES_BAR = 4
#: Named barriers EPILOGUE_BAR + consumer warpgroup: its O staging buffer is free / written
#: (the persistent kernel's smem + TMA store of O).
EPILOGUE_BAR = 8
