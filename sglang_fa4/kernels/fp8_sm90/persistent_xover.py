"""Cross-tile overlap of the persistent SM90 FP8 forward (switch ``xover`` with ``persist``; mixed
into :class:`.forward.Fp8AttentionForwardSm90`, called from ``PersistentConsumer.consume_persistent``).

Why: inside a q tile the one-level loop issues S_i = Q K_i^T together with O += P_{i-1} V_{i-1}
and runs S_i's softmax while that PV GEMM is in flight; at a tile boundary the plain persistent
loop (:mod:`.persistent_consumer`) drains instead -- the last PV GEMM alone, its wait, the epilogue,
then the next tile's first QK^T alone and its softmax with nothing of its own in flight.  8x4096
at d=128 has ~21 key tiles per q tile, so that boundary is ~1/21 of the work twice over
(results/h200/fp8_attention_speed5.md: 1.22x FA4 bf16 at 8x4096, 1.37x at 1x16384).

Here a CTA's tiles are one stream of key tiles: the boundary step ("cross") is a main-loop
iteration whose QK^T is the *next* tile's first (its Q stage, its first K/V^T stage) and whose PV
GEMM is the current tile's last:

* rescale O by the current tile's last factor, wait for the next tile's Q and first K/V^T stage,
  take the ping-pong turn, issue QK^T (next) then PV (current), pass the turn;
* wait for S (1 group), keep the current tile's row sums, reset the softmax state, mask + softmax
  the next tile's first S while the PV GEMM runs; wait for it, release its K/V^T stage, P -> E4M3;
* the epilogue of the current tile (O / rowsum -> bf16 -> store) reads O only after that wait,
  and O is zeroed before the next tile's first PV GEMM (its next turn), which accumulates into it.

``xover_pvfirst`` orders the cross step the other way: PV (current) then QK^T (next), the wait for
1 group gives the finished O, the epilogue runs while the next S is in flight, then the wait for
S and its softmax (with nothing of its own in flight).  Which hides more is for the GPU to say.

Turns: a tile of n key tiles still takes n turns (its first QK^T, in the cross step or alone,
then n - 1 loop turns); the last PV GEMM of a tile never takes one -- as in the plain loop, so the
arrivals and waits of the named barriers match (warpgroup 1 opens the CTA's first turn, warpgroup
0 takes the one left open; :mod:`.persistent_consumer`).  Both warpgroups see the same tiles and
key counts, so they take the same branches.  The Q ring: a tile's Q is released once its last
QK^T is complete (the loop's last wait), before the next tile's Q is waited for.  Tiles without
keys (seqlen_k = 0) and a last tile end the stream as the plain loop does (last PV alone);
``schedule.xover_steps`` is the Python twin of this order, for CPU tests.

A tile's later key tiles are ``ConsumerMainLoopWide.later_key_tiles``, as in ``one_level_tile``. The
other GEMM issue blocks are written out where they run, inside branches: the DSL yields an MMA whose
ACCUMULATE field is set in a region only when the ``set`` call is in that region's own code
(consumer_mainloop.py); a helper issuing the first QK^T inside ``if started == 0`` failed IR
verification ("operand does not dominate this use").
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import warpgroup

from sglang_fa4.kernels.fp8_sm90.kernel_shape import PINGPONG_BAR, WG_ROWS


class PersistentXover:
    """``xover_loop``: the persistent consumer's tile loop with the tile boundaries overlapped."""

    @cute.jit
    def next_valid(self, w: Int32, stride: Int32, num_work: Int32, sched):
        """The first valid work slot from ``w`` on (stepping by ``stride``) and its tile_info;
        num_work or more when there is none."""
        num_slots, mCuQ, mCuK, mDescale, s_first, s_perm, softmax_scale_log2, qhead_per_kvhead = sched
        info = self.tile_info(w, num_work, num_slots, mCuQ, mCuK, mDescale, s_first, s_perm, softmax_scale_log2,
                              qhead_per_kvhead)
        while (w < num_work) & (info[0] == 0):
            w += stride
            info = self.tile_info(w, num_work, num_slots, mCuQ, mCuK, mDescale, s_first, s_perm,
                                  softmax_scale_log2, qhead_per_kvhead)
        return w, info

    @cute.jit
    def xover_loop(self, tiled_mma_qk: cute.TiledMma, tiled_mma_pv: cute.TiledMma, thr_pv, frags, soft, epi,
                   pipe_q, pipe_kv, q_state, kv_state, mO: cute.Tensor, sched, wg: Int32, first_work: Int32,
                   stride: Int32, num_work: Int32):
        """The CTA's valid work slots from ``first_work`` on; ``frags``, ``soft`` and ``epi`` are
        consume_persistent's fragments, softmax state and O-store pieces (see there)."""
        tSrQ, tSrK, tOrVt, acc_o, acc_s, tOrP, tScS, tOcO, ones32 = frags
        row_max, row_sum, factor = soft
        d = self.head_dim
        tile_n = self.tile_n
        sum_done = cute.make_rmem_tensor((2,), Float32)  # the finished tile's row sums (its epilogue)
        w, cur = self.next_valid(first_work, stride, num_work, sched)
        prev_state = kv_state.clone()  # the K/V^T stage of the P in tOrP
        started = Int32(0)  # 1: the cross step has issued this tile's first QK^T (and waited for its Q)
        acc_o.fill(0.0)
        while w < num_work:
            m_block, head, offset_q, seqlen_q, seqlen_k, scale_log2, v_descale = cur[2:]  # cur[0]: valid
            w_next, nxt = self.next_valid(w + stride, stride, num_work, sched)  # a tile ahead, as consume_persistent
            row_start = m_block * self.tile_m + wg * WG_ROWS
            n_iters = (seqlen_k + tile_n - 1) // tile_n
            if started == 0:
                for r in cutlass.range_constexpr(2):
                    row_max[r] = -Float32.inf
                    row_sum[r] = 0.0
                    factor[r] = 1.0
                pipe_q.consumer_wait(q_state)
                if n_iters > 0:
                    # the tile's first QK^T alone (a CTA's first tile, or after a tile without keys)
                    pipe_kv.consumer_wait(kv_state)
                    if cutlass.const_expr(self.pingpong):
                        cute.arch.barrier(barrier_id=PINGPONG_BAR + wg, number_of_threads=2 * 128)
                    warpgroup.fence()
                    for kb in cutlass.range_constexpr(d // 32):
                        tiled_mma_qk.set(warpgroup.Field.ACCUMULATE, kb != 0)
                        cute.gemm(tiled_mma_qk, acc_s, tSrQ[None, None, kb, 2 * q_state.index + wg],
                                  tSrK[None, None, kb, kv_state.index], acc_s)
                    warpgroup.commit_group()
                    if cutlass.const_expr(self.pass_after_issue):
                        self.pass_turn(wg, self.last_turn(False))
                    warpgroup.wait_group(0)
                    if cutlass.const_expr(self.pingpong_late):
                        self.pass_turn(wg, self.last_turn(False))
                    self.mask_tile(acc_s, tScS, row_start, n_iters - 1, seqlen_k, seqlen_k - seqlen_q, Int32(0),
                                   Int32(0))
                    self.softmax_tile(acc_s, row_max, row_sum, factor, scale_log2, wg, ones32)
                    self.p_to_operand(acc_s, tOrP)
                    prev_state = kv_state.clone()
                    kv_state.advance()
            # the tile's other key tiles (consumer_mainloop_wide; non-causal, no window)
            kv_state, prev_state = self.later_key_tiles(
                tiled_mma_qk, tiled_mma_pv, tSrQ, 2 * q_state.index + wg, tSrK, tOrVt, acc_o, acc_s, tOrP, tScS,
                ones32, row_max, row_sum, factor, pipe_kv, kv_state, prev_state, wg, row_start, seqlen_k,
                seqlen_k - seqlen_q, n_iters, n_iters, scale_log2, Int32(0), Int32(0))
            pipe_q.consumer_release(q_state)  # every QK^T of this tile is complete (the waits above)
            q_state.advance()
            for r in cutlass.range_constexpr(2):
                sum_done[r] = row_sum[r]
            started = Int32(0)
            stored = Int32(0)  # xover_pvfirst: the cross step has stored this tile's O
            if n_iters > 0:
                m_block_n, seqlen_q_n, seqlen_k_n, scale_log2_n = nxt[2], nxt[5], nxt[6], nxt[7]
                n_iters_n = (seqlen_k_n + tile_n - 1) // tile_n
                cross = Int32(0)
                if w_next < num_work:
                    if n_iters_n > 0:
                        cross = Int32(1)
                if cross != 0:
                    # ---- cross step: the next tile's first QK^T + this tile's last PV, one turn ----
                    self.rescale_o(acc_o, factor)
                    pipe_q.consumer_wait(q_state)
                    pipe_kv.consumer_wait(kv_state)
                    if cutlass.const_expr(self.pingpong):
                        cute.arch.barrier(barrier_id=PINGPONG_BAR + wg, number_of_threads=2 * 128)
                    warpgroup.fence()
                    if cutlass.const_expr(self.xover_pv_first):
                        tiled_mma_pv.set(warpgroup.Field.ACCUMULATE, True)
                        for kb in cutlass.range_constexpr(tile_n // 32):
                            cute.gemm(tiled_mma_pv, acc_o, tOrP[None, None, kb],
                                      tOrVt[None, None, kb, prev_state.index], acc_o)
                        warpgroup.commit_group()
                    for kb in cutlass.range_constexpr(d // 32):
                        tiled_mma_qk.set(warpgroup.Field.ACCUMULATE, kb != 0)
                        cute.gemm(tiled_mma_qk, acc_s, tSrQ[None, None, kb, 2 * q_state.index + wg],
                                  tSrK[None, None, kb, kv_state.index], acc_s)
                    warpgroup.commit_group()
                    if cutlass.const_expr(not self.xover_pv_first):
                        tiled_mma_pv.set(warpgroup.Field.ACCUMULATE, True)
                        for kb in cutlass.range_constexpr(tile_n // 32):
                            cute.gemm(tiled_mma_pv, acc_o, tOrP[None, None, kb],
                                      tOrVt[None, None, kb, prev_state.index], acc_o)
                        warpgroup.commit_group()
                    if cutlass.const_expr(self.pass_after_issue):
                        self.pass_turn(wg, self.last_turn(False))
                    warpgroup.wait_group(1)  # xover_pvfirst: this tile's O; else the next tile's S
                    if cutlass.const_expr(self.pingpong_late):
                        self.pass_turn(wg, self.last_turn(False))
                    if cutlass.const_expr(self.xover_pv_first):
                        # this tile's epilogue while the next tile's S is in flight
                        pipe_kv.consumer_release(prev_state)
                        self.xover_epilogue(acc_o, sum_done, v_descale, row_start, seqlen_q, offset_q, head, m_block,
                                            wg, thr_pv, mO, tOcO, epi)
                        stored = Int32(1)
                        warpgroup.wait_group(0)  # the next tile's S
                    for r in cutlass.range_constexpr(2):
                        row_max[r] = -Float32.inf
                        row_sum[r] = 0.0
                        factor[r] = 1.0
                    row_start_n = m_block_n * self.tile_m + wg * WG_ROWS
                    self.mask_tile(acc_s, tScS, row_start_n, n_iters_n - 1, seqlen_k_n, seqlen_k_n - seqlen_q_n,
                                   Int32(0), Int32(0))
                    self.softmax_tile(acc_s, row_max, row_sum, factor, scale_log2_n, wg, ones32)
                    if cutlass.const_expr(not self.xover_pv_first):
                        if cutlass.const_expr(self.pin_wait):
                            self.pin_below(acc_s[cute.size(acc_s) - 1])
                        warpgroup.wait_group(0)  # this tile's O is complete
                        pipe_kv.consumer_release(prev_state)
                    self.p_to_operand(acc_s, tOrP)
                    prev_state = kv_state.clone()
                    kv_state.advance()
                    started = Int32(1)
                else:
                    # the last PV GEMM alone (the CTA's last tile, or the next has no keys)
                    self.rescale_o(acc_o, factor)
                    warpgroup.fence()
                    tiled_mma_pv.set(warpgroup.Field.ACCUMULATE, True)
                    for kb in cutlass.range_constexpr(tile_n // 32):
                        cute.gemm(tiled_mma_pv, acc_o, tOrP[None, None, kb], tOrVt[None, None, kb, prev_state.index],
                                  acc_o)
                    warpgroup.commit_group()
                    warpgroup.wait_group(0)
                    pipe_kv.consumer_release(prev_state)
            # ---- epilogue of this tile (O read before the next tile's first PV GEMM, next turn) ----
            if cutlass.const_expr(self.xover_pv_first):
                if stored == 0:
                    self.xover_epilogue(acc_o, sum_done, v_descale, row_start, seqlen_q, offset_q, head, m_block, wg,
                                        thr_pv, mO, tOcO, epi)
            else:
                self.xover_epilogue(acc_o, sum_done, v_descale, row_start, seqlen_q, offset_q, head, m_block, wg,
                                    thr_pv, mO, tOcO, epi)
            w = w_next
            cur = nxt

    @cute.jit
    def xover_epilogue(self, acc_o: cute.Tensor, sum_done: cute.Tensor, v_descale: Float32, row_start: Int32,
                       seqlen_q: Int32, offset_q: Int32, head: Int32, m_block: Int32, wg: Int32, thr_pv,
                       mO: cute.Tensor, tOcO: cute.Tensor, epi):
        """A finished tile's O / rowsum * v_descale -> bf16 -> global memory (as consume_persistent:
        TMA store of full 64-row halves unless o_direct), then O zeroed for the next tile."""
        stsm, thr_stsm, tRS_sO, sO, tma_o, mO_tma, store_thread = epi
        d = self.head_dim
        m64_block = 2 * m_block + wg
        mO_cur = cute.domain_offset((offset_q, 0), mO[None, head, None])
        tOgO = thr_pv.partition_C(cute.local_tile(mO_cur, (WG_ROWS, d), (m64_block, 0)))
        r_out = self.finish_o(acc_o, sum_done, v_descale)
        if cutlass.const_expr(self.o_tma):
            if row_start + WG_ROWS <= seqlen_q:
                self.store_o_tma(r_out, stsm, thr_stsm, tRS_sO, sO, tma_o, mO_tma, offset_q, head, m64_block, wg,
                                 store_thread)
            else:
                self.store_o_rows(r_out, tOgO, tOcO, row_start, seqlen_q)
        else:
            self.store_o_rows(r_out, tOgO, tOcO, row_start, seqlen_q)
        acc_o.fill(0.0)
