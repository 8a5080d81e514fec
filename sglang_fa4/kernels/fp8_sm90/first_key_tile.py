"""The first key tile of a q tile in the one-level loop (``consumer_mainloop_wide.one_level_tile``):
its QK^T, masking, softmax and P, and their narrow forms (``narrow``, the persistent kernel's; mixed into
:class:`.forward.Fp8AttentionForwardSm90`).

Why narrow forms: a q tile's key loop runs from its last key tile down, so the tile it starts with
holds the end of the sequence -- at 4096 or 16384 keys and 192-key tiles, 64 keys of 192.
Computed whole, that tile costs a full QK^T, 96 row-max steps and 96 exp2s a thread for a third of
the keys: 3% of an 8x4096 forward.  With ``narrow``, the first tile's QK^T is an m64nW WGMMA for
the least width W of ``layout.narrow_widths`` that holds the tile's keys (a runtime branch on the keys
left; each width is its own code, with its own MMA object, so no ACCUMULATE field set in one branch
reaches another), its mask and softmax run over W columns, and P's later k steps are zero, so the
PV GEMM that follows stays the full one (its k steps over zero P add nothing; no branch around a
WGMMA in the main loop).  Columns past W lie past the sequence, so the result is the whole tile's.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32
from cutlass.cutlass_dsl import extract_mlir_values, new_from_mlir_values
from cutlass.cute.nvgpu import warpgroup

from sglang_fa4.kernels.fp8_sm90.kernel_shape import F8, PINGPONG_BAR, WG_ROWS

_K_MAJOR = cute.nvgpu.OperandMajorMode.K


class FirstKeyTile:
    """``first_tile_operands`` (before any GEMM) and ``first_key_tile`` (one_level_tile's first tile)."""

    @cute.jit
    def first_tile_operands(self, tiled_mma_qk: cute.TiledMma, sK: cute.Tensor, tid: Int32):
        """None without ``narrow``; else per narrow width (W, its MMA, the thread's slice, the B
        fragments of each stage's first W keys (MMA, 1, d/32, stages)), then (0, a copy of the full MMA, None, None) for
        a full first tile.  Taken before the first GEMM sets any ACCUMULATE field."""
        ops = None
        if cutlass.const_expr(self.narrow):
            ops = []
            for w in cutlass.range_constexpr(len(self.narrow_widths)):
                width = self.narrow_widths[w]
                mma = sm90_utils.make_trivial_tiled_mma(F8, F8, _K_MAJOR, _K_MAJOR, Float32, (1, 1, 1), (WG_ROWS, width))
                thr = mma.get_slice(tid)
                sK_w = cute.flat_divide(sK, (width,))[None, 0, None, None]  # (W, d, stages): a stage's first W keys
                ops.append((width, mma, thr, thr.make_fragment_B(thr.partition_B(sK_w))))
            ops.append((0, new_from_mlir_values(tiled_mma_qk, extract_mlir_values(tiled_mma_qk)), None, None))
            ops = tuple(ops)
        return ops

    @cute.jit
    def first_key_tile(self, tiled_mma_qk: cute.TiledMma, first_ops, tSrQ: cute.Tensor, q_stage, tSrK: cute.Tensor,
                       acc_s: cute.Tensor, tOrP: cute.Tensor, tScS: cute.Tensor, row_max: cute.Tensor, row_sum: cute.Tensor, factor: cute.Tensor, pipe_kv, kv_state, wg: Int32,
                       row_start: Int32, seqlen_k: Int32, diag: Int32, n_block_max: Int32, n_iters: Int32,
                       scale_log2: Float32, window_left: Int32, window_right: Int32):
        """Tile n_block_max - 1 from the K/V^T wait to P in ``tOrP``: at the full width (no
        ``narrow``), else at the least width of ``first_ops`` that holds its keys."""
        args = (tSrQ, q_stage, tOrP, tScS, row_max, row_sum, factor, pipe_kv, kv_state, wg, row_start,
                seqlen_k, diag, n_block_max, n_iters, scale_log2, window_left, window_right)
        if cutlass.const_expr(first_ops is None):
            self.first_tile_at(tiled_mma_qk, tSrK, acc_s, 0, *args)
        else:
            # everything unpacked before the branches (a name assigned inside a runtime branch
            # is threaded through it by the DSL)
            keys = seqlen_k - (n_block_max - 1) * self.tile_n
            w0, mma0, thr0, k0 = first_ops[0]
            w1, mma1, thr1, k1 = first_ops[1]
            full_mma = first_ops[-1][1]
            if keys <= w0:
                self.first_tile_at(mma0, k0, thr0.make_fragment_C(thr0.partition_shape_C((WG_ROWS, w0))), w0, *args)
            else:
                if cutlass.const_expr(w1 == 0):  # one narrow width
                    self.first_tile_at(full_mma, tSrK, acc_s, 0, *args)
                else:
                    if keys <= w1:
                        self.first_tile_at(mma1, k1, thr1.make_fragment_C(thr1.partition_shape_C((WG_ROWS, w1))),
                                           w1, *args)
                    else:
                        self.first_tile_at(full_mma, tSrK, acc_s, 0, *args)

    @cute.jit
    def first_tile_at(self, mma: cute.TiledMma, tSrK: cute.Tensor, acc: cute.Tensor, ncols: cutlass.Constexpr,
                      tSrQ: cute.Tensor, q_stage, tOrP: cute.Tensor, tScS: cute.Tensor, row_max: cute.Tensor, row_sum: cute.Tensor, factor: cute.Tensor, pipe_kv, kv_state, wg: Int32,
                      row_start: Int32, seqlen_k: Int32, diag: Int32, n_block_max: Int32, n_iters: Int32,
                      scale_log2: Float32, window_left: Int32, window_right: Int32):
        """The first tile with S of ``ncols`` columns (0: the key tile's) in ``acc``."""
        pipe_kv.consumer_wait(kv_state)
        if cutlass.const_expr(self.pingpong):
            cute.arch.barrier(barrier_id=PINGPONG_BAR + wg, number_of_threads=2 * 128)
        warpgroup.fence()
        for kb in cutlass.range_constexpr(self.head_dim // 32):
            mma.set(warpgroup.Field.ACCUMULATE, kb != 0)
            cute.gemm(mma, acc, self.q_operand(tSrQ, kb, q_stage), tSrK[None, None, kb, kv_state.index], acc)
        warpgroup.commit_group()
        if cutlass.const_expr(self.pingpong):
            # turns run on across the persistent kernel's tiles: never its last (persistent_consumer)
            self.pass_turn(wg, cutlass.Boolean(False))
        warpgroup.wait_group(0)
        pipe_kv.release_k(kv_state)  # kv_split: K read
        self.mask_tile(acc, tScS, row_start, n_block_max - 1, seqlen_k, diag, window_left, window_right, ncols)
        self.softmax_tile(acc, row_max, row_sum, factor, scale_log2, ncols)
        self.p_to_operand(acc, tOrP, ncols)
