"""Device entry of the persistent SM90 FP8 attention forward (d=128 non-causal, kernel_config;
mixed into :class:`.forward.Fp8AttentionForwardSm90`): at most one CTA per SM, each working through
its share of the (q tile, head) work slots with a static stride (:mod:`.schedule` is the Python
twin of the order: longest sequences first, neighbouring slots sharing K/V).

Why: the non-persistent kernel pays ~3.9 us per CTA it could hide (CTA start, Q and first K/V
loads, the last PV GEMM and the O store; ``git show 244b9bd:benchmark/results/h200/fp8_attention_speed4.md``), 9% of an 8x4096
CTA.  Here the producer warp loads the next tile's Q (a ring of two Q buffers) and its first K/V^T
stages while the consumers finish the current one (the K/V ring flows on across tiles), and the
consumers hand O to a TMA store from shared memory (:mod:`.persistent_consumer`).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import cpasync

from sglang_fa4.kernels.fp8_sm90.kernel_shape import F8, PRODUCER_REGS, WG_ROWS
from sglang_fa4.kernels.fp8_sm90.layout import SM90_SMEM_BYTES, VT_ALIGN
from sglang_fa4.kernels.fp8_sm90.schedule import LPT_MAX_SEQS

#: Q buffers of the persistent kernel (each two 64-row halves): the next tile's Q loads while the
#: consumers still read the current one.
Q_STAGES = 2


class PersistentEntry:
    """``kernel_persistent`` and its launch (from ``Fp8AttentionForwardSm90.__call__``)."""

    @cute.jit
    def launch_persistent(self, tiled_mma_qk, tiled_mma_pv, tiled_mma_sum, tma_q, mQ_tma, tma_k, mK_tma, tma_vt,
                          mVt_tma, mO: cute.Tensor, mCuQ: cute.Tensor, mCuK: cute.Tensor, mDescale: cute.Tensor,
                          softmax_scale_log2: Float32, qhead_per_kvhead: Int32, sQ_layout, sK_layout, sVt_layout,
                          sOnes_layout, stream):
        """Host side: the O staging buffers and their TMA store atom, shared memory, and the grid --
        min(work slots, SMs), from the shapes only (no device read; self.num_sms is the launch
        device's count, taken when the variant is compiled)."""
        d = self.head_dim
        _ROW_MAJOR = cutlass.utils.LayoutEnum.ROW_MAJOR
        # one (64, d) bf16 buffer per consumer warpgroup, laid out as the TMA store reads it
        sO_layout = sm90_utils.make_smem_layout_a(_ROW_MAJOR, (WG_ROWS, self.tile_n, d), cutlass.BFloat16, 2)
        mO_v = cute.make_tensor(mO.iterator, cute.select(mO.layout, mode=[0, 2, 1]))  # (rows, d, head)
        tma_o, mO_tma = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileS2GOp(), mO_v, cute.slice_(sO_layout, (None, None, 0)), (WG_ROWS, d)
        )

        @cute.struct
        class StoragePersistent:
            mbar_q: cute.struct.MemRange[cutlass.Int64, 2 * Q_STAGES]
            mbar_kv: cute.struct.MemRange[cutlass.Int64, 2 * self.num_stages]
            if cutlass.const_expr(self.kv_split):  # V^T's own full / empty barriers (kv_pipes.py)
                mbar_v: cute.struct.MemRange[cutlass.Int64, 2 * self.num_stages]
            sched_first: cute.struct.MemRange[Int32, LPT_MAX_SEQS + 1]
            sched_perm: cute.struct.MemRange[Int32, LPT_MAX_SEQS + 1]
            sQ: cute.struct.Align[cute.struct.MemRange[F8, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[F8, cute.cosize(sK_layout)], 1024]
            sVt: cute.struct.Align[cute.struct.MemRange[F8, cute.cosize(sVt_layout)], 1024]
            # the O staging buffers of the TMA-store epilogue
            sO: cute.struct.Align[cute.struct.MemRange[cutlass.BFloat16, cute.cosize(sO_layout)], 1024]

        if cutlass.const_expr(StoragePersistent.size_in_bytes() > SM90_SMEM_BYTES):
            raise ValueError(f"persistent kernel: {StoragePersistent.size_in_bytes()} bytes of shared memory "
                             f"over {SM90_SMEM_BYTES} ({self.num_stages} K/V^T stages)")
        self.shared_storage = StoragePersistent
        num_work = (mO.shape[0] // self.tile_m + (mCuQ.shape[0] - 1)) * mO.shape[1]  # schedule.tile_slots x heads
        self.kernel_persistent(
            tiled_mma_qk, tiled_mma_pv, tiled_mma_sum, tma_q, mQ_tma, tma_k, mK_tma, tma_vt, mVt_tma, tma_o, mO_tma,
            mO, mCuQ, mCuK, mDescale, softmax_scale_log2, qhead_per_kvhead, sQ_layout, sK_layout, sVt_layout,
            sO_layout, sOnes_layout,
        ).launch(
            grid=[cutlass.min(num_work, Int32(self.num_sms)), 1, 1],
            block=[self.num_threads, 1, 1],
            smem=StoragePersistent.size_in_bytes(),
            stream=stream,
            min_blocks_per_mp=1,
        )

    @cute.jit
    def init_schedule(self, mCuQ: cute.Tensor, mCuK: cute.Tensor, s_first: cute.Tensor, s_perm: cute.Tensor,
                      tidx: Int32):
        """All threads: the longest-first table (schedule.lpt_table) in shared memory when there are
        at most LPT_MAX_SEQS sequences.  Thread i ranks sequence i (key length, ties by index) and
        sums the q tiles of the sequences before it; s_first / s_perm first hold the keys and tile
        counts.  The caller's next CTA barrier (the pipelines' creation) publishes the table."""
        batch = mCuQ.shape[0] - 1
        if batch <= LPT_MAX_SEQS:
            key = Int32(0)
            tiles = Int32(0)
            if tidx < batch:
                key = mCuK[tidx + 1] - mCuK[tidx]
                tiles = (mCuQ[tidx + 1] - mCuQ[tidx] + self.tile_m - 1) // self.tile_m
                s_first[tidx] = key
                s_perm[tidx] = tiles
            cute.arch.barrier()
            rank = Int32(0)
            before = Int32(0)
            if tidx < batch:
                for j in cutlass.range(batch, unroll=4):
                    key_j = s_first[j]
                    if (key_j > key) | ((key_j == key) & (j < tidx)):
                        rank += 1
                        before += s_perm[j]
            cute.arch.barrier()
            if tidx < batch:
                s_first[rank] = before
                s_perm[rank] = tidx
                if rank == batch - 1:
                    s_first[batch] = before + tiles

    @cute.jit
    def work_tile(self, w: Int32, num_slots: Int32, mCuQ: cute.Tensor, s_first: cute.Tensor, s_perm: cute.Tensor,
                  qhead_per_kvhead: Int32):
        """(valid, sequence, m block, q head) of work slot ``w`` (schedule.work_tile, the twin)."""
        g = qhead_per_kvhead
        rest = w // g
        slot = rest % num_slots
        head = (rest // num_slots) * g + (w - rest * g)
        batch_count = mCuQ.shape[0] - 1
        valid = Int32(0)
        batch = Int32(0)
        m_block = Int32(0)
        if batch_count <= LPT_MAX_SEQS:
            lo = Int32(0)
            hi = batch_count
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if s_first[mid] <= slot:
                    lo = mid
                else:
                    hi = mid
            batch = s_perm[lo]
            m_block = slot - s_first[lo]
            if slot < s_first[batch_count]:
                valid = Int32(1)
        else:
            batch, m_block = self.locate_tile(mCuQ, slot)
            if m_block * self.tile_m < mCuQ[batch + 1] - mCuQ[batch]:
                valid = Int32(1)
        return valid, batch, m_block, head

    @cute.kernel
    def kernel_persistent(
        self,
        tiled_mma_qk: cute.TiledMma,
        tiled_mma_pv: cute.TiledMma,
        tiled_mma_sum: cute.TiledMma,
        tma_q: cute.CopyAtom,
        mQ_tma: cute.Tensor,
        tma_k: cute.CopyAtom,
        mK_tma: cute.Tensor,
        tma_vt: cute.CopyAtom,
        mVt_tma: cute.Tensor,
        tma_o: cute.CopyAtom,
        mO_tma: cute.Tensor,
        mO: cute.Tensor,
        mCuQ: cute.Tensor,
        mCuK: cute.Tensor,
        mDescale: cute.Tensor,
        softmax_scale_log2: Float32,
        qhead_per_kvhead: Int32,
        sQ_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout,
        sVt_layout: cute.ComposedLayout,
        sO_layout: cute.ComposedLayout,
        sOnes_layout: cute.ComposedLayout,
    ):
        d = self.head_dim
        tile_n = self.tile_n
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg_idx = warp_idx // 4
        first_work, _, _ = cute.arch.block_idx()
        stride, _, _ = cute.arch.grid_dim()
        # work slots: tile slots x heads (schedule.tile_slots), from the shapes as on the host
        num_slots = mO.shape[0] // self.tile_m + (mCuQ.shape[0] - 1)
        num_work = num_slots * mO.shape[1]

        smem = utils.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        if warp_idx == 0:
            cpasync.prefetch_descriptor(tma_q)
            cpasync.prefetch_descriptor(tma_k)
            cpasync.prefetch_descriptor(tma_vt)
            cpasync.prefetch_descriptor(tma_o)
        s_first = storage.sched_first.get_tensor(cute.make_layout(LPT_MAX_SEQS + 1))
        s_perm = storage.sched_perm.get_tensor(cute.make_layout(LPT_MAX_SEQS + 1))
        self.init_schedule(mCuQ, mCuK, s_first, s_perm, tidx)
        pipe_q, pipe_kv = self.make_pipelines(storage, q_stages=Q_STAGES)
        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)  # (64, d, pieces x Q_STAGES)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sVt = storage.sVt.get_tensor(sVt_layout.outer, swizzle=sVt_layout.inner)
        sO = storage.sO.get_tensor(sO_layout.outer, swizzle=sO_layout.inner)  # (64, d, warpgroups)

        if wg_idx == 0:
            # ------------------------------ producer ------------------------------
            cute.arch.warpgroup_reg_dealloc(PRODUCER_REGS)
            if warp_idx == 0:
                q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, Q_STAGES)
                kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.num_stages)
                w = first_work
                while w < num_work:
                    valid, batch, m_block, head = self.work_tile(w, num_slots, mCuQ, s_first, s_perm,
                                                                 qhead_per_kvhead)
                    if valid != 0:
                        offset_q = mCuQ[batch]
                        seqlen_q = mCuQ[batch + 1] - offset_q
                        offset_k = mCuK[batch]
                        seqlen_k = mCuK[batch + 1] - offset_k
                        head_kv = head // qhead_per_kvhead
                        mQ_cur = cute.domain_offset((offset_q, 0), mQ_tma[None, None, head])
                        gQ = cute.local_tile(mQ_cur, (WG_ROWS, d), (None, 0))  # (64, d, m64 blocks)
                        tQsQ, tQgQ = cpasync.tma_partition(
                            tma_q, 0, cute.make_layout(1), cute.group_modes(sQ, 0, 2), cute.group_modes(gQ, 0, 2)
                        )
                        mK_cur = cute.domain_offset((offset_k, 0), mK_tma[None, None, head_kv])
                        gK = cute.local_tile(mK_cur, (tile_n, d), (None, 0))
                        tKsK, tKgK = cpasync.tma_partition(
                            tma_k, 0, cute.make_layout(1), cute.group_modes(sK, 0, 2), cute.group_modes(gK, 0, 2)
                        )
                        vt_offset = (offset_k + VT_ALIGN - 1) // VT_ALIGN * VT_ALIGN + VT_ALIGN * batch
                        mVt_cur = cute.domain_offset((0, vt_offset), mVt_tma[None, None, head_kv])
                        gVt = cute.local_tile(mVt_cur, (d, tile_n), (0, None))
                        tVsV, tVgV = cpasync.tma_partition(
                            tma_vt, 0, cute.make_layout(1), cute.group_modes(sVt, 0, 2), cute.group_modes(gVt, 0, 2)
                        )
                        pipe_q.producer_acquire(q_state)
                        n_wg = 2
                        for half in cutlass.range_constexpr(n_wg):  # a 64-row piece per consumer warpgroup
                            q_tile = n_wg * m_block + half
                            if cutlass.const_expr(half >= 1):
                                # a piece past the sequence's rows: load the first again (kernel_entry)
                                if m_block * self.tile_m + half * WG_ROWS >= seqlen_q:
                                    q_tile = n_wg * m_block
                            cute.copy(
                                tma_q,
                                tQgQ[None, q_tile],
                                tQsQ[None, n_wg * q_state.index + half],
                                tma_bar_ptr=pipe_q.producer_get_barrier(q_state),
                            )
                        q_state.advance()
                        n_block_max = (seqlen_k + tile_n - 1) // tile_n
                        for i in cutlass.range(n_block_max, unroll=1):
                            n_block = n_block_max - 1 - i
                            pipe_kv.producer_acquire(kv_state)
                            cute.copy(tma_k, tKgK[None, n_block], tKsK[None, kv_state.index],
                                      tma_bar_ptr=pipe_kv.producer_get_barrier(kv_state))
                            pipe_kv.acquire_v(kv_state)  # kv_split: V^T's buffer too
                            cute.copy(tma_vt, tVgV[None, n_block], tVsV[None, kv_state.index],
                                      tma_bar_ptr=pipe_kv.v_barrier(kv_state))
                            kv_state.advance()
                    w += stride
        else:
            # ------------------------------ consumers ------------------------------
            cute.arch.warpgroup_reg_alloc(self.consumer_regs)
            self.consume_persistent(
                tiled_mma_qk,
                tiled_mma_pv,
                sQ,
                sK,
                sVt,
                sO,
                tma_o,
                mO_tma,
                pipe_q,
                pipe_kv,
                mO,
                mCuQ,
                mCuK,
                mDescale,
                s_first,
                s_perm,
                softmax_scale_log2,
                qhead_per_kvhead,
                tidx - 128 * wg_idx,
                wg_idx - 1,
                first_work,
                stride,
                num_slots,
                num_work,
            )
