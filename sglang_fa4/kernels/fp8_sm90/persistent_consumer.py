"""The consumer warpgroups of the persistent SM90 FP8 forward (:mod:`.persistent_entry`; mixed into
:class:`.forward.Fp8AttentionForwardSm90`): the CTA's work slots one after another, each q tile
through the one-level key loop of :mod:`.consumer_mainloop_wide` (``one_level_tile``), with

* pipeline states carried from tile to tile: the Q ring (released once a tile's GEMMs are done, so
  the producer may load the tile after next) and the K/V^T ring;
* the ping-pong turns running on across tiles: warpgroup 1 opens warpgroup 0's first turn once a
  CTA and never skips a turn, and warpgroup 0 takes the one left open after its last tile, so each
  named barrier sees as many arrivals as waits;
* O through shared memory and a TMA store: the warpgroup writes its 64 rows
  with stmatrix into its own staging buffer, one warp issues the bulk store and the warpgroup goes
  on to its next tile; the buffer is reused once that store has read it (checked at the next
  tile's epilogue, a tile later).  A 64-row half that ends past its sequence is stored from the
  registers, rows < seqlen_q only (a TMA box would write the next sequence's rows).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import cpasync

from sglang_fa4.kernels.fp8_sm90.kernel_shape import EPILOGUE_BAR, PINGPONG_BAR, WG_ROWS
from sglang_fa4.kernels.fp8_sm90.persistent_entry import Q_STAGES


class PersistentConsumer:
    """``consume_persistent``: one consumer warpgroup's 64-row halves of the CTA's tiles."""

    @cute.jit
    def consume_persistent(
        self,
        tiled_mma_qk: cute.TiledMma,
        tiled_mma_pv: cute.TiledMma,
        sQ: cute.Tensor,
        sK: cute.Tensor,
        sVt: cute.Tensor,
        sO: cute.Tensor,
        tma_o: cute.CopyAtom,
        mO_tma: cute.Tensor,
        pipe_q,
        pipe_kv,
        mO: cute.Tensor,
        mCuQ: cute.Tensor,
        mCuK: cute.Tensor,
        mDescale: cute.Tensor,
        s_first: cute.Tensor,
        s_perm: cute.Tensor,
        softmax_scale_log2: Float32,
        qhead_per_kvhead: Int32,
        tid: Int32,
        wg: Int32,
        first_work: Int32,
        stride: Int32,
        num_slots: Int32,
        num_work: Int32,
    ):
        d = self.head_dim
        tile_n = self.tile_n
        # Everything derived from the MMAs is taken before the first GEMM sets their ACCUMULATE
        # field (consumer_mainloop.py: the field set in a staged loop does not dominate later uses).
        thr_qk = tiled_mma_qk.get_slice(tid)
        thr_pv = tiled_mma_pv.get_slice(tid)
        tSrQ = thr_qk.make_fragment_A(thr_qk.partition_A(sQ))  # (MMA, 1, d/32, 2 halves x Q_STAGES)
        tSrK = thr_qk.make_fragment_B(thr_qk.partition_B(sK))  # (MMA, 1, d/32, stages)
        tOrVt = thr_pv.make_fragment_B(thr_pv.partition_B(sVt))  # (MMA, 1, tile_n/32, stages)
        acc_o = thr_pv.make_fragment_C(thr_pv.partition_shape_C((WG_ROWS, d)))
        acc_s = thr_qk.make_fragment_C(thr_qk.partition_shape_C((WG_ROWS, tile_n)))
        tOrP = thr_pv.make_fragment_A(thr_pv.partition_shape_A((WG_ROWS, tile_n)))
        tScS = thr_qk.partition_C(cute.make_identity_tensor((WG_ROWS, tile_n)))
        tOcO = thr_pv.partition_C(cute.make_identity_tensor((WG_ROWS, d)))
        first_ops = self.first_tile_operands(tiled_mma_qk, sK, tid)  # narrow first tiles
        row_max = cute.make_rmem_tensor((2,), Float32)
        row_sum = cute.make_rmem_tensor((2,), Float32)
        factor = cute.make_rmem_tensor((2,), Float32)
        store_thread = tid == 0  # issues this warpgroup's TMA stores and waits for them
        # stmatrix of the bf16 O into this warpgroup's staging buffer
        stsm = cute.make_tiled_copy_C(
            cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4), cutlass.BFloat16),
            tiled_mma_pv,
        )
        thr_stsm = stsm.get_slice(tid)
        tRS_sO = thr_stsm.partition_D(sO[None, None, wg])

        if cutlass.const_expr(self.pingpong):
            # warpgroup 0 takes the CTA's first turn, opened by the last one (the turns then run on
            # across tiles)
            if wg == 1:
                cute.arch.barrier_arrive(barrier_id=PINGPONG_BAR, number_of_threads=2 * 128)
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, Q_STAGES)
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.num_stages)
        # a tile's coordinates and the loads they need are fetched one tile ahead, while the tile
        # before runs (their latency -- a search of the schedule table, then cu_seqlens and
        # descales -- is otherwise paid at every tile start)
        w = first_work
        nxt = self.tile_info(w, num_work, num_slots, mCuQ, mCuK, mDescale, s_first, s_perm, softmax_scale_log2,
                             qhead_per_kvhead)
        while w < num_work:
            valid, batch, m_block, head, offset_q, seqlen_q, seqlen_k, scale_log2, v_descale = nxt
            nxt = self.tile_info(w + stride, num_work, num_slots, mCuQ, mCuK, mDescale, s_first, s_perm,
                                 softmax_scale_log2, qhead_per_kvhead)
            if valid != 0:
                row_start = m_block * self.tile_m + wg * WG_ROWS
                m64_block = 2 * m_block + wg
                n_block_max = (seqlen_k + tile_n - 1) // tile_n
                acc_o.fill(0.0)
                for r in cutlass.range_constexpr(2):
                    row_max[r] = -Float32.inf
                    row_sum[r] = 0.0
                    factor[r] = 1.0
                mO_cur = cute.domain_offset((offset_q, 0), mO[None, head, None])
                tOgO = thr_pv.partition_C(cute.local_tile(mO_cur, (WG_ROWS, d), (m64_block, 0)))
                pipe_q.consumer_wait(q_state)
                q_piece = 2 * q_state.index + wg  # this warpgroup's 64 Q rows
                kv_state = self.one_level_tile(
                    tiled_mma_qk, tiled_mma_pv, tSrQ, q_piece, tSrK, tOrVt, acc_o, acc_s, tOrP,
                    tScS, row_max, row_sum, factor, pipe_kv, kv_state, wg, row_start, seqlen_k,
                    seqlen_k - seqlen_q, n_block_max, n_block_max, scale_log2, Int32(0), Int32(0), first_ops,
                )
                pipe_q.consumer_release(q_state)  # every QK^T of this tile is complete
                q_state.advance()
                r_out = self.finish_o(acc_o, row_sum, v_descale)
                if row_start + WG_ROWS <= seqlen_q:
                    self.store_o_tma(r_out, stsm, thr_stsm, tRS_sO, sO, tma_o, mO_tma, offset_q, head,
                                     m64_block, wg, store_thread)
                else:
                    self.store_o_rows(r_out, tOgO, tOcO, row_start, seqlen_q)
            w += stride
        if cutlass.const_expr(self.pingpong):
            if wg == 0:  # the turn the last warpgroup passed after its last GEMMs
                cute.arch.barrier(barrier_id=PINGPONG_BAR, number_of_threads=2 * 128)
        if store_thread:
            cute.arch.cp_async_bulk_wait_group(0)  # the last stores, before shared memory goes

    @cute.jit
    def tile_info(self, w: Int32, num_work: Int32, num_slots: Int32, mCuQ: cute.Tensor, mCuK: cute.Tensor,
                  mDescale: cute.Tensor, s_first: cute.Tensor, s_perm: cute.Tensor, softmax_scale_log2: Float32,
                  qhead_per_kvhead: Int32):
        """Work slot ``w``'s (valid, sequence, m block, q head, q offset, seqlen_q, seqlen_k, softmax
        scale with the q/k descales, v descale); past the last slot: not valid, slot 0's loads (in
        bounds)."""
        w_read = w
        if w >= num_work:
            w_read = Int32(0)
        valid, batch, m_block, head = self.work_tile(w_read, num_slots, mCuQ, s_first, s_perm, qhead_per_kvhead)
        if w >= num_work:
            valid = Int32(0)
        offset_q = mCuQ[batch]
        seqlen_q = mCuQ[batch + 1] - offset_q
        seqlen_k = mCuK[batch + 1] - mCuK[batch]
        head_kv = head // qhead_per_kvhead
        scale_log2 = softmax_scale_log2 * mDescale[0, batch, head_kv] * mDescale[1, batch, head_kv]
        v_descale = mDescale[2, batch, head_kv]
        return valid, batch, m_block, head, offset_q, seqlen_q, seqlen_k, scale_log2, v_descale

    @cute.jit
    def store_o_tma(self, r_out: cute.Tensor, stsm, thr_stsm, tRS_sO: cute.Tensor, sO: cute.Tensor, tma_o,
                    mO_tma: cute.Tensor, offset_q: Int32, head: Int32, m64_block: Int32, wg: Int32,
                    store_thread: cutlass.Boolean):
        """A full 64-row half of O: registers -> this warpgroup's staging buffer (stmatrix) -> TMA
        store, not waited for (the next call waits until it has read the buffer).  One thread
        issues the store (the DSL elects a thread for TMA loads, not for stores: a warp would
        issue it 32 times), commits it and later waits for its bulk group."""
        d = self.head_dim
        if store_thread:
            cute.arch.cp_async_bulk_wait_group(0, read=True)  # the previous store has read sO
        cute.arch.barrier(barrier_id=EPILOGUE_BAR + wg, number_of_threads=128)
        cute.copy(stsm, thr_stsm.retile(r_out), tRS_sO)
        cute.arch.fence_proxy("async.shared", space="cta")  # generic-proxy writes -> the TMA unit
        cute.arch.barrier(barrier_id=EPILOGUE_BAR + wg, number_of_threads=128)
        if store_thread:
            mO_cur = cute.domain_offset((offset_q, 0), mO_tma[None, None, head])
            gO = cute.local_tile(mO_cur, (WG_ROWS, d), (None, 0))  # (64, d, m64 blocks)
            tOsO, tOgO = cpasync.tma_partition(
                tma_o, 0, cute.make_layout(1), cute.group_modes(sO, 0, 2), cute.group_modes(gO, 0, 2)
            )
            cute.copy(tma_o, tOsO[None, wg], tOgO[None, m64_block])
            cute.arch.cp_async_bulk_commit_group()
