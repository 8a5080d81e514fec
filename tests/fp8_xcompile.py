"""Cross-compile sglang_fa4's SM90 FP8 attention forward on a machine without a GPU and report
what the PTX holds (run in a fresh process: the CuTe DSL reads its target at import).

    CUTE_DSL_ARCH=sm_90a CUTE_DSL_KEEP=ptx CUTE_DSL_DUMP_DIR=OUT \
        python tests/fp8_xcompile.py --dump-dir OUT --variant 128,0,0 [--variant 64,1,0 ...]

A variant is head_dim,causal,local; ``--variant defaults`` is every kernel the product compiles
(``layout.all_variants()``: d 64/96/128/192/256, full / causal / windowed -- the paged-KV route
launches the same ones).  Prints one JSON object: per variant, the PTX file, its sha256
(:func:`ptx_sha256`) and counts of the instructions that make it an FP8 attention kernel; with
CUTE_DSL_COMPILER_OPT=remarks{ptx} each variant's ptxas lines follow a marker line on stderr.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def ptx_sha256(ptx: str) -> str:
    """sha256 of the PTX with each kernel entry's symbol (which spells the Python module, class and
    method the DSL traced) renamed to ``kernel_<i>``: renaming or moving Python code leaves it
    alone, any change to an instruction, register, parameter or constant does not."""
    names = re.findall(r"^\.visible \.entry\s+(\w+)\(", ptx, re.M)
    for i, name in enumerate(names):
        ptx = ptx.replace(name, f"kernel_{i}")
    return hashlib.sha256(ptx.encode()).hexdigest()


def facts(ptx: str) -> dict:
    wgmma = re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)\.f32\.(\w+)\.(\w+)", ptx)
    return {
        "wgmma_e4m3": sorted({f"{s}.{a}.{b}" for s, a, b in wgmma if a == b == "e4m3"}),
        "wgmma_other": sorted({f"{s}.{a}.{b}" for s, a, b in wgmma if not a == b == "e4m3"}),
        "wgmma_count": len(wgmma),
        "cvt_e4m3x2": len(re.findall(r"cvt\.rn\.satfinite\.e4m3x2\.f32", ptx)),
        "tma_loads": len(re.findall(r"cp\.async\.bulk\.tensor\.\dd\.shared::cta\.global", ptx)),
        # waits on a pipeline's barriers (kv_split: V^T's own full / empty barriers add three)
        "mbar_waits": len(re.findall(r"\bmbarrier\.try_wait\.parity\.shared\.b64", ptx)),
        "setmaxnreg": re.findall(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+)", ptx),
        "named_bar_arrive": len(re.findall(r"\bbar\.arrive\s+[12],\s*256;", ptx)),
        # the ping-pong ring's barrier ids (wg3: 1, 2, 3) and the CTA's threads
        "bar_arrive_ids": sorted(set(re.findall(r"\bbar\.arrive\s+(\d+),\s*256;", ptx))),
        "reqntid": re.findall(r"\.reqntid\s+(\d+)", ptx),
        # warp votes (lazy_max: O's rescale skipped; stale_exp: the stale path and P's rescale)
        "votes": sorted(re.findall(r"\bvote\.sync\.(all|any)\.pred", ptx)),
        # arrives / waits on a barrier id held in a register (mufu_gate's ISSUED_BAR + warpgroup)
        "reg_bar_arrive": len(re.findall(r"\bbar\.arrive\s+%r\d+,\s*256;", ptx)),
        "reg_bar_sync_256": len(re.findall(r"\bbar\.sync\s+%r\d+,\s*256;", ptx)),
        "wgmma_wait_1": len(re.findall(r"wgmma\.wait_group\.sync\.aligned\s+1;", ptx)),
        # the no-op behind a branch that keeps ptxas from hoisting the PV wait (forward.pin_wait)
        "warp_sync": len(re.findall(r"\bbar\.warp\.sync\b", ptx)),
        # the compare whose branch skips that no-op: it must be false in every lane for every P
        # (>= 0, +inf, NaN), ordered "eq" against -1 (an unordered "leu" split a warp on NaN: hang)
        "pin_skip": [m[0] for m in re.findall(
            r"setp\.(\w+)\.f32\s+(%p\d+), %r\d+, 0fBF800000;\s*@\2 bra\s+\S+;\s*bar\.warp\.sync", ptx)],
        # the grid: (q tiles of all sequences, heads), no batch axis (KernelEntry.locate_tile)
        "ctaid": sorted(set(re.findall(r"%ctaid\.([xyz])", ptx))),
        # the persistent kernel: a grid-stride loop over work slots, O stored by TMA from stmatrix
        "nctaid": sorted(set(re.findall(r"%nctaid\.([xyz])", ptx))),
        "tma_stores": len(re.findall(r"cp\.async\.bulk\.tensor\.\dd\.global\.shared::cta", ptx)),
        "stmatrix": len(re.findall(r"\bstmatrix\.sync\.aligned", ptx)),
        "bulk_wait_read": len(re.findall(r"cp\.async\.bulk\.wait_group\.read\s+0;", ptx)),
        "target": (re.search(r"^\.target\s+(\S+)", ptx, re.M) or [None, None])[1],
        # mufu_token: per softmax, the exp2s between the turn's wait (a shared store of the row
        # maxima's result, the wait on a register barrier id, the load of the word of 0.0) and the
        # hand-over (an arrive on a register barrier id); and the exp2s outside those spans
        "mufu_spans": _mufu_spans(ptx),
        # pp_max: per ping-pong hand-over after a GEMM wait (bar.arrive 1|2, 256), the row-max and
        # exp2 instructions between that wait and it, and the exp2s after it (to the next GEMM)
        "turn_spans": _turn_spans(ptx),
    }


def _turn_spans(ptx: str) -> list:
    lines = ptx.split("\n")
    spans = []
    for i, line in enumerate(lines):
        if not re.search(r"\bbar\.arrive\s+[12],\s*256;", line):
            continue
        j = i
        while j > 0 and "wgmma.wait_group" not in lines[j]:
            j -= 1
        k = i
        while k < len(lines) - 1 and "wgmma.mma_async" not in lines[k] and "wgmma.wait_group" not in lines[k]:
            k += 1
        if j == 0:
            continue  # the first turn, opened before any GEMM
        before, after = lines[j:i], lines[i:k]
        spans.append([sum("max.f32" in x for x in before), sum("ex2.approx" in x for x in before),
                      sum("ex2.approx" in x for x in after)])
    return spans


def _mufu_spans(ptx: str) -> dict:
    take = re.compile(r"st\.shared\.b32[^\n]*\n(?:[^\n]*\n){0,2}?\s*bar\.sync\s+%r\d+, 256;\s*ld\.shared\.b32")
    give = re.compile(r"\bbar\.arrive\s+%r\d+,\s*256;")
    spans = []
    for m in take.finditer(ptx):
        g = give.search(ptx, m.end())
        if g is None:
            break
        spans.append(ptx.count("ex2.approx", m.end(), g.start()))
    return {"inside": spans, "total": ptx.count("ex2.approx")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump-dir", required=True)
    ap.add_argument("--variant", action="append", required=True)
    ap.add_argument("--flags", default="", help="Fp8AttentionForwardSm90 debug/variant switches, comma list")
    ap.add_argument("--record", help="write the variants' sha256 and the DSL version to this JSON file "
                                     "(tests/fp8_default_ptx.json after a deliberate kernel change)")
    args = ap.parse_args()
    from sglang_fa4.kernels.fp8_sm90.launch import compile_variant
    from sglang_fa4.kernels.fp8_sm90.layout import Fp8Variant, all_variants

    dump = Path(args.dump_dir)
    specs = []
    for spec in args.variant:
        specs += ([f"{v.head_dim},{int(v.causal)},{int(v.local)}" for v in all_variants()] if spec == "defaults"
                  else [spec])
    out = {"cutlass_dsl": importlib.metadata.version("nvidia-cutlass-dsl"), "variants": {}}
    for spec in specs:
        d, causal, local = (int(x) for x in spec.split(","))
        # each variant's PTX goes to its own directory: the file name does not tell causal from not,
        # so the next compile would overwrite it
        ptx_dir = dump / spec.replace(",", "_")
        print(f"== variant {spec}", file=sys.stderr, flush=True)
        t = time.perf_counter()
        compile_variant(Fp8Variant(d, bool(causal), bool(local)), debug=frozenset(f for f in args.flags.split(",") if f))
        new = sorted(dump.glob("*.ptx"))
        ptx_dir.mkdir()
        for p in new:
            os.replace(p, ptx_dir / p.name)
        row = out["variants"][spec] = {"seconds": round(time.perf_counter() - t, 1), "ptx_files": [p.name for p in new]}
        if new:
            ptx = (ptx_dir / new[-1].name).read_text()
            row.update(facts(ptx), sha256=ptx_sha256(ptx))
    sys.stderr.flush()
    if args.record:
        Path(args.record).write_text(json.dumps({
            "about": "sha256 of the sm_90a PTX of each default SM90 FP8 kernel (head_dim,causal,local), "
                     "cross-compiled by tests/fp8_xcompile.py --variant defaults; kernel entry symbols "
                     "renamed (fp8_xcompile.ptx_sha256)",
            "cutlass_dsl": out["cutlass_dsl"],
            "arch": os.environ.get("CUTE_DSL_ARCH"),
            "sha256": {spec: row.get("sha256") for spec, row in out["variants"].items()},
        }, indent=1) + "\n")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
