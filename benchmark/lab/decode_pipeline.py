"""Lab: does Triton keep the decode kernel's K/V loads in flight under the products? On a CPU.

The split kernel is compiled for sm_90a at each model shape's own launch plan
(``decode_regs.compile_split``), with the page indices loaded inside each key block (the default)
and one block ahead (``decode_plan.PREFETCH_PAGES``). In the Triton GPU IR of the key loop, the
K/V tiles' shared-memory buffers (``NxBLOCK_NxD``: N tiles in flight) and the ``async_wait`` counts
(the copy groups left outstanding while a tile is consumed: 0 waits for every copy, so the next
tile's load is not in flight during the products) say whether the software pipeline overlaps
memory with compute; ptxas's registers and spill (stack bytes) and the dynamic shared memory say
what it costs. Static facts about the compiled code, not timings (a GPU times the candidate:
``bench decode --backends fa4_fp8_split_kv fa4_fp8_split_kv_candidate fa3_fp8``).

    python benchmark/lab/decode_pipeline.py [--out DIR]    # -> DIR/decode_pipeline-tritonX.Y.Z.md
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmark.lab import decode_regs as R  # noqa: E402
from sglang_fa4.kernels.fp8_paged_kv import decode_plan as S  # noqa: E402

#: (label, head dim, group, q dtype, query rows): a decode step and a short extend per model shape
CONFIGS = [
    ("Llama-3-8B d128 GQA 4, decode", 128, 4, "fp8", 4),
    ("Llama-3-8B d128 GQA 4, 16-token extend", 128, 4, "fp8", 64),
    ("Qwen2.5-7B d128 GQA 7, decode", 128, 7, "fp8", 7),
    ("d256 GQA 2 (Gemma-4 sliding), decode", 256, 2, "fp8", 2),
    ("d256 GQA 2 (Gemma-4 sliding), 32-token extend", 256, 2, "fp8", 64),
    ("Gemma-4 d512 GQA 8 bf16 q, decode", 512, 8, "bf16", 8),
    ("Gemma-4 d512 GQA 8 bf16 q, prefill", 512, 8, "bf16", 8 * 4096),
]


def pipeline_facts(ttgir: str) -> dict:
    """The K/V buffers (shapes of the fp8 shared-memory allocations) and the ``async_wait`` counts."""
    return {"kv_buffers": sorted(set(re.findall(r"memdesc<([0-9x]+)xf8E4M3FN", ttgir))),
            "async_waits": [int(n) for n in re.findall(r"async_wait[^{\n]*\{num = (\d+)", ttgir)]}


def in_flight(facts: dict) -> bool:
    """Whether a copy stays outstanding while a tile is consumed (some wait leaves groups in flight)."""
    return any(n > 0 for n in facts["async_waits"])


def one(cfg: tuple, prefetch: bool) -> dict:
    label, d, g, q, rows = cfg
    p = S.plan(1, 1, g, d, max(1, rows // g), 8192, 132)
    kernel = R.compile_split(d, p.block_m, p.block_n, p.num_warps, p.num_stages, q, True, g, p.maxnreg, False,
                             prefetch_pages=prefetch)
    facts = pipeline_facts(kernel.asm["ttgir"])
    res = R.kernel_resources(kernel)
    return {"config": label, "prefetch_pages": prefetch,
            "launch": {"block_m": p.block_m, "block_n": p.block_n, "num_warps": p.num_warps,
                       "num_stages": p.num_stages, "maxnreg": p.maxnreg},
            **facts, "loads_in_flight": in_flight(facts), "registers": res["reg"], "stack_bytes": res["stack"],
            "dynamic_shared_bytes": res["dyn_shared"]}


def render(rows: list[dict], meta: dict) -> str:
    out = ["# The decode kernel's software pipeline: page indices inside each key block or one block ahead "
           "(sm_90a, on a CPU)", "",
           f"Triton {meta['triton']}, `{meta['command']}`. From the Triton GPU IR of the kernel compiled at each "
           "shape's launch plan: the K/V shared-memory buffers (N x block_n x d: N tiles in flight), the "
           "`async_wait` counts (0: every copy waited for before a tile is used), ptxas registers / spill "
           "and the dynamic shared memory. Static facts, not timings.", "",
           "| config | launch (bm, bn, warps, stages) | page indices | K/V buffers | async_wait counts | "
           "loads in flight under the products | registers | spill bytes | dynamic shared bytes |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        la = r["launch"]
        out.append(f"| {r['config']} | {la['block_m']}, {la['block_n']}, {la['num_warps']}, {la['num_stages']} | "
                   f"{'one block ahead' if r['prefetch_pages'] else 'inside the block'} | "
                   f"{', '.join(r['kv_buffers'])} | {', '.join(map(str, r['async_waits']))} | "
                   f"{'yes' if r['loads_in_flight'] else 'no'} | {r['registers']} | {r['stack_bytes']} | "
                   f"{r['dynamic_shared_bytes']} |")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None, help="write decode_pipeline-tritonVERSION.md here")
    rows = [one(cfg, prefetch) for cfg in CONFIGS for prefetch in (False, True)]
    R.report("decode_pipeline", rows, render, ap.parse_args().out)


if __name__ == "__main__":
    main()
