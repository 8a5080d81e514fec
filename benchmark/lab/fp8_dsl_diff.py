"""Lab: what the CUTLASS DSL version changes in the SM90 FP8 attention forward's machine code, on a
CPU (issue #42 item 5: "if a pinned DSL is slower, find out why from the PTX/SASS difference").

Per DSL version (the ``.cache/cutlass-dsl-<v>`` layers the tests build: 4.6.2 and 4.8.0, the pins
of SGLang 0.5.20-0.5.21 and 0.5.22-0.5.23, and 4.8.1, under which the speed bars were measured), the
default d=128 kernels are cross-compiled for sm_90a by ``tests/fp8_xcompile.py`` in a fresh
process, keeping the PTX and the cubin the DSL built; then, per variant: the PTX's sha256 (kernel
symbols renamed), the cubin's sha256, its instruction counts by opcode, the cubin's resource usage
(registers, stack, local memory: ``cuobjdump -res-usage``), and the SASS instruction counts (``cuobjdump -sass`` of the DSL's cubin,
Triton's bundled cuobjdump). The report lists, against the reference version, every opcode whose
count differs.

    python benchmark/lab/fp8_dsl_diff.py --out benchmark/results/cpu [--versions 4.6.2 4.8.0 4.8.1]

Not a product path.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: d=128 non-causal (the bars' shape) and causal, the table's defaults
VARIANTS = ("128,0,0", "128,1,0")
PTX_OP = re.compile(r"^\s*(?:@!?%p\d+\s+)?([a-z_][\w.:]*)", re.M)
SASS_OP = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")
RES_USAGE = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")


def layer_path(version: str) -> str:
    layer = ROOT / ".cache" / f"cutlass-dsl-{version}"
    if not layer.is_dir():
        raise SystemExit(f"{layer} missing: tests/setup_pip_layer.sh cutlass-dsl-{version} ... builds it "
                         "(the cross-compile tests do)")
    return os.pathsep.join([str(layer / "nvidia_cutlass_dsl" / "dsl_packages"), str(layer), str(ROOT)])


def opcode_counts(text: str, pattern: re.Pattern) -> dict[str, int]:
    return dict(sorted(collections.Counter(pattern.findall(text)).items()))


def ptx_opcodes(ptx: str) -> dict[str, int]:
    """Instruction counts of a PTX file by opcode (with its type suffixes), directives left out."""
    body = "\n".join(line for line in ptx.splitlines()
                     if line.strip() and not line.strip().startswith((".", "//", "{", "}", "$", ")")))
    return opcode_counts(body, PTX_OP)


def cuobjdump(*args: str) -> str:
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return subprocess.run([str(tool), *args], capture_output=True, text=True, check=True).stdout


def sass_opcodes(cubin: Path) -> dict[str, int]:
    return opcode_counts(cuobjdump("-sass", str(cubin)), SASS_OP)


def cubin_registers(cubin: Path) -> list[dict]:
    """Per kernel in the cubin: registers, stack, static shared memory, local memory (spills)."""
    return [dict(zip(("reg", "stack", "shared", "local"), map(int, m)))
            for m in RES_USAGE.findall(cuobjdump("-res-usage", str(cubin)))]


def compile_variant(version: str, variant: str, work: Path) -> dict:
    """One variant cross-compiled under one DSL version (its own process and dump directory: the
    DSL names a cubin after the kernel, not the variant)."""
    dump = work / version / variant.replace(",", "_")
    dump.mkdir(parents=True)  # the DSL silently writes nothing into a missing directory
    env = {**os.environ, "PYTHONPATH": layer_path(version), "CUTE_DSL_ARCH": "sm_90a",
           "CUTE_DSL_KEEP": "ptx,cubin", "CUTE_DSL_KEEP_PTX": "1", "CUTE_DSL_KEEP_CUBIN": "1",
           "CUTE_DSL_DUMP_DIR": str(dump)}
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "fp8_xcompile.py"), "--dump-dir", str(dump),
                           "--variant", variant], env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"DSL {version} {variant}: fp8_xcompile.py failed:\n{proc.stderr[-4000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    row = result["variants"][variant]
    ptx_files = sorted(dump.rglob("*.ptx"))
    cubins = sorted(dump.rglob("*.cubin"))
    if len(ptx_files) != 1:
        raise SystemExit(f"DSL {version} {variant}: expected one PTX file, found {[p.name for p in ptx_files]}")
    ptx = ptx_files[0].read_text()
    return {"cutlass_dsl": result.get("cutlass_dsl"), "ptx_sha256": row.get("sha256"),
            "ptx_version": (re.search(r"^\.version\s+(\S+)", ptx, re.M) or [None, None])[1],
            "ptx_lines": ptx.count("\n"), "registers": cubin_registers(cubins[-1]) if cubins else None,
            "ptx_ops": ptx_opcodes(ptx), "sass_ops": sass_opcodes(cubins[-1]) if cubins else None,
            "cubins": [c.name for c in cubins],
            "cubin_sha256": hashlib.sha256(cubins[-1].read_bytes()).hexdigest() if cubins else None}


def differences(a: dict[str, int], b: dict[str, int]) -> list[tuple[str, int, int]]:
    return [(k, a.get(k, 0), b.get(k, 0)) for k in sorted(set(a) | set(b)) if a.get(k, 0) != b.get(k, 0)]


def usage(kernels) -> str:
    return ", ".join(f"{k['reg']} / {k['stack']} / {k['local']}" for k in kernels or [])


def markdown(res: dict) -> str:
    ref = res["reference"]
    lines = ["# FP8 forward: PTX / SASS per CUTLASS DSL version (cross-compiled for sm_90a on a CPU)", "",
             f"Command: `{res['command']}`", "",
             "Per version and variant (head_dim,causal,local): the PTX's sha256 (kernel symbols renamed), the "
             "cubin's sha256 (the DSL's own ptxas), its PTX ISA version and line count, the SASS instruction "
             "total, the cubin's resource usage per kernel (`cuobjdump -res-usage`: registers / stack / local "
             f"bytes) and how many opcodes' counts differ from {ref}'s (PTX / SASS; the SASS total against "
             f"{ref}'s). The d=128 variants' "
             "differing opcodes are listed below the table.", "",
             "| DSL | variant | PTX sha256 | cubin sha256 | .version | PTX lines | SASS instructions "
             f"| registers / stack / local | opcodes differing from {ref} |",
             "|---|---|---|---|---|---|---|---|---|"]
    base = res["versions"][ref]["variants"]
    for ver, r in res["versions"].items():
        for name, v in r["variants"].items():
            sass_total = sum(v["sass_ops"].values()) if v["sass_ops"] else "—"
            b = base.get(name)
            ndiff = (f"{len(differences(b['ptx_ops'], v['ptx_ops']))} / "
                     f"{len(differences(b['sass_ops'] or {}, v['sass_ops'] or {}))}") if b and ver != ref else "—"
            if b and ver != ref and v["sass_ops"] and b["sass_ops"]:
                ndiff += f" (SASS {sum(v['sass_ops'].values()) / sum(b['sass_ops'].values()) - 1:+.1%})"
            lines.append(f"| {ver} | {name} | {(v['ptx_sha256'] or '')[:12]} | {(v['cubin_sha256'] or '')[:12]} "
                         f"| {v['ptx_version']} | {v['ptx_lines']} | {sass_total} | {usage(v['registers'])} | {ndiff} |")
    for ver, r in res["versions"].items():
        if ver == ref:
            continue
        for name, v in r["variants"].items():
            b = base.get(name)
            if not b or name not in VARIANTS:
                continue
            for kind in ("ptx_ops", "sass_ops"):
                if not (v[kind] and b[kind]):
                    continue
                diff = differences(b[kind], v[kind])
                lines += ["", f"## {name}: {kind.split('_')[0].upper()} opcodes, {ref} -> {ver} "
                              f"({len(diff)} differ)", ""]
                if diff:
                    lines += ["| opcode | " + ref + " | " + ver + " |", "|---|---|---|"]
                    lines += [f"| `{k}` | {x} | {y} |" for k, x, y in diff]
                else:
                    lines.append("identical counts")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="where fp8_dsl_diff.json.gz / .md go (required unless --render)")
    ap.add_argument("--versions", nargs="+", default=["4.6.2", "4.8.0", "4.8.1"])
    ap.add_argument("--reference", default="4.8.1", help="the version the others are compared with")
    ap.add_argument("--render", type=Path, help="only rewrite the markdown beside this result (.json.gz)")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS),
                    help="head_dim,causal,local ... or 'defaults': every kernel the product compiles")
    args = ap.parse_args()
    if args.render:
        res = json.loads(gzip.decompress(args.render.read_bytes()))
        args.render.with_name(args.render.name.removesuffix(".json.gz") + ".md").write_text(markdown(res))
        return
    if args.out is None:
        ap.error("--out is required")
    if args.reference not in args.versions:
        ap.error("--reference must be one of --versions")
    variants = args.variants
    if variants == ["defaults"]:
        from sglang_fa4.kernels.fp8_sm90.layout import all_variants

        variants = [f"{v.head_dim},{int(v.causal)},{int(v.local)}" for v in all_variants()]
    res = {"command": "python " + " ".join(sys.argv), "reference": args.reference, "variants": variants,
           "versions": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for ver in args.versions:
            print(f"[fp8_dsl_diff] DSL {ver}", flush=True)
            res["versions"][ver] = {"variants": {v: compile_variant(ver, v, Path(tmp)) for v in variants}}
    args.out.mkdir(parents=True, exist_ok=True)
    # per-opcode counts of 45 kernels: 240 KB as text, compressed to travel with the tree
    (args.out / "fp8_dsl_diff.json.gz").write_bytes(gzip.compress(json.dumps(res, indent=1).encode() + b"\n", mtime=0))
    (args.out / "fp8_dsl_diff.md").write_text(markdown(res))
    print(markdown(res))


if __name__ == "__main__":
    main()
