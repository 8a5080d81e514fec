"""The ``sglang-fa4`` command. Each subcommand lives in its own module exposing
``add_parser(subparsers)``; heavy imports (torch, flash_attn, cutlass) happen inside the handlers.

Every failure is a message, never a traceback: the handlers turn the failures they expect into
their own messages; anything else that escapes one is printed here as one line (exit 1).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# module (under sglang_fa4) -> registers one or more subcommands
SUBCOMMAND_MODULES = (
    "doctor",
    "patching.cli",
    "bench.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sglang-fa4",
        description="FlashAttention-4 as SGLang's ViT attention backend: diagnose, patch, benchmark.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(f"sglang_fa4.{name}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except BrokenPipeError:  # `sglang-fa4 doctor | head`: the reader left, nothing is wrong here
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 1
    except (OSError, ValueError, RuntimeError, ImportError) as exc:
        print(f"sglang-fa4 {args.command}: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
