"""The shared-library store (sglang_fa4/kernels/fa4/shared_libs.py) against the real flash-attn-4
b36 on a machine without a GPU. Run as a script in a fresh process whose PYTHONPATH has FA4 b36,
the CUTLASS DSL 4.8.1 and this repo; FLASH_ATTENTION_ARCH / CUTE_DSL_ARCH / FLASH_ATTENTION_NUM_SMS
pick the target (set by the test). Prints one JSON object (last line).

  store --root DIR [--fa4-cache DIR]
      FA4 imported: the ViT configurations of CONFIGS resolved through the kernel cache with a store
      at DIR, for real: FA4 cross-compiles each kernel under torch's FakeTensorMode (or loads it
      from its persistent cache at --fa4-cache), the store exports, links and keeps it. Nothing is
      launched (no GPU): FA4's compiled and disk-loaded functions are wrapped so that a call only
      records itself.
  load --root DIR
      A restart: FA4 is not imported. Each configuration's stored kernel is loaded with tvm_ffi alone
      and called through its launcher with CPU tensors, which the compiled function refuses with
      its own signature ("expected device_type=cuda") -- the FA4 kernel, its argument list, no
      launch. Reports which of flash_attn / cutlass / quack are in sys.modules afterwards.
  keys
      FA4's compile key and sglang-fa4's configuration for a sweep of ViT calls (cute.compile
      stubbed: nothing compiled): the store may key on the configuration only if equal
      configurations always had equal FA4 keys.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# (name, head_dim, heads, segment lengths, window, sinks): what ViTs hand FA4 (fa4_drift_check's)
CONFIGS = (
    ("qwen2_5_vl_full_d80", 80, 16, (1024, 3520), None, False),
    ("many_segments_d80", 80, 16, (96,) * 300, None, False),
    ("window_sinks_d64", 64, 16, (1024, 2048), (64, 64), True),
)
HEAVY = ("flash_attn", "cutlass", "quack")


def _heavy() -> list[str]:
    return sorted({m.split(".")[0] for m in sys.modules if m.split(".")[0] in HEAVY})


class _Recorded:
    """Stands in for a compiled (or disk-loaded) FA4 function on a machine without a GPU: a call
    only counts; ``export_to_c`` (when the real function has it) exports the real kernel."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0
        if hasattr(fn, "export_to_c"):
            self.export_to_c = fn.export_to_c

    def __call__(self, *args):
        self.calls += 1


def _no_launch(iface, *, compile_too: bool) -> None:
    import cutlass.cute as cute

    real_compile, real_load = cute.compile, cute.runtime.load_module
    cute.compile = (lambda *a, **k: _Recorded(real_compile(*a, **k))) if compile_too else (lambda *a, **k: _Recorded(None))

    class _Module:
        def __init__(self, module):
            self.module = module

        def __getattr__(self, name):
            return _Recorded(getattr(self.module, name))  # a plain tvm_ffi function: no export_to_c

    cute.runtime.load_module = lambda *a, **k: _Module(real_load(*a, **k))
    iface.is_fake_mode = lambda: False  # so FA4 assembles and "launches" its call


def _inputs(torch, d, heads, lens, sinks, device, dtype=None, kv_heads=None):
    from sglang_fa4.testing import cu_seqlens

    total = sum(lens)
    dtype = dtype or torch.bfloat16
    q = torch.empty(total, heads, d, dtype=dtype, device=device)
    k, v = (torch.empty(total, kv_heads or heads, d, dtype=dtype, device=device) for _ in range(2))
    cu = cu_seqlens(lens, device=device)
    s = torch.empty(heads, dtype=torch.float32, device=device) if sinks else None
    return q, k, v, cu, s


def store(args) -> dict:
    if args.fa4_cache:
        os.environ["FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"] = "1"
        os.environ["FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"] = str(args.fa4_cache)
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    import flash_attn.cute.interface as iface
    from sglang_fa4.kernels.fa4.b36 import FA4Backend
    from sglang_fa4.kernels.fa4.cache import KernelCache
    from sglang_fa4.kernels.fa4.shared_libs import Store

    _no_launch(iface, compile_too=True)
    cache = KernelCache(FA4Backend(), Store(args.root))
    rows = []
    with FakeTensorMode(allow_non_fake_inputs=True):
        for name, d, heads, lens, window, sinks in CONFIGS:
            q, k, v, cu, s = _inputs(torch, d, heads, lens, sinks, "cuda")
            t0 = time.perf_counter()
            cache(q, k, v, cu, max(lens), None, window or (None, None), s, None)
            event = cache.compile_events()[-1]
            entry = cache.store.entry_dir(event.config)
            meta = json.loads((entry / "meta.json").read_text()) if (entry / "meta.json").is_file() else None
            rows.append({"config": name, "seconds": time.perf_counter() - t0, "fa4_compiled": event.fa4_compiled,
                         "stored": meta is not None,
                         "functions": {r: lib["function"] for r, lib in (meta or {}).get("libraries", {}).items()}})
    return {"mode": "store", "configs": rows, "fa4_disk_cache": bool(args.fa4_cache), "heavy": _heavy()}


def load(args) -> dict:
    import torch

    from sglang_fa4.kernels.fa4 import b36 as fa4_b36
    from sglang_fa4.kernels.fa4.config import FwdCall, config_for
    from sglang_fa4.kernels.fa4.launcher import Launcher
    from sglang_fa4.kernels.fa4.shared_libs import Store

    arch = fa4_b36.device_arch()
    layout = fa4_b36.layout_for_arch(arch)
    store_ = Store(args.root)
    rows = []
    for name, d, heads, lens, window, sinks in CONFIGS:
        q, k, v, cu, s = _inputs(torch, d, heads, lens, sinks, "cpu")
        config = config_for(arch, torch.bfloat16, d, d, 1, max(lens), sum(lens), window or (None, None),
                            torch.float32 if sinks else None, len(lens))
        t0 = time.perf_counter()
        stored = store_.load(config, layout)
        row = {"config": name, "loaded": stored is not None, "load_seconds": time.perf_counter() - t0}
        if stored is not None:
            row["function_type"] = f"{type(stored.fn).__module__}.{type(stored.fn).__name__}"
            if stored.sched is not None:
                try:
                    stored.sched(cu, sum(lens))
                except Exception as exc:  # noqa: BLE001 - the refusal is what is checked
                    row["sched_refusal"] = f"{type(exc).__name__}: {exc}"
            launcher = Launcher.from_store(stored, layout, config)
            launcher.sched = (lambda c, t: (c.clone(), None)) if stored.sched is not None else None
            left, right = window or (None, None)
            call = FwdCall(q, k, v, cu, max(lens), None, False, left, right, s, torch.empty_like(q))
            try:
                launcher.launch(call)
                row["refusal"] = None
            except Exception as exc:  # noqa: BLE001
                row["refusal"] = f"{type(exc).__name__}: {exc}"
        rows.append(row)
    return {"mode": "load", "configs": rows, "heavy": _heavy(), "tvm_ffi": "tvm_ffi" in sys.modules}


def _sweep(torch):
    """(label, kwargs for _inputs, max_seqlen, window, softmax_scale, layout) of ViT-like calls."""
    out = []
    for d in (64, 72, 80, 128):
        for heads, kv in ((16, 16), (32, 32), (16, 8), (32, 16), (12, 4)):
            for lens in ((1024,), (0, 1024, 3520, 784), (96,) * 300, (8,) * 257, (8,) * 256):
                out.append((dict(d=d, heads=heads, kv_heads=kv, lens=lens), max(lens), None, None, "plain"))
    base = dict(d=80, heads=16, kv_heads=16, lens=(1024, 2048))
    for window in ((64, 64), (32, 16), (128, None), (None, 32), (None, 0), (-1, -1), (0, 0)):
        out.append((base, 2048, window, None, "plain"))
    for m in (None, 100, 128, 129, 256, 257, 8192):
        out.append((base, m, None, None, "plain"))
    out.append((dict(base, lens=(64, 64)), 64, None, None, "plain"))
    out.append((dict(base, lens=(100,)), 100, None, None, "plain"))
    out.append((dict(base, lens=(200,)), None, None, None, "plain"))
    for scale in (0.1, 1.0):
        out.append((base, 2048, None, scale, "plain"))
    for sink in ("float32", "bfloat16"):
        out.append((dict(base, sinks=sink), 2048, (64, 64), None, "plain"))
        out.append((dict(base, sinks=sink), 2048, None, None, "plain"))
    out.append((dict(base, dtype="float16"), 2048, None, None, "plain"))
    out.append((base, 2048, None, None, "packed"))
    out.append((base, 2048, None, None, "broadcast_kv"))
    return out


def keys(args) -> dict:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    import flash_attn.cute.interface as iface
    from sglang_fa4.kernels.fa4.b36 import FA4Backend
    from sglang_fa4.kernels.fa4.cache import KernelCache

    _no_launch(iface, compile_too=False)
    backend = FA4Backend()
    seen = []
    real = backend.compile_and_run
    backend.compile_and_run = lambda call: seen.append(real(call)) or seen[-1]
    rows = []
    with FakeTensorMode(allow_non_fake_inputs=True):
        for spec, m, window, scale, form in _sweep(torch):
            spec = dict(spec)
            dtype = getattr(torch, spec.pop("dtype", "bfloat16"))
            sink = spec.pop("sinks", None)
            lens, heads, kv, d = spec["lens"], spec["heads"], spec["kv_heads"], spec["d"]
            total = sum(lens)
            q, k, v, cu, _ = _inputs(torch, d, heads, lens, False, "cuda", dtype, kv)
            if form == "packed":
                qkv = torch.empty(total, 3, heads, d, dtype=dtype, device="cuda")
                q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
            elif form == "broadcast_kv":
                k = torch.empty(total, 1, d, dtype=dtype, device="cuda").expand(total, kv, d)
                v = torch.empty(total, 1, d, dtype=dtype, device="cuda").expand(total, kv, d)
            sinks = torch.empty(heads, dtype=getattr(torch, sink), device="cuda") if sink else None
            cache = KernelCache(backend)  # every call resolves through FA4
            cache(q, k, v, cu, m, scale, window or (None, None), sinks, None)
            rows.append({"call": f"{form} d={d} heads={heads}/{kv} segments={len(lens)} max_seqlen={m} "
                                 f"window={window} scale={scale} sinks={sink} dtype={dtype}",
                         "config": cache.configs_seen()[0].as_dict(), "fa4_key": repr(seen[-1].key)})
    return {"mode": "keys", "arch": backend.arch(), "rows": rows, "heavy": _heavy()}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=("store", "load", "keys"))
    p.add_argument("--root", type=Path)
    p.add_argument("--fa4-cache", type=Path)
    args = p.parse_args()
    import logging

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    result = {"store": store, "load": load, "keys": keys}[args.mode](args)
    print(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
