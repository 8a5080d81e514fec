"""FP8 (E4M3 Q/K/V) attention forward for SM90 in CuTe DSL: varlen, causal / sliding window, GQA,
bf16 output.

Shape of the kernel (one CTA per 128 query rows of one head of one sequence, 3 warpgroups):

* warpgroup 0 (producer, 24 registers): one warp issues TMA loads -- Q once (two 64-row halves),
  then K and V^T tiles of 128 keys into a ring of ``num_stages`` shared-memory stages guarded by
  mbarriers (a PipelineTmaAsync);
* warpgroups 1 and 2 (consumers, 240 registers): each owns 64 query rows.  Per key tile:
  S = Q K^T with FP8 WGMMA (m64n128k32, both operands K-major from shared memory), mask, online
  softmax in fp32 with P = exp2(s - max + 8) (E4M3 headroom, FA3's Max_offset), P converted to
  E4M3 *in the registers the accumulator left it in* and fed as WGMMA's register A operand for
  O_tile = P V (V^T K-major from shared memory), then O = O * rescale + O_tile in fp32 (two-level
  accumulation: Hopper's FP8 MMA accumulates with reduced precision, so each tile starts from zero).
  Main loop (default, ``overlap``): S_i = Q K_i^T is issued together with O_t = P_{i-1} V_{i-1}
  and the softmax of S_i runs while that PV GEMM is in flight (FA3's intra-warpgroup overlap);
  the fp32 O update of PV_{i-2} runs while S_i is in flight, a branch keeps ptxas from hoisting
  the PV wait above the softmax (``pin_below``), the row sums come from the tensor cores as
  P x ones with the PV GEMM (``rowsum_mma``) and the row max is 4 interleaved chains.  Measured
  side by side on the H200 (``git show 244b9bd:benchmark/results/h200/fp8_attention_speed2.md``): d64 11-16% faster
  than without these four, d128 unchanged (+-2%).  At d=128 causal / windowed the two consumer
  warpgroups also take turns issuing their GEMMs, the turn passed once S is complete
  (``pingpong_late``), and every 8th exp2 runs on the FMA pipe (``emu``): 3-5% less time
  (``git show 244b9bd:benchmark/results/h200/fp8_attention_speed3.md``).  Where the d128 time goes (Nsight Compute):
  ``git show 244b9bd:benchmark/results/h200/fp8_attention_ncu.md``.
* d=128 non-causal without a window: the persistent kernel (:mod:`.persistent_entry`), 128 x 192
  tiles, O accumulated by the PV GEMM itself (:mod:`.consumer_mainloop_wide`, FA3's way; S of 192
  keys needs the 64 registers of the two-level loop's tile accumulator), ping-pong with the turn
  passed right after a warpgroup's GEMM issue (FA3's scheduler barrier; O's rescale moved before
  the turn), all exp2s on the MUFU, a narrow first key tile and K / V^T behind their own barriers.

Which kernel gets which of these: :mod:`.kernel_config` (one table); the alternatives measured and
left off: benchmark/lab/NOTES-fp8-variants.md.

V^T comes from global memory already transposed, with its keys permuted inside groups of 16
(``layout.KEY_PERM``) so that P needs no register shuffles, each sequence starting at a 16-aligned
column (a TMA box's innermost coordinate must be 16-byte aligned); see ``layout.py``.

Descales are per (batch, kv head): q and k fold into the softmax scale, v into the final row scale.

Modules: this one is the host side (variant options, the MMAs, shared-memory layouts and TMA atoms,
the launch); :mod:`.kernel_config` the compile-time choices; :mod:`.kernel_entry` the device entry (block bounds, pipelines, the producer's TMA
loads); :mod:`.consumer_mainloop` the consumers' GEMM main loop and epilogue (d <= 128; above, the one-level loop
of :mod:`.consumer_mainloop_wide`);
:mod:`.tile_softmax` masking, online softmax and P -> E4M3; :mod:`.kernel_shape` the constants;
:mod:`.persistent_entry` / :mod:`.persistent_consumer` the persistent kernel.
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import cpasync, warpgroup

from sglang_fa4.kernels.fp8_sm90.consumer_mainloop import ConsumerMainLoop
from sglang_fa4.kernels.fp8_sm90.consumer_mainloop_wide import ConsumerMainLoopWide
from sglang_fa4.kernels.fp8_sm90.first_key_tile import FirstKeyTile
from sglang_fa4.kernels.fp8_sm90.kernel_config import Fp8KernelConfig, default_config
from sglang_fa4.kernels.fp8_sm90.kernel_entry import KernelEntry
from sglang_fa4.kernels.fp8_sm90.kernel_shape import CONSUMER_REGS, F8, NUM_THREADS, WG_ROWS
from sglang_fa4.kernels.fp8_sm90.layout import SUPPORTED_HEAD_DIMS, TILE_M, Fp8Variant, narrow_widths
from sglang_fa4.kernels.fp8_sm90.persistent_consumer import PersistentConsumer
from sglang_fa4.kernels.fp8_sm90.persistent_entry import Q_STAGES, PersistentEntry
from sglang_fa4.kernels.fp8_sm90.schedule import DEFAULT_NUM_SMS
from sglang_fa4.kernels.fp8_sm90.tile_softmax import TileSoftmax

_K_MAJOR = cute.nvgpu.OperandMajorMode.K
_ROW_MAJOR = cutlass.utils.LayoutEnum.ROW_MAJOR  # K-major for both A (M,K) and B (N,K)


class Fp8AttentionForwardSm90(KernelEntry, ConsumerMainLoop, ConsumerMainLoopWide, FirstKeyTile, TileSoftmax,
                              PersistentEntry, PersistentConsumer):
    """One compiled kernel: a variant (head dim, causal, local window) built with a
    :class:`.kernel_config.Fp8KernelConfig` (None: the table's, kernel_config.DEFAULT_CONFIGS)."""

    def __init__(self, head_dim: int, causal: bool = False, local: bool = False,
                 config: Fp8KernelConfig | None = None, num_sms: int = 0):
        if head_dim not in SUPPORTED_HEAD_DIMS:
            raise ValueError(f"head dim {head_dim} not in {SUPPORTED_HEAD_DIMS}")
        if causal and local:
            raise ValueError("causal and local are exclusive (causal is a window (inf, 0))")
        variant = Fp8Variant(head_dim, causal, local)
        config = default_config(variant) if config is None else config
        config.check_variant(variant)
        self.head_dim = head_dim
        self.causal = causal
        self.local = local
        self.config = config
        self.tile_m = TILE_M
        self.tile_n = config.tile_n
        self.num_stages = config.stages
        self.two_level = config.two_level
        self.pingpong = config.pingpong
        self.pingpong_late = config.pingpong_late
        self.pass_after_issue = config.pass_after_issue
        self.emu = config.emu
        self.rowsum_mma = config.rowsum_mma
        # the persistent kernel (persistent_entry.py); num_sms: the launch device's SM count
        # (launch.py; 132 in cross-compiles), its grid's bound
        self.persistent = config.persistent
        self.num_sms = int(num_sms) or DEFAULT_NUM_SMS
        self.narrow = config.narrow
        self.narrow_widths = narrow_widths(self.tile_n)
        self.kv_split = config.kv_split
        self.num_threads = NUM_THREADS
        self.consumer_regs = CONSUMER_REGS

    # ------------------------------------------------------------------------------------------
    # Host side (traced once per compile)
    # ------------------------------------------------------------------------------------------
    @cute.jit
    def __call__(
        self,
        mQ_u8: cute.Tensor,  # (total_q, Hq, d) uint8 view of E4M3
        mK_u8: cute.Tensor,  # (total_k, Hkv, d)
        mVt_u8: cute.Tensor,  # (Hkv, d, vt_cols) permuted V^T
        mO: cute.Tensor,  # (total_q, Hq, d) bf16
        mCuQ: cute.Tensor,  # (B+1,) int32
        mCuK: cute.Tensor,  # (B+1,) int32
        mDescale: cute.Tensor,  # (3, B, Hkv) float32: q, k, v descales
        softmax_scale_log2: Float32,
        window_left: Int32,
        window_right: Int32,
        qhead_per_kvhead: Int32,
        max_seqlen_q: Int32,
        stream,
    ):
        d = self.head_dim
        as_f8 = lambda t: cute.make_tensor(cute.recast_ptr(t.iterator, dtype=F8), t.layout)
        # (rows, d, head) views so a TMA box is (rows, d) of one head
        mQ = as_f8(mQ_u8)
        mQ = cute.make_tensor(mQ.iterator, cute.select(mQ.layout, mode=[0, 2, 1]))
        mK = as_f8(mK_u8)
        mK = cute.make_tensor(mK.iterator, cute.select(mK.layout, mode=[0, 2, 1]))
        mVt = as_f8(mVt_u8)
        mVt = cute.make_tensor(mVt.iterator, cute.select(mVt.layout, mode=[1, 2, 0]))  # (d, cols, Hkv)

        tiled_mma_qk = sm90_utils.make_trivial_tiled_mma(
            F8, F8, _K_MAJOR, _K_MAJOR, Float32, (1, 1, 1), (WG_ROWS, self.tile_n)
        )
        tiled_mma_pv = sm90_utils.make_trivial_tiled_mma(
            F8, F8, _K_MAJOR, _K_MAJOR, Float32, (1, 1, 1), (WG_ROWS, d), warpgroup.OperandSource.RMEM
        )
        # Q: two 64-row halves (one per consumer warpgroup) as two "stages" of an A layout (persistent:
        # Q_STAGES buffers of two halves, stage 2 * buffer + half)
        q_halves = 2 * Q_STAGES if cutlass.const_expr(self.persistent) else 2
        sQ_layout = sm90_utils.make_smem_layout_a(_ROW_MAJOR, (WG_ROWS, self.tile_n, d), F8, q_halves)
        sK_layout = sm90_utils.make_smem_layout_b(_ROW_MAJOR, (WG_ROWS, self.tile_n, d), F8, self.num_stages)
        sVt_layout = sm90_utils.make_smem_layout_b(_ROW_MAJOR, (WG_ROWS, d, self.tile_n), F8, self.num_stages)
        # rowsum_mma: P times a constant 8 x tile_n block of E4M3 ones (its content is uniform, so
        # its swizzle does not matter) gives the row sums in an m64n8 accumulator
        tiled_mma_sum = sm90_utils.make_trivial_tiled_mma(
            F8, F8, _K_MAJOR, _K_MAJOR, Float32, (1, 1, 1), (WG_ROWS, 8), warpgroup.OperandSource.RMEM
        )
        sOnes_layout = sm90_utils.make_smem_layout_b(_ROW_MAJOR, (WG_ROWS, 8, self.tile_n), F8, 2)

        g2s = cpasync.CopyBulkTensorTileG2SOp()
        tma_q, mQ_tma = cpasync.make_tiled_tma_atom(g2s, mQ, cute.slice_(sQ_layout, (None, None, 0)), (WG_ROWS, d))
        tma_k, mK_tma = cpasync.make_tiled_tma_atom(g2s, mK, cute.slice_(sK_layout, (None, None, 0)), (self.tile_n, d))
        tma_vt, mVt_tma = cpasync.make_tiled_tma_atom(
            g2s, mVt, cute.slice_(sVt_layout, (None, None, 0)), (d, self.tile_n)
        )
        self.tx_q = 2 * WG_ROWS * d
        self.tx_kv = 2 * self.tile_n * d

        @cute.struct
        class SharedStorage:
            mbar_q: cute.struct.MemRange[cutlass.Int64, 2]
            mbar_kv: cute.struct.MemRange[cutlass.Int64, 2 * self.num_stages]
            sQ: cute.struct.Align[cute.struct.MemRange[F8, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[F8, cute.cosize(sK_layout)], 1024]
            sVt: cute.struct.Align[cute.struct.MemRange[F8, cute.cosize(sVt_layout)], 1024]

        @cute.struct
        class SharedStorageOnes:
            mbar_q: cute.struct.MemRange[cutlass.Int64, 2]
            mbar_kv: cute.struct.MemRange[cutlass.Int64, 2 * self.num_stages]
            sQ: cute.struct.Align[cute.struct.MemRange[F8, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[F8, cute.cosize(sK_layout)], 1024]
            sVt: cute.struct.Align[cute.struct.MemRange[F8, cute.cosize(sVt_layout)], 1024]
            sOnes: cute.struct.Align[cute.struct.MemRange[F8, cute.cosize(sOnes_layout)], 1024]  # one per consumer

        if cutlass.const_expr(self.rowsum_mma):
            SharedStorage = SharedStorageOnes  # noqa: F811
        self.shared_storage = SharedStorage
        # the q tiles of all sequences numbered in one list (KernelEntry.locate_tile): sequence
        # b's from (cu[b] - cu[0]) // tile_m + b, so total_q // tile_m + batch CTAs a head cover
        # them all whatever max_seqlen_q (a host int, kept in the signature)
        num_heads = mQ_u8.shape[1]
        batch = mCuQ.shape[0] - 1
        num_tiles = mQ_u8.shape[0] // self.tile_m + batch
        if cutlass.const_expr(self.persistent):
            self.launch_persistent(tiled_mma_qk, tiled_mma_pv, tiled_mma_sum, tma_q, mQ_tma, tma_k, mK_tma, tma_vt,
                                   mVt_tma, mO, mCuQ, mCuK, mDescale, softmax_scale_log2, qhead_per_kvhead,
                                   sQ_layout, sK_layout, sVt_layout, sOnes_layout, stream)
        else:
            self.kernel(
                tiled_mma_qk,
                tiled_mma_pv,
                tma_q,
                mQ_tma,
                tma_k,
                mK_tma,
                tma_vt,
                mVt_tma,
                mO,
                mCuQ,
                mCuK,
                mDescale,
                softmax_scale_log2,
                window_left,
                window_right,
                qhead_per_kvhead,
                sQ_layout,
                sK_layout,
                sVt_layout,
                tiled_mma_sum,
                sOnes_layout,
            ).launch(
                grid=[num_tiles, num_heads, 1],
                block=[NUM_THREADS, 1, 1],
                smem=SharedStorage.size_in_bytes(),
                stream=stream,
                min_blocks_per_mp=1,
            )


def softmax_scale_log2(softmax_scale: float) -> float:
    return softmax_scale * math.log2(math.e)
