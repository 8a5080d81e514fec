"""CPU dry run of the arms' launch_server arguments (benchmark/release/serve_llm.py --cpu-dry, and
tests/test_serve_llm.py): run under a real SGLang (its packages first on PYTHONPATH), with the
plugins loaded by SGLang's loader, each arm's EXACT argument list goes through SGLang's own CLI
parser (``ServerArgs.add_cli_args`` / ``from_cli_args``) and server-args resolution on an SM90
platform faked with SGLang's ``override_platform`` (plus ``device='cuda'``, which a CPU cannot
detect), each arm's environment set; prints one JSON line: per case the resolved attention
backend, KV cache dtype, page size, or the error.

usage: python resolve_arms.py CASES.json   (a list of {"name", "argv", "env"}; start one process per
environment: sglang_fa4's plugin reads its switches when SGLang loads it)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings

SM90 = dict(is_sm90=True, is_hopper_with_cuda_12_3=True, is_sm100=False, is_sm120=False, is_blackwell=False)


def main() -> None:
    warnings.simplefilter("ignore")
    cases = json.loads(open(sys.argv[1]).read())
    from sglang.srt.plugins import load_plugins

    load_plugins()
    from sglang.srt.arg_groups.overrides import resolved_view
    from sglang.srt.runtime_context import override_platform
    from sglang.srt.server_args import ServerArgs

    out = []
    for case in cases:
        saved = {k: os.environ.get(k) for k in case["env"]}
        os.environ.update(case["env"])
        try:
            with override_platform(is_cuda=True, **SM90):
                parser = argparse.ArgumentParser()
                ServerArgs.add_cli_args(parser)
                ns = parser.parse_args(case["argv"])
                ns.device = "cuda"
                sa = ServerArgs.from_cli_args(ns)
                sa.resolve_once()
                v = resolved_view(sa)
                out.append({"name": case["name"], "backend": v.attention_backend,
                            "kv_cache_dtype": v.kv_cache_dtype, "page_size": v.page_size})
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - reported per case (argparse exits)
            out.append({"name": case["name"], "error": f"{type(exc).__name__}: {exc}"[:1500]})
        finally:
            for k, val in saved.items():
                if val is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = val
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
