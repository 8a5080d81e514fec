"""SGLang's own ``bench_serving`` (``sglang.benchmark.serving.cli_main``), run where HF ``datasets``
is missing (the GPU machine: no package index, and pyarrow alone is over a call's size limit).
SGLang 0.5.23 imports ``datasets.load_dataset`` at module level for its MMMU dataset only; the
random dataset on a local ShareGPT file never calls it, so a stand-in whose ``load_dataset``
raises, naming itself, is installed when (and only when) the real package does not import.

    python bench_serving_main.py [--parse-only] BENCH_SERVING_ARGS...

``--parse-only`` (this wrapper's, for the CPU dry run): SGLang's own parser and checks take the
arguments, SGLang's own tokenizer loader and dataset reader build the requests (offline: the local
file and tokenizer), and one JSON line -- the parsed arguments and the requests' prompt / output
lengths -- is printed instead of running.
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


def main(argv: list[str]) -> None:
    parse_only = "--parse-only" in argv
    argv = [a for a in argv if a != "--parse-only"]
    install_datasets_stand_in()
    from sglang.benchmark import serving

    if parse_only:
        def show(args):
            requests = serving.get_dataset(args, serving.get_tokenizer(args.tokenizer or args.model), args.model)
            lens = [(r.prompt_len, r.output_len) for r in requests]
            print(json.dumps({"args": vars(args), "requests": lens}, default=str))

        serving.run_benchmark = show
    sys.argv = ["sglang.benchmark.serving", *argv]
    serving.cli_main()


if __name__ == "__main__":
    main(sys.argv[1:])
