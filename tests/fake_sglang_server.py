"""A stand-in for ``python -m sglang.launch_server`` that speaks just enough of SGLang 0.5.23's HTTP
API and log for ``benchmark/release/serve_llm.py``'s orchestration to run end to end on a CPU
(tests/test_serve_llm.py): the log lines the harness waits for (the KV pool, "ready"), ``/v1/models``,
``/generate`` with ``input_ids`` only (text is refused, as the harness must never send it), greedy
logprobs with SGLang's conventions (``output_top_logprobs``; ``input_token_logprobs`` from
``logprob_start_len`` with None at that first position), a "Decode batch ... #running-req: N" line
while requests decode at once, and ``/start_profile`` writing a torch-profiler-like trace.

The "model" is a hash: the next token and its logprob depend only on the ids before it, so the
same ids get the same answer in every arm and a prefill scores a greedy answer exactly as the
decode did. ``--skew`` (nats) shifts every logprob of one arm, to make a run's arms differ.

usage: fake_sglang_server.py --port P [--attention-backend B] [--skew X] [--gather N --gather-new-tokens T]
       [...ignored SGLang args]
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

READY = "The server is fired up and ready to roll!"


def next_token(ids: list[int]) -> tuple[int, float, float]:
    """(token, its logprob, the runner-up's logprob) after ``ids``."""
    h = hashlib.sha256(json.dumps(ids[-64:]).encode() + str(len(ids)).encode()).digest()
    tok = 1000 + int.from_bytes(h[:4], "little") % 29000
    lp = -8.0 - h[4] / 255.0
    return tok, lp, lp - 0.05 - h[5] / 255.0


def scored(before: list[int], tok: int) -> float:
    """A prefill's logprob of ``tok`` after ``before``: the decode's where it is the greedy token."""
    greedy, lp, _ = next_token(before)
    return lp if greedy == tok else -20.0


def log(msg: str) -> None:
    print(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {msg}", flush=True)


class JsonHandler(BaseHTTPRequestHandler):
    """A quiet handler that answers JSON (this fake's, and tests/test_server_client.py's)."""

    def log_message(self, *args):
        pass

    def reply(self, body: dict, code: int = 200) -> None:
        raw = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)


#: a request asking ``--gather-new-tokens`` new tokens answers only once ``--gather`` requests ran at
#: once (at most HOLD_S), so the profile's requests decode together however slowly a loaded machine
#: starts them: a timed quiet window (0.3 s, then 1.0 s) let a loaded clean-clone CI run see them
#: spread wider and end apart. Other requests answer at once.
HOLD_S = 60.0


class Server(ThreadingHTTPServer):
    #: the listen backlog: socketserver's 5 reset connections when the profile's 16 requests connect
    #: at once on a loaded machine (a clean-clone CI run: ConnectionResetError); SGLang's uvicorn
    #: listens with 2048
    request_queue_size = 128


class State:
    def __init__(self, skew: float, gather: int, gather_new_tokens: int):
        self.skew, self.running, self.most_running = skew, 0, 0
        self.gather, self.gather_new_tokens = gather, gather_new_tokens
        self.cond = threading.Condition()


def handler(state: State):
    class H(JsonHandler):
        def do_GET(self):
            self.reply({"data": [{"id": "fake"}]} if self.path == "/v1/models" else {})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            if self.path == "/start_profile":
                threading.Thread(target=write_trace, args=(Path(body["output_dir"]), body.get("num_steps", 5)),
                                 daemon=True).start()
                return self.reply({})
            if self.path != "/generate":
                return self.reply({"error": self.path}, 404)
            ids = body.get("input_ids")
            if not (isinstance(ids, list) and ids and all(isinstance(i, int) for i in ids)):
                return self.reply({"error": "the fake server takes input_ids only"}, 400)
            n = int(body.get("sampling_params", {}).get("max_new_tokens", 16))
            with state.cond:
                state.running += 1
                state.most_running = max(state.most_running, state.running)
                log(f"Decode batch, #running-req: {state.running}, #token: {len(ids)}")
                state.cond.notify_all()
            try:
                seq, out, top = list(ids), [], []
                for _ in range(n):
                    tok, lp, lp2 = next_token(seq)
                    out.append([lp + state.skew, tok, None])
                    top.append([[lp + state.skew, tok, None], [lp2 + state.skew, tok + 1, None]])
                    seq.append(tok)
                    time.sleep(0.002)
                meta = {"output_token_logprobs": out, "output_top_logprobs": top}
                start = body.get("logprob_start_len")
                if start is not None:  # SGLang: position ``start`` gets None, then each token's logprob
                    meta["input_token_logprobs"] = [[None, ids[start], None]] + [
                        [scored(ids[:i], ids[i]) + state.skew, ids[i], None] for i in range(start + 1, len(ids))]
                if n == state.gather_new_tokens:
                    with state.cond:
                        state.cond.wait_for(lambda: state.most_running >= state.gather, timeout=HOLD_S)
                return self.reply({"text": "", "meta_info": meta})
            finally:
                with state.cond:
                    state.running -= 1

    return H


def write_trace(out_dir: Path, steps: int) -> None:
    time.sleep(0.2)
    events = []
    for _ in range(steps):  # a 12-layer step: per layer attention and a GEMM, the LM head once
        events += [{"ph": "X", "cat": "kernel", "name": "fp8_paged_decode_split", "dur": 10.0},
                   {"ph": "X", "cat": "kernel", "name": "nvjet_sm90_tst_192x16_64x8_2x1_v_bz_TNT", "dur": 30.0}] * 12
        events.append({"ph": "X", "cat": "kernel", "name": "nvjet_sm90_tst_512x16_64x3_2x1_v_bz_TNT", "dur": 20.0})
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "fake.trace.json.gz").write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--attention-backend", default="triton")
    ap.add_argument("--skew", type=float, default=0.0)
    ap.add_argument("--gather", type=int, default=0, help="requests that must run at once ...")
    ap.add_argument("--gather-new-tokens", type=int, default=-1, help="... before ones of this size answer")
    a, _ = ap.parse_known_args()
    log(f"server_args=ServerArgs(attention_backend='{a.attention_backend}', fake=True)")
    server = Server(("127.0.0.1", a.port), handler(State(a.skew, a.gather, a.gather_new_tokens)))
    log("Full KV Cache is allocated. dtype: torch.float8_e4m3fn, #tokens: 1000")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    log(READY)
    try:
        while True:
            time.sleep(1)
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
