"""The warm parent of the real-SGLang snippets (tests/sglang_harness.py): one per SGLang version.

Why: every snippet used to be a fresh interpreter that spent ~80% of its CPU time importing the
same third-party stack SGLang sits on (torch, torchvision, triton, transformers, openai, ...), about
20 s on a 2-core CI machine, before doing a second of work. This process imports that stack once
(never SGLang itself nor sglang_fa4: those read the snippet's environment at import), then forks one
child per snippet. The child gets what a fresh ``python -c`` would have -- the snippet's environment,
working directory, ``sys.argv``, a fresh ``__main__``, its own stdout/stderr files, freshly seeded
``random`` -- and then imports SGLang and runs the snippet exactly as before.

Run by the harness as ``python -c <this file's text>`` (so ``sys.path[0]`` is the working
directory, like a snippet's), with the version's target dir on PYTHONPATH. Protocol, one JSON
object per line: the harness writes ``{"code", "env", "cwd", "stdout", "stderr", "timeout"}`` on
stdin; this process answers ``{"rc", "timed_out"}`` once the child has exited (or was killed,
with its process group, at the timeout). End of stdin ends it.
"""

import json
import os
import signal
import sys
import time
import warnings

# Third-party packages SGLang imports at import time; none reads an SGLANG_* variable, so importing
# them before the snippet's environment is in place changes nothing. Missing ones are skipped.
PRELOAD = (
    "numpy", "PIL.Image", "requests", "pydantic", "yaml", "psutil", "zmq", "aiohttp", "fastapi",
    "uvicorn", "IPython", "torch", "torch._inductor.compile_fx", "torchvision", "triton",
    "transformers", "transformers.activations", "tokenizers", "huggingface_hub", "safetensors",
    "openai", "compressed_tensors", "xgrammar",
)


def _preload() -> None:
    with warnings.catch_warnings():  # the filters a snippet starts with stay the defaults
        warnings.simplefilter("ignore")
        for name in PRELOAD:
            try:
                __import__(name)
            except Exception:  # noqa: BLE001 -- a snippet importing it will see the real error
                sys.modules.pop(name, None)


def _child(req: dict, answers_fd: int) -> None:
    """In the forked child: become a fresh ``python -c`` of the snippet, run it, exit. Never returns."""
    rc = 1
    try:
        os.setpgid(0, 0)  # its own process group: a timeout kills what it started too
        os.close(answers_fd)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        sys.stdin = open(os.devnull)
        for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
            out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(out, fd)
            os.close(out)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        signal.signal(signal.SIGINT, signal.default_int_handler)
        import random
        random.seed()  # a fresh interpreter seeds from the OS; forked children would all share one state
        if "numpy.random" in sys.modules:
            sys.modules["numpy.random"].seed()
        import builtins
        import types

        main = types.ModuleType("__main__")
        main.__builtins__ = builtins
        sys.modules["__main__"] = main
        sys.argv = ["-c"]
        try:
            exec(compile(req["code"], "<string>", "exec"), main.__dict__)
            rc = 0
        except SystemExit as exc:  # as the interpreter reports it
            if exc.code is None:
                rc = 0
            elif isinstance(exc.code, int):
                rc = exc.code
            else:
                print(exc.code, file=sys.stderr)
                rc = 1
        except BaseException:  # noqa: BLE001
            import traceback

            traceback.print_exc()
            rc = 1
        import atexit

        atexit._run_exitfuncs()  # what interpreter shutdown runs (multiprocessing joins its helpers)
    except BaseException:  # noqa: BLE001 -- the setup itself failed: say so in the child's stderr
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(rc & 0xFF)


def _wait(pid: int, timeout: float) -> tuple[int, bool]:
    deadline = time.monotonic() + timeout
    delay = 0.01
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status), False
        if time.monotonic() > deadline:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            _, status = os.waitpid(pid, 0)
            return os.waitstatus_to_exitcode(status), True
        time.sleep(delay)
        delay = min(delay * 2, 0.2)


def main() -> None:
    # the protocol answers go to a private copy of stdout; fd 1 itself goes nowhere, so nothing a
    # preloaded module prints can corrupt them
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    quiet = os.open(os.devnull, os.O_WRONLY)
    os.dup2(quiet, 1)
    _preload()
    for line in sys.stdin:
        req = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(req, answers.fileno())
        rc, timed_out = _wait(pid, float(req["timeout"]))
        answers.write(json.dumps({"rc": rc, "timed_out": timed_out}) + "\n")


if __name__ == "__main__":
    main()
