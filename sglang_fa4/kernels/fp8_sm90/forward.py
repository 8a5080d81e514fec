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
  and the softmax of S_i runs while that PV GEMM is in flight (FA3's intra-warpgroup overlap).
  Options measured on the H200 and left off: ``pingpong`` (the two consumer warpgroups take turns
  issuing GEMMs through named barriers) and ``tree_reduce`` (pairwise row max/sum); ``no_overlap``
  is the one-tile-at-a-time loop.  The kernel is bound by the softmax path (MUFU exp2 + FP32 work),
  not by the GEMMs: see benchmark/results/h200/fp8_attention.md.

V^T comes from global memory already transposed, with its keys permuted inside groups of 16
(``layout.KEY_PERM``) so that P needs no register shuffles, each sequence starting at a 16-aligned
column (a TMA box's innermost coordinate must be 16-byte aligned); see ``layout.py``.

Descales are per (batch, kv head): q and k fold into the softmax scale, v into the final row scale.
"""

from __future__ import annotations

import math
from typing import Optional

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import cpasync, warpgroup

from sglang_fa4.kernels.fp8_sm90.layout import (
    P_LOG2_OFFSET,
    SUPPORTED_HEAD_DIMS,
    TILE_M,
    TILE_N,
    VT_ALIGN,
)

F8 = cutlass.Float8E4M3FN
_K_MAJOR = cute.nvgpu.OperandMajorMode.K
_ROW_MAJOR = cutlass.utils.LayoutEnum.ROW_MAJOR  # K-major for both A (M,K) and B (N,K)

NUM_THREADS = 384
PRODUCER_REGS = 24
CONSUMER_REGS = 240
WG_ROWS = 64  # query rows per consumer warpgroup


#: Named barriers PINGPONG_BAR (+0: warpgroup 0's GEMM turn, +1: warpgroup 1's); 0 is __syncthreads.
PINGPONG_BAR = 1


def _tree_reduce(vals: list, op):
    """Pairwise reduction of a Python list of traced values (plain Python: inlined at trace time)."""
    vals = list(vals)
    while len(vals) > 1:
        nxt = [op(vals[i], vals[i + 1]) for i in range(0, len(vals) - 1, 2)]
        if len(vals) % 2:
            nxt.append(vals[-1])
        vals = nxt
    return vals[0]


class Fp8AttentionForwardSm90:
    """One compiled variant: head dim, causal, local window (everything else is runtime)."""

    def __init__(
        self,
        head_dim: int,
        causal: bool = False,
        local: bool = False,
        num_stages: int = 0,
        debug: frozenset = frozenset(),
        overlap: bool = True,
        pingpong: bool = False,
        tree_reduce: bool = False,
    ):
        if head_dim not in SUPPORTED_HEAD_DIMS:
            raise ValueError(f"head dim {head_dim} not in {SUPPORTED_HEAD_DIMS}")
        if causal and local:
            raise ValueError("causal and local are exclusive (causal is a window (inf, 0))")
        self.head_dim = head_dim
        self.causal = causal
        self.local = local
        self.tile_m = TILE_M
        self.tile_n = TILE_N
        # K + V^T per stage: 2 * tile_n * d bytes (32 KiB at d=128); Q is 128 * d.
        self.num_stages = num_stages or (4 if head_dim <= 128 else 2)
        # Bisection / timing switches for bring-up only ("no_setmaxnreg", "skip_qk", "skip_pv",
        # "skip_kv", "skip_store", "skip_mask", "skip_softmax"; the skip_* ones give wrong results),
        # and main-loop choices ("overlap"/"no_overlap", "pingpong", "tree_reduce") for timing.
        # launch.DEBUG_FLAGS is empty in use.
        self.debug = frozenset(debug)
        # Issue the next tile's QK^T GEMM with the previous tile's PV GEMM and run the softmax
        # while the latter is in flight (FA3's intra-warpgroup overlap); False: one tile at a time.
        self.overlap = (overlap or "overlap" in self.debug) and "no_overlap" not in self.debug
        # Ping-pong of the two consumer warpgroups (FA3's warp-scheduler barriers): they take turns
        # issuing their GEMMs, so one warpgroup's softmax (MUFU/FMA pipes) runs while the other's
        # GEMMs hold the tensor cores.  Needs the overlapped main loop (one GEMM turn per tile).
        self.pingpong = self.overlap and (pingpong or "pingpong" in self.debug) and "no_pingpong" not in self.debug
        # Pairwise (tree) row max / row sum instead of serial chains.  Off: measured slower on the
        # H200 (more live registers in the overlapped loop), kept for experiments.
        self.tree_reduce = (tree_reduce or "tree_reduce" in self.debug) and "no_tree_reduce" not in self.debug

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
        # Q: two 64-row halves (one per consumer warpgroup) as two "stages" of an A layout
        sQ_layout = sm90_utils.make_smem_layout_a(_ROW_MAJOR, (WG_ROWS, self.tile_n, d), F8, 2)
        sK_layout = sm90_utils.make_smem_layout_b(_ROW_MAJOR, (WG_ROWS, self.tile_n, d), F8, self.num_stages)
        sVt_layout = sm90_utils.make_smem_layout_b(_ROW_MAJOR, (WG_ROWS, d, self.tile_n), F8, self.num_stages)

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

        self.shared_storage = SharedStorage
        num_m_blocks = (max_seqlen_q + self.tile_m - 1) // self.tile_m
        num_heads = mQ_u8.shape[1]
        batch = mCuQ.shape[0] - 1
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
        ).launch(
            grid=[num_m_blocks, num_heads, batch],
            block=[NUM_THREADS, 1, 1],
            smem=SharedStorage.size_in_bytes(),
            stream=stream,
            min_blocks_per_mp=1,
        )

    # ------------------------------------------------------------------------------------------
    # Device side
    # ------------------------------------------------------------------------------------------
    @cute.kernel
    def kernel(
        self,
        tiled_mma_qk: cute.TiledMma,
        tiled_mma_pv: cute.TiledMma,
        tma_q: cute.CopyAtom,
        mQ_tma: cute.Tensor,
        tma_k: cute.CopyAtom,
        mK_tma: cute.Tensor,
        tma_vt: cute.CopyAtom,
        mVt_tma: cute.Tensor,
        mO: cute.Tensor,
        mCuQ: cute.Tensor,
        mCuK: cute.Tensor,
        mDescale: cute.Tensor,
        softmax_scale_log2: Float32,
        window_left: Int32,
        window_right: Int32,
        qhead_per_kvhead: Int32,
        sQ_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout,
        sVt_layout: cute.ComposedLayout,
    ):
        d = self.head_dim
        tile_m = self.tile_m
        tile_n = self.tile_n
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg_idx = warp_idx // 4
        m_block, head, batch = cute.arch.block_idx()

        smem = utils.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        if warp_idx == 0:
            cpasync.prefetch_descriptor(tma_q)
            cpasync.prefetch_descriptor(tma_k)
            cpasync.prefetch_descriptor(tma_vt)
        consumer_warps = pipeline.CooperativeGroup(pipeline.Agent.Thread, 8)
        pipe_q = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar_q.data_ptr(),
            num_stages=1,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=consumer_warps,
            tx_count=self.tx_q,
        )
        pipe_kv = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar_kv.data_ptr(),
            num_stages=self.num_stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=consumer_warps,
            tx_count=self.tx_kv,
        )
        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sVt = storage.sVt.get_tensor(sVt_layout.outer, swizzle=sVt_layout.inner)

        offset_q = mCuQ[batch]
        seqlen_q = mCuQ[batch + 1] - offset_q
        offset_k = mCuK[batch]
        seqlen_k = mCuK[batch + 1] - offset_k
        head_kv = head // qhead_per_kvhead
        m_start = m_block * tile_m
        # Bottom-right aligned diagonal (FlashAttention's convention for seqlen_q != seqlen_k).
        diag = seqlen_k - seqlen_q

        n_block_max = (seqlen_k + tile_n - 1) // tile_n
        n_block_min = Int32(0)
        if cutlass.const_expr(self.causal or self.local):
            right = Int32(0) if cutlass.const_expr(self.causal) else window_right
            hi = m_start + tile_m + diag + right  # keys < hi can be visible to this block
            n_hi = Int32(0)
            if hi > 0:
                n_hi = (hi + tile_n - 1) // tile_n
            n_block_max = cutlass.min(n_block_max, n_hi)
        if cutlass.const_expr(self.local):
            lo = m_start + diag - window_left
            if lo > 0:
                n_block_min = lo // tile_n
        n_iters = n_block_max - n_block_min
        if n_iters < 0:
            n_iters = Int32(0)

        if m_start < seqlen_q:
            if wg_idx == 0:
                # ------------------------------ producer ------------------------------
                if cutlass.const_expr("no_setmaxnreg" not in self.debug):
                    cute.arch.warpgroup_reg_dealloc(PRODUCER_REGS)
                if warp_idx == 0:
                    mQ_cur = cute.domain_offset((offset_q, 0), mQ_tma[None, None, head])
                    gQ = cute.local_tile(mQ_cur, (WG_ROWS, d), (None, 0))  # (64, d, m64 blocks)
                    tQsQ, tQgQ = cpasync.tma_partition(
                        tma_q, 0, cute.make_layout(1), cute.group_modes(sQ, 0, 2), cute.group_modes(gQ, 0, 2)
                    )
                    mK_cur = cute.domain_offset((offset_k, 0), mK_tma[None, None, head_kv])
                    gK = cute.local_tile(mK_cur, (tile_n, d), (None, 0))  # (tile_n, d, n blocks)
                    tKsK, tKgK = cpasync.tma_partition(
                        tma_k, 0, cute.make_layout(1), cute.group_modes(sK, 0, 2), cute.group_modes(gK, 0, 2)
                    )
                    # layout.vt_column_offset: 16-aligned, as TMA wants its innermost coordinate
                    vt_offset = (offset_k + VT_ALIGN - 1) // VT_ALIGN * VT_ALIGN + VT_ALIGN * batch
                    mVt_cur = cute.domain_offset((0, vt_offset), mVt_tma[None, None, head_kv])
                    gVt = cute.local_tile(mVt_cur, (d, tile_n), (0, None))  # (d, tile_n, n blocks)
                    tVsV, tVgV = cpasync.tma_partition(
                        tma_vt, 0, cute.make_layout(1), cute.group_modes(sVt, 0, 2), cute.group_modes(gVt, 0, 2)
                    )
                    q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
                    pipe_q.producer_acquire(q_state)
                    for half in cutlass.range_constexpr(2):
                        q_tile = 2 * m_block + half
                        if cutlass.const_expr(half == 1):
                            # A 64-row half that starts past the sequence can start past the end
                            # of the whole q tensor (a TMA box entirely out of bounds: one of the
                            # two suspects of the H200 "illegal instruction", with the V^T
                            # alignment).  Its rows are never stored, so load the first half
                            # again (same byte count for the barrier).
                            if m_start + WG_ROWS >= seqlen_q:
                                q_tile = 2 * m_block
                        cute.copy(
                            tma_q,
                            tQgQ[None, q_tile],
                            tQsQ[None, half],
                            tma_bar_ptr=pipe_q.producer_get_barrier(q_state),
                        )
                    kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.num_stages)
                    n_loads = n_iters
                    if cutlass.const_expr("skip_kv" in self.debug):
                        n_loads = Int32(0)
                    for i in cutlass.range(n_loads, unroll=1):
                        n_block = n_block_max - 1 - i
                        pipe_kv.producer_acquire(kv_state)
                        cute.copy(
                            tma_k,
                            tKgK[None, n_block],
                            tKsK[None, kv_state.index],
                            tma_bar_ptr=pipe_kv.producer_get_barrier(kv_state),
                        )
                        cute.copy(
                            tma_vt,
                            tVgV[None, n_block],
                            tVsV[None, kv_state.index],
                            tma_bar_ptr=pipe_kv.producer_get_barrier(kv_state),
                        )
                        kv_state.advance()
            else:
                # ------------------------------ consumers ------------------------------
                if cutlass.const_expr("no_setmaxnreg" not in self.debug):
                    cute.arch.warpgroup_reg_alloc(CONSUMER_REGS)
                wg = wg_idx - 1
                tid = tidx - 128 * wg_idx
                scale_log2 = softmax_scale_log2 * mDescale[0, batch, head_kv] * mDescale[1, batch, head_kv]
                v_descale = mDescale[2, batch, head_kv]
                self.consume(
                    tiled_mma_qk,
                    tiled_mma_pv,
                    sQ[None, None, wg],
                    sK,
                    sVt,
                    pipe_q,
                    pipe_kv,
                    mO,
                    tid,
                    wg,
                    m_start + wg * WG_ROWS,
                    2 * m_block + wg,
                    head,
                    offset_q,
                    seqlen_q,
                    seqlen_k,
                    diag,
                    n_block_max,
                    n_iters,
                    scale_log2,
                    v_descale,
                    window_left,
                    window_right,
                )

    @cute.jit
    def consume(
        self,
        tiled_mma_qk: cute.TiledMma,
        tiled_mma_pv: cute.TiledMma,
        sQ_wg: cute.Tensor,
        sK: cute.Tensor,
        sVt: cute.Tensor,
        pipe_q,
        pipe_kv,
        mO: cute.Tensor,
        tid: Int32,
        wg: Int32,
        row_start: Int32,
        m64_block: Int32,
        head: Int32,
        offset_q: Int32,
        seqlen_q: Int32,
        seqlen_k: Int32,
        diag: Int32,
        n_block_max: Int32,
        n_iters: Int32,
        scale_log2: Float32,
        v_descale: Float32,
        window_left: Int32,
        window_right: Int32,
    ):
        d = self.head_dim
        tile_n = self.tile_n
        thr_qk = tiled_mma_qk.get_slice(tid)
        thr_pv = tiled_mma_pv.get_slice(tid)
        tSrQ = thr_qk.make_fragment_A(thr_qk.partition_A(sQ_wg))  # (MMA, 1, d/32)
        tSrK = thr_qk.make_fragment_B(thr_qk.partition_B(sK))  # (MMA, 1, d/32, stages)
        tOrVt = thr_pv.make_fragment_B(thr_pv.partition_B(sVt))  # (MMA, 1, tile_n/32, stages)
        acc_o = thr_pv.make_fragment_C(thr_pv.partition_shape_C((WG_ROWS, d)))
        acc_o.fill(0.0)
        # (m, n) coordinates of this thread's accumulator values, for masking
        tScS = thr_qk.partition_C(cute.make_identity_tensor((WG_ROWS, tile_n)))
        row_max = cute.make_rmem_tensor((2,), Float32)
        row_sum = cute.make_rmem_tensor((2,), Float32)
        factor = cute.make_rmem_tensor((2,), Float32)
        for r in cutlass.range_constexpr(2):
            row_max[r] = -Float32.inf
            row_sum[r] = 0.0
            factor[r] = 1.0

        # output partition, taken before the main loop sets the MMAs' ACCUMULATE field
        mO_cur = cute.domain_offset((offset_q, 0), mO[None, head, None])
        gO = cute.local_tile(mO_cur, (WG_ROWS, d), (m64_block, 0))
        tOgO = thr_pv.partition_C(gO)
        tOcO = thr_pv.partition_C(cute.make_identity_tensor((WG_ROWS, d)))

        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        pipe_q.consumer_wait(q_state)
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.num_stages)
        if cutlass.const_expr("skip_kv" in self.debug):
            n_iters = Int32(0)
        acc_s = thr_qk.make_fragment_C(thr_qk.partition_shape_C((WG_ROWS, tile_n)))
        acc_t = thr_pv.make_fragment_C(thr_pv.partition_shape_C((WG_ROWS, d)))
        tOrP = thr_pv.make_fragment_A(thr_pv.partition_shape_A((WG_ROWS, tile_n)))
        if cutlass.const_expr(not self.overlap):
            # one tile at a time: S = QK^T, wait, softmax, P -> E4M3, O_t = PV, wait, O = O*f + O_t
            for i in cutlass.range(n_iters, unroll=1):
                n_block = n_block_max - 1 - i
                pipe_kv.consumer_wait(kv_state)
                stage = kv_state.index
                warpgroup.fence()
                if cutlass.const_expr("skip_qk" in self.debug):
                    acc_s.fill(0.0)
                else:
                    for kb in cutlass.range_constexpr(d // 32):
                        tiled_mma_qk.set(warpgroup.Field.ACCUMULATE, kb != 0)
                        cute.gemm(tiled_mma_qk, acc_s, tSrQ[None, None, kb], tSrK[None, None, kb, stage], acc_s)
                warpgroup.commit_group()
                warpgroup.wait_group(0)
                self.mask_tile(acc_s, tScS, row_start, n_block, seqlen_k, diag, window_left, window_right)
                self.softmax_tile(acc_s, row_max, row_sum, factor, scale_log2)
                self.p_to_operand(acc_s, tOrP)
                warpgroup.fence()
                if cutlass.const_expr("skip_pv" in self.debug):
                    acc_t.fill(0.0)
                else:
                    for kb in cutlass.range_constexpr(tile_n // 32):
                        tiled_mma_pv.set(warpgroup.Field.ACCUMULATE, kb != 0)
                        cute.gemm(tiled_mma_pv, acc_t, tOrP[None, None, kb], tOrVt[None, None, kb, stage], acc_t)
                warpgroup.commit_group()
                warpgroup.wait_group(0)
                pipe_kv.consumer_release(kv_state)
                kv_state.advance()
                for v in cutlass.range_constexpr(cute.size(acc_o)):
                    acc_o[v] = acc_o[v] * factor[(v // 2) % 2] + acc_t[v]
        else:
            # FA3-style intra-warpgroup overlap: S_i = Q K_i^T and O_t = P_{i-1} V_{i-1} are issued
            # together; the softmax of S_i runs while the PV GEMM of the previous tile is in flight.
            f_prev = cute.make_rmem_tensor((2,), Float32)
            if n_iters > 0:
                if cutlass.const_expr(self.pingpong):
                    # warpgroup 0 takes the first turn: warpgroup 1 opens its barrier once
                    if wg == 1:
                        cute.arch.barrier_arrive(barrier_id=PINGPONG_BAR, number_of_threads=2 * 128)
                pipe_kv.consumer_wait(kv_state)
                if cutlass.const_expr(self.pingpong):
                    cute.arch.barrier(barrier_id=PINGPONG_BAR + wg, number_of_threads=2 * 128)
                warpgroup.fence()
                if cutlass.const_expr("skip_qk" in self.debug):
                    acc_s.fill(0.0)
                else:
                    for kb in cutlass.range_constexpr(d // 32):
                        tiled_mma_qk.set(warpgroup.Field.ACCUMULATE, kb != 0)
                        cute.gemm(tiled_mma_qk, acc_s, tSrQ[None, None, kb], tSrK[None, None, kb, kv_state.index], acc_s)
                warpgroup.commit_group()
                if cutlass.const_expr(self.pingpong):
                    self.pass_turn(wg, n_iters == 1)
                warpgroup.wait_group(0)
                self.mask_tile(acc_s, tScS, row_start, n_block_max - 1, seqlen_k, diag, window_left, window_right)
                self.softmax_tile(acc_s, row_max, row_sum, factor, scale_log2)
                self.p_to_operand(acc_s, tOrP)
                for r in cutlass.range_constexpr(2):
                    f_prev[r] = factor[r]
                prev_state = kv_state.clone()
                kv_state.advance()
                for i in cutlass.range(1, n_iters, unroll=1):
                    n_block = n_block_max - 1 - i
                    pipe_kv.consumer_wait(kv_state)
                    if cutlass.const_expr(self.pingpong):
                        cute.arch.barrier(barrier_id=PINGPONG_BAR + wg, number_of_threads=2 * 128)
                    warpgroup.fence()
                    if cutlass.const_expr("skip_qk" in self.debug):
                        acc_s.fill(0.0)
                    else:
                        for kb in cutlass.range_constexpr(d // 32):
                            tiled_mma_qk.set(warpgroup.Field.ACCUMULATE, kb != 0)
                            cute.gemm(tiled_mma_qk, acc_s, tSrQ[None, None, kb], tSrK[None, None, kb, kv_state.index], acc_s)
                    warpgroup.commit_group()
                    if cutlass.const_expr("skip_pv" in self.debug):
                        acc_t.fill(0.0)
                    else:
                        for kb in cutlass.range_constexpr(tile_n // 32):
                            tiled_mma_pv.set(warpgroup.Field.ACCUMULATE, kb != 0)
                            cute.gemm(tiled_mma_pv, acc_t, tOrP[None, None, kb], tOrVt[None, None, kb, prev_state.index], acc_t)
                    warpgroup.commit_group()
                    if cutlass.const_expr(self.pingpong):
                        self.pass_turn(wg, i == n_iters - 1)
                    warpgroup.wait_group(1)  # S_i ready (groups complete in order)
                    self.mask_tile(acc_s, tScS, row_start, n_block, seqlen_k, diag, window_left, window_right)
                    self.softmax_tile(acc_s, row_max, row_sum, factor, scale_log2)
                    warpgroup.wait_group(0)  # P_{i-1} V_{i-1} ready; tOrP free again
                    pipe_kv.consumer_release(prev_state)
                    for v in cutlass.range_constexpr(cute.size(acc_o)):
                        acc_o[v] = acc_o[v] * f_prev[(v // 2) % 2] + acc_t[v]
                    for r in cutlass.range_constexpr(2):
                        f_prev[r] = factor[r]
                    self.p_to_operand(acc_s, tOrP)
                    prev_state = kv_state.clone()
                    kv_state.advance()
                warpgroup.fence()
                if cutlass.const_expr("skip_pv" in self.debug):
                    acc_t.fill(0.0)
                else:
                    for kb in cutlass.range_constexpr(tile_n // 32):
                        tiled_mma_pv.set(warpgroup.Field.ACCUMULATE, kb != 0)
                        cute.gemm(tiled_mma_pv, acc_t, tOrP[None, None, kb], tOrVt[None, None, kb, prev_state.index], acc_t)
                warpgroup.commit_group()
                warpgroup.wait_group(0)
                pipe_kv.consumer_release(prev_state)
                for v in cutlass.range_constexpr(cute.size(acc_o)):
                    acc_o[v] = acc_o[v] * f_prev[(v // 2) % 2] + acc_t[v]

        # ---- epilogue: O / rowsum * v_descale -> bf16, rows < seqlen_q only ----
        out_scale = cute.make_rmem_tensor((2,), Float32)
        for r in cutlass.range_constexpr(2):
            s = row_sum[r]
            s += cute.arch.shuffle_sync_bfly(s, offset=1)
            s += cute.arch.shuffle_sync_bfly(s, offset=2)
            out_scale[r] = Float32(0.0)
            if s > 0.0:
                out_scale[r] = v_descale * cute.arch.rcp_approx(s)
        for v in cutlass.range_constexpr(cute.size(acc_o)):
            acc_o[v] = acc_o[v] * out_scale[(v // 2) % 2]
        r_out = cute.make_rmem_tensor_like(acc_o, cutlass.BFloat16)
        r_out.store(acc_o.load().to(cutlass.BFloat16))
        if cutlass.const_expr("skip_store" not in self.debug):
            for v in cutlass.range_constexpr(cute.size(acc_o)):
                if row_start + tOcO[v][0] < seqlen_q:
                    tOgO[v] = r_out[v]

    @cute.jit
    def pass_turn(self, wg: Int32, last: cutlass.Boolean):
        """Open the other warpgroup's GEMM turn.  Warpgroup 1 skips its last one: it opened
        warpgroup 0's first turn up front, so each barrier sees as many arrivals as waits."""
        if wg == 0:
            cute.arch.barrier_arrive(barrier_id=PINGPONG_BAR + 1, number_of_threads=2 * 128)
        else:
            if not last:
                cute.arch.barrier_arrive(barrier_id=PINGPONG_BAR, number_of_threads=2 * 128)

    @cute.jit
    def mask_tile(self, acc_s: cute.Tensor, tScS: cute.Tensor, row_start: Int32, n_block: Int32, seqlen_k: Int32,
                  diag: Int32, window_left: Int32, window_right: Int32):
        """Mask S, only for key tiles that cross a boundary."""
        tile_n = self.tile_n
        col0 = n_block * tile_n
        need_mask = Int32(0)
        if col0 + tile_n > seqlen_k:
            need_mask = Int32(1)
        if cutlass.const_expr(self.causal):
            if col0 + tile_n - 1 > row_start + diag:
                need_mask = Int32(1)
        if cutlass.const_expr(self.local):
            if col0 + tile_n - 1 > row_start + diag + window_right:
                need_mask = Int32(1)
            if col0 < row_start + WG_ROWS - 1 + diag - window_left:
                need_mask = Int32(1)
        if cutlass.const_expr("skip_mask" in self.debug):
            need_mask = Int32(0)
        if need_mask != 0:
            self.apply_mask(acc_s, tScS, row_start, col0, seqlen_k, diag, window_left, window_right)

    @cute.jit
    def softmax_tile(self, acc_s: cute.Tensor, row_max: cute.Tensor, row_sum: cute.Tensor, factor: cute.Tensor,
                     scale_log2: Float32):
        """Online softmax in place (2 rows per thread; a row lives in one quad): acc_s becomes
        P = exp2(s*scale - max*scale + 8), factor the rescale of everything before this tile."""
        for r in cutlass.range_constexpr(0 if cutlass.const_expr("skip_softmax" in self.debug) else 2):
            mx = row_max[r]
            if cutlass.const_expr(self.tree_reduce):
                mx = cute.arch.fmax(mx, _tree_reduce(
                    [acc_s[e + 2 * r + 4 * j] for j in range(self.tile_n // 8) for e in range(2)], cute.arch.fmax))
            else:
                for j in cutlass.range_constexpr(self.tile_n // 8):
                    for e in cutlass.range_constexpr(2):
                        mx = cute.arch.fmax(mx, acc_s[e + 2 * r + 4 * j])
            mx = cute.arch.fmax(mx, cute.arch.shuffle_sync_bfly(mx, offset=1))
            mx = cute.arch.fmax(mx, cute.arch.shuffle_sync_bfly(mx, offset=2))
            m_use = mx
            if mx == -Float32.inf:
                m_use = Float32(0.0)
            factor[r] = cute.math.exp2((row_max[r] - m_use) * scale_log2, fastmath=True)
            row_max[r] = mx
            bias = m_use * scale_log2 - P_LOG2_OFFSET
            s = Float32(0.0)
            for j in cutlass.range_constexpr(self.tile_n // 8):
                for e in cutlass.range_constexpr(2):
                    v = e + 2 * r + 4 * j
                    acc_s[v] = cute.math.exp2(acc_s[v] * scale_log2 - bias, fastmath=True)
                    if cutlass.const_expr(not self.tree_reduce):
                        s += acc_s[v]
            if cutlass.const_expr(self.tree_reduce):
                s = _tree_reduce([acc_s[e + 2 * r + 4 * j] for j in range(self.tile_n // 8) for e in range(2)],
                                 lambda a, b: a + b)
            row_sum[r] = row_sum[r] * factor[r] + s

    @cute.jit
    def p_to_operand(self, acc_s: cute.Tensor, tOrP: cute.Tensor):
        """P (fp32 accumulator order) -> E4M3 A-operand registers, no shuffles (V^T keys are
        permuted to match, layout.KEY_PERM)."""
        p_f32 = cute.make_rmem_tensor_like(tOrP, Float32)
        for kb in cutlass.range_constexpr(self.tile_n // 32):
            for h in cutlass.range_constexpr(2):
                for r in cutlass.range_constexpr(2):
                    for i4 in cutlass.range_constexpr(4):
                        # A value (i4, r, h, kb) is key 32kb + 16h + 4q + i4 to the MMA; it
                        # takes accumulator column block j = 4kb + 2h + i4//2, element i4%2.
                        src = (i4 % 2) + 2 * r + 4 * (4 * kb + 2 * h + i4 // 2)
                        p_f32[i4 + 4 * r + 8 * h + 16 * kb] = acc_s[src]
        tOrP.store(p_f32.load().to(F8))

    @cute.jit
    def apply_mask(
        self,
        acc_s: cute.Tensor,
        tScS: cute.Tensor,
        row_start: Int32,
        col0: Int32,
        seqlen_k: Int32,
        diag: Int32,
        window_left: Int32,
        window_right: Int32,
    ):
        for v in cutlass.range_constexpr(cute.size(acc_s)):
            row = row_start + tScS[v][0]
            col = col0 + tScS[v][1]
            hi = seqlen_k
            if cutlass.const_expr(self.causal):
                hi = cutlass.min(hi, row + diag + 1)
            if cutlass.const_expr(self.local):
                hi = cutlass.min(hi, row + diag + window_right + 1)
            if col >= hi:
                acc_s[v] = -Float32.inf
            if cutlass.const_expr(self.local):
                if col < row + diag - window_left:
                    acc_s[v] = -Float32.inf


def softmax_scale_log2(softmax_scale: float) -> float:
    return softmax_scale * math.log2(math.e)
