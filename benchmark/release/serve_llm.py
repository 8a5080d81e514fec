"""LLM serving on an FP8 KV cache, our route against SGLang's default (issue #45; issue #44 item 4 for
Gemma-4), with real SGLang ``launch_server`` processes on one GPU.

One invocation, one model: each arm's server (benchmark/serve_check/serve_arms.py) started ONCE,
one after another (the next when the previous has sized its KV pool), all alive together with the
same ``--max-total-tokens`` (equal KV pools in tokens) and ``--mem-fraction-static``; then, against
the live servers, one serving at a time: the accuracy prompts (token ids, greedy, 32 tokens, logprobs
and top-2 margins) on every arm, and every arm scoring the baseline's answers teacher-forced; then
SGLang's own ``bench_serving`` (one client process, serve_check/bench_serving_run.Client) per
workload in rounds A B C A B C A B C; then one decode profile per arm (torch.profiler through
``/start_profile``, 16 requests at ~8k context; its time kept back from the rounds); the servers
stopped, their logs read (0 FA4 compiles / Triton kernel loads after ready, the backend each
resolved, the pools). Dummy weights redrawn N(0, 0.02) per parameter name, Gemma-4's q/k norms at
head_dim**-0.25 (serve_check/check_plugin.py), so greedy tokens mean something and are the same in
every arm.

Writes OUT/serve_llm-MODEL.json and .md and OUT/serve_llm-MODEL-logs.tgz (the servers' logs, the
bench_serving outputs, the profiles' summaries). ``--cpu-dry`` runs what a CPU can: checkpoint
dirs, dataset, every arm's exact argument list through SGLang's CLI parser and resolution on a
faked SM90 (the backend each arm gets), and the report writer on a sample bench_serving result.

usage (GPU machine, after the bundles: benchmark/release/gpu_serve_call.sh):
  python3 benchmark/release/serve_llm.py --model gemma4_31b --out $OUT --pythonpath SGLANG_PATHS
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tarfile
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
SERVE = HERE.parent / "serve_check"
REPO = HERE.parents[1]
sys.path[:0] = [str(SERVE), str(HERE)]

import bench_serving_run as bench  # noqa: E402
import decode_profile  # noqa: E402
import llm_checkpoints  # noqa: E402
import logcheck  # noqa: E402
import serve_arms  # noqa: E402
import serve_report  # noqa: E402

PLUGIN_DIST = "sglang_fa4_serve_llm-0.0.0.dist-info"
DEFAULTS = {
    # 12 layers keep the 31B's 5:1 sliding:full mix (10 + 2); the bf16 reference arm joins where the
    # GPU holds three such servers (an H200), see docs/serving.md
    "gemma4_31b": {"layers": 12, "workloads": ["8192:1024:16:16", "1024:1024:16:16"]},
    "llama3_8b": {"layers": 32, "workloads": ["8192:1024:16:16", "1024:1024:16:16"]},
}
POOL_LINE = re.compile(r"full_layer_tokens=(\d+), swa_layer_tokens=(\d+)")
BACKEND_ARG = re.compile(r"(?<!\w)attention_backend(?:='|': ')(\w+)'")  # ServerArgs(...) or its dict form
OVER_PROFILED = re.compile(r"max_total_tokens=(\d+) is larger than the profiled value (\d+)")
DECODE_RUNNING = re.compile(r"Decode batch.*#running-req: (\d+)")
PROFILE_RESERVE_S = 45.0  # what one arm's profile takes (16 x 8k prefills, the steps, the trace)


# ---- plan ---------------------------------------------------------------------------------------

def server_opts(model: str, workloads: list, mem_fraction: float, swa_ratio: float) -> serve_arms.ServerOpts:
    """Equal pools for every arm: room for the largest workload's requests all at full length
    (+5%, rounded up to 4096 tokens), and the profile's 16 x 8k."""
    need = max([w.concurrency * (w.input_len + w.output_len) for w in workloads] + [16 * (8192 + 128)])
    tokens = -(-int(need * 1.05) // 4096) * 4096
    conc = max(w.concurrency for w in workloads + [bench.Workload(1, 1, 16, 16)])
    return serve_arms.ServerOpts(max_total_tokens=tokens, mem_fraction_static=mem_fraction,
                                 swa_full_tokens_ratio=swa_ratio, max_running_requests=max(conc, 16),
                                 chunked_prefill_size=8192, cuda_graph_max_bs=max(conc, 16))


def memory_estimate_gib(model: str, layers: int, arms, opts: serve_arms.ServerOpts) -> dict:
    """Weights + KV pools per arm (the planner's figure; the logs give SGLang's)."""
    cfg = llm_checkpoints.model_config(model, layers)
    weights = llm_checkpoints.param_count(cfg) * 2 / 2**30
    out = {}
    for a in arms:
        kvb = llm_checkpoints.kv_bytes_per_token(cfg, 1 if a.kv_cache_dtype.startswith("fp8") else 2)
        kv = (opts.max_total_tokens * kvb["full"] + opts.max_total_tokens * opts.swa_full_tokens_ratio * kvb["swa"]) / 2**30
        out[a.name] = {"weights": round(weights, 2), "kv": round(kv, 2)}
    out["total_weights_kv"] = round(sum(v["weights"] + v["kv"] for v in out.values()), 2)
    return out


def token_ids(rng, n: int, low: int = 1000, high: int = 30000) -> list[int]:
    """``n`` ordinary token ids (below every served model's vocabulary, above its special ids)."""
    return [rng.randrange(low, high) for _ in range(n)]


def accuracy_prompts(n: int, seed: int = 7) -> list[dict]:
    """``n`` fixed prompts of 16 to 3000 token ids (longer than Gemma-4's 1024-token window, so the
    sliding layers slide), seeded: sent as ``input_ids`` so the teacher-forced request can append
    the baseline's answer token for token."""
    import random

    rng = random.Random(seed)
    sizes = [16, 64, 200, 500, 1000, 1500, 2200, 3000]
    return [{"name": f"p{i}-{sizes[i % len(sizes)]}", "ids": token_ids(rng, sizes[i % len(sizes)])} for i in range(n)]


# ---- servers ------------------------------------------------------------------------------------

def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url: str, body: dict | None = None, timeout: float = 600.0):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 - loopback only
        return r.status, r.read()


def write_plugin_dist(ep_dir: Path) -> None:
    dist = ep_dir / PLUGIN_DIST
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang-fa4-serve-llm\nVersion: 0.0.0\n")
    (dist / "entry_points.txt").write_text("[sglang.srt.plugins]\nsglang_fa4_serve_check = check_plugin:register\n"
                                           "sglang_fa4_serve_llm = llm_plugin:register\n")


class Server:
    def __init__(self, arm, argv, env, log_path: Path, port: int):
        self.arm, self.argv, self.env, self.log_path, self.port = arm, argv, env, log_path, port
        self.proc = None
        self.t0 = None
        self.ready = False
        self.startup_s = None
        self.error = None

    def start(self, cwd: Path) -> None:
        self.t0 = time.monotonic()
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(self.argv, env=self.env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def pool_sized(self) -> bool:
        t = self.text()
        return self.proc.poll() is not None or logcheck.READY in t or "KV Cache is allocated" in t

    def poll_ready(self) -> bool:
        if self.ready:
            return True
        if self.proc.poll() is not None:
            self.error = self.error or f"server exited with {self.proc.returncode}"
            return False
        if logcheck.READY in self.text():
            try:
                if http(f"http://127.0.0.1:{self.port}/v1/models", timeout=5)[0] == 200:
                    self.ready, self.startup_s = True, round(time.monotonic() - self.t0, 1)
            except OSError:
                pass
        return self.ready

    def stop(self) -> None:
        if self.proc is None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=20)
                break
            except subprocess.TimeoutExpired:
                continue


def post_generate(port: int, body: dict) -> dict:
    """SGLang's ``/generate``: the answer's ``meta_info``."""
    _, raw = http(f"http://127.0.0.1:{port}/generate", body, timeout=300)
    return json.loads(raw)["meta_info"]


def failed(exc: Exception) -> dict:
    """A request's failure, recorded per prompt."""
    return {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:500]}


def generate(port: int, ids: list[int], max_new_tokens: int) -> dict:
    """One greedy /generate of token ``ids`` with the output tokens' logprobs and the top-1 minus top-2
    margin per token."""
    if not (isinstance(ids, list) and ids and all(isinstance(i, int) for i in ids)):
        raise TypeError(f"generate takes a non-empty list of token ids, not {type(ids).__name__}")
    body = {"input_ids": ids, "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new_tokens,
                                                  "ignore_eos": True},
            "return_logprob": True, "top_logprobs_num": 2}
    try:
        meta = post_generate(port, body)
        lp = meta["output_token_logprobs"]
        top = meta.get("output_top_logprobs") or []
        margins = [round(t[0][0] - t[1][0], 6) if t and len(t) > 1 and None not in (t[0][0], t[1][0]) else None
                   for t in top]
        return {"ok": True, "ids": [int(x[1]) for x in lp], "logprobs": [x[0] for x in lp], "margins": margins}
    except Exception as exc:  # noqa: BLE001 - recorded per prompt
        return failed(exc)


def teacher_forced(port: int, prompt: list[int], answer: list[int]) -> dict:
    """The server's logprobs of ``answer`` after ``prompt``, all scored in one prefill of
    ``prompt + answer``. SGLang reports position ``logprob_start_len`` as None (its logprob would
    come from the position before), so the range starts at the prompt's last token: every answer
    token gets its logprob."""
    body = {"input_ids": prompt + answer, "sampling_params": {"temperature": 0.0, "max_new_tokens": 1},
            "return_logprob": True, "logprob_start_len": len(prompt) - 1}
    try:
        lp = post_generate(port, body)["input_token_logprobs"]
        got = [int(x[1]) for x in lp][-len(answer):]
        vals = [x[0] for x in lp][-len(answer):]
        if got != answer:
            return {"ok": False, "error": f"teacher-forced ids misaligned: {got[:4]}... against {answer[:4]}..."}
        if any(v is None for v in vals):
            return {"ok": False, "error": f"teacher-forced logprobs missing at {[i for i, v in enumerate(vals) if v is None][:4]}"}
        return {"ok": True, "logprobs": vals}
    except Exception as exc:  # noqa: BLE001 - recorded per prompt
        return failed(exc)


def profile_prompts(n: int, context: int, seed: int = 11) -> list[list[int]]:
    """``n`` different prompts of ``context`` token ids (no shared prefix) for the profiled decode."""
    import random

    rng = random.Random(seed)
    return [token_ids(rng, context) for _ in range(n)]


#: the profiled decode: this many requests at once, each asking this many new tokens
PROFILE_REQUESTS, PROFILE_NEW_TOKENS = 16, 160


def profile_arm(s: Server, layers: int, prof_dir: Path, steps: int, context: int) -> dict:
    """PROFILE_REQUESTS requests at ~``context`` tokens decoding; once the log shows them all running,
    SGLang's profiler over ``steps`` decode steps; the trace analysed."""
    n = PROFILE_REQUESTS
    prompts = profile_prompts(n, context)
    mark = len(s.text())
    answers = []
    threads = [threading.Thread(target=lambda p=p: answers.append(generate(s.port, p, PROFILE_NEW_TOKENS)),
                                daemon=True) for p in prompts]
    for t in threads:
        t.start()
    t0 = time.monotonic()
    while time.monotonic() - t0 < 120:
        runs = [int(m[1]) for m in DECODE_RUNNING.finditer(s.text()[mark:])]
        if runs and max(runs) >= n:
            break
        if not any(t.is_alive() for t in threads):  # all answered or failed before n ran at once
            errors = [x.get("error") for x in answers if not x.get("ok")]
            return {"ok": False, "error": f"the {n} requests ended before all decoded at once; errors {errors[:2]}"}
        time.sleep(0.2)
    out_dir = prof_dir / s.arm.name
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        http(f"http://127.0.0.1:{s.port}/start_profile",
             {"output_dir": str(out_dir), "num_steps": steps, "activities": ["CPU", "GPU"]}, timeout=60)
    except Exception as exc:  # noqa: BLE001
        return {"ok": False, "error": f"start_profile: {exc}"}
    for t in threads:
        t.join(timeout=180)
    t0 = time.monotonic()
    trace = None
    while time.monotonic() - t0 < 60 and trace is None:
        trace = decode_profile.newest_trace(out_dir)
        time.sleep(1)
    if trace is None:
        return {"ok": False, "error": "no trace written"}
    time.sleep(2)  # the writer may still be flushing
    r = decode_profile.analyse(decode_profile.load_trace(trace), steps, layers)
    r["context"] = f"{n} requests at ~{context} tokens"
    r["trace"] = trace.name
    return r


# ---- the run ------------------------------------------------------------------------------------

#: the CUDA-only stand-ins (site/sitecustomize.py installs them) and the serve-check modules
STAND_IN_PATHS = (str(SERVE / "site"), str(SERVE))


def client_pythonpath(a) -> str:
    """bench_serving's path: SGLang's packages behind the same CUDA-only stand-ins the servers get
    (on a CUDA machine ``sglang.benchmark.serving`` imports ``sgl_kernel`` through SGLang's
    quantization registry), without the plugin."""
    return ":".join([*STAND_IN_PATHS, a.pythonpath])


def server_pythonpath(a) -> str:
    """The servers' path: the stand-ins, the plugin's entry point (``a.work/ep``), SGLang's packages."""
    return ":".join([*STAND_IN_PATHS, str(a.work / "ep"), a.pythonpath])


def build_servers(a, arms, ckpt: Path, pythonpath: str, opts) -> list[Server]:
    servers = []
    for arm in arms:
        port = free_port()
        argv = [a.python, "-m", "sglang.launch_server",
                *serve_arms.server_args(a.model, arm, str(ckpt), port, opts)]
        env = {**os.environ, **serve_arms.server_env(arm), "PYTHONPATH": pythonpath}
        servers.append(Server(arm, argv, env, a.work / f"server-{a.model}-{arm.name}.log", port))
    return servers


def command_line(s: Server) -> str:
    keys = sorted(serve_arms.server_env(s.arm))
    return " ".join([f"{k}={s.env[k]}" for k in keys] + [shlex.quote(x) for x in s.argv])


def log_facts(text: str) -> dict:
    f = logcheck.analyse(text)
    lines = text.splitlines()
    ready_at = f.get("ready_line")
    f["attention_backends"] = sorted({m[1] for line in lines if (m := BACKEND_ARG.search(line))})
    pool = [m for line in lines if (m := POOL_LINE.search(line))]
    f["pool_tokens"] = {"full": int(pool[0][1]), "swa": int(pool[0][2])} if pool else None
    over = [m for line in lines if (m := OVER_PROFILED.search(line))]
    f["pool_below_max_total_tokens"] = {"asked": int(over[0][1]), "profiled": int(over[0][2])} if over else None
    trit = [i for i, line in enumerate(lines) if "serve-llm: triton kernel loaded" in line]
    f["triton_before_ready"] = sum(1 for i in trit if ready_at is not None and i < ready_at)
    after = Counter(lines[i].rsplit("loaded ", 1)[1].rsplit(".", 1)[-1].strip() for i in trit
                    if ready_at is not None and i > ready_at)
    f["triton_after_ready_names"] = dict(sorted(after.items()))
    # a server that never got ready has no "after ready" (None, not every load); the route's own
    # kernels (fp8_paged_*, fp8_forward_*) must all have compiled at startup
    f["triton_after_ready"] = None if ready_at is None else sum(after.values())
    f["route_triton_after_ready"] = None if ready_at is None else sum(n for k, n in after.items() if k.startswith("fp8_"))
    f["fa3_seam"] = sorted({line.split("fa3 seam", 1)[1].split(";")[0].strip() for line in lines if "fa3 seam" in line})
    f["route_lines"] = [line[-300:] for line in lines if "sglang-fa4:" in line and "backend" in line][:5]
    return f


def relevant_lines(text: str) -> str:
    keep = ("sglang-fa4", "serve-llm", "serve-check", "KV Cache", "full_layer_tokens", "max_total", "attention_backend",
            "Traceback", "Error", "error", "fired up", "Capture", "cuda graph", "Load weight", "Memory pool")
    return "\n".join(line[:2000] for line in text.splitlines() if any(k in line for k in keep)) + "\n"


def run(a) -> dict:
    arms = serve_arms.parse_arms(a.model, a.arms)
    plan = serve_arms.PLANS[a.model]
    workloads = [bench.parse_workload(w) for w in a.workloads]
    opts = server_opts(a.model, workloads, a.mem_fraction_static, a.swa_full_tokens_ratio)
    fit_notes = []
    if not a.arms:  # the default arms: reference arms only where all servers fit the GPU together
        est = memory_estimate_gib(a.model, a.layers, arms, opts)
        gpu_gib = a.gpu_memory_gib or gpu_memory_gib() or 80.0
        arms, fit_notes = serve_arms.arms_that_fit(arms, {k: v["weights"] + v["kv"] for k, v in est.items()
                                                          if k != "total_weights_kv"}, gpu_gib)
    ckpt = llm_checkpoints.write_checkpoint(a.model, a.work / "ckpt" / a.model, a.layers)
    dataset = bench.write_sharegpt(a.work / "sharegpt_local.json", seed=a.seed)
    layers_note = (f"{a.layers} of {llm_checkpoints.FULL_LAYERS[a.model]} layers "
                   f"{llm_checkpoints.layer_counts(llm_checkpoints.model_config(a.model, a.layers))}"
                   + ("" if a.layers == llm_checkpoints.FULL_LAYERS[a.model] else
                      f": reduced so {len(arms)} servers fit the one GPU at once ({a.layers_reason})"))
    res = {"command": "python3 " + " ".join(shlex.quote(x) for x in sys.argv),
           "meta": {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "gpu": gpu_name(),
                    "model": a.model, "layers": a.layers, "full_layers": llm_checkpoints.FULL_LAYERS[a.model],
                    "layers_note": layers_note, "baseline": plan.baseline,
                    "arms": [{"name": x.name, "what": x.what, "kv_cache_dtype": x.kv_cache_dtype,
                              "upgrade": x.upgrade, "expected_backend": x.backend} for x in arms],
                    "server_opts": opts.__dict__, "workloads": [w.__dict__ for w in workloads], "rounds": a.rounds,
                    "seed": a.seed, "memory_estimate_gib": memory_estimate_gib(a.model, a.layers, arms, opts),
                    "stand_ins": "benchmark/sglang_on_gpu/cuda_only_stubs.py (identical in every arm)",
                    "bench_client": "one bench_serving_main.py --stdin process for all runs (SGLang imported "
                                    "once); each run's arguments are its recorded command's"},
           "servers": [], "runs": [], "accuracy": {}, "profiles": {}, "notes": list(fit_notes)}
    a.partial = res  # what main writes if a SIGTERM (the call's time limit) ends the run early
    if a.cpu_dry:
        return dry(a, arms, ckpt, dataset, opts, res)
    t_begin = time.monotonic()
    write_plugin_dist(a.work / "ep")
    pythonpath = server_pythonpath(a)
    servers = build_servers(a, arms, ckpt, pythonpath, opts)
    signal.signal(signal.SIGTERM, _stop)
    # bench_serving's one client process (SGLang imported once), started once the pools are sized
    client = bench.Client(a.python, {**os.environ, "PYTHONPATH": client_pythonpath(a)}, a.work)
    try:
        for i, s in enumerate(servers):  # one after another: each sizes its pool on settled memory
            s.start(a.repo)
            print(f"[serve-llm] started {s.arm.name} (port {s.port})", flush=True)
            t0 = time.monotonic()
            while not s.pool_sized() and time.monotonic() - t0 < a.start_timeout_s:
                time.sleep(0.5)
        client.start()
        t0 = time.monotonic()
        while time.monotonic() - t0 < a.start_timeout_s and not all(s.poll_ready() or s.proc.poll() is not None
                                                                  for s in servers):
            time.sleep(0.5)
        for s in servers:
            s.poll_ready()
            print(f"[serve-llm] {s.arm.name}: ready={s.ready} in {s.startup_s} s {s.error or ''}", flush=True)
        live = [s for s in servers if s.ready]
        base = next((s for s in live if s.arm.name == plan.baseline), None)
        if base is None:
            res["notes"].append("the baseline server did not come up: nothing compared")
            return res
        # accuracy: every arm, the same prompts
        prompts = accuracy_prompts(a.accuracy_prompts)
        answers = {s.arm.name: [{"name": p["name"], **generate(s.port, p["ids"], a.accuracy_tokens)} for p in prompts]
                   for s in live}
        for s in live:  # every arm scores the baseline's answers, teacher-forced
            for p, ans, b in zip(prompts, answers[s.arm.name], answers[base.arm.name]):
                ans["tf"] = (teacher_forced(s.port, p["ids"], b["ids"]) if b.get("ok")
                             else {"ok": False, "error": "no baseline answer"})
        for s in live:
            if s is base:
                continue
            rows = serve_report.compare_tokens(answers[base.arm.name], answers[s.arm.name], a.accuracy_tokens)
            res["accuracy"][s.arm.name] = {"per_prompt": rows, "verdict": serve_report.accuracy_verdict(
                rows, a.min_full_share, a.max_logprob_diff)}
        res["accuracy_answers"] = answers
        res["accuracy_answers_ok"] = {k: sum(1 for x in v if x.get("ok")) for k, v in answers.items()}
        # rounds, interleaved; the profiles' time kept back from them (the profiles run after)
        reserve_s = PROFILE_RESERVE_S * len(live) if a.profile_steps else 0.0
        per_round_s = None
        for rd in range(1, a.rounds + 1):
            elapsed = time.monotonic() - t_begin
            if a.time_budget_s and per_round_s and elapsed + per_round_s > a.time_budget_s - reserve_s:
                res["notes"].append(f"rounds {rd}..{a.rounds} not run: {elapsed:.0f} s used, a round takes "
                                    f"~{per_round_s:.0f} s, budget {a.time_budget_s:.0f} s "
                                    f"({reserve_s:.0f} s of it kept for the profiles)")
                break
            t_round = time.monotonic()
            for w in workloads:
                for s in live:
                    out_file = a.work / f"bench-{a.model}-{w.name}-r{rd}-{s.arm.name}.jsonl"
                    out_file.unlink(missing_ok=True)
                    cmd = bench.command(a.python, s.port, str(ckpt), dataset, w, a.seed, out_file)
                    t0 = time.monotonic()
                    rc, err, text = client.run(cmd[2:], a.bench_timeout_s)
                    (a.work / (out_file.stem + ".log")).write_text(text[-40000:] + (f"\n{err}\n" if err else ""))
                    r = bench.read_result(out_file, w.num_prompts)
                    r["wall_s"] = round(time.monotonic() - t0, 1)
                    if rc:
                        r.update(ok=False, error=r.get("error") or f"bench_serving failed ({rc}): {err}")
                    res["runs"].append({"workload": w.name, "round": rd, "arm": s.arm.name, "result": r,
                                        "command": " ".join(shlex.quote(x) for x in cmd)})
                    print(f"[serve-llm] r{rd} {w.name} {s.arm.name}: ok={r.get('ok')} "
                          f"{r.get('output_throughput')} tok/s in {r['wall_s']} s", flush=True)
                    write(res, a)
            per_round_s = time.monotonic() - t_round
        # profiles (after the rounds: a stuck profile cannot cost them)
        if a.profile_steps:
            for s in live:
                print(f"[serve-llm] profile {s.arm.name}", flush=True)
                res["profiles"][s.arm.name] = profile_arm(s, a.layers, a.work / "profiles", a.profile_steps,
                                                          a.profile_context)
                write(res, a)
    finally:
        client.close()
        for s in servers:
            s.stop()
        for s in servers:
            text = s.text()
            (a.work / (s.log_path.stem + ".relevant.log")).write_text(relevant_lines(text))
            facts = log_facts(text)
            res["servers"].append({"arm": s.arm.name, "ready": s.ready, "startup_s": s.startup_s, "error": s.error,
                                   "command": command_line(s), "log": s.log_path.name,
                                   "log_facts": {k: v for k, v in facts.items() if k not in ("vit_calls", "vit_probes")}})
            for x in res["meta"]["arms"]:
                if x["name"] == s.arm.name:
                    x["resolved_backend"] = facts["attention_backends"]
        res["ratios"] = serve_report.ratios(res["runs"], plan.baseline)
        res["checks"] = checks(res)
    return res


def checks(res: dict) -> dict:
    servers = res["servers"]
    return {
        "all_ready": all(s["ready"] for s in servers),
        "backends_as_expected": all(x.get("resolved_backend") == [x["expected_backend"]] for x in res["meta"]["arms"]),
        "every_request_answered": bool(res["runs"]) and all(r["result"].get("ok") for r in res["runs"]),
        "fa4_compiles_after_ready": sum(s["log_facts"].get("after_ready", {}).get("fa4_compiles", 0) for s in servers),
        "triton_kernels_after_ready": {s["arm"]: s["log_facts"].get("triton_after_ready") for s in servers},
        "equal_pools": len({json.dumps(s["log_facts"].get("pool_tokens") or s["log_facts"].get("max_total_num_tokens"))
                            for s in servers}) == 1,
        "accuracy_ok": {k: v["verdict"]["ok"] for k, v in res.get("accuracy", {}).items()},
    }


def gpu_memory_gib() -> float | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30)
        return float(out.stdout.strip().splitlines()[0]) / 1024 if out.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, IndexError, ValueError):
        return None


def gpu_name() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "none"
    except (OSError, subprocess.TimeoutExpired, IndexError):
        return "none"


def dry(a, arms, ckpt: Path, dataset: Path, opts, res: dict) -> dict:
    """What a CPU can check (see the module docstring)."""
    cases = [{"name": arm.name, "argv": serve_arms.server_args(a.model, arm, str(ckpt), 30000, opts),
              "env": serve_arms.server_env(arm)} for arm in arms]
    resolved = []
    for case in cases:  # one process per arm, its environment set before start (the plugin reads it at load)
        cases_file = a.work / f"cases-{a.model}-{case['name']}.json"
        cases_file.write_text(json.dumps([case]))
        env = {**os.environ, **case["env"], "PYTHONPATH": ":".join([str(a.repo), a.pythonpath])}
        p = subprocess.run([a.python, str(SERVE / "resolve_arms.py"), str(cases_file)], env=env, capture_output=True,
                           text=True, timeout=600, cwd=a.work)
        try:
            resolved += json.loads(p.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise SystemExit(f"resolve_arms.py failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-5000:]}") from None
    for x, r in zip(res["meta"]["arms"], resolved):
        x["resolved_backend"] = r.get("backend") or r.get("error")
    res["dry"] = {"resolved": resolved, "dataset": str(dataset), "checkpoint": str(ckpt),
                  "backends_as_expected": all(r.get("backend") == arm.backend for r, arm in zip(resolved, arms))}
    # the report writer on a sample bench_serving result (two rounds, every arm)
    for rd in (1, 2):
        for i, arm in enumerate(arms):
            f = a.work / f"sample-{arm.name}-{rd}.jsonl"
            f.write_text(json.dumps({"completed": 4, "duration": 1.0, "output_throughput": 1000.0 * (1 + 0.1 * i),
                                     "mean_tpot_ms": 10.0 / (1 + 0.1 * i), "median_tpot_ms": 10.0,
                                     "median_itl_ms": 9.0, "mean_itl_ms": 9.5, "mean_ttft_ms": 100.0,
                                     "median_ttft_ms": 99.0, "errors": ["", "", "", ""],
                                     "output_lens": [8, 8, 8, 8]}) + "\n")
            res["runs"].append({"workload": "sample", "round": rd, "arm": arm.name,
                                "result": bench.read_result(f, 4), "command": "sample"})
    res["ratios"] = serve_report.ratios(res["runs"], serve_arms.PLANS[a.model].baseline)
    res["notes"].append("CPU dry run: the runs are a SAMPLE result, not a measurement")
    return res


class TimeLimit(Exception):
    """The call's time limit sent SIGTERM: stop, keep what ran."""


def _stop(*_):
    raise TimeLimit


def write(res: dict, a) -> None:
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / f"serve_llm-{a.model}.json").write_text(json.dumps(res, indent=1, default=str) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=sorted(serve_arms.PLANS), required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--arms", help="comma-separated arm names (default: all of the model's)")
    ap.add_argument("--layers", type=int, help="decoder layers (default: gemma4_31b 10, llama3_8b 32)")
    ap.add_argument("--layers-reason", default="one 31B-config server of full depth holds ~58 GiB of bf16 weights: "
                                                "no second server fits beside it on one card",
                    help="recorded with a reduced layer count")
    ap.add_argument("--workloads", nargs="+", help="IN:OUT:PROMPTS:CONCURRENCY ... (default per model)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--accuracy-prompts", type=int, default=8)
    ap.add_argument("--accuracy-tokens", type=int, default=32)
    ap.add_argument("--min-full-share", type=float, default=0.75,
                    help="share of prompts whose first tokens must all equal the baseline's")
    ap.add_argument("--max-logprob-diff", type=float, default=0.1, help="mean |logprob diff| bound (nats)")
    ap.add_argument("--profile-steps", type=int, default=5, help="decode steps profiled per arm (0: none)")
    ap.add_argument("--profile-context", type=int, default=8192)
    ap.add_argument("--mem-fraction-static", type=float, default=0.85)
    ap.add_argument("--swa-full-tokens-ratio", type=float, default=1.0,
                    help="Gemma-4's SWA pool over the full pool: 16 prompts of 8k are prefilled before the "
                         "first decode step frees out-of-window slots, so the SWA pool must hold them all "
                         "(0.25 retracted requests on the first H100 run)")
    ap.add_argument("--gpu-memory-gib", type=float, help="the GPU's memory for the default arms (default: nvidia-smi, else 80)")
    ap.add_argument("--start-timeout-s", type=float, default=300)
    ap.add_argument("--bench-timeout-s", type=float, default=180)
    ap.add_argument("--time-budget-s", type=float, default=0, help="start no round that would end after this")
    ap.add_argument("--pythonpath", default="", help="SGLang's packages (.sgl23/install.sh's answer)")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--repo", type=Path, default=REPO)
    ap.add_argument("--work", type=Path, default=Path("/tmp/serve_llm"))
    ap.add_argument("--cpu-dry", action="store_true")
    a = ap.parse_args(argv)
    d = DEFAULTS[a.model]
    a.layers = a.layers or d["layers"]
    a.workloads = a.workloads or d["workloads"]
    if a.rounds < 1 or a.accuracy_prompts < 1:
        ap.error("--rounds and --accuracy-prompts must be >= 1")
    try:
        for w in a.workloads:
            bench.parse_workload(w)
        serve_arms.parse_arms(a.model, a.arms)
        llm_checkpoints.model_config(a.model, a.layers)
    except ValueError as exc:
        ap.error(str(exc))
    a.work.mkdir(parents=True, exist_ok=True)
    # the servers and the dry run's children start in a.work: relative entries would point elsewhere
    a.pythonpath = ":".join(str(Path(p).resolve()) for p in a.pythonpath.split(":") if p)
    rc = 0
    try:
        res = run(a)
    except TimeLimit:
        res = a.partial
        res["notes"].append("stopped early by SIGTERM (the call's time limit): what ran is kept")
    except (Exception, SystemExit) as exc:  # a failure: what ran is kept, the error named, exit 1
        if getattr(a, "partial", None) is None:
            raise
        res, rc = a.partial, 1
        res["notes"].append(f"FAILED: {type(exc).__name__}: {str(exc)[-3000:]}")
        print(f"serve_llm: FAILED: {exc}", file=sys.stderr)
    write(res, a)
    md = serve_report.markdown(res)
    (a.out / f"serve_llm-{a.model}.md").write_text(md)
    with tarfile.open(a.out / f"serve_llm-{a.model}-logs.tgz", "w:gz") as tar:
        for f in sorted(a.work.glob("*.log")) + sorted(a.work.glob("*.jsonl")) + sorted(a.work.glob("cases-*.json")):
            tar.add(f, arcname=f.name)
    print(md)
    return rc


if __name__ == "__main__":
    sys.exit(main())
