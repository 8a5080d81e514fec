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
  the fp32 O update of PV_{i-2} runs while S_i is in flight (``fold_early``), a branch keeps
  ptxas from hoisting the PV wait above the softmax (``pin_wait``), the row sums come from the
  tensor cores as P x ones with the PV GEMM (``rowsum_mma``) and the row max is 4 interleaved
  chains (``ilp``).  Measured side by side on the H200 (benchmark/results/h200/
  fp8_attention_speed2.md): d64 11-16% faster than without these four, d128 unchanged (+-2%).
  At d=128 causal / windowed the two consumer warpgroups also take turns issuing their GEMMs, the
  turn passed once S is complete (``pingpong_late``), and every 8th exp2 runs on the FMA pipe
  (``emu``): 3-5% less time (fp8_attention_speed3.md).  Options measured and left off: ``pingpong``
  with the turn passed right after issue, ``tree_reduce`` (pairwise row max/sum); ``no_overlap`` is
  the one-tile-at-a-time loop.  Where the d128 time goes (Nsight Compute): fp8_attention_ncu.md.
* d=128 non-causal without a window ("wide tile"): 128 x 192 tiles, O accumulated by the PV GEMM
  itself (:mod:`.consumer_mainloop_wide`, FA3's way; S of 192 keys needs the 64 registers of the
  two-level loop's tile accumulator), ping-pong with the turn passed right after a warpgroup's
  GEMM issue (FA3's scheduler barrier; O's rescale moved before the turn), all exp2s on the MUFU:
  3-5% less time than the speed3 loop, side by side (fp8_attention_speed4.md).

V^T comes from global memory already transposed, with its keys permuted inside groups of 16
(``layout.KEY_PERM``) so that P needs no register shuffles, each sequence starting at a 16-aligned
column (a TMA box's innermost coordinate must be 16-byte aligned); see ``layout.py``.

Descales are per (batch, kv head): q and k fold into the softmax scale, v into the final row scale.

Modules: this one is the host side (variant options, the MMAs, shared-memory layouts and TMA atoms,
the launch); :mod:`.kernel_entry` the device entry (block bounds, pipelines, the producer's TMA
loads); :mod:`.consumer_mainloop` the consumers' GEMM main loop and epilogue (d <= 128; above, the one-level loop
of :mod:`.consumer_mainloop_wide`);
:mod:`.tile_softmax` masking, online softmax and P -> E4M3; :mod:`.kernel_shape` the constants;
:mod:`.persistent_switches` the persistent kernel's switches (its modules: ``persistent_*``).
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
from sglang_fa4.kernels.fp8_sm90.kernel_entry import KernelEntry
from sglang_fa4.kernels.fp8_sm90.kernel_shape import F8, NUM_THREADS, WG_ROWS, consumer_regs, num_threads
from sglang_fa4.kernels.fp8_sm90.layout import (
    D256_CAUSAL_DEFAULT_SWITCHES,
    SUPPORTED_HEAD_DIMS,
    TILE_N,
    TWO_LEVEL_MAX_HEAD_DIM,
    WIDE_DEFAULT_SWITCHES,
    WIDE_TILE_N,
    explicit_stages,
    head_dim_stages,
    narrow_widths,
    numbered_switch,
    scoped_switches,
    tile_stages,
    wide_defaults_for,
    with_wide_defaults,
)
from sglang_fa4.kernels.fp8_sm90.persistent_consumer import PersistentConsumer
from sglang_fa4.kernels.fp8_sm90.persistent_entry import Q_STAGES, PersistentEntry
from sglang_fa4.kernels.fp8_sm90.persistent_switches import PersistentSwitches
from sglang_fa4.kernels.fp8_sm90.persistent_xover import PersistentXover
from sglang_fa4.kernels.fp8_sm90.tile_softmax import TileSoftmax

_K_MAJOR = cute.nvgpu.OperandMajorMode.K
_ROW_MAJOR = cutlass.utils.LayoutEnum.ROW_MAJOR  # K-major for both A (M,K) and B (N,K)


class Fp8AttentionForwardSm90(KernelEntry, ConsumerMainLoop, ConsumerMainLoopWide, FirstKeyTile, TileSoftmax,
                              PersistentEntry, PersistentConsumer, PersistentXover, PersistentSwitches):
    """One compiled variant: head dim, causal, local window (everything else is runtime)."""

    def __init__(
        self,
        head_dim: int,
        causal: bool = False,
        local: bool = False,
        num_stages: int = 0,
        debug: frozenset = frozenset(),
        overlap: bool = True,
        pingpong=None,
        tree_reduce: bool = False,
        fold_early: bool = True,
        pin_wait: bool = True,
        ilp: int = 4,
        emu=None,
        rowsum_mma: bool = True,
        pingpong_late=None,
        num_sms: int = 0,
    ):
        if head_dim not in SUPPORTED_HEAD_DIMS:
            raise ValueError(f"head dim {head_dim} not in {SUPPORTED_HEAD_DIMS}")
        if causal and local:
            raise ValueError("causal and local are exclusive (causal is a window (inf, 0))")
        self.head_dim = head_dim
        self.causal = causal
        self.local = local
        debug = frozenset(debug)
        # d=128 non-causal without a window ("wide tile"): a 128 x 192 tile (FA3's FP8 d=128 tile
        # for column-major V, as V^T is here), O accumulated by the PV GEMM itself (one level: the
        # wider S needs the 64 registers of the tile's own PV accumulator), the two consumer
        # warpgroups in ping-pong with the turn passed once a warpgroup's GEMMs are issued (FA3's
        # scheduler barrier), all exp2s on the MUFU: 3-5% less time than the speed3 loop, side by
        # side (results/h200/fp8_attention_speed4.md).  d=128 causal / windowed keep the 128 x 128 two-level loop with
        # pp_late + emu8 (fp8_attention_speed3.md); other head dims the loop before that.
        wide_tile = head_dim == 128 and not causal and not local
        d128_default = head_dim == 128
        # A switch written "w:X" is X for the wide-tile kernel and nothing for the others, "d256:X"
        # X for head dim 256 only ("d256c:X" causal, "d256f:X" unmasked, "d256l:X" windowed), so
        # one set of switches can vary some kernels alone (check_fp8_attention --variants;
        # layout.scoped_switches).
        debug = scoped_switches(debug, head_dim, causal, local, wide_tile)
        if wide_tile and WIDE_DEFAULT_SWITCHES:
            debug = with_wide_defaults(debug, wide_defaults_for(debug))
        if head_dim == 256 and causal and not local and D256_CAUSAL_DEFAULT_SWITCHES:
            debug = with_wide_defaults(debug, D256_CAUSAL_DEFAULT_SWITCHES)  # an explicit nN wins
        # Key tile ("nN" switch, e.g. "n192"): a multiple of 32, the PV GEMM's K step.  At d=256
        # (O alone is 128 registers a thread) 64 / 96 / 128 keys build without spills for sm_90a,
        # 160 spills 192 bytes (S + P of 160 keys beside O).
        # "wg3" (persistent kernel): three consumer warpgroups, 96-key tiles unless told otherwise
        self.consumer_wgs = 3 if "wg3" in debug else 2
        self.tile_m = WG_ROWS * self.consumer_wgs
        self.num_threads = num_threads(self.consumer_wgs)
        self.consumer_regs = consumer_regs(self.consumer_wgs)
        self.tile_n = numbered_switch(debug, "n", 96 if self.consumer_wgs == 3 else WIDE_TILE_N if wide_tile else TILE_N)
        if self.tile_n % 32 or not 32 <= self.tile_n <= 256:
            raise ValueError(f"key tile {self.tile_n}: a multiple of 32 (the PV GEMM's K step) up to 256")
        # K + V^T per stage: 2 * tile_n * d bytes (32 KiB at d=128); Q is 128 * d.  Shared memory
        # holds Q + 4 stages up to d=128, 3 at d=192, 2 at d=256 (layout.head_dim_stages); other
        # key tiles: as many stages (at most 4) as fit (layout.tile_stages: 4 for 128 x 192).
        # "sN" (e.g. "s3"): N stages, as long as they fit (layout.explicit_stages).
        stages_flag = numbered_switch(debug, "s", 0)
        self.num_stages = num_stages or (explicit_stages(head_dim, self.tile_n, stages_flag) if stages_flag
                                         else head_dim_stages(head_dim) if self.tile_n == TILE_N
                                         else tile_stages(head_dim, self.tile_n))
        # O accumulated in two levels (fp32 O + each tile's fp32 P V) up to d=128; above, the two
        # accumulators do not fit the consumers' 240 registers beside S, so the PV GEMM
        # accumulates into O itself (consumer_mainloop_wide, FA3's way); also for the wide tile.
        # Switches "one_level" / "two_level".
        self.two_level = (head_dim <= TWO_LEVEL_MAX_HEAD_DIM and (not wide_tile or "two_level" in debug)
                          and "one_level" not in debug)
        # Bisection / timing switches for bring-up only ("no_setmaxnreg", "skip_qk", "skip_pv",
        # "skip_kv", "skip_store", "skip_mask", "skip_softmax"; the skip_* ones give wrong results),
        # and main-loop choices ("overlap"/"no_overlap", "pingpong", "pp_late"/"pp_early", "no_pingpong",
        # "emuN", "nN", "one_level"/"two_level", "tree_reduce", ...) for timing;
        # "two_level,n128,pp_late" is the d=128 non-causal loop of speed3 (emu8 being the d=128
        # default), "no_pingpong,emu0" the one before.  launch.DEBUG_FLAGS is empty in use.
        self.debug = debug
        # Issue the next tile's QK^T GEMM with the previous tile's PV GEMM and run the softmax
        # while the latter is in flight (FA3's intra-warpgroup overlap); False: one tile at a time.
        self.overlap = (overlap or "overlap" in self.debug) and "no_overlap" not in self.debug
        # Ping-pong of the two consumer warpgroups (FA3's warp-scheduler barriers): they take turns
        # issuing their GEMMs, so one warpgroup's softmax (MUFU/FMA pipes) runs while the other's
        # GEMMs hold the tensor cores.  Needs the overlapped main loop (one GEMM turn per tile).
        # d=128 default (None): on (see wide_tile above for the turn's hand-over).
        if pingpong is None:
            pingpong = d128_default
        if pingpong_late is None:
            pingpong_late = d128_default and not wide_tile
        if emu is None:
            # every 8th exp2 on the FMA pipe helps the two-level d=128 loop (speed3) and costs the
            # wide tile 3-5% (speed4: 'w:emu0' vs the same kernel with emu8, same rounds)
            emu = 8 if d128_default and self.two_level else 0
        self.pingpong = self.overlap and (pingpong or pingpong_late or "pingpong" in self.debug
                                          or "pp_late" in self.debug) and "no_pingpong" not in self.debug
        # Ping-pong with the turn passed once this warpgroup's S = QK^T is complete (after its
        # wait), not right after issuing its GEMMs.  Why: Nsight Compute on the H200
        # (results/h200/fp8_attention_ncu.md) shows tensor pipe and MUFU each ~44% busy and almost
        # never at the same time -- both warpgroups wait for their QK^T together, then both run
        # their exp2s together.  Passing the turn after issue does not separate them (the tensor
        # cores interleave both warpgroups' queued WGMMAs, so both S tiles still land together);
        # passing it after S is ready does: the other warpgroup's QK^T runs during this one's softmax.
        self.pingpong_late = self.pingpong and (pingpong_late or "pp_late" in self.debug) and "pp_early" not in self.debug
        # Pairwise (tree) row max / row sum instead of serial chains.  Off: measured slower on the
        # H200 (more live registers in the overlapped loop), kept for experiments.
        self.tree_reduce = (tree_reduce or "tree_reduce" in self.debug) and "no_tree_reduce" not in self.debug
        # Overlap loop: a branch on P's last value (a late softmax result) before the PV GEMM's wait.
        # Why: ptxas's scheduler otherwise places that wait (WARPGROUP.DEPBAR, cheap in its model) in
        # the first latency gap of the row-max chain, i.e. before the softmax, so the PV GEMM never
        # overlaps the softmax (sm_90a SASS of the default: DEPBAR 0 before the first MUFU.EX2).
        self.pin_wait = self.overlap and (pin_wait or "pin_wait" in self.debug) and "no_pin_wait" not in self.debug
        # Row max / row sum as this many interleaved serial chains (shorter dependent chains, few
        # live partials); 1 = one chain per row.
        self.ilp = numbered_switch(self.debug, "ilp", ilp or 1)
        # Every emu-th exp2 of a row on the FMA pipe (tile_softmax.exp2_on_fma), the rest on the MUFU
        # (16/clk/SM: a 128x128 tile's exp2s alone take as long as its FP8 MMAs at peak); 0 = none.
        self.emu = numbered_switch(self.debug, "emu", emu)
        # Overlap loop: add PV_{i-2} into the fp32 O while S_i = Q K_i^T is in flight, just before
        # PV_{i-1} is issued, instead of right after PV_{i-1}'s wait (same sums, same order), so
        # that nothing but P's conversion waits for the PV GEMM.
        # Row sums from the tensor cores: P x (a block of ones) as a third small WGMMA (m64n8) with
        # the PV GEMM, folded into fp32 like O, instead of 64 FADDs per tile (the sum is then of
        # the E4M3 P that also multiplies V).  Overlap loop only.
        self.rowsum_mma = self.two_level and self.overlap and (rowsum_mma or "rowsum_mma" in self.debug) and "no_rowsum_mma" not in self.debug
        if not self.two_level and not self.overlap:
            raise ValueError(f"head dim {head_dim}: the one-level loop is the overlapped one only (no_overlap)")
        self.fold_early = self.overlap and (fold_early or "fold_early" in self.debug) and "no_fold_early" not in self.debug
        # A warpgroup starts its exp2s only once the other one has issued its next GEMMs (a second
        # pair of named barriers).  Why: the QGMMAs that follow a MUFU stream in the MIO queue stall
        # (mio_throttle in the profile), so a GEMM issue that overlaps the other warpgroup's exp2s
        # reaches the tensor cores late.  Not yet measured on the GPU; off by default.
        self.mufu_gate = self.rowsum_mma and "mufu_gate" in self.debug  # reads the block of ones
        # One-level loop ("mufu_token"): the two consumer warpgroups take turns at their exp2 streams
        # (a token on a pair of named barriers, taken once a tile's row maxima are known, given after
        # its last exp2).  Why: Nsight Compute of the wide-tile default (fp8_attention_ncu_persist.md)
        # shows both warpgroups in their exp2 phase together (16 cycles a MUFU.EX2 where one warp
        # alone takes 8) and the tensor pipe idle meanwhile; exclusive exp2 phases keep them half a
        # period apart, each warpgroup's GEMMs running during the other's exp2s.
        self.mufu_token = not self.two_level and "mufu_token" in self.debug
        self.persistent_switches(head_dim, causal, local, num_stages, stages_flag, num_sms)
        # "narrow" (one-level loop, not xover): a q tile's first key tile, the one that holds the
        # sequence's end, computed at the least width of narrow_widths that holds its keys
        # (first_key_tile.py: 64 of 192 keys at 4096 or 16384 keys).
        self.narrow = "narrow" in self.debug
        self.narrow_widths = narrow_widths(self.tile_n)
        if self.narrow and (self.two_level or self.xover or not self.narrow_widths):
            raise ValueError(f"narrow: a switch of the one-level loop without xover, for key tiles that 64 or 96 "
                             f"divide (got key tile {self.tile_n}, two_level={self.two_level}, xover={self.xover})")
        # the row sums come from an MMA (no FADDs in the softmax)
        self.row_sums_on_mma = self.rowsum_mma or self.sum_mma
        # a word of 0.0 and a scratch word per consumer warpgroup in shared memory (zero_words)
        self.zero_words_used = self.mufu_token or self.pingpong_max
        # The turn passed right after the GEMM issue (FA3's scheduler barrier; the default)
        self.pass_after_issue = self.pingpong and not self.pingpong_late and not self.pingpong_max

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
        q_halves = self.consumer_wgs * Q_STAGES if cutlass.const_expr(self.persistent) else 2
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
        self.tx_q = self.consumer_wgs * WG_ROWS * d
        self.tx_kv = 2 * self.tile_n * d

        @cute.struct
        class SharedStorage:
            mbar_q: cute.struct.MemRange[cutlass.Int64, 2]
            mbar_kv: cute.struct.MemRange[cutlass.Int64, 2 * self.num_stages]
            if cutlass.const_expr(self.mufu_token):  # per consumer warpgroup: 0.0, a scratch word (mufu_take)
                zero: cute.struct.MemRange[Float32, 4]
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
