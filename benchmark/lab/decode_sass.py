"""Lab: what one key block of the paged split-KV FP8 decode kernel costs in instructions, on a CPU.

The kernel is compiled for sm_90a as a real launch specializes it (``decode_regs.compile_split``),
``cuobjdump -sass`` disassembles it, and the key loop (the longest backward branch) is counted by
opcode: its shared-memory loads (LDS.U8 is one byte a load), conversions (F2FP), tensor-core MMAs
(HMMA), byte permutes (PRMT), register moves and the rest, at each model shape's own launch plan.

Static counts say what a GPU must issue, not how fast it runs. The committed
``benchmark/results/cpu/decode_sass-triton3.6.0.md`` compares V read as bytes (P @ V reduces over V's
rows and ldmatrix cannot transpose 8-bit data on SM90, so Triton fetches the staged fp8 V tile one
byte a load) with V read as 32-bit words made fp16 in registers (commit deb21cf's ``V_WORDS``
candidate): the words cut the loop's instructions to 0.79-0.83x under Triton 3.6.0, yet took
1.03-1.05x the time at d128 on an H100 (``benchmark/results/h100/decode-other-v.md``), so the
kernel is not bound by what it issues, and the candidate left the kernel.

    python benchmark/lab/decode_sass.py [--out DIR]     # -> DIR/decode_sass-tritonX.Y.Z.md

Triton's code generation differs between versions; run it under the Triton a GPU run uses.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmark.lab import decode_regs as R  # noqa: E402
from sglang_fa4.kernels.fp8_paged_kv import decode_plan as S  # noqa: E402

#: (label, head dim, group, q dtype): the decode shapes of the models the matrix times (one decode
#: row each), with the plan's own launch config
CONFIGS = [
    ("Llama-3-8B d128 GQA 4", 128, 4, "fp8"),
    ("Qwen2.5-7B d128 GQA 7", 128, 7, "fp8"),
    ("d256 GQA 2 (Gemma-4 sliding layers)", 256, 2, "fp8"),
    ("Gemma-4 d512 GQA 8, bf16 q", 512, 8, "bf16"),
]
#: opcode classes reported apart (the rest is summed as "other")
CLASSES = ("LDS.U8", "LDS", "LDSM", "STS", "LDGSTS", "F2FP", "HMMA", "PRMT", "IMAD.MOV", "MUFU")
_INSTR = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?);")
_TARGET = re.compile(r"\bBRA\b.*?0x([0-9a-f]+)")


def instructions(sass: str) -> list[tuple[int, str]]:
    """(address, instruction text without its predicate) for every SASS instruction."""
    out = []
    for line in sass.splitlines():
        m = _INSTR.match(line)
        if m:
            out.append((int(m.group(1), 16), re.sub(r"^@!?U?P\w+\s+", "", m.group(2).strip())))
    return out


def key_loop(ins: list[tuple[int, str]]) -> list[str]:
    """The instructions of the longest loop (from a backward branch's target to the branch)."""
    best = (0, 0, -1)
    for addr, text in ins:
        m = _TARGET.search(text)
        if m and int(m.group(1), 16) < addr:
            lo = int(m.group(1), 16)
            n = sum(1 for a, _ in ins if lo <= a <= addr)
            best = max(best, (n, lo, addr))
    if best[0] == 0:
        raise ValueError("no loop found in the SASS")
    return [t for a, t in ins if best[1] <= a <= best[2]]


def classify(op: str) -> str:
    if op.startswith("LDS.U8") or op.startswith("LDS.S8"):
        return "LDS.U8"
    if op.startswith("IMAD.MOV"):
        return "IMAD.MOV"
    base = op.split(".")[0]
    return base if base in CLASSES else "other"


def count(cfg: tuple) -> dict:
    label, d, g, q = cfg
    p = S.plan(1, 1, g, d, 1, 8192, 132)
    kernel = R.compile_split(d, p.block_m, p.block_n, p.num_warps, p.num_stages, q, True, g, p.maxnreg, False)
    loop = key_loop(instructions(R.cuobjdump(kernel, "-sass")))
    by = collections.Counter(classify(t.split()[0]) for t in loop)
    return {"config": label, "head_dim": d, "group": g, "q": q,
            "launch": {"block_m": p.block_m, "block_n": p.block_n, "num_warps": p.num_warps,
                       "num_stages": p.num_stages, "maxnreg": p.maxnreg},
            "loop_instructions": len(loop), "by_class": {c: by.get(c, 0) for c in (*CLASSES, "other")},
            "per_key": round(len(loop) / p.block_n, 2)}


def render(rows: list[dict], meta: dict) -> str:
    out = ["# The decode kernel's key loop in SASS (sm_90a, on a CPU)", "",
           f"Triton {meta['triton']}, `{meta['command']}`. One iteration of the key loop (one key block) per "
           "thread, counted by opcode in the cubin Triton builds for sm_90a; static counts, not timings.", "",
           "| config | launch (bm, bn, warps, stages) | loop instructions | per key | "
           + " | ".join(CLASSES) + " | other |",
           "|---|---|---|---|" + "---|" * (len(CLASSES) + 1)]
    for r in rows:
        la = r["launch"]
        out.append(f"| {r['config']} | {la['block_m']}, {la['block_n']}, {la['num_warps']}, {la['num_stages']} | "
                   f"{r['loop_instructions']} | {r['per_key']} | "
                   + " | ".join(str(r["by_class"][c]) for c in (*CLASSES, "other")) + " |")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None, help="write decode_sass-tritonVERSION.md here")
    R.report("decode_sass", [count(cfg) for cfg in CONFIGS], render, ap.parse_args().out)


if __name__ == "__main__":
    main()
