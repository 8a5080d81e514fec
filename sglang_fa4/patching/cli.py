"""``sglang-fa4 patch {status,check,apply,revert}`` and ``sglang-fa4 build-wheel``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add_parser(subparsers) -> None:
    patch = subparsers.add_parser(
        "patch",
        help="apply/revert the sglang-fa4 patch series on an SGLang tree",
        description="Apply, check or revert the patch series for the target's SGLang version. "
        "Operations are all-or-nothing; refusals change nothing.",
    )
    patch.add_argument("action", choices=("status", "check", "apply", "revert"))
    patch.add_argument(
        "--target",
        metavar="DIR",
        help="an sglang package dir, a dir holding sglang/ (site-packages, unpacked wheel) or a "
        "source checkout (python/sglang/); default: the installed sglang",
    )
    patch.add_argument("--sglang-version", metavar="X.Y.Z", help="override the detected sglang version")
    patch.add_argument("--json", action="store_true", help="machine-readable output (status/apply/revert)")
    patch.set_defaults(handler=_run_patch)

    wheel = subparsers.add_parser(
        "build-wheel",
        help="build a fork wheel sglang-<version>+fa4.N with the patch series applied",
    )
    wheel.add_argument("--sglang", required=True, metavar="X.Y.Z", help="upstream sglang version")
    wheel.add_argument("-o", "--output", default="dist", metavar="DIR", help="output directory (default dist/)")
    wheel.add_argument("--from", dest="source", metavar="FILE",
                       help="use this upstream wheel instead of downloading one with pip")
    wheel.set_defaults(handler=_run_build_wheel)


def _run_patch(args: argparse.Namespace) -> int:
    from sglang_fa4.patching import apply as ops
    from sglang_fa4.patching.series import PatchError

    try:
        target = ops.resolve_target(args.target, args.sglang_version)
        if args.action == "status":
            info = ops.status(target)
            if args.json:
                print(json.dumps(info, indent=2))
            else:
                if info["applied_by_content"]:
                    state = (f"applied (told by content: its {ops.STATE_NAME} is missing; "
                             "'sglang-fa4 patch revert' undoes it)")
                else:
                    state = f"applied (revision {info['applied_revision']})" if info["applied"] else "not applied"
                print(f"sglang {info['sglang_version']} at {info['package']}: {state}; "
                      f"series revision {info['series_revision']}: {', '.join(info['patches'])}")
                for rel, what in info["files"].items():
                    print(f"  {what:9s} {rel}")
        elif args.action == "check":
            for line in ops.check(target):
                print(line)
        elif args.action == "apply":
            state = ops.apply(target)
            print(json.dumps(state, indent=2) if args.json else
                  f"applied {len(state['patches'])} patch(es), {len(state['files'])} file(s) to {target.package}")
        else:
            state = ops.revert(target)
            lost = " (its state file was missing: told by content)" if state.get("state_file") == "missing" else ""
            print(json.dumps(state, indent=2) if args.json else
                  f"reverted {len(state['patches'])} patch(es){lost}; {len(state['files'])} file(s) restored byte-identical")
    except PatchError as exc:
        print(f"sglang-fa4 patch {args.action}: {exc}", file=sys.stderr)
        return 1
    return 0


def _run_build_wheel(args: argparse.Namespace) -> int:
    from sglang_fa4.patching.series import PatchError
    from sglang_fa4.patching.wheel import build_fork_wheel

    try:
        path = build_fork_wheel(args.sglang, Path(args.output), Path(args.source) if args.source else None)
    except PatchError as exc:
        print(f"sglang-fa4 build-wheel: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0
