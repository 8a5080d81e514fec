"""SGLang's own ``bench_serving`` (``sglang.benchmark.serving.cli_main``), run where HF ``datasets``
is missing (the GPU machine: no package index, and pyarrow alone is over a call's size limit).
SGLang 0.5.23 imports ``datasets.load_dataset`` at module level for its MMMU dataset only; the
random dataset on a local ShareGPT file never calls it, so a stand-in whose ``load_dataset``
raises, naming itself, is installed when (and only when) the real package does not import.

    python bench_serving_main.py [--parse-only] BENCH_SERVING_ARGS...
    python bench_serving_main.py --stdin


``--parse-only`` (this wrapper's, for the CPU dry run): SGLang's own parser and checks take the
arguments, SGLang's own tokenizer loader and dataset reader build the requests (offline: the local
file and tokenizer), and one JSON line -- the parsed arguments and the requests' prompt / output
lengths -- is printed instead of running.

``--stdin``: one run per input line (a JSON list of bench_serving arguments) in this one process,
so SGLang is imported once (about 25 s per run on the GPU machine otherwise); after each run one
line ``DONE_MARK {"rc": 0|1, "error": ...}`` (bench_serving's own output goes to stdout before it).
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types


def install_datasets_stand_in() -> bool:
    """A ``datasets`` module whose ``load_dataset`` raises, if the real one is not importable."""
    if importlib.util.find_spec("datasets") is not None:
        return False
    mod = types.ModuleType("datasets")

    def load_dataset(*args, **kwargs):
        raise RuntimeError("datasets.load_dataset: HF datasets is not installed here (bench_serving_main's "
                           "stand-in); only datasets read from a local file work")

    mod.load_dataset = load_dataset
    mod.__version__ = "0.0.0+stand-in"
    sys.modules["datasets"] = mod
    return True


DONE_MARK = "BENCH_SERVING_MAIN_DONE"


def show_requests(serving, args) -> None:
    """``--parse-only``: the parsed arguments and the requests' lengths as one JSON line."""
    requests = serving.get_dataset(args, serving.get_tokenizer(args.tokenizer or args.model), args.model)
    lens = [(r.prompt_len, r.output_len) for r in requests]
    print(json.dumps({"args": vars(args), "requests": lens}, default=str), flush=True)


def run_lines(lines, out=sys.stdout) -> None:
    """``--stdin``: SGLang's own parser and ``run_benchmark`` for every line (``--parse-only`` in a
    line: its requests shown instead), the error of one run reported and the next still run."""
    install_datasets_stand_in()
    from sglang.benchmark import serving

    real = serving.run_benchmark
    for line in lines:
        if not line.strip():
            continue
        captured = []
        rc, err = 0, None
        try:
            argv = json.loads(line)
            if not isinstance(argv, list) or not all(isinstance(x, str) for x in argv):
                raise ValueError(f"a line must be a JSON list of strings, not {line.strip()[:80]!r}")
            parse_only = "--parse-only" in argv
            argv = [x for x in argv if x != "--parse-only"]
            serving.run_benchmark = captured.append  # the parser and its checks only
            sys.argv = ["sglang.benchmark.serving", *argv]
            serving.cli_main()
            serving.run_benchmark = real
            if len(captured) != 1:
                raise RuntimeError(f"cli_main handed over {len(captured)} argument sets")
            if parse_only:
                show_requests(serving, captured[0])
            else:
                real(captured[0])
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - reported on the DONE line
            rc, err = 1, f"{type(exc).__name__}: {exc}"[:1000]
        finally:
            serving.run_benchmark = real
        print(f"{DONE_MARK} {json.dumps({'rc': rc, 'error': err})}", file=out, flush=True)


def main(argv: list[str]) -> None:
    if argv == ["--stdin"]:
        run_lines(sys.stdin)
        return
    parse_only = "--parse-only" in argv
    argv = [a for a in argv if a != "--parse-only"]
    install_datasets_stand_in()
    from sglang.benchmark import serving

    if parse_only:
        serving.run_benchmark = lambda args: show_requests(serving, args)
    sys.argv = ["sglang.benchmark.serving", *argv]
    serving.cli_main()


if __name__ == "__main__":
    main(sys.argv[1:])
