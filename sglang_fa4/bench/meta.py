"""The `meta` block of a benchmark result: GPU, command line, package versions, ceilings."""

from __future__ import annotations

import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path


def command_line(argv: list[str] | None = None) -> str:
    """The exact command as typed: `sglang-fa4 ...` for the console script, else the python -m form."""
    argv = list(sys.argv if argv is None else argv)
    prog = Path(argv[0]).name if argv else "sglang-fa4"
    if prog in ("sglang-fa4",):
        head = "sglang-fa4"
    elif prog == "cli.py" or prog.endswith("__main__.py") or prog == "-m":
        head = "python3 -m sglang_fa4.cli"
    else:
        head = shlex.quote(argv[0])
    return " ".join([head] + [shlex.quote(a) for a in argv[1:]])


def _version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def versions() -> dict:
    out = {"python": platform.python_version()}
    for dist in ("torch", "triton", "flash-attn-4", "nvidia-cutlass-dsl", "transformers", "sglang", "sglang-fa4"):
        out[dist] = _version(dist)
    try:
        import torch

        out["cuda"] = torch.version.cuda
    except ImportError:
        pass
    out["fa4_call"] = "direct cached-kernel launch"  # sglang_fa4.kernels.varlen (what the results compare)
    try:
        from .backends import triton_context_attention_fwd

        mod = sys.modules[triton_context_attention_fwd().__module__]
        out["triton_attn_source"] = getattr(mod, "__file__", None)
    except Exception:
        out["triton_attn_source"] = None
    from .fa3 import build_source

    out["fa3"] = build_source()  # FA3 built from source (the fa3 backend), where present
    out["git_commit"] = _git_commit()
    return out


def _git_commit() -> str | None:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip() or None
    except Exception:
        return None


def gpu_info() -> dict:
    import torch

    p = torch.cuda.get_device_properties(0)
    info = {
        "name": p.name,
        "compute_capability": f"{p.major}.{p.minor}",
        "sms": p.multi_processor_count,
        "memory_gib": round(p.total_memory / 2**30, 1),
        "l2_bytes": getattr(p, "L2_cache_size", None),
    }
    try:
        info["driver"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20,
        ).stdout.strip() or None
    except Exception:
        info["driver"] = None
    return info


def gpu_slug(name: str) -> str:
    """'NVIDIA H200' -> 'h200' (results folder name)."""
    low = name.lower().replace("nvidia", "").strip()
    for token in low.replace("-", " ").split():
        if any(c.isdigit() for c in token):
            return token
    return low.replace(" ", "_") or "gpu"


def base_meta(kind: str, argv: list[str] | None = None) -> dict:
    return {
        "kind": kind,
        "command": command_line(argv),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "gpu": gpu_info(),
        "versions": versions(),
    }


def ceilings() -> dict:
    from .timing import measure_copy_gbps, measure_matmul_tflops

    mm = measure_matmul_tflops()
    cp = measure_copy_gbps()
    return {
        "bf16_matmul_tflops": mm["tflops"],
        "bf16_matmul_shape": mm["shape"],
        "copy_gbps": cp["gbps"],
        "copy_bytes": cp["bytes"],
        "method": "median of 5 samples; matmul on random data via torch.mm; copy counts bytes read + written",
    }
