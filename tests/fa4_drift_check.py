"""sglang-fa4 with a flash-attn-4 other than the one it was written against (issue #19 item 5).

Run as a script in a fresh process whose PYTHONPATH puts the other flash-attn-4 (and a CUTLASS DSL)
first. Without ``--gpu`` it needs no GPU: FA4's real forward runs under torch's FakeTensorMode on fake
CUDA tensors with its kernel compile replaced by a stand-in that records the argument list it is
launched with (FA4 skips the launch in fake mode, so its fake-mode switch is turned off for that),
i.e. everything up to the launch is the other version's own code. Per configuration a ViT uses
(Qwen2.5-VL d80 and Qwen3-VL d72 full attention, >256 segments, MiMo-VL's sliding window with
sinks) it reports whether sglang-fa4's recorded-call check recognised the call (direct launch) or
sent the configuration to FA4's public API; then, with the recognised layout made not to match, that
every configuration falls back to the public API with one warning and no error; and what
``sglang-fa4 doctor`` says about the installed FA4.

With ``--gpu`` (the H200): the same configurations for real through
``sglang_fa4.kernels.varlen.fa4_varlen_attention``, twice each, compared with an fp32 reference on
fresh random data (output poisoned with NaN first), then the forced public-API path likewise.

    PYTHONPATH=OTHER_FA4:DSL:REPO python tests/fa4_drift_check.py --arch 90 [--gpu]
Prints one JSON object (last line).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# (name, head_dim, heads, segment lengths, window, sinks): what the ViTs hand FA4
CONFIGS = (
    ("qwen2_5_vl_full_d80", 80, 16, (0, 1024, 3520, 784), None, False),
    ("qwen3_vl_full_d72", 72, 16, (2304, 4096), None, False),
    ("many_segments_d80", 80, 16, (96,) * 300, None, False),  # > 64: FA4, not the short-window route
    ("mimo_window_sinks_d80", 80, 16, (1024, 2048), (64, 64), True),
)


class _Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


class _NoLaunch:
    """Stands in for a compiled kernel on a machine without a GPU: keeps the arguments."""

    def __init__(self):
        self.calls = 0
        self.last_nargs = None

    def __call__(self, *args):
        self.calls += 1
        self.last_nargs = len(args)


def _inputs(torch, d, heads, lens, sinks, device, gen=None):
    from sglang_fa4.testing import cu_seqlens

    total = sum(lens)
    q, k, v = (torch.randn(total, heads, d, device=device, generator=gen, dtype=torch.float32).to(torch.bfloat16)
               for _ in range(3))
    cu = cu_seqlens(lens, device=device)
    s = torch.randn(heads, device=device, generator=gen) if sinks else None
    return q, k, v, cu, s


def run_configs(torch, dispatch_call, gpu: bool, cache) -> list[dict]:
    from sglang_fa4.testing import attention_fp32, rel_err
    from sglang_fa4.kernels.fa4.cache import PublicLauncher

    rows = []
    gen = torch.Generator(device="cuda").manual_seed(0) if gpu else None
    for name, d, heads, lens, window, sinks in CONFIGS:
        row = {"config": name}
        before = set(cache._launchers)
        try:
            for attempt in range(2):  # the first resolves the configuration, the second launches it
                q, k, v, cu, s = _inputs(torch, d, heads, lens, sinks, "cuda", gen)
                out = torch.full_like(q, float("nan"))
                got = dispatch_call(q, k, v, cu, max(lens), window or (None, None), s, out)
                row["returned_out"] = got is out
                if gpu:
                    torch.cuda.synchronize()
                    ref = attention_fp32(q, k, v, cu, window=window or (None, None), sinks=s)
                    err = rel_err(got, ref)
                    row[f"rel_err_call{attempt + 1}"] = err
                    row["finite"] = bool(torch.isfinite(got).all())
        except Exception as exc:  # noqa: BLE001 - reported, the check fails on it
            row["error"] = f"{type(exc).__name__}: {exc}"
        new = [cache._launchers[key] for key in cache._launchers if key not in before]
        row["path"] = ("public_api" if isinstance(new[0], PublicLauncher) else "direct_launch") if new else None
        rows.append(row)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", type=int, default=90, help="FA4 kernel class (90: SM90, 100: SM100)")
    ap.add_argument("--gpu", action="store_true", help="run for real on the GPU")
    ap.add_argument("--out", type=Path, help="also write the JSON object here")
    args = ap.parse_args()
    if not args.gpu:
        os.environ.setdefault("FLASH_ATTENTION_ARCH", f"sm_{args.arch}")
        os.environ.setdefault("CUTE_DSL_ARCH", f"sm_{args.arch}a")
        os.environ.setdefault("FLASH_ATTENTION_NUM_SMS", "132" if args.arch == 90 else "148")
    logger = logging.getLogger("sglang_fa4")
    handler = _Warnings()
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)

    from sglang_fa4 import doctor
    from sglang_fa4.kernels.fa4 import b36 as fa4_b36
    from sglang_fa4.kernels.fa4 import cache as fa4_kernel_cache
    from sglang_fa4.kernels.fa4.b36 import FA4Backend
    from sglang_fa4.kernels.fa4.cache import KernelCache

    import torch
    import flash_attn.cute.interface as iface

    result = {"command": "python " + " ".join(["tests/fa4_drift_check.py"] + sys.argv[1:]),
              "flash_attn_file": iface.__file__, "installed_version": fa4_b36.installed_version(),
              "written_against": fa4_b36.FA4_VERSION, "arch": args.arch, "gpu": args.gpu,
              "doctor_fa4": doctor._fa4_report()}
    kernels = _NoLaunch()
    fake = None
    if not args.gpu:
        from torch._subclasses.fake_tensor import FakeTensorMode

        iface.cute.compile = lambda *a, **k: kernels  # no GPU: nothing to compile for, nothing to launch
        iface.is_fake_mode = lambda: False  # so FA4 assembles and "launches" its call
        fake = FakeTensorMode(allow_non_fake_inputs=True)
        fake.__enter__()

    def through(cache):
        def call(q, k, v, cu, m, window, s, out):
            return cache(q, k, v, cu, m, None, window, s, out)
        return call

    # 1) as installed: the recorded-call check decides per configuration
    if args.gpu:
        from sglang_fa4.kernels import fa4, varlen

        cache = fa4.kernel_cache()
        call = lambda q, k, v, cu, m, w, s, out: varlen.fa4_varlen_attention(  # noqa: E731
            q, k, v, cu, m, window_size=w, sinks=s, out=out)
    else:
        cache = KernelCache(FA4Backend())
        call = through(cache)
    warned0 = len(handler.messages)
    rows = run_configs(torch, call, args.gpu, cache)
    result["as_installed"] = {"configs": rows, "public_configs": [str(c) for c in cache.public_configs()],
                              "warnings": handler.messages[warned0:]}
    if not args.gpu:  # FA4's kernel "launches" (resolving + direct calls) and the last one's arity
        result["as_installed"]["kernel_launches"] = kernels.calls
        result["as_installed"]["kernel_nargs"] = kernels.last_nargs

    # 2) a kernel call this sglang-fa4 does not recognise: every configuration takes the public API
    real_layout = fa4_kernel_cache.layout_for_arch
    fa4_kernel_cache.layout_for_arch = lambda arch: fa4_b36.CallLayout(nargs=real_layout(arch).nargs + 1)
    drift_cache = KernelCache(FA4Backend())
    if args.gpu:
        previous = fa4.install_kernel_cache(drift_cache)
        try:
            rows = run_configs(torch, call, args.gpu, drift_cache)
        finally:
            fa4.install_kernel_cache(previous)
    else:
        rows = run_configs(torch, through(drift_cache), args.gpu, drift_cache)
    fa4_kernel_cache.layout_for_arch = real_layout
    result["layout_not_recognised"] = {"configs": rows,
                                       "public_configs": len(drift_cache.public_configs())}
    if fake is not None:
        fake.__exit__(None, None, None)
    result["warnings"] = handler.messages
    result["version_warnings"] = sum("is installed; sglang-fa4 is written against" in m for m in handler.messages)
    result["layout_fallback_warnings"] = sum("run through FA4's public API" in m for m in handler.messages)
    if args.gpu:
        result["gpu_name"] = torch.cuda.get_device_name()
    print(json.dumps(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
