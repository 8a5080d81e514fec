"""SGLang's own ``bench_serving`` against a live server, offline: its command line, the local dataset it
needs, and its result file read back.

``--dataset-name random`` (SGLang 0.5.20-0.5.23, ``benchmark/datasets/random.py``) cuts or repeats
the token ids of ShareGPT conversations' first turns to the requested input length; without a valid
``--dataset-path`` it downloads ShareGPT, which the GPU machine cannot. :func:`write_sharegpt` makes a
local file of that format (seeded ASCII word salad, every conversation a different opening, so
no two prompts share a prefix). With the harness's byte-level tokenizers an ASCII text decodes
and re-encodes to the same ids, so a prompt has exactly the requested number of tokens (SGLang's
own tokenizer on the server adds the BOS that bench_serving subtracts). ``--tokenizer`` is the
checkpoint directory (no /model_info lookup, no hub).
"""

from __future__ import annotations

import json
import queue
import random
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from bench_serving_main import DONE_MARK

WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "
         "quebec romeo sierra tango uniform victor whiskey xray yankee zulu river stone cloud field light "
         "paper window garden engine silver orange number market").split()


def write_sharegpt(path: Path, conversations: int = 64, words: int = 2000, seed: int = 0) -> Path:
    """A ShareGPT-format JSON (``conversations``: human, gpt) of ASCII text, ``words`` words per
    first turn (~12k bytes: longer than an 8k-token prompt, so bench_serving cuts it, not repeats)."""
    rng = random.Random(seed)
    data = []
    for i in range(conversations):
        text = f"Conversation {i}: " + " ".join(rng.choice(WORDS) for _ in range(words))
        data.append({"id": f"local-{i}", "conversations": [{"from": "human", "value": text},
                                                          {"from": "gpt", "value": "ok"}]})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


@dataclass(frozen=True)
class Workload:
    input_len: int
    output_len: int
    num_prompts: int
    concurrency: int

    @property
    def name(self) -> str:
        return f"in{self.input_len}-out{self.output_len}-c{self.concurrency}"


def parse_workload(s: str) -> Workload:
    """``IN:OUT:PROMPTS:CONCURRENCY`` (e.g. 8192:1024:16:16)."""
    try:
        i, o, n, c = (int(x) for x in s.split(":"))
    except ValueError:
        raise ValueError(f"bad workload {s!r}: IN:OUT:PROMPTS:CONCURRENCY, four integers") from None
    if min(i, o, n, c) < 1:
        raise ValueError(f"bad workload {s!r}: every number must be >= 1")
    if n < c:
        raise ValueError(f"bad workload {s!r}: {n} prompts never reach concurrency {c}")
    return Workload(i, o, n, c)


def command(python: str, port: int, model_dir: str, dataset: Path, w: Workload, seed: int, out_file: Path) -> list[str]:
    """SGLang's ``bench_serving`` for one run, through ``bench_serving_main.py`` (a ``datasets``
    stand-in where HF datasets is missing); greedy, ignore-eos: every request decodes exactly
    ``output_len`` tokens; no warmup request: the harness's accuracy prompts warmed the server, and
    a 1k-token warmup would cost a whole decode."""
    return [python, str(Path(__file__).resolve().parent / "bench_serving_main.py"), "--backend", "sglang", "--host", "127.0.0.1", "--port", str(port),
            "--model", model_dir, "--tokenizer", model_dir,
            "--dataset-name", "random", "--dataset-path", str(dataset),
            "--random-input-len", str(w.input_len), "--random-output-len", str(w.output_len),
            "--random-range-ratio", "1", "--num-prompts", str(w.num_prompts),
            "--max-concurrency", str(w.concurrency), "--request-rate", "inf", "--seed", str(seed),
            "--warmup-requests", "0", "--disable-tqdm", "--output-details", "--output-file", str(out_file)]


#: what the report keeps of a bench_serving result
METRICS = ("completed", "duration", "output_throughput", "mean_tpot_ms", "median_tpot_ms", "median_itl_ms",
           "mean_itl_ms", "mean_ttft_ms", "median_ttft_ms", "p99_itl_ms", "total_input_tokens", "total_output_tokens")


def read_result(out_file: Path, num_prompts: int) -> dict:
    """The last JSON line of bench_serving's ``--output-file``: the metrics kept, failed requests
    (a non-empty error, or prompts not completed), and the output lengths seen."""
    if not out_file.exists():
        return {"ok": False, "error": f"no result file {out_file.name}"}
    lines = [line for line in out_file.read_text().splitlines() if line.strip()]
    if not lines:
        return {"ok": False, "error": f"{out_file.name} is empty"}
    r = json.loads(lines[-1])
    missing = [k for k in ("completed", "output_throughput", "mean_tpot_ms", "median_itl_ms", "mean_ttft_ms")
               if r.get(k) is None]
    if missing:
        return {"ok": False, "error": f"bench_serving result lacks {missing}"}
    errors = [e for e in r.get("errors") or [] if e]
    out = {k: r.get(k) for k in METRICS}
    out["failed"] = max(len(errors), num_prompts - int(r["completed"]))
    out["errors"] = errors[:5]
    lens = r.get("output_lens") or []
    out["output_lens"] = sorted(set(lens)) if lens else None
    out["ok"] = out["failed"] == 0
    return out


class Client:
    """One ``bench_serving_main.py --stdin`` process for all of a call's runs (SGLang imported once):
    :meth:`run` hands it one run's arguments and returns ``(rc, error, output)`` once the run's DONE
    line arrives, or ``(124, "timeout ...", output)`` after ``timeout`` s (the process is then
    killed; the next run starts a new one)."""

    def __init__(self, python: str, env: dict, cwd: Path):
        self.python, self.env, self.cwd, self.proc, self.lines = python, env, cwd, None, None

    def start(self) -> None:
        """Start the process now (it imports SGLang at once: start it while the servers come up)."""
        self.proc = subprocess.Popen([self.python, str(Path(__file__).resolve().parent / "bench_serving_main.py"),
                                      "--stdin"], env=self.env, cwd=self.cwd, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        self.lines = queue.Queue()
        proc, lines = self.proc, self.lines

        def pump():
            for line in proc.stdout:
                lines.put(line)
            lines.put(None)  # the process ended

        threading.Thread(target=pump, daemon=True).start()

    def run(self, args: list[str], timeout: float) -> tuple[int, str | None, str]:
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        self.proc.stdin.write(json.dumps(args) + "\n")
        self.proc.stdin.flush()
        out, end = [], time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                self.close()
                return 124, f"timeout after {timeout:.0f} s", "".join(out)
            if line is None:
                self.proc = None
                return 1, "bench_serving_main exited", "".join(out)
            if line.startswith(DONE_MARK):
                done = json.loads(line[len(DONE_MARK):])
                return int(done["rc"]), done.get("error"), "".join(out)
            out.append(line)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None
