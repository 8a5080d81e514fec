"""A real SGLang server, launched as users launch it, answering a real client (issue #14).

For each run (SGLang version, model, ViT graphs on/off) it starts
``python3 -m sglang.launch_server --model-path DIR --load-format dummy --mm-attention-backend fa4
--attention-backend triton --sampling-backend pytorch ...`` with sglang_fa4 installed as a plugin
(entry point), graphs on = ``SGLANG_VIT_ENABLE_CUDA_GRAPH=1 SGLANG_FA4_VIT_GRAPH_BUDGETS_ENABLE=1``,
``SGLANG_FA4_JIT_MONITOR=raise`` always; waits for ready; sends through the ``openai`` client
single images (448x448, 720p, 1080p, 4K), three images of different sizes in one request, a video
(the committed clip, serve_check/video.py) where that SGLang's video decoder reads it, TTFT rounds
per image size and for the video, then N random requests (and the video) concurrently in a random
order and each of them again alone; stops the server; reads its log.

Checkpoints: benchmark/serve_check/checkpoints.py (public configs, vision towers at full size,
language models cut to a few layers, local tokenizer). Weights: SGLang's dummy loader, redrawn at
a usable scale by the check's own plugin (benchmark/serve_check/check_plugin.py says why).

usage (GPU machine; see benchmark/sglang_on_gpu/README.md for the bundles):
  python3 benchmark/release/check_server.py --out DIR --sgl-bundle .sgl --repo REPO [--video-bundle .video] \
      --runs 0.5.23:qwen2_5_vl:on 0.5.23:qwen2_5_vl:off ...
Writes DIR/server.json, DIR/server.md and one log per run.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
SERVE = HERE.parent / "serve_check"
sys.path[:0] = [str(SERVE)]

import checkpoints  # noqa: E402
import logcheck  # noqa: E402
import video  # noqa: E402

PLUGIN_DIST = "sglang_fa4_serve_check-0.0.0.dist-info"
STAND_INS = {
    "sgl_kernel": "rmsnorm, fused_add_rmsnorm, silu_and_mul, gelu_and_mul, gelu_tanh_and_mul, "
                  "utils.is_arch_support_pdl (plain torch); every other name raises when called",
    "flashinfer": "every name raises when called; SGLANG_IS_FLASHINFER_AVAILABLE=false keeps SGLang off it",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_args(model_dir: str, port: int, *, deterministic: bool = True) -> list[str]:
    """The launch_server arguments of every run (graphs on/off differ only in the environment)."""
    args = ["--model-path", model_dir, "--load-format", "dummy", "--mm-attention-backend", "fa4",
            "--attention-backend", "triton", "--sampling-backend", "pytorch",
            "--host", "127.0.0.1", "--port", str(port),
            # the LLM's decode graphs are not what is checked here (and cost startup time)
            "--disable-cuda-graph",
            # every request computes its own ViT and prefill: no prefix reuse between the
            # concurrent and the alone copy of a request
            "--disable-radix-cache",
            # a 4K image (10.6k LLM tokens on Qwen2.5-VL) is prefilled in one chunk
            "--chunked-prefill-size", "16384",
            "--random-seed", "0", "--log-level", "info"]
    if deterministic:
        # batch-invariant LLM kernels: a request's greedy tokens must not depend on what else is
        # in its batch, so "concurrent == alone" tests the ViT/cache path, not GEMM tiling
        args.append("--enable-deterministic-inference")
    return args


def server_env(graphs: bool, pythonpath: str) -> dict:
    env = dict(os.environ)
    env.update({
        "PYTHONPATH": pythonpath,
        "PYTHONUNBUFFERED": "1",
        "SGLANG_VIT_ENABLE_CUDA_GRAPH": "1" if graphs else "0",
        "SGLANG_FA4_VIT_GRAPH_BUDGETS_ENABLE": "1" if graphs else "0",
        "SGLANG_FA4_JIT_MONITOR": "raise",
        # the flashinfer stand-in must not make SGLang pick flashinfer paths
        "SGLANG_IS_FLASHINFER_AVAILABLE": "false",
        # no ViT-embedding reuse between requests: every request runs the tower
        "SGLANG_VLM_CACHE_SIZE_MB": "0",
        # sgl-kernel is a stand-in here (no dist-info): SGLang's own switch for its version check
        "SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK": "1",
    })
    return env


SERVER_ENV_KEYS = ("SGLANG_VIT_ENABLE_CUDA_GRAPH", "SGLANG_FA4_VIT_GRAPH_BUDGETS_ENABLE", "SGLANG_FA4_JIT_MONITOR",
                   "SGLANG_IS_FLASHINFER_AVAILABLE", "SGLANG_VLM_CACHE_SIZE_MB", "SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK")


def write_plugin_dist(ep_dir: Path) -> Path:
    """The dist-info that makes SGLang's plugin loader find the check's plugin."""
    dist = ep_dir / PLUGIN_DIST
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang-fa4-serve-check\nVersion: 0.0.0\n")
    (dist / "entry_points.txt").write_text("[sglang.srt.plugins]\nsglang_fa4_serve_check = check_plugin:register\n")
    return dist


def http_get(url: str, timeout: float = 5.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - loopback only
        return r.status, r.read()


def wait_ready(proc: subprocess.Popen, port: int, log_path: Path, timeout_s: float) -> tuple[bool, float, str]:
    """Until the log says ready and /v1/models answers; (ok, seconds, why-not)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if proc.poll() is not None:
            return False, time.monotonic() - t0, f"server exited with {proc.returncode}"
        text = log_path.read_text(errors="replace") if log_path.exists() else ""
        if logcheck.READY in text:
            try:
                status, _ = http_get(f"http://127.0.0.1:{port}/v1/models")
                if status == 200:
                    return True, time.monotonic() - t0, ""
            except OSError:
                pass
        time.sleep(0.5)
    return False, time.monotonic() - t0, f"not ready after {timeout_s:.0f} s"


def stop(proc: subprocess.Popen) -> None:
    """The server and every process it started (its own process group)."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        pass
    for _ in range(20):  # children (scheduler, detokenizer) may outlive the launcher
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.5)
    else:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if proc.poll() is None:
        proc.wait(timeout=10)


def gpu_query(field: str) -> str | None:
    """nvidia-smi's value for the first GPU (no CUDA context in this process: it would take GPU
    memory from the servers' KV sizing)."""
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def wait_gpu_idle(limit_mib: float = 2048, timeout_s: float = 60) -> float | None:
    """Until the GPU's used memory is back under ``limit_mib`` (the last server's processes are
    gone), so the next server sizes its KV cache on the same free memory."""
    t0 = time.monotonic()
    used = None
    while time.monotonic() - t0 < timeout_s:
        v = gpu_query("memory.used")
        if v is None:
            return None
        used = float(v)
        if used < limit_mib:
            break
        time.sleep(1)
    return used


VIDEO_SITE = Path("/tmp/video")  # where .video/install.sh unpacks decord (kept while the machine is warm)


def video_site(bundle: str | None) -> str | None:
    """The folder holding decord for the servers' PYTHONPATH: ``bundle``/install.sh's answer when
    the bundle travelled in this call, else /tmp/video when an earlier call unpacked it; None
    without either (the video is then skipped, the reason recorded)."""
    if bundle and (Path(bundle) / "install.sh").is_file():
        out = subprocess.run(["bash", str(Path(bundle) / "install.sh")], capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[-1]
        # not fatal: the servers still run; the preflight records that no decoder was found
        print(f"[serve-check] {bundle}/install.sh failed ({out.returncode}): {out.stderr.strip()[-500:]}", flush=True)
    return str(VIDEO_SITE) if (VIDEO_SITE / ".done").is_file() else None


PIDS = "server_pgids"  # in --work: process groups of servers this script started (killed on the next start)


def kill_leftovers(work: Path) -> list[int]:
    """Servers an earlier, interrupted invocation left running (they run in their own session, so
    the device tool does not end them): their process groups, by the ids this script recorded."""
    f = work / PIDS
    killed = []
    if f.exists():
        for line in f.read_text().split():
            try:
                os.killpg(int(line), signal.SIGKILL)
                killed.append(int(line))
            except (ProcessLookupError, ValueError, PermissionError):
                pass
        f.unlink()
    return killed


def one_run(spec: dict, a, ckpt_root: Path, pythonpath: str) -> dict:
    from client import Client, SIZES, fixed_requests, random_requests, video_request

    version, model, mode = spec["version"], spec["model"], spec["mode"]
    graphs = mode == "on"
    variant = spec.get("variant")
    tag = f"{version}-{model}-{mode}" + (f"-{variant}" if variant else "") + ("" if a.deterministic else "-nodet")
    port = free_port()
    model_dir = str(ckpt_root / model)
    argv = [sys.executable, "-m", "sglang.launch_server", *server_args(model_dir, port, deterministic=a.deterministic)]
    env = server_env(graphs, pythonpath)
    if variant == "nooverlap":
        argv.append("--disable-overlap-schedule")
    elif variant == "upstream":
        env.update(SGLANG_FA4_VIT_GRAPH_BUDGETS_ENABLE="0", SGLANG_FA4_JIT_MONITOR="warn")
    elif variant == "probe":
        env.update(SERVE_CHECK_VIT_PROBE="1")
    log_path = a.log_dir / f"server-{tag}.log"
    result: dict = {"run": tag, **spec, "command": " ".join(
        [f"{k}={env[k]}" for k in SERVER_ENV_KEYS] + [shlex.quote(x) for x in argv])}
    result["gpu_mem_used_mib_at_start"] = wait_gpu_idle()
    t_start = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, env=env, cwd=a.repo, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    with open(a.work / PIDS, "a") as f:
        f.write(f"{proc.pid}\n")
    try:
        ok, secs, why = wait_ready(proc, port, log_path, spec.get("start_timeout_s", a.start_timeout_s))
        result["ready"] = ok
        result["startup_s"] = round(secs, 1)
        if not ok:
            result["error"] = why
            return result
        client = Client(f"http://127.0.0.1:{port}/v1", model_dir, max_tokens=a.max_tokens)
        client.images = a.images  # encoded once, before the first server (same pictures every run)
        fixed = fixed_requests()
        rand = random_requests(a.requests, seed=a.seed)
        # the video: only where this SGLang's own decoder read the clip (preflight in main)
        pre = a.video.get(version) or {"ok": False, "why": "no preflight"}
        vid = [video_request()] if pre.get("ok") else []
        result["video"] = {"sent": True, "decoder": pre["decoder"], "request": vid[0].name,
                           "expected_video_tokens": video.expected_video_tokens(model)} if vid else \
            {"sent": False, "why": pre["why"]}
        fixed += vid
        result["fixed"] = [client.send(r) for r in fixed]
        result["ttft"] = {}
        for r in fixed[:len(SIZES)] + vid:
            result["ttft"][r.name.split("-", 1)[1]] = client.ttft(r, a.ttft_rounds)
        # the video goes into the concurrent batch among the images (a prefill batch, one ViT call)
        t0 = time.monotonic()
        conc = client.send_concurrently(rand + vid, a.concurrency, seed=a.seed + 1)
        result["concurrent_s"] = round(time.monotonic() - t0, 2)
        t0 = time.monotonic()
        alone = [client.send(r) for r in rand + vid]
        result["alone_s"] = round(time.monotonic() - t0, 2)
        result["random"] = [{"name": r.name, "images": [list(i[:2]) + [i[3]] for i in r.images],
                             "concurrent": c, "alone": s} for r, c, s in zip(rand, conc, alone)]
        if vid:
            result["video"].update(concurrent=conc[-1], alone=alone[-1])
        try:
            _, body = http_get(f"http://127.0.0.1:{port}/server_info", timeout=10)
            info = json.loads(body)
            result["server_info"] = {k: info.get(k) for k in ("version", "max_total_num_tokens") if k in info}
        except (OSError, ValueError):
            pass
    finally:
        stop(proc)
        result["wall_s"] = round(time.monotonic() - t_start, 1)
        text = log_path.read_text(errors="replace") if log_path.exists() else ""
        result["log"] = log_path.name
        result["log_facts"] = logcheck.analyse(text)
    return result


def ids_of(rec: dict):
    return rec.get("output_ids") if rec and rec.get("ok") else None


def evaluate(runs: list[dict], kv_bytes_per_token: dict) -> dict:
    """The checks, per run and across the on/off pair of a (version, model)."""
    checks = {}
    for r in runs:
        f = r.get("log_facts", {})
        sched = logcheck.scheduler_hooks(f)
        c = {"ready": bool(r.get("ready"))}
        if r.get("ready"):
            fixed_ok = all(x.get("ok") for x in r.get("fixed", []))
            rand = list(r.get("random", []))
            vid = r.get("video") or {}
            if vid.get("sent"):  # its concurrent/alone pair is checked like a random request's
                rand.append({"name": vid["request"], "concurrent": vid.get("concurrent") or {},
                             "alone": vid.get("alone") or {}})
                rec = next((x for x in r.get("fixed", []) if x["name"] == vid["request"]), {})
                c["video_tokens"] = rec.get("video_tokens")
                c["video_tokens_as_expected"] = rec.get("video_tokens") == vid["expected_video_tokens"]
            c["video"] = "sent" if vid.get("sent") else f"not sent: {vid.get('why', 'no record')}"
            c["all_requests_ok"] = fixed_ok and all(x["concurrent"].get("ok") and x["alone"].get("ok") for x in rand) \
                and all(t["median_ms"] is not None and not t["errors"] for t in r.get("ttft", {}).values())
            c["requests_sent"] = len(r.get("fixed", [])) + 2 * len(rand) + sum(
                1 + len(t["ms"]) + len(t["errors"]) for t in r.get("ttft", {}).values())
            mism = [x["name"] for x in rand if ids_of(x["concurrent"]) != ids_of(x["alone"])]
            c["concurrent_equals_alone"] = not mism and bool(rand)
            c["concurrent_mismatches"] = mism
        c["plugin_hooks_in_scheduler"] = bool(sched and sched.get("applied", {}).get("sglang_fa4"))
        c["scheduler_hooks"] = sched.get("applied", {}).get("sglang_fa4") if sched else None
        c["fa4_warmup_before_ready"] = any(w["before_ready"] for w in f.get("warmup", []))
        if r["mode"] == "on":
            c["budget_capture_before_ready"] = any(b["before_ready"] for b in f.get("budgets", []))
        c["fa4_compiles_after_ready"] = f.get("after_ready", {}).get("fa4_compiles")
        c["graph_captures_after_ready"] = f.get("after_ready", {}).get("graph_captures")
        c["stand_ins_called"] = f.get("stand_ins_called")
        vit = f.get("vit_calls")
        if vit and vit.get("calls"):  # logged by the check's plugin (servers run before it had none)
            c["vit_same_image_same_output"] = vit["with_several_outputs"] == 0
        checks[r["run"]] = c
    pairs = {}
    for on in (r for r in runs if r["mode"] == "on" and not r.get("variant") and r.get("ready")):
        off = next((r for r in runs if r["mode"] == "off" and not r.get("variant") and r["version"] == on["version"]
                    and r["model"] == on["model"] and r.get("ready")), None)
        if off is None:
            continue
        key = f"{on['version']}-{on['model']}"
        p: dict = {}
        same, diff = [], []
        # paired by request name (the video, where sent, is among the fixed requests)
        ron, roff = ({x["name"]: x for x in run.get("fixed", []) + [y["alone"] for y in run.get("random", [])]}
                     for run in (on, off))
        for name, a_ in ron.items():
            if name in roff:
                (same if ids_of(a_) is not None and ids_of(a_) == ids_of(roff[name]) else diff).append(name)
        p["graphs_on_equals_off"] = {"equal": len(same), "different": diff}
        if set(ron) ^ set(roff):
            p["graphs_on_equals_off"]["unpaired"] = sorted(set(ron) ^ set(roff))
        p["ttft_ms"] = {size: {"on": on["ttft"][size]["median_ms"], "off": off["ttft"][size]["median_ms"]}
                        for size in on.get("ttft", {}) if size in off.get("ttft", {})}
        ton, toff = on["log_facts"].get("max_total_num_tokens"), off["log_facts"].get("max_total_num_tokens")
        if ton and toff:
            bpt = kv_bytes_per_token[on["model"]]
            p["kv_tokens"] = {"on": ton, "off": toff, "delta": toff - ton}
            p["kv_bytes_taken_by_budgets_gib"] = round((toff - ton) * bpt / 2**30, 3)
        bud = on["log_facts"].get("budgets") or []
        if bud:
            p["budget_graph_mib_allocated"] = bud[0]["graph_mib"]
        pairs[key] = p
    return {"per_run": checks, "pairs": pairs}


def kv_bytes_per_token(model: str, text_layers: int) -> int:
    cfg = checkpoints.text_config(checkpoints.model_config(model, text_layers))
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return text_layers * 2 * cfg["num_key_value_heads"] * head_dim * 2  # K and V, bf16


def markdown(res: dict) -> str:
    ev = res["checks"]
    lines = ["# A real SGLang server with sglang-fa4, answering the openai client (H200)", "",
             f"Command: `{res['command']}`", "",
             f"Date: {res['meta']['date']}. GPU: {res['meta'].get('gpu')}. Models: {', '.join(res['meta']['models'])} "
             f"(public configs, vision towers full size, language model {res['meta']['text_layers']} layers; "
             "`--load-format dummy`, weights redrawn N(0, 0.02) by the check's plugin).", "",
             "Stand-ins for what cannot travel: " + "; ".join(f"`{k}`: {v}" for k, v in STAND_INS.items()) + ".", "",
             "## Per server", "",
             "| run | ready (s) | requests ok | concurrent == alone | hooks in scheduler | warmup before ready "
             "| budgets before ready | FA4 compiles after ready | captures after ready | max_total_num_tokens |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["runs"]:
        c = ev["per_run"][r["run"]]
        lines.append(f"| {r['run']} | {c['ready']} ({r.get('startup_s')}) | {c.get('all_requests_ok')} "
                     f"({c.get('requests_sent')}) | {c.get('concurrent_equals_alone')} | {c['plugin_hooks_in_scheduler']} "
                     f"| {c['fa4_warmup_before_ready']} | {c.get('budget_capture_before_ready', 'n/a (off)')} "
                     f"| {c['fa4_compiles_after_ready']} | {c['graph_captures_after_ready']} "
                     f"| {r.get('log_facts', {}).get('max_total_num_tokens')} |")
    for r in res["runs"]:
        if r.get("error"):
            lines.append(f"\n`{r['run']}` failed: {r['error']} (log `{r['log']}`).")
    for r in (x for x in res["runs"] if x.get("ready")):
        f = r.get("log_facts", {})
        c = ev["per_run"][r["run"]]
        lines += ["", f"### {r['run']}", ""]
        if r.get("variant"):
            lines.append(f"- diagnostic variant `{r['variant']}`: {VARIANTS[r['variant']]}")
        w = (f.get("warmup") or [{}])[0]
        b = (f.get("budgets") or [None])[0]
        kv = f.get("kv_alloc")
        lines.append(f"- startup {r.get('startup_s')} s to ready; FA4 warmup {w.get('variants')} variant(s) in "
                     f"{w.get('seconds')} s ({w.get('compiled')} compiled, {w.get('loaded')} loaded from cache)"
                     + (f"; {b['graphs']} budget graphs {b['budgets']}, {b['graph_mib']} MiB" if b else "")
                     + (f"; KV cache {kv['tokens']} tokens, {kv['k_gb'] + kv['v_gb']:.2f} GB" if kv else ""))
        lines.append(f"- sglang_fa4 hooks applied in the scheduler: {', '.join(c.get('scheduler_hooks') or []) or 'none seen'}")
        vit = f.get("vit_calls")
        if vit and vit.get("calls"):
            lines.append(f"- vision tower calls {vit['calls']}, distinct images {vit['images']} "
                         f"({vit['seen_in_several_calls']} seen in several calls, alone and batched): images whose "
                         f"output rows differ between calls: {vit['with_several_outputs']}"
                         + (f" {vit['differing']}" if vit["differing"] else ""))
        pr = f.get("vit_probes")
        if pr:
            lines.append(f"- probe: {pr['images']} images of {pr['calls']} multi-image calls run again alone "
                         f"(paths {pr['alone_paths']}; {pr['failed']} probe failures); bitwise equal "
                         f"{pr['bitwise_equal']} of {pr['images']}; max |difference| {pr['max_abs_diff']}")
        lines.append(f"- 50 random requests: {r.get('concurrent_s')} s concurrently ({res['meta']['concurrency']} at a time), "
                     f"{r.get('alone_s')} s one by one; distinct outputs {len({tuple(x['alone'].get('output_ids') or ()) for x in r.get('random', [])})}"
                     f"/{len(r.get('random', []))}; prefill batches by requests in them "
                     f"{f.get('prefill_batches_by_requests')} (a batch's images go through one ViT call), "
                     f"up to {f.get('max_running_requests_seen')} requests running")
        lines.append(video_line(r.get("video") or {}, c))
        lines += ["", "| request | image / video tokens | prompt tokens | latency ms | TTFT median ms (rounds) |",
                  "|---|---|---|---|---|"]
        for q in r.get("fixed", []):
            size = q["name"].split("-", 1)[1]
            t = r.get("ttft", {}).get(size)
            tt = f"{t['median_ms']:.1f} ({', '.join(f'{x:.1f}' for x in t['ms'])})" if t and t.get("median_ms") else ""
            lines.append(f"| {q['name']} | {q.get('image_tokens')} / {q.get('video_tokens')} | {q.get('prompt_tokens')} | "
                         f"{q['latency_s'] * 1e3:.1f} | {tt} |")
    if ev["pairs"]:
        lines += ["", "## Graphs on vs off", ""]
        for key, p in ev["pairs"].items():
            lines.append(f"**{key}**: greedy output ids equal on {p['graphs_on_equals_off']['equal']} requests, "
                         f"different on {len(p['graphs_on_equals_off']['different'])} "
                         f"{p['graphs_on_equals_off']['different'] or ''}; KV tokens {p.get('kv_tokens')}, "
                         f"budgets take {p.get('kv_bytes_taken_by_budgets_gib')} GiB of KV cache "
                         f"(graphs' own allocation {p.get('budget_graph_mib_allocated')} MiB).")
            lines.append("")
            lines.append("| image | TTFT on ms | TTFT off ms | off/on |")
            lines.append("|---|---|---|---|")
            for size, t in p["ttft_ms"].items():
                ratio = (t["off"] / t["on"]) if t["on"] and t["off"] else None
                lines.append(f"| {size} | {t['on']:.1f} | {t['off']:.1f} | {ratio:.2f} |" if ratio else
                             f"| {size} | {t['on']} | {t['off']} | |")
            lines.append("")
    lines += ["", "## Not run / notes", ""] + [f"- {n}" for n in res["notes"]]
    return "\n".join(lines) + "\n"


def video_line(v: dict, c: dict) -> str:
    """The per-server markdown line on the video request."""
    if not v.get("sent"):
        return f"- video not sent: {v.get('why', 'no record (run before the check sent videos)')}"
    same = ids_of(v.get("concurrent")) is not None and ids_of(v.get("concurrent")) == ids_of(v.get("alone"))
    return (f"- video (`{video.CLIP.name}`, {video.FRAMES} frames {video.WIDTH}x{video.HEIGHT} at {video.FPS} fps, "
            f"decoded by {v.get('decoder')}): {c.get('video_tokens')} video tokens (expected "
            f"{v.get('expected_video_tokens')}); sent among the random requests, greedy ids equal to alone: {same}")


def run_estimate(done: list[dict]) -> float:
    """Seconds the next run should take: the longest request phase so far plus a startup, the
    shortest seen after the first (the first server compiles Triton/JIT kernels the later ones
    find on disk), else 60% of the first's."""
    timed = [r for r in done if r.get("ready") and r.get("startup_s") is not None and r.get("wall_s")]
    if not timed:
        return max((r.get("wall_s") or 0 for r in done), default=0)
    phase = max(r["wall_s"] - r["startup_s"] for r in timed)
    startups = [r["startup_s"] for r in timed]
    return phase + (min(startups[1:]) if len(startups) > 1 else 0.6 * startups[0])


#: diagnostic server variants (a run's optional 4th field): what each changes against a plain run
VARIANTS = {
    "nooverlap": "--disable-overlap-schedule (SGLang's scheduler does not overlap batch preparation with the forward)",
    "upstream": "graphs on, sglang-fa4's budget graphs off: SGLang's own per-layout ViT graphs (captured on the "
                "request path, so the JIT monitor only warns)",
    "probe": "each image of a multi-image ViT call run again alone, through the budget replay and eagerly, "
             "its rows compared in the server process (serve_check/check_plugin.py, 'vit probe' lines)",
}


def parse_run(s: str) -> dict:
    parts = s.split(":")
    if len(parts) not in (3, 4):
        raise argparse.ArgumentTypeError(f"bad run {s!r}: VERSION:MODEL:on|off[:VARIANT]")
    version, model, mode = parts[:3]
    variant = parts[3] if len(parts) == 4 else None
    if model not in checkpoints.MODELS or mode not in ("on", "off") or (variant and variant not in VARIANTS):
        raise argparse.ArgumentTypeError(f"bad run {s!r}: VERSION:MODEL:on|off[:VARIANT], MODEL in "
                                         f"{checkpoints.MODELS}, VARIANT in {sorted(VARIANTS)}")
    if variant == "upstream" and mode != "on":
        raise argparse.ArgumentTypeError(f"bad run {s!r}: the 'upstream' variant needs graphs on")
    spec = {"version": version, "model": model, "mode": mode}
    if variant:
        spec["variant"] = variant
    return spec


def version_pythonpath(a, version: str, vsite: str | None = None) -> str:
    """Server PYTHONPATH: the stand-ins' sitecustomize, the check's plugin (and its dist-info),
    then what ``.sgl/install.sh VERSION REPO`` prints (that SGLang, shared packages, sglang_fa4's
    entry point, the repo, the FA4 bundle), then the video decoder's folder if any.
    ``--pythonpath V=PATH`` replaces install.sh (CPU tests)."""
    given = dict(p.split("=", 1) for p in a.pythonpath)
    if version in given:
        base = given[version]
    else:
        out = subprocess.run(["bash", str(Path(a.sgl_bundle) / "install.sh"), version, str(a.repo)],
                             capture_output=True, text=True, check=True)
        base = out.stdout.strip().splitlines()[-1]
    return ":".join([str(SERVE / "site"), str(SERVE), str(a.work / "ep"), base] + ([vsite] if vsite else []))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--runs", type=parse_run, nargs="+", default=[], help="VERSION:MODEL:on|off ... (not with --merge)")
    ap.add_argument("--sgl-bundle", default=".sgl")
    ap.add_argument("--video-bundle", help="the .video bundle (decord; make_video_bundle.sh); without it, "
                    "/tmp/video if an earlier call unpacked it there; else the video is skipped (reason recorded)")
    ap.add_argument("--repo", type=Path, default=HERE.parents[1], help="where sglang_fa4 is (server cwd)")
    ap.add_argument("--pythonpath", action="append", default=[], help="VERSION=PATH instead of install.sh")
    ap.add_argument("--work", type=Path, default=Path("/tmp/serve_check"))
    ap.add_argument("--text-layers", type=int, default=4)
    ap.add_argument("--requests", type=int, default=50)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--ttft-rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--start-timeout-s", type=float, default=240)
    ap.add_argument("--time-budget-s", type=float, default=0, help="start no run after this many seconds")
    ap.add_argument("--no-deterministic", dest="deterministic", action="store_false")
    ap.add_argument("--no-fallback", dest="fallback", action="store_false",
                    help="do not retry the first server without deterministic inference when it fails to start")
    ap.add_argument("--log-dir", type=Path, help="server logs (default: --out)")
    ap.add_argument("--merge", type=Path, nargs="*", default=None,
                    help="no servers: merge these server.json files (logs beside each, or in --log-dir), "
                         "re-read the logs, evaluate, write --out")
    a = ap.parse_args(argv)
    a.log_dir = a.log_dir or a.out
    # `timeout` sends SIGTERM: leave through the finally blocks (they stop the running server)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if a.merge is not None:
        return merge(a)
    if not a.runs:
        ap.error("--runs is required (unless --merge)")
    a.repo = a.repo.resolve()
    t_begin = time.monotonic()
    a.out.mkdir(parents=True, exist_ok=True)
    a.log_dir.mkdir(parents=True, exist_ok=True)
    a.work.mkdir(parents=True, exist_ok=True)
    leftovers = kill_leftovers(a.work)
    write_plugin_dist(a.work / "ep")
    models = sorted({r["model"] for r in a.runs})
    ckpt_root = a.work / "ckpt"
    for m in models:
        checkpoints.write_checkpoint(m, ckpt_root / m, a.text_layers)
    vsite = video_site(a.video_bundle)
    paths = {v: version_pythonpath(a, v, vsite) for v in sorted({r["version"] for r in a.runs})}
    # can each SGLang take the clip? (its own decoder, in the server's Python, minus the stand-ins)
    a.video = {v: video.preflight(p.split(":", 1)[1]) for v, p in paths.items()}
    # the client (openai, its pydantic) comes from the first version's packages
    for p in reversed(paths[min(paths)].split(":")[2:]):
        if p not in sys.path:
            sys.path.append(p)
    from client import fixed_requests, random_requests

    a.images = {}
    for req in fixed_requests() + random_requests(a.requests, seed=a.seed):
        req.messages(a.images)  # PNG/JPEG + base64 once, not while a server waits
    gpu = gpu_query("name") or "none"
    res = {"command": "python3 " + " ".join(shlex.quote(x) for x in sys.argv),
           "meta": {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "gpu": gpu, "models": models,
                    "text_layers": a.text_layers, "requests": a.requests, "concurrency": a.concurrency,
                    "ttft_rounds": a.ttft_rounds, "max_tokens": a.max_tokens, "deterministic": a.deterministic,
                    "stand_ins": STAND_INS, "server_env": {k: "see each run's command" for k in SERVER_ENV_KEYS},
                    "video": {"clip": video.CLIP.name, "bytes": video.CLIP.stat().st_size, "frames": video.FRAMES,
                              "size": [video.WIDTH, video.HEIGHT], "fps": video.FPS, "decoder_site": vsite,
                              "preflight": a.video}},
           "runs": [], "notes": []}
    if leftovers:
        res["notes"].append(f"killed servers left by an interrupted earlier invocation: process groups {leftovers}")
    per_run_s = []
    for spec in a.runs:
        elapsed = time.monotonic() - t_begin
        estimate = run_estimate(res["runs"])
        if a.time_budget_s and elapsed + estimate > a.time_budget_s:
            res["notes"].append(f"{spec['version']}:{spec['model']}:{spec['mode']} not run: {elapsed:.0f} s used, "
                                f"a run estimated at {estimate:.0f} s, budget {a.time_budget_s:.0f} s")
            continue
        if per_run_s:  # later servers find Triton/JIT/FA4 caches warm
            spec["start_timeout_s"] = min(a.start_timeout_s, max(90.0, 2 * per_run_s[0]))
        print(f"[serve-check] {spec} ...", flush=True)
        t0 = time.monotonic()
        r = one_run(spec, a, ckpt_root, paths[spec["version"]])
        failed = not r.get("ready") or r.get("log_facts", {}).get("budget_capture_failed")
        if failed and a.deterministic and a.fallback and not any(x.get("ready") for x in res["runs"]):
            # no server has come up yet: try once without --enable-deterministic-inference, and keep
            # that for the remaining runs if it helps (recorded; concurrent==alone then tests less)
            res["runs"].append({**r, "run": r["run"] + "-deterministic-failed"})
            a.deterministic, a.fallback = False, False  # once per invocation
            print(f"[serve-check] {r['run']} not ready ({r.get('error')}); again without deterministic inference",
                  flush=True)
            r = one_run(spec, a, ckpt_root, paths[spec["version"]])
            if r.get("ready"):
                res["notes"].append("the servers ran WITHOUT --enable-deterministic-inference: the first one did not "
                                    "start with it (see the -deterministic-failed run)")
            else:
                a.deterministic = True
        r["deterministic"] = a.deterministic
        per_run_s.append(time.monotonic() - t0)
        res["runs"].append(r)
        print(f"[serve-check] {r['run']}: ready={r.get('ready')} startup={r.get('startup_s')}s wall={r.get('wall_s')}s "
              f"{r.get('error', '')}", flush=True)
        write_json(res, a.out)  # after every server: a later one failing keeps what ran
    finish(res, a.out, a.text_layers)
    return 0


def write_json(res: dict, out: Path) -> None:
    """server.json without indentation: its per-request records are the bulk, and the tree that
    travels to the GPU machine beside the FA4 bundle must stay under the 64 MiB a call carries."""
    (out / "server.json").write_text(json.dumps(res, separators=(",", ":"), default=str) + "\n")


def finish(res: dict, out: Path, text_layers: int) -> None:
    models = sorted({r["model"] for r in res["runs"]}) or res["meta"]["models"]
    res["checks"] = evaluate(res["runs"], {m: kv_bytes_per_token(m, text_layers) for m in models})
    for r in res["runs"]:
        v = r.get("video")
        note = None if v is None or v.get("sent") else f"video: not sent on SGLang {r['version']}: {v.get('why')}"
        if note and note not in res["notes"]:
            res["notes"].append(note)
    write_json(res, out)
    (out / "server.md").write_text(markdown(res))
    print(markdown(res))


def merge(a) -> int:
    """Several invocations' results (e.g. two device calls) as one: runs concatenated (a later
    file's run of the same name replaces an earlier one), logs re-read, checks recomputed."""
    merged = None
    for path in a.merge:
        raw = path.read_bytes()  # server.json, or the committed server.json.gz
        part = json.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)
        if merged is None:
            merged = {**part, "runs": [], "notes": [], "parts": []}
        merged["parts"].append({"file": str(path), "command": part["command"], "date": part["meta"]["date"]})
        for r in part["runs"]:
            log = (path.parent / r["log"]) if (path.parent / r["log"]).exists() else (a.log_dir / r["log"])
            if log.exists():
                r["log_facts"] = logcheck.analyse(log.read_text(errors="replace"))
            merged["runs"] = [x for x in merged["runs"] if x["run"] != r["run"]] + [r]
        merged["notes"] += [n for n in part["notes"] if n not in merged["notes"]]
    merged["command"] = " ; ".join(p["command"] for p in merged["parts"])
    a.out.mkdir(parents=True, exist_ok=True)
    finish(merged, a.out, merged["meta"]["text_layers"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
