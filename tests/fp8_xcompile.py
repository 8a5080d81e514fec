"""Cross-compile sglang_fa4's SM90 FP8 attention forward on a machine without a GPU and report
what the PTX holds (run in a fresh process: the CuTe DSL reads its target at import).

    CUTE_DSL_ARCH=sm_90a CUTE_DSL_KEEP=ptx CUTE_DSL_DUMP_DIR=OUT \
        python tests/fp8_xcompile.py --dump-dir OUT --variant 128,0,0 [--variant 64,1,0 ...]

A variant is head_dim,causal,local, optionally followed by :name=value,... -- fields of its
kernel config that differ from the table's (kernel_config.Fp8KernelConfig); ``--variant defaults`` is every kernel the product compiles
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
        "setmaxnreg": re.findall(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+)", ptx),
        "named_bar_arrive": len(re.findall(r"\bbar\.arrive\s+[12],\s*256;", ptx)),
        "wgmma_wait_1": len(re.findall(r"wgmma\.wait_group\.sync\.aligned\s+1;", ptx)),
        # the no-op behind a branch that keeps ptxas from hoisting the PV wait (consumer_mainloop.pin_below)
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
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump-dir", required=True)
    ap.add_argument("--variant", action="append", required=True)
    ap.add_argument("--record", help="write the variants' sha256 and the DSL version to this JSON file "
                                     "(tests/fp8_default_ptx.json after a deliberate kernel change)")
    args = ap.parse_args()
    from benchmark.lab.fp8_kernel_configs import config_for
    from sglang_fa4.kernels.fp8_sm90.launch import compile_variant
    from sglang_fa4.kernels.fp8_sm90.layout import Fp8Variant, all_variants

    dump = Path(args.dump_dir)
    specs = []
    for spec in args.variant:
        specs += ([f"{v.head_dim},{int(v.causal)},{int(v.local)}" for v in all_variants()] if spec == "defaults"
                  else [spec])
    out = {"cutlass_dsl": importlib.metadata.version("nvidia-cutlass-dsl"), "variants": {}}
    for spec in specs:
        shape, _, changes = spec.partition(":")
        d, causal, local = (int(x) for x in shape.split(","))
        # each variant's PTX goes to its own directory: the file name does not tell causal from not,
        # so the next compile would overwrite it
        ptx_dir = dump / spec.replace(",", "_").replace(":", "-")
        print(f"== variant {spec}", file=sys.stderr, flush=True)
        t = time.perf_counter()
        variant = Fp8Variant(d, bool(causal), bool(local))
        compile_variant(variant, config=config_for(variant, changes))
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
