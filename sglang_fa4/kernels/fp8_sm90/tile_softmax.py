"""Per-tile register work of the SM90 FP8 attention forward's consumers (mixed into
:class:`.forward.Fp8AttentionForwardSm90`): causal / sliding-window / length masking of S, the
online softmax with E4M3 headroom (P = exp2(s - max + 8)), and P -> the E4M3 A operand of the PV
GEMM in the registers the accumulator left it in (V^T's keys are permuted to match)."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from sglang_fa4.kernels.fp8_sm90.kernel_shape import F8, ISSUED_BAR, MUFU_BAR, WG_ROWS
from sglang_fa4.kernels.fp8_sm90.layout import LAZY_MAX_LOG2, P_LOG2_OFFSET, STALE_BOUND_LOG2


def _tree_reduce(vals: list, op):
    """Pairwise reduction of a Python list of traced values (plain Python: inlined at trace time)."""
    vals = list(vals)
    while len(vals) > 1:
        nxt = [op(vals[i], vals[i + 1]) for i in range(0, len(vals) - 1, 2)]
        if len(vals) % 2:
            nxt.append(vals[-1])
        vals = nxt
    return vals[0]


# 2^f on [0, 1) as c0 + c1 f + c2 f^2 (fitted here for least maximum relative error: 1.7e-3, far
# below E4M3's 2^-4 step; the row sum sees the same value as P's fp32 before rounding).
_EXP2_POLY = ("0f3F8038B1", "0f3F285A60", "0f3EACA2E6")  # 1.00173, 0.657629, 0.337180


@dsl_user_op
def exp2_on_fma(x: Float32, *, loc=None, ip=None) -> Float32:
    """2^x without the MUFU: floor by a round-down add of 1.5*2^23 (integer part lands in the low
    mantissa bits), a degree-2 polynomial for the fraction, the integer part shifted into the
    exponent.  x is clamped at -127 (-inf from masking gives ~2^-127, zero once in E4M3)."""
    c0, c1, c2 = _EXP2_POLY
    return Float32(llvm.inline_asm(
        T.f32(),
        [Float32(x).ir_value(loc=loc, ip=ip)],
        "{\n\t.reg .f32 c, r, b, f, p;\n\t.reg .b32 ri, pi, e;\n\t"
        "max.f32 c, $1, 0fC2FE0000;\n\t"
        "add.rm.f32 r, c, 0f4B400000;\n\t"
        "sub.f32 b, r, 0f4B400000;\n\t"
        "sub.f32 f, c, b;\n\t"
        f"fma.rn.f32 p, f, {c2}, {c1};\n\t"
        f"fma.rn.f32 p, p, f, {c0};\n\t"
        "mov.b32 ri, r;\n\tmov.b32 pi, p;\n\t"
        "shl.b32 e, ri, 23;\n\t"
        "add.s32 pi, pi, e;\n\t"
        "mov.b32 $0, pi;\n\t}",
        "=f,f",
        has_side_effects=False,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    ))


def _chains_reduce(vals: list, op, chains: int):
    """``chains`` independent serial reductions over interleaved values, then a pairwise finish: the
    dependent chain is len/chains long (latency) while only ``chains`` partials are live."""
    parts = list(vals[:chains])
    for k in range(chains, len(vals)):
        parts[k % chains] = op(parts[k % chains], vals[k])
    return _tree_reduce(parts, op)

class TileSoftmax:
    """Register-level steps of one key tile, called from ``consume``."""

    def s_width(self, ncols: int) -> int:
        """Columns S holds: ``ncols`` (first_key_tile's narrow forms) or, for 0, the key tile's
        (plain Python, so the DSL does not trace the choice)."""
        return ncols if ncols else self.tile_n

    @cute.jit
    def mask_tile(self, acc_s: cute.Tensor, tScS: cute.Tensor, row_start: Int32, n_block: Int32, seqlen_k: Int32,
                  diag: Int32, window_left: Int32, window_right: Int32, ncols: cutlass.Constexpr = 0):
        """Mask S, only for key tiles that cross a boundary (``ncols``: S holds the tile's first
        ncols columns, first_key_tile's narrow forms; 0: all of them)."""
        tile_n = self.tile_n
        width = self.s_width(ncols)
        col0 = n_block * tile_n
        need_mask = Int32(0)
        if col0 + width > seqlen_k:
            need_mask = Int32(1)
        if cutlass.const_expr(self.causal):
            if col0 + width - 1 > row_start + diag:
                need_mask = Int32(1)
        if cutlass.const_expr(self.local):
            if col0 + width - 1 > row_start + diag + window_right:
                need_mask = Int32(1)
            if col0 < row_start + WG_ROWS - 1 + diag - window_left:
                need_mask = Int32(1)
        if cutlass.const_expr("skip_mask" in self.debug):
            need_mask = Int32(0)
        if need_mask != 0:
            self.apply_mask(acc_s, tScS, row_start, col0, seqlen_k, diag, window_left, window_right)

    @cute.jit
    def softmax_tile(self, acc_s: cute.Tensor, row_max: cute.Tensor, row_sum: cute.Tensor, factor: cute.Tensor,
                     scale_log2: Float32, wg: Int32, ones32: cute.Tensor, ncols: cutlass.Constexpr = 0):
        """Online softmax in place (2 rows per thread; a row lives in one quad): acc_s becomes
        P = exp2(s*scale - max*scale + 8), factor the rescale of everything before this tile.
        ``mufu_gate``: both rows' maxima first, then wait until the other consumer warpgroup has
        issued its GEMMs (named barrier ISSUED_BAR + other), then the exp2s (forward.mufu_gate).
        ``ncols``: S holds the tile's first ncols columns (0: all; first_key_tile)."""
        bias = cute.make_rmem_tensor((2,), Float32)
        if cutlass.const_expr(self.mufu_gate):
            for r in cutlass.range_constexpr(0 if cutlass.const_expr("skip_softmax" in self.debug) else 2):
                self.row_max_step(acc_s, row_max, factor, bias, scale_log2, r, ncols)
            cute.arch.barrier(barrier_id=ISSUED_BAR + 1 - wg, number_of_threads=2 * 128)
            # ptxas moves register-only instructions across a bar.sync; a shared-memory load is not
            # moved above it, so the exp2s take their scale through one: a word of the block of
            # E4M3 ones (0x38383838, written before the main loop), shifted to 0.
            gated_scale = scale_log2 + Float32(ones32[0] >> 30)
            for r in cutlass.range_constexpr(0 if cutlass.const_expr("skip_softmax" in self.debug) else 2):
                self.exp_row_step(acc_s, row_sum, factor, bias, gated_scale, r, ncols)
        elif cutlass.const_expr(self.mufu_token):
            # both rows' maxima, this warpgroup's turn at the exp2 stream, its exp2s and row sums,
            # then the turn handed on: behind a branch on both sums, which need every exp2 (ptxas
            # orders independent exp2s freely, so no single P marks the last one)
            for r in cutlass.range_constexpr(2):
                self.row_max_step(acc_s, row_max, factor, bias, scale_log2, r, ncols)
            zero = self.mufu_take(wg, ones32, bias[0] + bias[1])
            for r in cutlass.range_constexpr(2):
                bias[r] = bias[r] + zero  # the exp2s depend on a load after the wait
                self._row_exps(acc_s, bias, scale_log2, r, False, ncols)
            for r in cutlass.range_constexpr(2):
                self._row_sum(acc_s, row_sum, factor, Float32(0.0), r, False, ncols)
            self.mufu_give(wg, row_sum[0] + row_sum[1])
        elif cutlass.const_expr(self.pingpong_max):
            # both rows' maxima, the GEMM turn handed on (forward.pingpong_max), then the exp2s
            for r in cutlass.range_constexpr(2):
                self.row_max_step(acc_s, row_max, factor, bias, scale_log2, r, ncols)
            zero = self.turn_after_max(wg, ones32, factor[0] + factor[1])
            for r in cutlass.range_constexpr(2):
                bias[r] = bias[r] + zero  # the exp2s depend on a load after the hand-over
                self.exp_row_step(acc_s, row_sum, factor, bias, scale_log2, r, ncols)
        else:
            for r in cutlass.range_constexpr(0 if cutlass.const_expr("skip_softmax" in self.debug) else 2):
                self.row_max_step(acc_s, row_max, factor, bias, scale_log2, r, ncols)
                self.exp_row_step(acc_s, row_sum, factor, bias, scale_log2, r, ncols)

    @cute.jit
    def row_max_step(self, acc_s: cute.Tensor, row_max: cute.Tensor, factor: cute.Tensor, bias: cute.Tensor,
                     scale_log2: Float32, r: cutlass.Constexpr, ncols: cutlass.Constexpr = 0):
        """Row r's new maximum (quad shuffles), its rescale factor and the exp2 bias."""
        blocks = self.s_width(ncols) // 8
        mx = row_max[r]
        if cutlass.const_expr(self.ilp > 1):
            mx = cute.arch.fmax(mx, _chains_reduce(
                [acc_s[e + 2 * r + 4 * j] for j in range(blocks) for e in range(2)],
                cute.arch.fmax, self.ilp))
        elif cutlass.const_expr(self.tree_reduce):
            mx = cute.arch.fmax(mx, _tree_reduce(
                [acc_s[e + 2 * r + 4 * j] for j in range(blocks) for e in range(2)], cute.arch.fmax))
        else:
            for j in cutlass.range_constexpr(blocks):
                for e in cutlass.range_constexpr(2):
                    mx = cute.arch.fmax(mx, acc_s[e + 2 * r + 4 * j])
        mx = cute.arch.fmax(mx, cute.arch.shuffle_sync_bfly(mx, offset=1))
        mx = cute.arch.fmax(mx, cute.arch.shuffle_sync_bfly(mx, offset=2))
        if cutlass.const_expr(self.lazy_max):
            if (mx - row_max[r]) * scale_log2 <= LAZY_MAX_LOG2:
                mx = row_max[r]  # not raised: the factor stays exactly 1 (P below 2^8.75)
        m_use = mx
        if mx == -Float32.inf:
            m_use = Float32(0.0)
        factor[r] = cute.math.exp2((row_max[r] - m_use) * scale_log2, fastmath=True)
        row_max[r] = mx
        bias[r] = m_use * scale_log2 - P_LOG2_OFFSET

    @cute.jit
    def stale_softmax_tile(self, acc_s: cute.Tensor, row_max: cute.Tensor, row_sum: cute.Tensor,
                           factor: cute.Tensor, scale_log2: Float32, row_bound: cute.Tensor, wg: Int32,
                           ones32: cute.Tensor):
        """stale_exp: P = exp2(s * scale - max_before * scale + 8) right from S, the tile's row
        maxima computed beside the exp2s (ALU beside MUFU) instead of before them; a row whose max
        moved past LAZY_MAX_LOG2 then takes its new max and P, its sum and O their factor (P x
        factor is exact where it matters: the stale P was below 2^108).  The warp takes this path
        only if none of its rows' score bounds (``row_bound``, raw S units) lies more than
        STALE_BOUND_LOG2 above the running max (else the stale P could overflow), else the plain
        softmax_tile; a NaN or a row without a max yet fails the test."""
        fits = Int32(0)
        if (row_bound[0] - row_max[0]) * scale_log2 <= STALE_BOUND_LOG2:
            if (row_bound[1] - row_max[1]) * scale_log2 <= STALE_BOUND_LOG2:
                fits = Int32(1)
        if cute.arch.vote_all_sync(fits != 0):
            for r in cutlass.range_constexpr(2):
                mx, s = self._stale_row_exps(acc_s, row_max[r], scale_log2, r)
                mx = cute.arch.fmax(mx, cute.arch.shuffle_sync_bfly(mx, offset=1))
                mx = cute.arch.fmax(mx, cute.arch.shuffle_sync_bfly(mx, offset=2))
                f = Float32(1.0)
                if (mx - row_max[r]) * scale_log2 > LAZY_MAX_LOG2:
                    f = cute.math.exp2((row_max[r] - mx) * scale_log2, fastmath=True)
                    row_max[r] = mx
                factor[r] = f
                row_sum[r] = (row_sum[r] + s) * f
            self.rescale_if_moved(acc_s, factor)  # P of the rows that moved
        else:
            self.softmax_tile(acc_s, row_max, row_sum, factor, scale_log2, wg, ones32)

    # Plain Python: runs at trace time, inlined like the code it stands for.
    def _stale_row_exps(self, acc_s, m_before, scale_log2, r: int):
        """Row r's exp2s on the max from before the tile (in place) with the row's max over the
        tile (4 chains, from ``m_before``) and its sum of P; returns (this thread's max, sum)."""
        bias = m_before * scale_log2 - P_LOG2_OFFSET
        parts = [m_before] * 4
        s = Float32(0.0)
        for k, (j, e) in enumerate((j, e) for j in range(self.tile_n // 8) for e in range(2)):
            v = e + 2 * r + 4 * j
            x = acc_s[v]
            parts[k % 4] = cute.arch.fmax(parts[k % 4], x)
            acc_s[v] = cute.math.exp2(x * scale_log2 - bias, fastmath=True)
            s += acc_s[v]
        return _tree_reduce(parts, cute.arch.fmax), s

    @cute.jit
    def q_row_bounds(self, sQ_piece: cute.Tensor, tScS: cute.Tensor, tid: Int32, row_bound: cute.Tensor):
        """stale_exp: this thread's two rows' bound on a score, in raw S units: the row's sum of
        |q| times 448 (no E4M3 K element is larger); a quad sums a row's columns in quarters."""
        chunk = 8  # columns converted at a time (all of a quarter at once spills beside O)
        q8 = cute.make_rmem_tensor((chunk,), F8)
        qf = cute.make_rmem_tensor((chunk,), Float32)
        for r in cutlass.range_constexpr(2):
            row = tScS[2 * r][0]
            s = Float32(0.0)
            for c0 in cutlass.range(0, self.head_dim // 4, chunk, unroll=1):  # a loop, so no hoisted addresses
                for c in cutlass.range_constexpr(chunk):
                    q8[c] = sQ_piece[row, tid % 4 + 4 * (c0 + c)]
                qf.store(q8.load().to(Float32))
                for c in cutlass.range_constexpr(chunk):
                    s += cute.arch.fmax(qf[c], -qf[c])
            s += cute.arch.shuffle_sync_bfly(s, offset=1)
            s += cute.arch.shuffle_sync_bfly(s, offset=2)
            row_bound[r] = s * Float32(448.0)

    @cute.jit
    def exp_row_step(self, acc_s: cute.Tensor, row_sum: cute.Tensor, factor: cute.Tensor, bias: cute.Tensor,
                     scale_log2: Float32, r: cutlass.Constexpr, ncols: cutlass.Constexpr = 0):
        """Row r's P = exp2(s * scale - bias) in place, and its running sum (unless rowsum_mma)."""
        inline = not self.tree_reduce and self.ilp <= 1 and not self.row_sums_on_mma
        s = self._row_exps(acc_s, bias, scale_log2, r, inline, ncols)
        self._row_sum(acc_s, row_sum, factor, s, r, inline, ncols)

    # Plain Python: runs at trace time, inlined like the code it stands for.
    def _row_exps(self, acc_s, bias, scale_log2, r: int, inline_sum: bool, ncols: int = 0):
        """Row r's P = exp2(s * scale - bias) in place (its first ``ncols`` columns; 0: all);
        returns their sum if ``inline_sum`` (added as they are computed), else 0."""
        s = Float32(0.0)
        for j in range(self.s_width(ncols) // 8):
            for e in range(2):
                v = e + 2 * r + 4 * j
                if self.emu > 0 and (2 * j + e) % self.emu == self.emu - 1:
                    acc_s[v] = exp2_on_fma(acc_s[v] * scale_log2 - bias[r])  # FMA pipe, not MUFU
                else:
                    acc_s[v] = cute.math.exp2(acc_s[v] * scale_log2 - bias[r], fastmath=True)
                if inline_sum:
                    s += acc_s[v]
        return s

    def _row_sum(self, acc_s, row_sum, factor, s, r: int, inline_sum: bool, ncols: int = 0):
        """row_sum[r] = row_sum[r] * factor[r] + row r's sum of P (``s`` if it was summed inline;
        with rowsum_mma the PV GEMM's companion P x ones sums the row, consumer_mainloop)."""
        def vals():
            return [acc_s[e + 2 * r + 4 * j] for j in range(self.s_width(ncols) // 8) for e in range(2)]

        if self.row_sums_on_mma or inline_sum:
            pass
        elif self.ilp > 1:
            s = _chains_reduce(vals(), lambda a, b: a + b, self.ilp)
        elif self.tree_reduce:
            s = _tree_reduce(vals(), lambda a, b: a + b)
        else:
            for x in vals():
                s += x
        row_sum[r] = row_sum[r] * factor[r] + s

    # Plain Python: runs at trace time, inlined like the code it stands for.
    def zero_words(self, storage, wg):
        """mufu_token: the consumer warpgroups' words of 0.0 in shared memory, (1, 1, 2), followed by
        a scratch word each; this thread writes its warpgroup's 0.0 (each thread reads back only its
        own write: no barrier)."""
        words = storage.zero.get_tensor(cute.make_layout((1, 1, 2)))
        words[0, 0, wg] = Float32(0.0)
        return words

    def between_words(self, zero_word, before, barrier_op):
        """``barrier_op()`` pinned between what computed ``before`` and what adds the returned 0.0
        (this warpgroup's word, zero_words).  ptxas moves register-only instructions across a
        barrier both ways (and predicates a branch around one), shared-memory accesses it does
        not: ``before`` is stored to the scratch word ahead of the barrier, the 0.0 loaded after it."""
        words = cute.make_tensor(cute.recast_ptr(zero_word.iterator, dtype=Float32), cute.make_layout(3))
        words[2] = before
        barrier_op()
        return words[0]

    def mufu_take(self, wg, zero_word, before):
        """mufu_token: wait for this warpgroup's turn at the exp2 stream; returns its word of 0.0,
        which the caller adds into the exp2s' bias, so that the row maxima (``before``) stay above
        the wait and the exp2s below (between_words)."""
        return self.between_words(
            zero_word, before, lambda: cute.arch.barrier(barrier_id=MUFU_BAR + wg, number_of_threads=2 * 128))

    @cute.jit
    def mufu_give(self, wg: Int32, x: Float32):
        """mufu_token: hand the exp2 stream to the other warpgroup, behind a branch on ``x`` (the
        tile's row sums added: >= 0, +inf or NaN, never -1) so that it follows every exp2."""
        if x != Float32(-1.0):
            cute.arch.barrier_arrive(barrier_id=MUFU_BAR + 1 - wg, number_of_threads=2 * 128)

    def turn_after_max(self, wg, zero_word, factors):
        """pp_max: hand the GEMM turn to the other warpgroup between the row maxima and the exp2s;
        returns this warpgroup's word of 0.0 for the exp2s' bias.  The arrive sits behind a branch
        on ``factors`` (the two rescale factors, exp2 results: >= 0 or NaN, never -1), so it follows
        the maxima, and between the scratch word's store and the 0.0's load (between_words), so the
        exp2s stay below it."""
        return self.between_words(zero_word, factors, lambda: self.turn_if_not_minus_one(wg, factors))

    @cute.jit
    def turn_if_not_minus_one(self, wg: Int32, x: Float32):
        if x != Float32(-1.0):
            self.pass_turn(wg, cutlass.Boolean(False))

    @cute.jit
    def p_to_operand(self, acc_s: cute.Tensor, tOrP: cute.Tensor, ncols: cutlass.Constexpr = 0):
        """P (fp32 accumulator order) -> E4M3 A-operand registers, no shuffles (V^T keys are
        permuted to match, layout.KEY_PERM).  ``ncols``: S holds the tile's first ncols columns
        (first_key_tile), P's later k steps are zero."""
        p_f32 = cute.make_rmem_tensor_like(tOrP, Float32)
        for kb in cutlass.range_constexpr(self.tile_n // 32):
            for h in cutlass.range_constexpr(2):
                for r in cutlass.range_constexpr(2):
                    for i4 in cutlass.range_constexpr(4):
                        # A value (i4, r, h, kb) is key 32kb + 16h + 4q + i4 to the MMA; it
                        # takes accumulator column block j = 4kb + 2h + i4//2, element i4%2.
                        src = (i4 % 2) + 2 * r + 4 * (4 * kb + 2 * h + i4 // 2)
                        if cutlass.const_expr(32 * kb >= self.s_width(ncols)):
                            p_f32[i4 + 4 * r + 8 * h + 16 * kb] = Float32(0.0)
                        else:
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
