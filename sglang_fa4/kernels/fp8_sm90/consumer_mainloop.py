"""The consumer warpgroups' main loop of the SM90 FP8 attention forward (mixed into
:class:`.forward.Fp8AttentionForwardSm90`): S = Q K^T and O_tile = P V with FP8 WGMMA per key tile
(FA3's intra-warpgroup overlap; optional ping-pong of the two warpgroups through named barriers),
the two-level fp32 O accumulation, and the epilogue (O / rowsum * v_descale -> bf16).  Masking, softmax and P's conversion are :mod:`.tile_softmax`."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import warpgroup

from sglang_fa4.kernels.fp8_sm90.kernel_shape import PINGPONG_BAR, WG_ROWS


class ConsumerMainLoop:
    """``consume``: one consumer warpgroup's 64 query rows, from Q in shared memory to O in global."""

    @cute.jit
    def consume(
        self,
        tiled_mma_qk: cute.TiledMma,
        tiled_mma_pv: cute.TiledMma,
        tiled_mma_sum: cute.TiledMma,
        sQ_wg: cute.Tensor,
        sK: cute.Tensor,
        sVt: cute.Tensor,
        sOnes_wg: cute.Tensor,
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
        # rowsum_mma: row sums as P x ones (m64n8: every column of a row holds its sum)
        thr_sum = tiled_mma_sum.get_slice(tid)
        tSrOnes = thr_sum.make_fragment_B(thr_sum.partition_B(sOnes_wg))  # (MMA, 1, tile_n/32)
        acc_so = thr_sum.make_fragment_C(thr_sum.partition_shape_C((WG_ROWS, 8)))  # fp32, folded
        acc_st = thr_sum.make_fragment_C(thr_sum.partition_shape_C((WG_ROWS, 8)))  # this tile's
        acc_so.fill(0.0)
        acc_st.fill(0.0)
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
        acc_s = thr_qk.make_fragment_C(thr_qk.partition_shape_C((WG_ROWS, tile_n)))
        acc_t = thr_pv.make_fragment_C(thr_pv.partition_shape_C((WG_ROWS, d)))
        tOrP = thr_pv.make_fragment_A(thr_pv.partition_shape_A((WG_ROWS, tile_n)))
        # FA3-style intra-warpgroup overlap: S_i = Q K_i^T and O_t = P_{i-1} V_{i-1} are issued
        # together; the softmax of S_i runs while the PV GEMM of the previous tile is in flight.
        f_prev = cute.make_rmem_tensor((2,), Float32)
        # O += PV_{i-2} runs while S_i = Q K_i^T is in flight, just before PV_{i-1} is issued (same
        # sums, same order), so that nothing but P's conversion waits for the PV GEMM
        f_fold = cute.make_rmem_tensor((2,), Float32)
        acc_t.fill(0.0)
        for r in cutlass.range_constexpr(2):
            f_fold[r] = 1.0
        if n_iters > 0:
            if cutlass.const_expr(self.pingpong):
                # warpgroup 0 takes the first turn: warpgroup 1 opens its barrier once
                if wg == 1:
                    cute.arch.barrier_arrive(barrier_id=PINGPONG_BAR, number_of_threads=2 * 128)
            pipe_kv.consumer_wait(kv_state)
            if cutlass.const_expr(self.pingpong):
                cute.arch.barrier(barrier_id=PINGPONG_BAR + wg, number_of_threads=2 * 128)
            warpgroup.fence()
            for kb in cutlass.range_constexpr(d // 32):
                tiled_mma_qk.set(warpgroup.Field.ACCUMULATE, kb != 0)
                cute.gemm(tiled_mma_qk, acc_s, tSrQ[None, None, kb], tSrK[None, None, kb, kv_state.index], acc_s)
            warpgroup.commit_group()
            if cutlass.const_expr(self.pass_after_issue):
                self.pass_turn(wg, n_iters == 1)
            warpgroup.wait_group(0)
            if cutlass.const_expr(self.pingpong_late):
                self.pass_turn(wg, n_iters == 1)  # S ready: the other warpgroup's QK^T may start
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
                for kb in cutlass.range_constexpr(d // 32):
                    tiled_mma_qk.set(warpgroup.Field.ACCUMULATE, kb != 0)
                    cute.gemm(tiled_mma_qk, acc_s, tSrQ[None, None, kb], tSrK[None, None, kb, kv_state.index], acc_s)
                warpgroup.commit_group()
                self.rescale_add(acc_o, acc_t, f_fold)  # PV_{i-2}, waited for last iteration
                if cutlass.const_expr(self.rowsum_mma):
                    self.rescale_add(acc_so, acc_st, f_fold)
                warpgroup.fence()  # acc_t read above, written by the PV GEMM below
                for kb in cutlass.range_constexpr(tile_n // 32):
                    tiled_mma_pv.set(warpgroup.Field.ACCUMULATE, kb != 0)
                    cute.gemm(tiled_mma_pv, acc_t, tOrP[None, None, kb], tOrVt[None, None, kb, prev_state.index], acc_t)
                if cutlass.const_expr(self.rowsum_mma):
                    for kb in cutlass.range_constexpr(tile_n // 32):
                        tiled_mma_sum.set(warpgroup.Field.ACCUMULATE, kb != 0)
                        cute.gemm(tiled_mma_sum, acc_st, tOrP[None, None, kb], tSrOnes[None, None, kb], acc_st)
                warpgroup.commit_group()
                if cutlass.const_expr(self.pass_after_issue):
                    self.pass_turn(wg, i == n_iters - 1)
                warpgroup.wait_group(1)  # S_i ready (groups complete in order)
                if cutlass.const_expr(self.pingpong_late):
                    self.pass_turn(wg, i == n_iters - 1)
                self.mask_tile(acc_s, tScS, row_start, n_block, seqlen_k, diag, window_left, window_right)
                self.softmax_tile(acc_s, row_max, row_sum, factor, scale_log2)
                self.pin_below(acc_s[cute.size(acc_s) - 1])  # P's last value (>= 0)
                warpgroup.wait_group(0)  # P_{i-1} V_{i-1} ready; tOrP free again
                pipe_kv.consumer_release(prev_state)
                for r in cutlass.range_constexpr(2):
                    f_fold[r] = f_prev[r]
                for r in cutlass.range_constexpr(2):
                    f_prev[r] = factor[r]
                self.p_to_operand(acc_s, tOrP)
                prev_state = kv_state.clone()
                kv_state.advance()
            self.rescale_add(acc_o, acc_t, f_fold)
            if cutlass.const_expr(self.rowsum_mma):
                self.rescale_add(acc_so, acc_st, f_fold)
            warpgroup.fence()
            for kb in cutlass.range_constexpr(tile_n // 32):
                tiled_mma_pv.set(warpgroup.Field.ACCUMULATE, kb != 0)
                cute.gemm(tiled_mma_pv, acc_t, tOrP[None, None, kb], tOrVt[None, None, kb, prev_state.index], acc_t)
            if cutlass.const_expr(self.rowsum_mma):
                for kb in cutlass.range_constexpr(tile_n // 32):
                    tiled_mma_sum.set(warpgroup.Field.ACCUMULATE, kb != 0)
                    cute.gemm(tiled_mma_sum, acc_st, tOrP[None, None, kb], tSrOnes[None, None, kb], acc_st)
            warpgroup.commit_group()
            warpgroup.wait_group(0)
            pipe_kv.consumer_release(prev_state)
            self.rescale_add(acc_o, acc_t, f_prev)
            if cutlass.const_expr(self.rowsum_mma):
                self.rescale_add(acc_so, acc_st, f_prev)

        # ---- epilogue: O / rowsum * v_descale -> bf16, rows < seqlen_q only ----
        out_scale = cute.make_rmem_tensor((2,), Float32)
        for r in cutlass.range_constexpr(2):
            s = row_sum[r]
            if cutlass.const_expr(self.rowsum_mma):
                s = acc_so[2 * r]  # already the whole row's
            else:
                s += cute.arch.shuffle_sync_bfly(s, offset=1)
                s += cute.arch.shuffle_sync_bfly(s, offset=2)
            out_scale[r] = Float32(0.0)
            if s > 0.0:
                out_scale[r] = v_descale * cute.arch.rcp_approx(s)
        for v in cutlass.range_constexpr(cute.size(acc_o)):
            acc_o[v] = acc_o[v] * out_scale[(v // 2) % 2]
        r_out = cute.make_rmem_tensor_like(acc_o, cutlass.BFloat16)
        r_out.store(acc_o.load().to(cutlass.BFloat16))
        for v in cutlass.range_constexpr(cute.size(acc_o)):
            if row_start + tOcO[v][0] < seqlen_q:
                tOgO[v] = r_out[v]

    # The GEMM issue blocks above stay written out at each use: moved into a helper (plain Python
    # or @cute.jit, both tried with cutlass-dsl 4.8.1), the MMA's ACCUMULATE field set inside the
    # staged loop escapes it and the DSL's IR verification fails ("operand does not dominate").

    # A plain Python helper: it runs at trace time, so it inlines exactly like the code it replaces.
    def rescale_add(self, acc_o, acc_t, factor):
        """O = O * factor + O_tile (two-level accumulation; ``factor`` per row, 2 rows a thread)."""
        for v in range(cute.size(acc_o)):
            acc_o[v] = acc_o[v] * factor[(v // 2) % 2] + acc_t[v]

    @cute.jit
    def pin_below(self, x: Float32):
        """A branch on ``x`` (a late softmax result) around a no-op: it ends the basic block, and
        ptxas does not schedule the instructions after it (the PV GEMM's wait) above the softmax
        (sm_90a SASS without it: the PV wait, WARPGROUP.DEPBAR, cheap in ptxas's model, placed in
        the first latency gap of the row-max chain, i.e. before the softmax, so the PV GEMM never
        overlapped it).  The branch must be taken by every lane for every value a P can
        hold (>= 0, +inf, NaN): ``x != -1`` is unordered, true for NaN.  ``x > -1`` skipped the
        warp sync in lanes whose P was NaN and ran it in lanes whose P was masked to 0: a NaN in q
        or k split the warp there and hung the d=256 96-key kernel on the H200."""
        if x != Float32(-1.0):
            cute.arch.sync_warp()

    @cute.jit
    def pass_turn(self, wg: Int32, last: cutlass.Boolean):
        """Open the other warpgroup's GEMM turn.  Warpgroup 1 skips its last one: it opened
        warpgroup 0's first turn up front, so each barrier sees as many arrivals as waits."""
        if wg == 0:
            cute.arch.barrier_arrive(barrier_id=PINGPONG_BAR + 1, number_of_threads=2 * 128)
        else:
            if not last:
                cute.arch.barrier_arrive(barrier_id=PINGPONG_BAR, number_of_threads=2 * 128)
