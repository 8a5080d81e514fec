"""Device entry of the SM90 FP8 attention forward (:class:`.forward.Fp8AttentionForwardSm90`
mixes it in): the CTA's key-block range (causal / local window bounds), the Q and K/V^T TMA
pipelines, the producer warp's loads, and the hand-off to the consumer warpgroups
(:mod:`.consumer_mainloop`)."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import cpasync

from sglang_fa4.kernels.fp8_sm90.kernel_shape import CONSUMER_REGS, ONES_BAR, PRODUCER_REGS, WG_ROWS
from sglang_fa4.kernels.fp8_sm90.kv_pipes import KvPipes
from sglang_fa4.kernels.fp8_sm90.layout import VT_ALIGN


class KernelEntry:
    """The ``@cute.kernel`` (launched by ``Fp8AttentionForwardSm90.__call__``)."""

    @cute.jit
    def locate_tile(self, mCuQ: cute.Tensor, tile: Int32):
        """(sequence, m block) of the grid's ``tile``-th CTA (layout.locate_tile, the Python twin):
        sequence b's q tiles are numbered from first(b) = (cu[b] - cu[0]) // tile_m + b, which
        grows with b and leaves room for its ceil(len_b / tile_m) tiles, so a binary search over
        cu_seqlens finds the sequence (log2(batch) loads); a number between two sequences' tiles
        lands past its sequence's rows and the CTA does nothing. The grid (forward.py) is
        total_q // tile_m + batch, not batch x ceil(max_seqlen / tile_m): a ViT budget graph's ~70
        segment slots otherwise launched 70 x 330 CTAs per head at a 4K picture's 42196-token
        budget, nearly all empty (vit_fp8-run1.md, the 4K graph row at 0.891x)."""
        tile_m = self.tile_m
        cu0 = mCuQ[0]
        lo = Int32(0)
        hi = mCuQ.shape[0] - 1  # batch: the answer lies in [lo, hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if (mCuQ[mid] - cu0) // tile_m + mid <= tile:
                lo = mid
            else:
                hi = mid
        return lo, tile - ((mCuQ[lo] - cu0) // tile_m + lo)

    def make_pipelines(self, storage, q_stages: int):
        """The Q and K/V^T TMA pipelines on ``storage``'s barriers: one producer thread, the
        consumer warps (8; a plain method: traced inline into the kernel calling it;
        the persistent kernel shares it with ``q_stages`` = 2).  K/V^T as :class:`.kv_pipes.KvPipes`
        (kv_split: V^T on ``storage.mbar_v``)."""
        consumer_warps = pipeline.CooperativeGroup(pipeline.Agent.Thread, 8)
        pipe_q = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar_q.data_ptr(),
            num_stages=q_stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=consumer_warps,
            tx_count=self.tx_q,
        )
        split = self.kv_split
        pipe_kv = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar_kv.data_ptr(),
            num_stages=self.num_stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=consumer_warps,
            tx_count=self.tx_kv // 2 if split else self.tx_kv,
        )
        pipe_v = None
        if split:  # V^T behind its own barriers (kv_pipes.py)
            pipe_v = pipeline.PipelineTmaAsync.create(
                barrier_storage=storage.mbar_v.data_ptr(),
                num_stages=self.num_stages,
                producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
                consumer_group=consumer_warps,
                tx_count=self.tx_kv // 2,
            )
        return pipe_q, KvPipes(pipe_kv, pipe_v)

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
        tiled_mma_sum: cute.TiledMma,
        sOnes_layout: cute.ComposedLayout,
    ):
        d = self.head_dim
        tile_m = self.tile_m
        tile_n = self.tile_n
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg_idx = warp_idx // 4
        tile, head, _ = cute.arch.block_idx()
        batch, m_block = self.locate_tile(mCuQ, tile)

        smem = utils.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        if warp_idx == 0:
            cpasync.prefetch_descriptor(tma_q)
            cpasync.prefetch_descriptor(tma_k)
            cpasync.prefetch_descriptor(tma_vt)
        pipe_q, pipe_kv = self.make_pipelines(storage, q_stages=1)
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
                    for i in cutlass.range(n_iters, unroll=1):
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
                            tma_bar_ptr=pipe_kv.v_barrier(kv_state),
                        )
                        kv_state.advance()
            else:
                # ------------------------------ consumers ------------------------------
                cute.arch.warpgroup_reg_alloc(CONSUMER_REGS)
                wg = wg_idx - 1
                tid = tidx - 128 * wg_idx
                scale_log2 = softmax_scale_log2 * mDescale[0, batch, head_kv] * mDescale[1, batch, head_kv]
                v_descale = mDescale[2, batch, head_kv]
                sOnes_wg = sVt[None, None, wg]  # unused unless rowsum_mma
                if cutlass.const_expr(self.rowsum_mma):
                    sOnes_wg = self.fill_ones(storage, sOnes_layout, tid, wg)
                # d > 128: O accumulated by the PV GEMM itself (forward.two_level)
                consume = self.consume if cutlass.const_expr(self.two_level) else self.consume_one_level
                consume(
                    tiled_mma_qk,
                    tiled_mma_pv,
                    tiled_mma_sum,
                    sQ[None, None, wg],
                    sK,
                    sVt,
                    sOnes_wg,
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
    def fill_ones(self, storage, sOnes_layout: cute.ComposedLayout, tid: Int32, wg: Int32):
        """rowsum_mma: this consumer warpgroup's 8 x tile_n block of E4M3 ones (0x38), made
        visible to the tensor cores (async proxy) before its first WGMMA; returns the block."""
        ones32 = storage.sOnes.get_tensor(cute.make_layout(cute.cosize(sOnes_layout) // 4), dtype=Int32)
        per_wg = cute.cosize(sOnes_layout) // 8
        for k in cutlass.range_constexpr(per_wg // 128):
            ones32[wg * per_wg + tid * (per_wg // 128) + k] = Int32(0x38383838)
        cute.arch.fence_proxy("async.shared", space="cta")
        cute.arch.barrier(barrier_id=ONES_BAR + wg, number_of_threads=128)
        sOnes = storage.sOnes.get_tensor(sOnes_layout.outer, swizzle=sOnes_layout.inner)
        return sOnes[None, None, wg]
