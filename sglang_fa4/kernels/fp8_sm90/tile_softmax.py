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

from sglang_fa4.kernels.fp8_sm90.kernel_shape import F8, WG_ROWS
from sglang_fa4.kernels.fp8_sm90.layout import P_LOG2_OFFSET

#: The row max and row sum of a tile run as this many interleaved serial chains (a shorter
#: dependent chain, few live partials; forward.py: part of the speed2 loop).
ROW_CHAINS = 4


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
        if need_mask != 0:
            self.apply_mask(acc_s, tScS, row_start, col0, seqlen_k, diag, window_left, window_right)

    @cute.jit
    def softmax_tile(self, acc_s: cute.Tensor, row_max: cute.Tensor, row_sum: cute.Tensor, factor: cute.Tensor,
                     scale_log2: Float32, ncols: cutlass.Constexpr = 0):
        """Online softmax in place (2 rows per thread; a row lives in one quad): acc_s becomes
        P = exp2(s*scale - max*scale + 8), factor the rescale of everything before this tile.
        ``ncols``: S holds the tile's first ncols columns (0: all; first_key_tile)."""
        bias = cute.make_rmem_tensor((2,), Float32)
        for r in cutlass.range_constexpr(2):
            self.row_max_step(acc_s, row_max, factor, bias, scale_log2, r, ncols)
            self.exp_row_step(acc_s, row_sum, factor, bias, scale_log2, r, ncols)

    @cute.jit
    def row_max_step(self, acc_s: cute.Tensor, row_max: cute.Tensor, factor: cute.Tensor, bias: cute.Tensor,
                     scale_log2: Float32, r: cutlass.Constexpr, ncols: cutlass.Constexpr = 0):
        """Row r's new maximum (quad shuffles), its rescale factor and the exp2 bias."""
        blocks = self.s_width(ncols) // 8
        mx = cute.arch.fmax(row_max[r], _chains_reduce(
            [acc_s[e + 2 * r + 4 * j] for j in range(blocks) for e in range(2)], cute.arch.fmax, ROW_CHAINS))
        mx = cute.arch.fmax(mx, cute.arch.shuffle_sync_bfly(mx, offset=1))
        mx = cute.arch.fmax(mx, cute.arch.shuffle_sync_bfly(mx, offset=2))
        m_use = mx
        if mx == -Float32.inf:
            m_use = Float32(0.0)
        factor[r] = cute.math.exp2((row_max[r] - m_use) * scale_log2, fastmath=True)
        row_max[r] = mx
        bias[r] = m_use * scale_log2 - P_LOG2_OFFSET

    @cute.jit
    def exp_row_step(self, acc_s: cute.Tensor, row_sum: cute.Tensor, factor: cute.Tensor, bias: cute.Tensor,
                     scale_log2: Float32, r: cutlass.Constexpr, ncols: cutlass.Constexpr = 0):
        """Row r's P = exp2(s * scale - bias) in place, and its running sum (unless rowsum_mma)."""
        self._row_exps(acc_s, bias, scale_log2, r, ncols)
        self._row_sum(acc_s, row_sum, factor, r, ncols)

    # Plain Python: runs at trace time, inlined like the code it stands for.
    def _row_exps(self, acc_s, bias, scale_log2, r: int, ncols: int = 0):
        """Row r's P = exp2(s * scale - bias) in place (its first ``ncols`` columns; 0: all)."""
        for j in range(self.s_width(ncols) // 8):
            for e in range(2):
                v = e + 2 * r + 4 * j
                if self.emu > 0 and (2 * j + e) % self.emu == self.emu - 1:
                    acc_s[v] = exp2_on_fma(acc_s[v] * scale_log2 - bias[r])  # FMA pipe, not MUFU
                else:
                    acc_s[v] = cute.math.exp2(acc_s[v] * scale_log2 - bias[r], fastmath=True)

    def _row_sum(self, acc_s, row_sum, factor, r: int, ncols: int = 0):
        """row_sum[r] = row_sum[r] * factor[r] + row r's sum of P (with rowsum_mma the PV GEMM's
        companion P x ones sums the row, consumer_mainloop: only the rescale here)."""
        s = Float32(0.0)
        if not self.rowsum_mma:
            s = _chains_reduce([acc_s[e + 2 * r + 4 * j] for j in range(self.s_width(ncols) // 8) for e in range(2)],
                               lambda a, b: a + b, ROW_CHAINS)
        row_sum[r] = row_sum[r] * factor[r] + s

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
