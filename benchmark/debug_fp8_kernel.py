"""Bring-up bisection for the SM90 FP8 forward: each step in a fresh process (a faulting kernel
poisons the CUDA context), CUDA_LAUNCH_BLOCKING=1, with a timeout.

  python benchmark/debug_fp8_kernel.py --out-dir DIR [--then "ARGS for check_fp8_attention.py"]

Steps: a tiny call of the full kernel and of variants with parts switched off (setmaxnreg, QK GEMM,
PV GEMM, K/V loads, output store), a tiny FA4 bf16 call, compute-sanitizer on the full kernel
(cubin + PTX kept for the PC it names).  If a full-featured variant passes, runs the check script
with it.  Writes debug.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

TINY = r"""
import sys, torch, json
sys.path.insert(0, %(root)r)
from sglang_fa4.kernels.fp8_sm90 import launch
from sglang_fa4.kernels.fp8_sm90.vt_pack import pack_vt_reference
flags = frozenset(x for x in %(flags)r.split(",") if x)
launch.DEBUG_FLAGS = flags
torch.manual_seed(0)
lens = %(lens)r
cu = torch.tensor([0] + list(__import__("itertools").accumulate(lens)), dtype=torch.int32, device="cuda")
t = sum(lens); h = %(h)d; d = %(d)d
q = torch.randn(t, h, d, device="cuda").to(torch.float8_e4m3fn)
k = torch.randn(t, h, d, device="cuda").to(torch.float8_e4m3fn)
v = torch.randn(t, h, d, device="cuda").to(torch.float8_e4m3fn)
vt = pack_vt_reference(v.view(torch.uint8), cu)
out = torch.full((t, h, d), float("nan"), dtype=torch.bfloat16, device="cuda")
launch.fp8_varlen_attention(q, k, None, cu, cu, max(lens), max(lens), out=out, vt=vt, causal=%(causal)r)
torch.cuda.synchronize()
ref = torch.empty(t, h, d, device="cuda")
c = cu.tolist()
for b in range(len(lens)):
    qb, kb, vb = (x[c[b]:c[b+1]].float().transpose(0, 1) for x in (q, k, v))
    s = qb @ kb.transpose(1, 2) * d ** -0.5
    if %(causal)r:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, device="cuda", dtype=torch.bool).triu(1), float("-inf"))
    ref[c[b]:c[b+1]] = (torch.softmax(s, -1) @ vb).transpose(0, 1)
o = out.float()
print("RESULT", json.dumps({"finite": bool(torch.isfinite(o).all()), "err": ((o - ref).norm() / ref.norm()).item()}))
"""

FA4 = r"""
import torch
from flash_attn.cute import flash_attn_varlen_func
cu = torch.tensor([0, 256], dtype=torch.int32, device="cuda")
q = torch.randn(256, 2, 128, device="cuda").bfloat16()
o = flash_attn_varlen_func(q, q, q, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=256, max_seqlen_k=256)
torch.cuda.synchronize()
print("RESULT", '{"ok": true}')
"""


def step(name, code, timeout, env_extra=None, prefix=()):
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1", PYTHONUNBUFFERED="1")
    env.update(env_extra or {})
    t = time.perf_counter()
    try:
        p = subprocess.run([*prefix, sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env)
        out = p.stdout + p.stderr
        rc = p.returncode
    except subprocess.TimeoutExpired as e:
        out = ((e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")) + "\nTIMEOUT"
        rc = "timeout"
    res = None
    for line in out.splitlines():
        if line.startswith("RESULT "):
            res = json.loads(line[7:])
    tail = [l for l in out.splitlines() if "Deprecat" not in l and "warnings.warn" not in l][-25:]
    row = {"step": name, "rc": rc, "result": res, "seconds": round(time.perf_counter() - t, 1), "tail": tail if res is None or name.startswith("sanitizer") else tail[-3:]}
    print(json.dumps({k: v for k, v in row.items() if k != "tail"}), flush=True)
    if res is None or name.startswith("sanitizer"):
        print("\n".join(tail), flush=True)
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", default=os.environ.get("OUT", "."))
    ap.add_argument("--then", default="")
    ap.add_argument("--budget", type=float, default=225.0)
    args = ap.parse_args()
    t0 = time.perf_counter()
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    root = str(HERE.parent)
    rows = []

    def tiny(flags, lens=(256,), h=2, d=128, causal=False):
        return TINY % {"root": root, "flags": flags, "lens": list(lens), "h": h, "d": d, "causal": causal}

    full = step("full", tiny(""), 60)
    rows.append(full)
    chosen = "" if full["result"] and full["result"]["finite"] and full["result"]["err"] < 3e-2 else None
    if chosen is None:
        for flags in ["no_setmaxnreg", "skip_store", "skip_pv", "skip_qk,skip_pv", "skip_kv"]:
            rows.append(step(flags, tiny(flags), 45))
        rows.append(step("fa4_bf16", FA4, 60))
        dump = out / "dump"
        dump.mkdir(exist_ok=True)
        rows.append(step("sanitizer full", tiny(""), 90,
                         {"CUTE_DSL_KEEP": "ptx,cubin", "CUTE_DSL_DUMP_DIR": str(dump)},
                         prefix=("compute-sanitizer", "--tool", "memcheck", "--show-backtrace", "device")))
        ok = rows[1]["result"]
        if ok and ok["finite"] and ok["err"] < 3e-2:
            chosen = "no_setmaxnreg"
    else:
        for name, kw in [("causal 2seq", dict(lens=(300, 1000), causal=True)), ("d64", dict(d=64)), ("d96", dict(d=96))]:
            rows.append(step(name, tiny("", **kw), 45))
    (out / "debug.json").write_text(json.dumps(rows, indent=1))
    if chosen is not None and args.then:
        left = args.budget - (time.perf_counter() - t0)
        cmd = [sys.executable, str(HERE / "check_fp8_attention.py"), "--out-dir", str(out), *args.then.split()]
        if chosen:
            cmd += ["--debug-flags", chosen]
        print("running", cmd, "with", round(left), "s left", flush=True)
        try:
            subprocess.run(cmd, timeout=max(left, 10))
        except subprocess.TimeoutExpired:
            print("check timed out", flush=True)


if __name__ == "__main__":
    main()
