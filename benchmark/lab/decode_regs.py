"""Lab: registers, spills and shared memory of the paged split-KV FP8 kernel per launch config, on a
CPU (no GPU): Triton compiles the kernel for sm_90a (``GPUTarget("cuda", 90, 64)``, its bundled
ptxas) and ``cuobjdump -res-usage`` reads the cubin.

Not a product path: the block sizes it informs live in
``sglang_fa4/kernels/fp8_paged_kv/decode_plan.py`` (their docstrings quote its numbers). One config
a line, ``key=value`` pairs (defaults: d=512 bm=16 bn=16 w=8 s=3 q=bf16 single=1 g=8 image=0)::

    python benchmark/lab/decode_regs.py d=512,bm=16,bn=16 d=512,bm=32,bn=16 d=256,bm=16,bn=32,q=fp8
    python benchmark/lab/decode_regs.py --plan 512                 # the plan's own decode/prefill configs
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from sglang_fa4.kernels.fp8_paged_kv import decode as D  # noqa: E402
from sglang_fa4.kernels.fp8_paged_kv import decode_plan as S  # noqa: E402

Q_TYPES = {"bf16": "*bf16", "fp8": "*fp8e4nv"}
#: pointers and strides a real launch specializes as 16-byte aligned
ALIGNED = ("tok_stride", "q_stride_t", "q_stride_h", "o_stride_t", "o_stride_h", "pt_stride", "part_stride_s",
           "part_stride_t")


def compile_split(d: int, bm: int, bn: int, warps: int = 8, stages: int = S.NUM_STAGES, q: str = "bf16",
                  single: bool = True, g: int = 8, maxnreg=None, image: bool = False,
                  prefetch_pages: bool = False, d_pieces: int = 1):
    """The split kernel compiled for sm_90a with a real launch's specialization (Triton's
    CompiledKernel: ``asm["ptx"]``, ``asm["cubin"]``, ``asm["ttgir"]``)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = D._make_split_kernel()
    names = [p.name for p in fn.params]
    consts = {"G": g, "D": d, "D_POW2": S.pow2_at_least(d), "BLOCK_M": bm, "BLOCK_N": bn, "SINGLE": single,
              "WRITE_LSE": False, "IMAGE": image, "PREFETCH_PAGES": prefetch_pages,
              "D_PIECES": d_pieces}
    ptrs = {"Q": Q_TYPES[q], "K_CACHE": "*fp8e4nv", "V_CACHE": "*fp8e4nv", "K_DESC": "*fp32", "V_DESC": "*fp32",
            "OUT": "*bf16", "LSE": "*fp32", "O_PART": "*fp32", "LSE_PART": "*fp32"}
    sig = {n: "constexpr" if n in consts else ptrs.get(n, "*i32" if n.isupper() else
                                                         "fp32" if n == "qk_scale_log2" else "i32") for n in names}
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in names
             if n not in consts and (n.isupper() or n in ALIGNED)}
    options = {"num_warps": warps, "num_stages": stages, **({"maxnreg": maxnreg} if maxnreg else {})}
    return triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs),
                          target=GPUTarget("cuda", 90, 64), options=options)


def tool(name: str) -> str:
    """A CUDA binary tool shipped inside Triton's wheel (cuobjdump, nvdisasm, ptxas)."""
    import triton

    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name)


def cuobjdump(kernel, flag: str) -> str:
    """``cuobjdump FLAG`` (``-res-usage``, ``-sass``) of a compiled kernel's cubin."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        return subprocess.run([tool("cuobjdump"), flag, f.name], capture_output=True, text=True, check=True).stdout


def kernel_resources(kernel) -> dict:
    """{"reg", "stack", "shared", "dyn_shared", "local", "mma", "cp_async"} of a compiled kernel."""
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", cuobjdump(kernel, "-res-usage"))
    reg, stack, shared, local = (int(x) for x in m.groups())
    ptx = kernel.asm["ptx"]
    # "shared" is the cubin's static shared memory; Triton's pipeline buffers are dynamic
    # (metadata.shared), and cp.async in the PTX shows whether the K/V loads were pipelined at all
    return {"reg": reg, "stack": stack, "shared": shared, "dyn_shared": kernel.metadata.shared, "local": local,
            "mma": len(re.findall(r"\bmma\.sync|\bwgmma", ptx)), "cp_async": len(re.findall(r"\bcp\.async\.(?:ca|cg)", ptx))}


def resources(d: int, bm: int, bn: int, warps: int = 8, stages: int = S.NUM_STAGES, q: str = "bf16",
              single: bool = True, g: int = 8, maxnreg=None, image: bool = False,
              prefetch_pages: bool = False, d_pieces: int = 1) -> dict:
    """:func:`kernel_resources` of the split kernel compiled for sm_90a."""
    return kernel_resources(compile_split(d, bm, bn, warps, stages, q, single, g, maxnreg, image, prefetch_pages,
                                          d_pieces))


def report(name: str, rows: list, render, out_dir=None) -> str:
    """A static count's markdown (``render(rows, meta)``), printed and, with ``out_dir``, written to
    ``out_dir/NAME-tritonVERSION.md``: the count depends on the Triton that compiled the kernel."""
    import triton

    meta = {"triton": triton.__version__, "command": f"python benchmark/lab/{name}.py --out DIR"}
    md = render(rows, meta)
    print(md)
    if out_dir:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{name}-triton{triton.__version__}.md").write_text(md)
    return md


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("configs", nargs="*", help="key=value,... (d bm bn w s q single g maxnreg image)")
    ap.add_argument("--plan", type=int, default=None, help="the plan's configs for this head dim (decode, prefill)")
    args = ap.parse_args()
    configs = []
    for spec in args.configs:
        a = dict(kv.split("=") for kv in spec.split(","))
        configs.append(dict(d=int(a.get("d", 512)), bm=int(a.get("bm", 16)), bn=int(a.get("bn", 16)),
                            warps=int(a.get("w", 8)), stages=int(a.get("s", S.NUM_STAGES)), q=a.get("q", "bf16"),
                            single=a.get("single", "1") == "1", g=int(a.get("g", 8)),
                            maxnreg=int(a["maxnreg"]) if "maxnreg" in a else None, image=a.get("image") == "1"))
    if args.plan:
        for rows in (8, 10 ** 6):  # a decode step of GQA 8, a long prefill
            p = S.plan(1, 1, 8, args.plan, max(1, rows // 8), 4096, 132)
            for q in ("bf16", "fp8"):
                configs.append(dict(d=args.plan, bm=p.block_m, bn=p.block_n, warps=p.num_warps, stages=p.num_stages,
                                    q=q, single=True, g=8, maxnreg=p.maxnreg))
    for c in configs:
        print(c, resources(**c), flush=True)


if __name__ == "__main__":
    main()
