"""Cross-compile SGLang's vendored FA4 SM100 forward kernel on a machine without a GPU and report
what the generated PTX contains.

Run as a script in a fresh process (the CuTe DSL reads its target from the environment at import):

    CUTE_DSL_ARCH=sm_103a FLASH_ATTENTION_ARCH=sm_103 SGLANG_CUTE_AOT_CACHE_DIR= \
    CUTE_DSL_KEEP=ptx CUTE_DSL_DUMP_DIR=OUT python tests/fa4_xcompile.py --sglang-root DIR --dump-dir OUT \
        --flag on --flag off

DIR holds the ``sglang`` package (an unpacked wheel). The package's ``__init__`` (which pulls in
transformers and the whole runtime) is bypassed: ``sglang`` is registered as a bare namespace so
that only the attention kernel modules are imported. For each ``--flag`` state the forward is
traced under torch's FakeTensorMode (compiles, launches nothing) for the hd=128 non-causal varlen
bf16 configuration, with SGLANG_FA4_TMEM_LOAD_RED_MAX set accordingly; the PTX lands in a
per-flag subdirectory of OUT. Prints one JSON object: per flag, the compile key and PTX facts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import types
from pathlib import Path

FLAG = "SGLANG_FA4_TMEM_LOAD_RED_MAX"


# Packages whose __init__ drags in the serving runtime; the kernel modules below them need none of it.
_BARE_PACKAGES = (
    "sglang", "sglang.srt", "sglang.kernels", "sglang.kernels.ops", "sglang.kernels.ops.attention",
)


def _bare_sglang(root: Path) -> None:
    for name in _BARE_PACKAGES:
        path = root.joinpath(*name.split("."))
        pkg = types.ModuleType(name)
        pkg.__path__ = [str(path)]
        pkg.__file__ = str(path / "__init__.py")
        sys.modules[name] = pkg
    # sglang/utils.py imports IPython, requests, pydantic...; the JIT helpers only want is_in_ci
    utils = types.ModuleType("sglang.utils")
    utils.is_in_ci = lambda: False
    sys.modules["sglang.utils"] = utils


def _stub_hardware_info() -> None:
    """cutlass.utils.HardwareInfo asks the CUDA driver; answer for a B200/B300-class part."""
    import cutlass.utils as cu

    class _HardwareInfo:
        def __init__(self, *args, **kwargs):
            pass

        def get_max_active_clusters(self, cluster_size: int) -> int:
            return 148 // max(1, cluster_size)

        def get_l2_cache_size_in_bytes(self) -> int:
            return 126 * 1024 * 1024

        def get_device_multiprocessor_count(self) -> int:
            return 148

    cu.HardwareInfo = _HardwareInfo
    try:
        import cutlass.utils.hardware_info as hi

        hi.HardwareInfo = _HardwareInfo
    except ImportError:
        pass


def compile_once(interface, dump_dir: Path, dest: Path, hd: int = 128, causal: bool = False,
                 varlen: bool = True) -> dict:
    """Compile the forward once; move the PTX it dumped into `dest`; report on it."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    batch, seqlen, heads = 2, 1024, 16
    total = batch * seqlen
    cache = interface._flash_attn_fwd.compile_cache.cache
    keys_before = set(cache)
    with FakeTensorMode(allow_non_fake_inputs=True):
        shape = (total, heads, hd) if varlen else (batch, seqlen, heads, hd)
        q, k, v = (torch.empty(shape, dtype=torch.bfloat16, device="cuda") for _ in range(3))
        if varlen:
            cu = torch.empty(batch + 1, dtype=torch.int32, device="cuda")
            interface._flash_attn_fwd(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu,
                                      max_seqlen_q=seqlen, max_seqlen_k=seqlen, causal=causal)
        else:
            interface._flash_attn_fwd(q, k, v, causal=causal)
    new_keys = [k for k in cache if k not in keys_before]
    dest.mkdir(parents=True, exist_ok=True)
    ptx = []
    for p in sorted(dump_dir.glob("*.ptx")):
        ptx.append(p.rename(dest / p.name))
    lines = [line for p in ptx for line in p.read_text(errors="replace").splitlines()]
    return {
        "new_compile_keys": [repr(k) for k in new_keys],
        "ptx_files": [str(p) for p in ptx],
        "ld_red": sum("tcgen05.ld.red" in line for line in lines),
        "ld_red_max": sum("tcgen05.ld.red" in line and ".max" in line for line in lines),
        "ld_plain": sum("tcgen05.ld." in line and "tcgen05.ld.red" not in line for line in lines),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sglang-root", required=True, type=Path)
    ap.add_argument("--dump-dir", required=True, type=Path)
    ap.add_argument("--flag", action="append", choices=("on", "off"), required=True)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--batched", action="store_true", help="(batch, seqlen) tensors instead of varlen")
    args = ap.parse_args()
    args.dump_dir.mkdir(parents=True, exist_ok=True)
    _bare_sglang(args.sglang_root.resolve())
    _stub_hardware_info()
    from sglang.kernels.ops.attention.flash_attn.cute import interface

    out = {}
    for flag in args.flag:
        os.environ[FLAG] = "1" if flag == "on" else "0"
        out[flag] = compile_once(interface, args.dump_dir, args.dump_dir / f"flag-{flag}",
                                 hd=args.head_dim, causal=args.causal, varlen=not args.batched)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
