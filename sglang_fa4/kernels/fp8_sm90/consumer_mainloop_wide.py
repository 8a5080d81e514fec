"""The consumers' main loop for head dims above 128 (192, 256) and for the d=128 non-causal "wide
tile" (128 x 192) of the SM90 FP8 attention forward (mixed into
:class:`.forward.Fp8AttentionForwardSm90`; used where ``two_level`` is off).

Why a second loop: the d <= 128 loop (:mod:`.consumer_mainloop`) accumulates O in two levels -- each
tile's P V into its own fp32 accumulator, added into an fp32 O -- because Hopper's FP8 MMA
accumulates with reduced precision.  That is two (64 x d) fp32 accumulators per consumer
warpgroup: d registers a thread (256 at d=256) beside S's 64, over the 240 a consumer has.  Here
the PV GEMM accumulates into O itself, O being rescaled by the tile's softmax factor just before
the GEMM is issued (FA3's way for FP8 at every head dim): d/2 registers for O.  The schedule is the
overlapped one of the d <= 128 loop: S_i = Q K_i^T is issued together with O += P_{i-1} V_{i-1},
and the softmax of S_i runs while that PV GEMM is in flight.  Row sums are the softmax's own
(``rowsum_mma`` is off: its ones block would cost shared memory the wide K/V stages need).
With ``pingpong`` (the persistent kernel's) the two consumer warpgroups take turns issuing their
GEMMs (named barriers, as in the d <= 128 loop) and O's rescale runs before the turn is taken, so
a turn is the QK^T and PV WGMMAs back to back.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import warpgroup

from sglang_fa4.kernels.fp8_sm90.kernel_shape import PINGPONG_BAR, WG_ROWS


class ConsumerMainLoopWide:
    """``consume_one_level``: one consumer warpgroup's 64 query rows, O accumulated by the PV
    WGMMA itself (same arguments as ``ConsumerMainLoop.consume``)."""

    @cute.jit
    def consume_one_level(
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
        tScS = thr_qk.partition_C(cute.make_identity_tensor((WG_ROWS, tile_n)))
        row_max = cute.make_rmem_tensor((2,), Float32)
        row_sum = cute.make_rmem_tensor((2,), Float32)
        factor = cute.make_rmem_tensor((2,), Float32)
        for r in cutlass.range_constexpr(2):
            row_max[r] = -Float32.inf
            row_sum[r] = 0.0
            factor[r] = 1.0

        mO_cur = cute.domain_offset((offset_q, 0), mO[None, head, None])
        gO = cute.local_tile(mO_cur, (WG_ROWS, d), (m64_block, 0))
        tOgO = thr_pv.partition_C(gO)
        tOcO = thr_pv.partition_C(cute.make_identity_tensor((WG_ROWS, d)))

        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        pipe_q.consumer_wait(q_state)
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.num_stages)
        acc_s = thr_qk.make_fragment_C(thr_qk.partition_shape_C((WG_ROWS, tile_n)))
        tOrP = thr_pv.make_fragment_A(thr_pv.partition_shape_A((WG_ROWS, tile_n)))
        first_ops = self.first_tile_operands(tiled_mma_qk, sK, tid)
        self.one_level_tile(tiled_mma_qk, tiled_mma_pv, tSrQ, None, tSrK, tOrVt, acc_o, acc_s, tOrP, tScS,
                            row_max, row_sum, factor, pipe_kv, kv_state, wg, row_start, seqlen_k, diag,
                            n_block_max, n_iters, scale_log2, window_left, window_right, first_ops=first_ops)

        # ---- epilogue: O / rowsum * v_descale -> bf16, rows < seqlen_q only ----
        r_out = self.finish_o(acc_o, row_sum, v_descale)
        self.store_o_rows(r_out, tOgO, tOcO, row_start, seqlen_q)

    @cute.jit
    def finish_o(self, acc_o: cute.Tensor, row_sum: cute.Tensor, v_descale: Float32) -> cute.Tensor:
        """O / rowsum * v_descale as bf16 registers (a row without any weight gives 0)."""
        out_scale = cute.make_rmem_tensor((2,), Float32)
        for r in cutlass.range_constexpr(2):
            s = row_sum[r]  # this thread's share of the row: the quad holds the rest
            s += cute.arch.shuffle_sync_bfly(s, offset=1)
            s += cute.arch.shuffle_sync_bfly(s, offset=2)
            out_scale[r] = Float32(0.0)
            if s > 0.0:
                out_scale[r] = v_descale * cute.arch.rcp_approx(s)
        for v in cutlass.range_constexpr(cute.size(acc_o)):
            acc_o[v] = acc_o[v] * out_scale[(v // 2) % 2]
        r_out = cute.make_rmem_tensor_like(acc_o, cutlass.BFloat16)
        r_out.store(acc_o.load().to(cutlass.BFloat16))
        return r_out

    @cute.jit
    def store_o_rows(self, r_out: cute.Tensor, tOgO: cute.Tensor, tOcO: cute.Tensor, row_start: Int32,
                     seqlen_q: Int32):
        """bf16 O from registers to global memory, rows < seqlen_q only (ptxas pairs the values:
        32-bit stores)."""
        for v in cutlass.range_constexpr(cute.size(r_out)):
            if row_start + tOcO[v][0] < seqlen_q:
                tOgO[v] = r_out[v]

    @cute.jit
    def one_level_tile(
        self,
        tiled_mma_qk: cute.TiledMma,
        tiled_mma_pv: cute.TiledMma,
        tSrQ: cute.Tensor,
        q_stage,
        tSrK: cute.Tensor,
        tOrVt: cute.Tensor,
        acc_o: cute.Tensor,
        acc_s: cute.Tensor,
        tOrP: cute.Tensor,
        tScS: cute.Tensor,
        row_max: cute.Tensor,
        row_sum: cute.Tensor,
        factor: cute.Tensor,
        pipe_kv,
        kv_state,
        wg: Int32,
        row_start: Int32,
        seqlen_k: Int32,
        diag: Int32,
        n_block_max: Int32,
        n_iters: Int32,
        scale_log2: Float32,
        window_left: Int32,
        window_right: Int32,
        first_ops=None,
    ):
        """One q tile's key loop, from its first QK^T to its last PV GEMM (O in ``acc_o``, the
        softmax state in row_max / row_sum / factor), K/V^T stages from ``kv_state`` on; returns
        the state after them (the persistent kernel carries it to its next tile).  ``q_stage``:
        None for a Q operand without a stage mode, else the stage (persistent Q ring).  ``first_ops``: first_key_tile's narrow MMAs
        (``first_tile_operands``; None: the first tile at full width)."""
        tile_n = self.tile_n
        if n_iters > 0:
            # (ping-pong here is the persistent kernel's: its turns run on across its tiles, opened
            # once a CTA, persistent_consumer)
            self.first_key_tile(tiled_mma_qk, first_ops, tSrQ, q_stage, tSrK, acc_s, tOrP, tScS, row_max,
                                row_sum, factor, pipe_kv, kv_state, wg, row_start, seqlen_k, diag, n_block_max,
                                n_iters, scale_log2, window_left, window_right)
            prev_state = kv_state.clone()
            kv_state.advance()
            kv_state, prev_state = self.later_key_tiles(
                tiled_mma_qk, tiled_mma_pv, tSrQ, q_stage, tSrK, tOrVt, acc_o, acc_s, tOrP, tScS, row_max,
                row_sum, factor, pipe_kv, kv_state, prev_state, wg, row_start, seqlen_k, diag, n_block_max, n_iters,
                scale_log2, window_left, window_right)
            self.rescale_o(acc_o, factor)
            pipe_kv.wait_v(prev_state)  # kv_split: V^T of the last key tile
            warpgroup.fence()
            tiled_mma_pv.set(warpgroup.Field.ACCUMULATE, True)
            for kb in cutlass.range_constexpr(tile_n // 32):
                cute.gemm(tiled_mma_pv, acc_o, tOrP[None, None, kb], tOrVt[None, None, kb, prev_state.index], acc_o)
            warpgroup.commit_group()
            warpgroup.wait_group(0)
            pipe_kv.consumer_release(prev_state)

        return kv_state

    @cute.jit
    def later_key_tiles(
        self,
        tiled_mma_qk: cute.TiledMma,
        tiled_mma_pv: cute.TiledMma,
        tSrQ: cute.Tensor,
        q_stage,
        tSrK: cute.Tensor,
        tOrVt: cute.Tensor,
        acc_o: cute.Tensor,
        acc_s: cute.Tensor,
        tOrP: cute.Tensor,
        tScS: cute.Tensor,
        row_max: cute.Tensor,
        row_sum: cute.Tensor,
        factor: cute.Tensor,
        pipe_kv,
        kv_state,
        prev_state,
        wg: Int32,
        row_start: Int32,
        seqlen_k: Int32,
        diag: Int32,
        n_block_max: Int32,
        n_iters: Int32,
        scale_log2: Float32,
        window_left: Int32,
        window_right: Int32,
    ):
        """Key tiles 1 .. n_iters - 1 of a q tile, after its first QK^T and softmax (P in ``tOrP``,
        its K/V^T stage ``prev_state``): each issues S_i = Q K_i^T with O += P_{i-1} V_{i-1} and
        runs S_i's softmax while that PV GEMM is in flight.  Returns (kv_state, prev_state); the
        last PV GEMM is the caller's (one_level_tile's)."""
        d = self.head_dim
        tile_n = self.tile_n
        for i in cutlass.range(1, n_iters, unroll=1):
            n_block = n_block_max - 1 - i
            if cutlass.const_expr(self.pingpong):
                # ping-pong: O's rescale before this warpgroup's turn, so that the turn holds
                # the GEMM issues alone (the previous PV GEMM into O was waited for below)
                self.rescale_o(acc_o, factor)
            pipe_kv.consumer_wait(kv_state)
            pipe_kv.wait_v(prev_state)  # kv_split: V^T of the PV GEMM below
            if cutlass.const_expr(self.pingpong):
                cute.arch.barrier(barrier_id=PINGPONG_BAR + wg, number_of_threads=2 * 128)
            warpgroup.fence()
            for kb in cutlass.range_constexpr(d // 32):
                tiled_mma_qk.set(warpgroup.Field.ACCUMULATE, kb != 0)
                cute.gemm(tiled_mma_qk, acc_s, self.q_operand(tSrQ, kb, q_stage), tSrK[None, None, kb, kv_state.index], acc_s)
            warpgroup.commit_group()
            # O (tiles < i-1, at tile i-2's max) -> tile i-1's max, then O += P_{i-1} V_{i-1}
            if cutlass.const_expr(not self.pingpong):
                self.rescale_o(acc_o, factor)
                warpgroup.fence()
            tiled_mma_pv.set(warpgroup.Field.ACCUMULATE, True)
            for kb in cutlass.range_constexpr(tile_n // 32):
                cute.gemm(tiled_mma_pv, acc_o, tOrP[None, None, kb], tOrVt[None, None, kb, prev_state.index], acc_o)
            warpgroup.commit_group()
            if cutlass.const_expr(self.pingpong):
                # turns run on across the persistent kernel's tiles: never its last (persistent_consumer)
                self.pass_turn(wg, cutlass.Boolean(False))
            warpgroup.wait_group(1)  # S_i ready (groups complete in order)
            pipe_kv.release_k(kv_state)  # kv_split: K_i read
            self.mask_tile(acc_s, tScS, row_start, n_block, seqlen_k, diag, window_left, window_right)
            self.softmax_tile(acc_s, row_max, row_sum, factor, scale_log2)
            self.pin_below(acc_s[cute.size(acc_s) - 1])  # keep the PV wait below the softmax
            warpgroup.wait_group(0)  # P_{i-1} V_{i-1} done; tOrP free again
            pipe_kv.consumer_release(prev_state)
            self.p_to_operand(acc_s, tOrP)
            prev_state = kv_state.clone()
            kv_state.advance()
        return kv_state, prev_state

    # Plain Python: runs at trace time, inlined like the code it stands for.
    def rescale_o(self, acc_o, factor):
        """O = O * factor (per row; a thread holds 2 rows: values (v // 2) % 2)."""
        for v in range(cute.size(acc_o)):
            acc_o[v] = acc_o[v] * factor[(v // 2) % 2]

    def q_operand(self, tSrQ, kb: int, q_stage):
        """The QK^T GEMM's A operand for k step ``kb``: of stage ``q_stage`` unless it is None."""
        return tSrQ[None, None, kb] if q_stage is None else tSrQ[None, None, kb, q_stage]
