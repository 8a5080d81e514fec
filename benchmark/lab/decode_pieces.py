"""Lab: the decode kernel's head dim in one piece or two, under the register caps that let more CTAs
share an SM. On a CPU.

Decode is bandwidth-bound and wants many CTAs an SM; the split kernel's registers bound how many
(255 a thread at d256 and d512: 2 CTAs of 4 warps). A cap (Triton's ``maxnreg``) raises the count,
but with the whole head dim's K/V tile converted in registers the capped kernel spills. With
``decode_plan`` launch ``d_pieces=2`` the key loop takes the head dim as two column pieces, each its
own pair of products (QK summed over the pieces, P @ V per piece), so only half a tile is live at
once. This compiles the kernel for sm_90a at each decode shape's launch plan, one piece and two,
uncapped and capped, and reports ptxas's registers, its stack bytes (spill) and the dynamic shared
memory, with the CTAs an SM holds by registers and by shared memory. Static facts, not timings (a GPU
times the variants: ``decode_tune.py --sweep candidate``).

    python benchmark/lab/decode_pieces.py [--out DIR]    # -> DIR/decode_pieces-tritonX.Y.Z.md
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmark.lab import decode_regs as R  # noqa: E402
from sglang_fa4.kernels.fp8_paged_kv import decode_plan as S  # noqa: E402

#: (label, head dim, group, q dtype, register caps to compile under: None is the plan's own)
CONFIGS = [
    ("Llama-3-8B d128 GQA 4, decode", 128, 4, "fp8", (None, 96)),
    ("d256 GQA 2 (Gemma-4 sliding), decode", 256, 2, "fp8", (None, 168, 128)),
    ("Gemma-4 d512 GQA 8 bf16 q, decode", 512, 8, "bf16", (None, 168)),
]

#: an H100 / H200 SM: registers, shared memory (bytes, with the 1 KiB each CTA reserves), CTAs
SM_REGISTERS, SM_SHARED, SM_CTAS, CTA_RESERVED_SHARED = 65536, 233472, 32, 1024


def ctas_per_sm(registers: int, warps: int, shared: int) -> dict:
    """CTAs an SM holds by its registers (allocated per warp in units of 256) and by shared memory."""
    per_warp = -(-registers * 32 // 256) * 256
    return {"by_registers": min(SM_CTAS, SM_REGISTERS // (per_warp * warps)),
            "by_shared": min(SM_CTAS, SM_SHARED // (shared + CTA_RESERVED_SHARED))}


def one(cfg: tuple, cap, pieces: int) -> dict:
    label, d, g, q, _ = cfg
    p = S.plan(1, 1, g, d, 1, 8192, 132)
    maxnreg = cap if cap is not None else p.maxnreg
    res = R.kernel_resources(R.compile_split(d, p.block_m, p.block_n, p.num_warps, p.num_stages, q, True, g, maxnreg,
                                             False, d_pieces=pieces))
    return {"config": label, "d_pieces": pieces, "maxnreg": maxnreg,
            "launch": {"block_m": p.block_m, "block_n": p.block_n, "num_warps": p.num_warps,
                       "num_stages": p.num_stages},
            "registers": res["reg"], "stack_bytes": res["stack"], "dynamic_shared_bytes": res["dyn_shared"],
            **ctas_per_sm(res["reg"], p.num_warps, res["shared"] + res["dyn_shared"])}


def render(rows: list[dict], meta: dict) -> str:
    out = ["# The decode kernel's head dim in one piece or two, under register caps (sm_90a, on a CPU)", "",
           f"Triton {meta['triton']}, `{meta['command']}`. The split kernel compiled at each shape's launch "
           "plan with the head dim as one column piece or two (`decode_plan` launch `d_pieces`), uncapped or "
           "under a register cap (`maxnreg`): ptxas's registers and stack bytes (spill), the dynamic shared "
           "memory, and the CTAs an SM holds by registers and by shared memory (the lower bounds it). Static "
           "facts, not timings.", "",
           "| config | launch (bm, bn, warps, stages) | register cap | pieces | registers | stack bytes | "
           "dynamic shared bytes | CTAs an SM (registers / shared) |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        la = r["launch"]
        out.append(f"| {r['config']} | {la['block_m']}, {la['block_n']}, {la['num_warps']}, {la['num_stages']} | "
                   f"{r['maxnreg'] or 'none'} | {r['d_pieces']} | {r['registers']} | {r['stack_bytes']} | "
                   f"{r['dynamic_shared_bytes']} | {r['by_registers']} / {r['by_shared']} |")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None, help="write decode_pieces-tritonVERSION.md here")
    rows = [one(cfg, cap, pieces) for cfg in CONFIGS for cap in cfg[4] for pieces in (1, 2)]
    R.report("decode_pieces", rows, render, ap.parse_args().out)


if __name__ == "__main__":
    main()
