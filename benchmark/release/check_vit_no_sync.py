"""GPU check: SGLang's Qwen2.5-VL ViT eager forward makes no device->host sync with the plugin.

In one process, on one GPU, with the REAL SGLang (whatever ``import sglang`` finds):
  1. publish ServerArgs (the ViT attention backend), a world-size-1 TP group, load the plugin
     (SGLang's loader; ``sglang_fa4.plugin.register()`` if the entry point is not installed);
  2. build ``Qwen2_5_VisionTransformer`` from a config given on the command line (default: the
     7B tower), random weights (std 0.05), on the GPU;
  3. warm both forwards (upstream's, kept before the plugin wrapped it, and the hooked one) with
     sync debug off, compare their outputs (max abs diff, bitwise equal or not);
  4. run each once under ``torch.cuda.set_sync_debug_mode("error")``: upstream is expected to
     raise (its .item() and blocking copies), the hooked one not; records the messages and where;
  5. host time per forward (call until return) and wall time (until the GPU is done), medians.
``--device cpu`` runs steps 1-3 and 5 only (a plumbing check where there is no GPU: sdpa backend).
Backend: ``auto`` is fa4 when ``flash_attn.cute`` imports, else triton_attn (sdpa builds its mask
from cu_seqlens on the host, a sync of its own, so it cannot pass step 4; ``--backend sdpa``
still runs). Writes JSON to ``--out`` after every step; exit 0 when hooked made no sync,
upstream did, and the outputs agree.

  python benchmark/release/check_vit_no_sync.py --out vit_no_sync.json --sglang-version 0.5.23
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import statistics
import sys
import time
import traceback
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

import torch  # noqa: E402

# Qwen2.5-VL-7B's vision config
TOWER_7B = dict(
    depth=32, hidden_size=1280, hidden_act="silu", intermediate_size=3420, num_heads=16, in_channels=3,
    patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112, out_hidden_size=3584,
    fullatt_block_indexes=[7, 15, 23, 31],
)
FORWARD = "sglang.srt.models.qwen2_5_vl.Qwen2_5_VisionTransformer.forward"


def load_plugin() -> dict:
    """SGLang's own loader; register() directly when our entry point is not installed."""
    import sglang.srt.plugins as plugins
    from sglang.srt.plugins.hook_registry import HookRegistry

    from sglang_fa4 import plugin
    plugins.load_plugins()
    via = "entry point"
    if FORWARD not in HookRegistry._patched and plugin._registered_plan is None:
        plugin.register()
        HookRegistry.apply_hooks()
        via = "sglang_fa4.plugin.register()"
    plan = plugin._registered_plan
    return {"loaded_via": via, "hooked": plan.hooked if plan else None,
            "forward_hooked": FORWARD in HookRegistry._patched}


def build_tower(config: dict, device, dtype, seed: int = 0):
    from sglang.srt.models.qwen2_5_vl import Qwen2_5_VisionTransformer
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig

    vit = Qwen2_5_VisionTransformer(Qwen2_5_VLVisionConfig(**config))
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in vit.parameters():
            p.normal_(0.0, 0.05)
    return vit.to(device=device, dtype=dtype).eval()


def tower_input(config: dict, grid, device, dtype, seed: int = 1):
    """x (patches, C*T*P*P) and grid_thw as SGLang gets them (grid: a CPU int64 tensor)."""
    grid_thw = torch.tensor(grid, dtype=torch.int64)
    patches = int(grid_thw.prod(dim=1).sum())
    dim = config["in_channels"] * config["temporal_patch_size"] * config["patch_size"] ** 2
    g = torch.Generator().manual_seed(seed)
    return torch.randn(patches, dim, generator=g).to(device=device, dtype=dtype), grid_thw


def pick_backend(requested: str) -> tuple[str, str]:
    if requested != "auto":
        return requested, "requested"
    if _imports("flash_attn.cute"):
        return "fa4", "flash_attn.cute imports"
    return "triton_attn", "flash_attn.cute does not import (sdpa syncs by design)"


def _imports(module: str) -> bool:
    try:
        __import__(module)
        return True
    except Exception:
        return False


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def sync_check(fn) -> dict:
    """Run fn under sync debug "error"; whether it raised, the message and our/SGLang frames."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        fn()
        return {"raised": False}
    except RuntimeError as exc:
        frames = [f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in traceback.extract_tb(exc.__traceback__)
                  if "sglang" in f.filename]
        return {"raised": True, "message": str(exc).splitlines()[0][:300], "frames": frames[-6:]}
    finally:
        torch.cuda.set_sync_debug_mode(0)
        torch.cuda.synchronize()


def time_forward(fn, iters: int, device: str) -> dict:
    host, wall = [], []
    for _ in range(iters):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        _sync(device)
        host.append((t1 - t0) * 1e3)
        wall.append((time.perf_counter() - t0) * 1e3)
    return {"host_ms": round(statistics.median(host), 4), "wall_ms": round(statistics.median(wall), 4),
            "iters": iters}


def parse_grid(text: str) -> list[list[int]]:
    return [[int(v) for v in item.split("x")] for item in text.split(",") if item]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="JSON result file")
    p.add_argument("--sglang-version", default="", help="label recorded with the result (the installed version is recorded too)")
    p.add_argument("--backend", default="auto", choices=["auto", "fa4", "fa3", "triton_attn", "sdpa"])
    p.add_argument("--grid", default="1x78x138,2x36x64", help="t x h x w per image, comma-separated (patches)")
    p.add_argument("--depth", type=int, default=TOWER_7B["depth"])
    p.add_argument("--hidden", type=int, default=TOWER_7B["hidden_size"])
    p.add_argument("--heads", type=int, default=TOWER_7B["num_heads"])
    p.add_argument("--intermediate", type=int, default=TOWER_7B["intermediate_size"])
    p.add_argument("--out-hidden", type=int, default=TOWER_7B["out_hidden_size"])
    p.add_argument("--fullatt", default=",".join(map(str, TOWER_7B["fullatt_block_indexes"])))
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                   help="cpu: no sync check, only that the script and the hooked forward run (sdpa)")
    args = p.parse_args(argv)
    warnings.simplefilter("ignore")

    result: dict = {"command": shlex.join([sys.executable, *sys.argv]), "sglang_version_label": args.sglang_version}

    def save():
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1, default=str))

    on_gpu = args.device == "cuda"
    if on_gpu and not torch.cuda.is_available():
        result["error"] = "no CUDA device"
        save()
        print("no CUDA device", file=sys.stderr)
        return 2
    if on_gpu:  # a GPU machine without SGLang's CUDA-only binaries (the device machine): stand-ins
        from benchmark.sglang_on_gpu import cuda_only_stubs

        result["stubbed_packages"] = cuda_only_stubs.install_missing()
    import sglang

    dtype = getattr(torch, args.dtype)
    backend, why = pick_backend(args.backend) if on_gpu else ("sdpa", "cpu run")
    config = {**TOWER_7B, "depth": args.depth, "hidden_size": args.hidden, "num_heads": args.heads,
              "intermediate_size": args.intermediate, "out_hidden_size": args.out_hidden,
              "fullatt_block_indexes": [int(i) for i in args.fullatt.split(",") if i]}
    grid = parse_grid(args.grid)
    result.update({
        "sglang_version_installed": getattr(sglang, "__version__", None), "torch": torch.__version__,
        "python": platform.python_version(),
        "device": torch.cuda.get_device_name() if on_gpu else platform.processor() or "cpu",
        "capability": list(torch.cuda.get_device_capability()) if on_gpu else None,
        "backend": {"requested": args.backend, "used": backend, "why": why,
                    "flash_attn_cute": _imports("flash_attn.cute")},
        "config": config, "dtype": args.dtype, "grid": grid,
    })
    save()

    from benchmark.sglang_on_gpu.sglang_towers import init_sglang

    init_sglang(backend, dist_backend="gloo")  # world size 1: no collectives
    from sglang.srt.models.qwen2_5_vl import Qwen2_5_VisionTransformer

    upstream_forward = Qwen2_5_VisionTransformer.forward  # before the plugin wraps it
    result["plugin"] = load_plugin()
    save()

    vit = build_tower(config, args.device, dtype)
    x, grid_thw = tower_input(config, grid, args.device, dtype)
    result["patches"] = x.shape[0]
    result["attention_backend_of_block0"] = vit.blocks[0].attn.qkv_backend_name
    runs = {"upstream": lambda: upstream_forward(vit, x, grid_thw), "hooked": lambda: vit(x, grid_thw)}

    with torch.inference_mode():
        outs = {name: fn() for name, fn in runs.items()}  # warm: compiles happen here
        outs = {name: fn() for name, fn in runs.items()}
        _sync(args.device)
        diff = (outs["hooked"].float() - outs["upstream"].float()).abs().max().item()
        result["max_abs_diff"] = diff
        result["bitwise_equal"] = bool(torch.equal(outs["hooked"], outs["upstream"]))
        result["output_shape"] = list(outs["hooked"].shape)
        save()
        for name, fn in runs.items():
            result[name] = sync_check(fn) if on_gpu else {"raised": None}
            save()
        for name, fn in runs.items():
            result[name].update(time_forward(fn, args.iters, args.device))
            save()

    agree = result["bitwise_equal"]  # README: bitwise equal to upstream's forward
    if on_gpu:
        result["ok"] = bool(result["upstream"]["raised"] and not result["hooked"]["raised"] and agree)
    else:
        result["ok"] = bool(agree and result["plugin"]["forward_hooked"])
    save()
    print(f"sglang {result['sglang_version_installed']} ({args.sglang_version or 'no label'}), "
          f"{result['device']}, backend {backend} ({why}), {result['patches']} patches")
    for name in runs:
        r = result[name]
        state = {True: f"raised: {r.get('message')}", False: "no sync", None: "sync not checked (cpu)"}[r["raised"]]
        print(f"  {name:9s} {state}; host {r['host_ms']:.3f} ms, wall {r['wall_ms']:.3f} ms per forward")
    print(f"  max |hooked - upstream| = {diff:.3g} (bitwise equal: {result['bitwise_equal']})")
    print("OK" if result["ok"] else "FAIL", "->", args.out)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
