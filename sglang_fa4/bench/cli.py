"""`sglang-fa4 bench kernels|vit|decode`: argument parsing only; the work lives in kernels.py / vit.py /
decode.py."""

from __future__ import annotations

import argparse

from .layouts import QUICK_KERNEL_LAYOUTS


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out-dir", default=None,
                   help="where JSON/markdown/PNG go (default: benchmark/results/<gpu>, e.g. h200)")
    p.add_argument("--quick", action="store_true", help="a small subset that runs in about a minute")
    p.add_argument("--time-budget-s", type=float, default=0,
                   help="start no new case after this many seconds (0: no limit); results stay valid")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG (no matplotlib needed)")


def apply_quick_kernels(args) -> None:
    if args.quick:
        if args.head_dims == [64, 72, 80, 128]:
            args.head_dims = [80, 128]
        from .layouts import DEFAULT_KERNEL_LAYOUTS

        if args.layouts == list(DEFAULT_KERNEL_LAYOUTS):
            args.layouts = list(QUICK_KERNEL_LAYOUTS)
        if args.rounds == 10:
            args.rounds = 4


def apply_quick_vit(args) -> None:
    if args.quick:
        from .vit import MODELS
        from .layouts import PICTURES

        if args.models == list(MODELS):
            args.models = ["qwen2_5_vl"]
        if args.images == list(PICTURES):
            args.images = ["448", "720p"]
        if args.rounds == 5:
            args.rounds = 3


def _kernels(args) -> int:
    from . import kernels

    apply_quick_kernels(args)
    kernels.run(args)
    return 0


def _vit(args) -> int:
    from . import vit

    apply_quick_vit(args)
    vit.run(args)
    return 0


def _decode(args) -> int:
    from . import decode

    decode.run(args)
    return 0


def add_parser(subparsers) -> None:
    from . import decode, kernels, vit

    bench = subparsers.add_parser("bench", help="benchmarks on a CUDA GPU (kernels, vit, decode)")
    sub = bench.add_subparsers(dest="bench_command", required=True)
    for name, module, handler, summary in (
        ("kernels", kernels, _kernels, "varlen attention kernels: fa4 vs fa4_public vs triton_attn vs sdpa"),
        ("vit", vit, _vit, "transformers Qwen2.5-VL / Qwen3-VL vision towers end to end per attention backend"),
        ("decode", decode, _decode, "paged FP8-KV decode: the split-KV kernel vs FA3-FP8 and FA3-bf16 (FA3's "
                                    "own splits), SGLang's triton fp8"),
    ):
        parser = sub.add_parser(name, help=summary, description=(module.__doc__ or "").split("\n\n")[0])
        module.add_arguments(parser)
        _common(parser)
        parser.set_defaults(handler=handler)
