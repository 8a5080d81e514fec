"""What one compiled SM90 FP8 attention kernel is built with beyond its variant (head dim, mask):
:class:`Fp8KernelConfig`, and :data:`DEFAULT_CONFIGS`, the one table of the configs the product
compiles, one row per :class:`~.layout.Fp8Variant`.

Each row is what measured fastest on the H200 (benchmark/results/h200/fp8_attention_*.md, cited per
field below); the alternatives measured and left off live in the lab
(benchmark/lab/NOTES-fp8-variants.md).  Pure Python: no cutlass, testable on a CPU.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from sglang_fa4.kernels.fp8_sm90.layout import SUPPORTED_HEAD_DIMS, TWO_LEVEL_MAX_HEAD_DIM, Fp8Variant, narrow_widths


@dataclass(frozen=True)
class Fp8KernelConfig:
    """The compile-time choices of one kernel (everything else is a runtime argument).

    * ``tile_n``: keys per K/V^T tile (a multiple of 32, the PV GEMM's k step).
    * ``stages``: K/V^T stages in shared memory (what fits beside Q; layout.head_dim_stages,
      tile_stages, persistent_stages).
    * ``two_level``: O accumulated as fp32 O + each tile's fp32 P V (Hopper's FP8 MMA accumulates
      with reduced precision) -- two (64 x d) accumulators, so head dims up to 128 only; else the PV
      GEMM accumulates into O itself (consumer_mainloop_wide, FA3's way).  The two-level loop takes
      its row sums from the tensor cores (P x a block of E4M3 ones with the PV GEMM, ``rowsum_mma``).
    * ``pingpong``: the two consumer warpgroups take turns issuing their GEMMs (named barriers), so
      one's softmax runs while the other's GEMMs hold the tensor cores.
    * ``pingpong_late``: the turn is passed once S is complete (two-level loop), not right after the
      GEMM issue (FA3's scheduler barrier).
    * ``emu``: every emu-th exp2 of a row on the FMA pipe instead of the MUFU (0: none).
    * ``persistent``: min(work, SMs) CTAs looping over (q tile, head) slots (persistent_entry.py),
      the d=128 non-causal one-level kernel only; it comes with the narrow first key tile
      (first_key_tile.py), K and V^T behind their own barriers (kv_pipes.py) and O stored by TMA.
    """

    tile_n: int
    stages: int
    two_level: bool
    pingpong: bool = False
    pingpong_late: bool = False
    emu: int = 0
    persistent: bool = False

    def __post_init__(self):
        if self.tile_n % 32 or not 32 <= self.tile_n <= 256:
            raise ValueError(f"tile_n {self.tile_n}: a multiple of 32 (the PV GEMM's k step) up to 256")
        if self.stages < 2:
            raise ValueError(f"stages {self.stages}: at least 2 (a K/V^T stage is read while the next loads)")
        if self.pingpong_late and not (self.pingpong and self.two_level):
            raise ValueError("pingpong_late: a hand-over of the two-level loop's ping-pong (needs pingpong, two_level)")
        if self.emu < 0:
            raise ValueError(f"emu {self.emu}: 0 (none) or every emu-th exp2")
        if self.persistent and self.two_level:
            raise ValueError("persistent: the persistent kernel runs the one-level loop (two_level=False)")
        if self.pingpong and not self.two_level and not self.persistent:
            raise ValueError("pingpong in the one-level loop: the persistent kernel's (its turns run on across tiles)")
        if self.persistent and not narrow_widths(self.tile_n):
            raise ValueError(f"persistent: its narrow first key tile needs a key tile that 64 or 96 divide, "
                             f"got {self.tile_n}")

    # The switches that come with the ones above (plain properties: one source of truth).
    @property
    def rowsum_mma(self) -> bool:
        """Row sums as P x ones on the tensor cores: the two-level loop's (its ones block costs
        shared memory the one-level loop's wide stages need)."""
        return self.two_level

    @property
    def narrow(self) -> bool:
        """The first key tile's QK^T at the least width that holds its keys (first_key_tile.py)."""
        return self.persistent

    @property
    def kv_split(self) -> bool:
        """K and V^T of a stage behind their own barriers (kv_pipes.py)."""
        return self.persistent

    @property
    def pass_after_issue(self) -> bool:
        """The ping-pong turn passed right after the GEMM issue (FA3's scheduler barrier)."""
        return self.pingpong and not self.pingpong_late

    def check_variant(self, variant: Fp8Variant) -> None:
        """Raise ValueError if this config cannot build ``variant``."""
        if self.two_level and variant.head_dim > TWO_LEVEL_MAX_HEAD_DIM:
            raise ValueError(f"two_level at head dim {variant.head_dim}: the two fp32 accumulators do not fit the "
                             f"consumers' registers above {TWO_LEVEL_MAX_HEAD_DIM}")
        if self.persistent and (variant.head_dim != 128 or variant.causal or variant.local):
            raise ValueError(f"persistent: the d=128 non-causal kernel only, got {variant.describe()}")

    def replace(self, **changes) -> "Fp8KernelConfig":
        """A copy with ``changes`` (checked like any config): what a benchmark passes to compare."""
        return dataclasses.replace(self, **changes)


_TWO_LEVEL = Fp8KernelConfig(tile_n=128, stages=4, two_level=True)
# d=128 causal / windowed: ping-pong with the turn passed once S is complete, every 8th exp2 on the
# FMA pipe: 3-5% less time (git show 244b9bd:benchmark/results/h200/fp8_attention_speed3.md)
_D128_MASKED = Fp8KernelConfig(tile_n=128, stages=4, two_level=True, pingpong=True, pingpong_late=True, emu=8)
# d=128 non-causal: 128 x 192 tiles, O accumulated by the PV GEMM, ping-pong passed after the issue
# (git show 244b9bd:benchmark/results/h200/fp8_attention_speed4.md), persistent CTAs (the speed5,
# persist and speed6 runs at the same commit), narrow first key tiles + split K/V^T barriers
# (benchmark/results/h200/fp8_attention_kvsplit.md, fp8_attention_default2.md: 1.34x / 1.44x FA4 bf16); 3 stages
# beside the two Q buffers and the O staging buffers
_D128_FULL = Fp8KernelConfig(tile_n=192, stages=3, two_level=False, pingpong=True, persistent=True)
_D192 = Fp8KernelConfig(tile_n=128, stages=3, two_level=False)
_D256 = Fp8KernelConfig(tile_n=128, stages=2, two_level=False)
# d=256 causal: 96-key tiles, 3 stages: 1.26x FA4 bf16 at 1x8192 against 0.89x with 128 keys
# (fp8_attention_d256_tiles.md)
_D256_CAUSAL = Fp8KernelConfig(tile_n=96, stages=3, two_level=False)


def _rows(head_dim: int, full: Fp8KernelConfig, causal: Fp8KernelConfig, local: Fp8KernelConfig) -> dict:
    return {Fp8Variant(head_dim, False, False): full, Fp8Variant(head_dim, True, False): causal,
            Fp8Variant(head_dim, False, True): local}


#: The config of every kernel the product compiles: (head dim, causal, local) -> config.
DEFAULT_CONFIGS: dict = {
    **_rows(64, _TWO_LEVEL, _TWO_LEVEL, _TWO_LEVEL),
    **_rows(96, _TWO_LEVEL, _TWO_LEVEL, _TWO_LEVEL),
    **_rows(128, _D128_FULL, _D128_MASKED, _D128_MASKED),
    **_rows(192, _D192, _D192, _D192),
    **_rows(256, _D256, _D256_CAUSAL, _D256),
}


def default_config(variant: Fp8Variant) -> Fp8KernelConfig:
    """The table's config for ``variant``."""
    try:
        return DEFAULT_CONFIGS[variant]
    except KeyError:
        raise ValueError(f"no FP8 kernel for {variant!r} (head dims {SUPPORTED_HEAD_DIMS})") from None
