"""Cross-compile, for sm_90a on a machine without a GPU, one of each kind of sglang-fa4's CuTe
kernels under whatever CUTLASS DSL is first on PYTHONPATH (tests/test_xcompile_dsl_versions.py runs
this once per version a supported SGLang pins). Run in a fresh process (the DSL reads its target at
import) with CUTE_DSL_ARCH=sm_90a, CUTE_DSL_KEEP=ptx, CUTE_DSL_DUMP_DIR=OUT, FLASH_ATTENTION_ARCH=sm_90
and FLASH_ATTENTION_NUM_SMS=132:

    python tests/xcompile_dsl_smoke.py --dump-dir OUT --fp8 128,0,0 --fp8 64,0,1 --fa4 80 --fa4 64,64,1

Prints one JSON object: the DSL's version, what sglang_fa4's version gate says it builds, and per
kernel the seconds, the PTX file and the instruction facts that make it that kernel (or the error).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from importlib import metadata
from pathlib import Path

# beside this script (sys.path[0] when run): the sha the pinned record, tests/fp8_default_ptx.json, uses
from fp8_xcompile import ptx_sha256

ROOT = Path(__file__).resolve().parents[1]


def _written(dump: Path) -> dict:
    """Each PTX file's modification time now: a kernel whose file name repeats an earlier one's
    overwrites it, so "new" means written since, not a new name."""
    return {p: p.stat().st_mtime_ns for p in dump.glob("*.ptx")}


def _new_ptx(dump: Path, before: dict) -> str:
    new = sorted((p for p in dump.glob("*.ptx") if before.get(p) != p.stat().st_mtime_ns),
                 key=lambda p: p.stat().st_mtime_ns)
    return new[-1].read_text() if new else ""


def fp8(dump: Path, spec: str) -> dict:
    from sglang_fa4.kernels.fp8_sm90.launch import compile_variant
    from sglang_fa4.kernels.fp8_sm90.layout import Fp8Variant

    d, causal, local = (int(x) for x in spec.split(","))
    before = _written(dump)
    compile_variant(Fp8Variant(d, bool(causal), bool(local)))
    ptx = _new_ptx(dump, before)
    wgmma = re.findall(r"wgmma\.mma_async\.sync\.aligned\.m\d+n\d+k\d+\.f32\.(\w+)\.(\w+)", ptx)
    return {"wgmma_e4m3": sum(a == b == "e4m3" for a, b in wgmma), "wgmma_other": sum(a != "e4m3" for a, _ in wgmma),
            "cvt_e4m3x2": len(re.findall(r"cvt\.rn\.satfinite\.e4m3x2\.f32", ptx)),
            "target": (re.search(r"^\.target\s+(\S+)", ptx, re.M) or [None, None])[1],
            "sha256": ptx_sha256(ptx) if ptx else None}


def fa4(dump: Path, spec: str) -> dict:
    """FA4 b36's varlen bf16 forward as the ViT warmup compiles it (FakeTensorMode: no launch).
    ``spec``: head_dim[,window[,sinks[,segments]]]: a sliding window of that many tokens each side
    (0: none), attention-sink logits (MiMo-VL's windowed blocks), the segment count (> 256 adds
    FA4's scheduler kernels)."""
    import torch
    from flash_attn.cute import interface
    from torch._subclasses.fake_tensor import FakeTensorMode

    head_dim, window, sinks, segments = ([int(x) for x in spec.split(",")] + [0, 0, 2])[:4]
    heads, tokens = 16, 4544
    before = _written(dump)
    with FakeTensorMode(allow_non_fake_inputs=True):
        q, k, v = (torch.empty(tokens, heads, head_dim, dtype=torch.bfloat16, device="cuda") for _ in range(3))
        cu = torch.empty(segments + 1, dtype=torch.int32, device="cuda")
        extra = {}
        if window:
            extra["window_size_left"] = extra["window_size_right"] = window
        if sinks:
            extra["learnable_sink"] = torch.empty(heads, dtype=torch.bfloat16, device="cuda")
        longest = window or tokens
        interface._flash_attn_fwd(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=longest,
                                  max_seqlen_k=longest, **extra)
    ptx = _new_ptx(dump, before)
    wgmma = re.findall(r"wgmma\.mma_async\.sync\.aligned\.m\d+n\d+k\d+\.f32\.(\w+)\.(\w+)", ptx)
    return {"wgmma_bf16": sum(a == b == "bf16" for a, b in wgmma),
            "tcgen05_mma": len(re.findall(r"\btcgen05\.mma\.", ptx)),
            "ld_red_max": len(re.findall(r"tcgen05\.ld\.red\S*\.max", ptx)),
            "target": (re.search(r"^\.target\s+(\S+)", ptx, re.M) or [None, None])[1]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump-dir", required=True, type=Path)
    ap.add_argument("--fp8", action="append", default=[], help="head_dim,causal,local")
    ap.add_argument("--fa4", action="append", default=[], help="head_dim[,window[,sinks[,segments]]]")
    args = ap.parse_args()
    if os.environ.get("CUTE_DSL_ARCH", "").startswith("sm_10"):
        from fa4_xcompile import _stub_hardware_info  # the CUDA driver's answer for a B200/B300

        _stub_hardware_info()
    from sglang_fa4.kernels import dsl_versions

    version = metadata.version("nvidia-cutlass-dsl")
    out: dict = {"nvidia-cutlass-dsl": version, "builds": sorted(dsl_versions.builds(version)), "kernels": {}}
    jobs = [(f"fp8 {s}", fp8, s) for s in args.fp8] + [(f"fa4 {s}", fa4, s) for s in args.fa4]
    for name, fn, arg in jobs:
        t = time.perf_counter()
        try:
            out["kernels"][name] = fn(args.dump_dir, arg)
        except Exception as exc:  # reported per kernel: the test names what a version cannot build
            out["kernels"][name] = {"error": f"{type(exc).__name__}: {str(exc)[:2000]}"}
        out["kernels"][name]["seconds"] = round(time.perf_counter() - t, 1)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
