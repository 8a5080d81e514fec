"""The persistent SM90 FP8 kernel's switches (mixed into :class:`.forward.Fp8AttentionForwardSm90`,
called from its constructor once the main-loop switches are known): ``persist`` itself and its
variants -- ``xover`` / ``xover_pvfirst``, ``pp_max``, ``sum_mma``, ``wg3``, ``lazy_max`` /
``stale_exp``, ``kv_split`` -- each with the check that names what it cannot be combined with."""

from __future__ import annotations

from sglang_fa4.kernels.fp8_sm90.layout import persistent_stages
from sglang_fa4.kernels.fp8_sm90.persistent_entry import Q_STAGES
from sglang_fa4.kernels.fp8_sm90.schedule import DEFAULT_NUM_SMS


class PersistentSwitches:
    """``persistent_switches``: the persistent kernel's attributes from ``self.debug``."""

    def persistent_switches(self, head_dim: int, causal: bool, local: bool, num_stages: int, stages_flag: int,
                            num_sms: int):
        # Persistent CTAs ("persist", d=128 non-causal one-level loop; persistent_entry.py): a grid
        # of min(work, SMs) CTAs each looping over (q tile, head) work slots, Q double-buffered,
        # O stored through shared memory + TMA ("o_direct": from the registers, one more K/V^T
        # stage).  num_sms: the launch device's SM count (launch.py; 132 in cross-compiles).
        self.persistent = "persist" in self.debug and "no_persist" not in self.debug
        self.num_sms = int(num_sms) or DEFAULT_NUM_SMS
        self.o_tma = self.persistent and "o_direct" not in self.debug
        if self.persistent:
            if head_dim != 128 or causal or local or self.two_level or not self.overlap or self.mufu_gate:
                raise ValueError("persist: the persistent kernel is the d=128 non-causal one-level loop only "
                                 f"(got head dim {head_dim}, causal={causal}, local={local}, "
                                 f"two_level={self.two_level})")
            if stages_flag:
                raise ValueError("sN: a stage count of the non-persistent kernel (the persistent one sizes its own)")
            self.num_stages = num_stages or persistent_stages(head_dim, self.tile_n, Q_STAGES, self.o_tma,
                                                              self.tile_m)
        # Cross-tile overlap ("xover", with "persist"; persistent_xover.py): a tile's last PV GEMM is
        # issued with the next tile's first QK^T and its epilogue runs after the next tile's first
        # softmax, so the tensor cores do not drain at the CTA's tile boundaries.
        self.xover = self.persistent and "xover" in self.debug and "no_xover" not in self.debug
        if "xover" in self.debug and not self.persistent:
            raise ValueError("xover: a switch of the persistent kernel (give it together with persist)")
        # "xover_pvfirst": the cross step issues the tile's last PV GEMM before the next tile's first
        # QK^T and runs the epilogue while that QK^T is in flight (the default order, QK^T first, runs
        # the next tile's first softmax while the PV GEMM is in flight and the epilogue after it).
        self.xover_pv_first = self.xover and "xover_pvfirst" in self.debug
        if "xover_pvfirst" in self.debug and not self.xover:
            raise ValueError("xover_pvfirst: an order of the xover cross step (give it together with persist, xover)")
        # "pp_max" (persistent kernel): the ping-pong turn passed once this warpgroup's row maxima
        # are known, just before its exp2s, instead of right after its GEMM issue.  Why: Nsight
        # Compute of the default (fp8_attention_ncu_persist.md) has both warpgroups issuing their
        # GEMMs back to back, then both in their exp2 phase together (16 cycles a MUFU.EX2 where a
        # lone warp takes 8); passed here, the other warpgroup's GEMMs, S wait and row maxima run
        # during this one's exp2s, which then do not meet its own.  One turn per softmax as before.
        # Measured 4% slower than the default (fp8_attention_ppmax.md).
        self.pingpong_max = self.pingpong and "pp_max" in self.debug
        if "pp_max" in self.debug and (not self.persistent or self.xover or not self.pingpong):
            raise ValueError("pp_max: a turn order of the persistent kernel's ping-pong (not with xover or no_pingpong)")
        if self.pingpong_max:
            self.pingpong_late = False
        # "sum_mma" (persistent kernel, no xover): row sums from the tensor cores as in the two-level
        # loop (rowsum_mma: P times a block of E4M3 ones, m64n8 WGMMAs issued with each PV GEMM),
        # folded into fp32 after each tile and rescaled beside O, instead of 94 FADDs a key tile (7%
        # of the consumer's stall samples in fp8_attention_ncu_persist.md).  Its ones block: 2 x 8 x
        # tile_n bytes.  Measured 15% slower than the FADDs (fp8_attention_summma.md).
        self.sum_mma = self.persistent and not self.xover and "sum_mma" in self.debug
        if "sum_mma" in self.debug and not self.sum_mma:
            raise ValueError("sum_mma: a switch of the persistent kernel without xover (give it with persist)")
        # "wg3" (persistent kernel): a third consumer warpgroup, 192 x 96 tiles, consumers at 160
        # registers (kernel_shape.consumer_regs), the ping-pong a ring of three turns.  Why: the
        # profile (fp8_attention_ncu_persist.md) has a warpgroup's dependent chain per key tile (S
        # wait, row maxima, exp2s, P, the GEMM issue) longer than the other warpgroup's GEMMs, so
        # two warpgroups leave the tensor pipe idle half the time; with three, two others cover it.
        # Measured 3-10% slower than the default (fp8_attention_wg3.md, _wg3b.md).
        if self.consumer_wgs == 3 and (not self.persistent or self.xover or self.pingpong_max or self.mufu_token
                                       or self.sum_mma):
            raise ValueError("wg3: three consumer warpgroups are a variant of the persistent kernel alone "
                             "(give it with persist; not with xover, pp_max, mufu_token or sum_mma)")
        # "lazy_max" (persistent kernel): a row's max is raised only when a tile's exceeds it by
        # more than layout.LAZY_MAX_LOG2, so most tiles' factors are exactly 1 and O's rescale is
        # skipped by a warp vote.  "stale_exp" (implies it): the exp2s of a q tile's later key tiles
        # take the max from before the tile and the tile's own max is computed beside them, P
        # rescaled after if it moved (tile_softmax.stale_softmax_tile).  Why: the profile
        # (fp8_attention_ncu_persist.md) has the row maxima, 618 of a warp's 3303 cycles a key
        # tile, between S and the exp2s on the warpgroup's dependent chain.  Measured: lazy_max
        # within the noise, stale_exp 17% slower (fp8_attention_stale.md; fp8_attention_ncu_stale.md:
        # the MUFU streams then arrive in bursts, mio throttle).
        self.stale_exp = "stale_exp" in self.debug
        self.lazy_max = self.stale_exp or "lazy_max" in self.debug
        if self.lazy_max and (not self.persistent or self.xover or self.sum_mma):
            raise ValueError("lazy_max / stale_exp: switches of the persistent kernel (give them with persist; "
                             "not with xover or sum_mma)")
        # "kv_split" (persistent kernel, no xover): K and V^T of a stage behind their own barriers,
        # K freed once S is complete (kv_pipes.py; on by default, fp8_attention_kvsplit.md).
        self.kv_split = "kv_split" in self.debug
        if self.kv_split and (not self.persistent or self.xover):
            raise ValueError("kv_split: a switch of the persistent kernel without xover (give it with persist)")
