"""The server check's client side and verdicts (benchmark/release/check_server.py, benchmark/serve_check/),
without a GPU: the real ``openai`` client against a tiny OpenAI-compatible fake on 127.0.0.1 that
answers like SGLang (``response_token_ids`` / ``prompt_token_ids`` when ``return_token_ids`` is
asked), the log reader against lines formatted with sglang-fa4's own format strings, and the
verdicts (concurrent vs alone, graphs on vs off, KV cache taken by the budgets)."""

import argparse
import hashlib
import json
import re
import sys
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmark" / "serve_check"), str(ROOT / "benchmark" / "release"), str(ROOT / "benchmark")]
import check_server  # noqa: E402
import client  # noqa: E402
import logcheck  # noqa: E402
from fake_sglang_server import JsonHandler  # noqa: E402

try:
    import openai  # noqa: F401
except ImportError:  # .venv has no openai: each SGLang target dir carries the version it pins
    from sglang_harness import available_versions, target_dir

    if available_versions():
        sys.path.append(str(target_dir(available_versions()[-1])))
pytest.importorskip("openai")


class FakeSGLang(JsonHandler):
    """Chat completions: output ids derived from the request's content (so equal requests get
    equal ids), one <|image_pad|> per image in the prompt ids; ``corrupt`` names requests whose
    n-th answer is altered (a stand-in for cross-request corruption)."""

    seen: dict = {}
    corrupt: set = set()
    requests: list = []

    def do_GET(self):
        self.reply({"object": "list", "data": [{"id": "m", "object": "model"}]})

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        FakeSGLang.requests.append(req)
        parts = req["messages"][0]["content"]
        images = [p["image_url"]["url"] for p in parts if p["type"] == "image_url"]
        videos = [p["video_url"]["url"] for p in parts if p["type"] == "video_url"]
        assert all(u.startswith("data:image/") for u in images)
        assert all(u.startswith("data:video/mp4;base64,") for u in videos)
        text = [p["text"] for p in parts if p["type"] == "text"][0]
        digest = hashlib.sha256((text + "".join(images + videos)).encode()).digest()
        ids = [b % 1000 for b in digest[: req["max_tokens"]]]
        key = text + "".join(images + videos)
        FakeSGLang.seen[key] = FakeSGLang.seen.get(key, 0) + 1
        if text in FakeSGLang.corrupt and FakeSGLang.seen[key] == 1:
            ids = [i + 1 for i in ids]
        choice = {"index": 0, "message": {"role": "assistant", "content": "x"}, "finish_reason": "length"}
        if req.get("return_token_ids"):
            choice["response_token_ids"] = ids
            choice["prompt_token_ids"] = [151644] + [client.IMAGE_PAD] * (7 * len(images)) \
                + [client.VIDEO_PAD] * (1196 * len(videos)) + [151645]
        self.reply({"id": "c", "object": "chat.completion", "created": 0, "model": req["model"],
                    "choices": [choice], "usage": {"prompt_tokens": 9, "completion_tokens": len(ids), "total_tokens": 9}})


@pytest.fixture()
def fake_server():
    FakeSGLang.seen, FakeSGLang.corrupt, FakeSGLang.requests = {}, set(), []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), FakeSGLang)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()


def test_requests_the_check_sends():
    fixed = client.fixed_requests()
    assert [r.name for r in fixed] == ["single-448", "single-720p", "single-1080p", "single-4k", "three-images"]
    assert [r.images[0][:2] for r in fixed[:4]] == [(448, 448), (1280, 720), (1920, 1080), (3840, 2160)]
    three = fixed[4].images
    assert len(three) == 3 and len({i[:2] for i in three}) == 3
    rand = client.random_requests(50, seed=0)
    assert len(rand) == 50 and rand == client.random_requests(50, seed=0)
    assert {i[3] for r in rand for i in r.images} == {"PNG", "JPEG"}
    assert any(len(r.images) > 1 for r in rand)
    png, jpg = client.make_image(64, 48, 1, "PNG"), client.make_image(64, 48, 1, "JPEG")
    assert png.startswith(b"\x89PNG") and jpg.startswith(b"\xff\xd8")
    assert png == client.make_image(64, 48, 1, "PNG") and png != client.make_image(64, 48, 2, "PNG")


def test_client_against_a_loopback_fake(fake_server):
    c = client.Client(fake_server, "m", max_tokens=4)
    reqs = client.random_requests(12, seed=3)
    FakeSGLang.corrupt = {reqs[5].text}
    c.prepare(reqs)
    conc = c.send_concurrently(reqs, workers=4, seed=1)
    alone = [c.send(r) for r in reqs]
    assert all(r["ok"] for r in conc + alone)
    assert [r["name"] for r in conc] == [r.name for r in reqs]  # results in request order
    assert all(len(r["output_ids"]) == 4 for r in conc)
    assert conc[0]["image_tokens"] == 7 * len(reqs[0].images)
    sent = FakeSGLang.requests[0]
    assert sent["temperature"] == 0.0 and sent["ignore_eos"] is True and sent["return_token_ids"] is True
    # the verdict: only requests whose ids differ (the corrupted text's first answer) are named
    run = {"run": "v-qwen2_5_vl-on", "version": "v", "model": "qwen2_5_vl", "mode": "on", "ready": True,
           "fixed": [], "ttft": {}, "log_facts": {},
           "random": [{"name": r.name, "concurrent": x, "alone": y} for r, x, y in zip(reqs, conc, alone)]}
    ev = check_server.evaluate([run], {"qwen2_5_vl": 8192})["per_run"]["v-qwen2_5_vl-on"]
    bad = [r.name for r in reqs if r.text == reqs[5].text]
    assert ev["concurrent_mismatches"] and set(ev["concurrent_mismatches"]) <= set(bad)
    assert ev["concurrent_equals_alone"] is False and ev["all_requests_ok"] is True
    t = c.ttft(reqs[0], rounds=3)
    assert t["warm_ok"] and len(t["ms"]) == 3 and t["median_ms"] > 0


def test_failed_requests_are_recorded_not_raised():
    c = client.Client("http://127.0.0.1:9/v1", "m", timeout=2)  # nothing listens on port 9
    r = c.send(client.fixed_requests()[0])
    assert r["ok"] is False and "Error" in r["error"]


def _product_format(path: str, start: str) -> str:
    """A logger format string of sglang-fa4, read from its source (keeps the reader in step)."""
    src = (ROOT / "sglang_fa4" / path).read_text()
    m = re.search(r'"(' + re.escape(start) + r'[^"]*)"(?:\s*\n\s*"([^"]*)")?', src)
    assert m, f"{start!r} not found in sglang_fa4/{path}"
    return m[1] + (m[2] or "")


def test_log_reader_on_the_products_own_formats():
    warm = _product_format("startup/warmup.py", "sglang-fa4 warmup: %d FA4 variant(s)") % (2, 8.81, 2, 0, 1, 0, False)
    variant = _product_format("startup/warmup.py", "sglang-fa4 warmup [%d/%d] %s: %.3f s") % (1, 2, "d80 full", 4.2, "compiled")
    budgets = _product_format("integration/vit_budget_capture.py", "sglang-fa4: %d ViT budget graph(s)") % (
        8, [1024, 2048], "244.0 MiB allocated, 1494.0 MiB reserved", "2103.1 MiB", "within the 3072.0 MiB bound")
    capture = _product_format("integration/vit_budgets.py", "sglang-fa4: ViT CUDA graph captured after")
    fa4_after = _product_format("startup/jit_monitor.py", "sglang-fa4: FA4 ")
    hooks = 'serve-check: hooks in sglang::scheduler_TP0 pid 42: {"applied": {"sglang_fa4": ["a.b"]}, "sglang_fa4_plan": null}'
    log = "\n".join([
        "[2026 TP0] " + variant, "[2026 TP0] " + warm, "[2026 TP0] " + budgets, "[2026 TP0] " + hooks,
        "[2026 TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1000, K size: 1.00 GB, V size: 1.00 GB",
        "[2026 TP0] max_total_num_tokens=1000, chunked_prefill_size=16384, max_prefill_tokens=16384",
        "[2026] The server is fired up and ready to roll!",
        "[2026 TP0] Prefill batch, #new-seq: 3, #new-token: 82, #cached-token: 0, token usage: 0.00, #running-req: 2,",
        "[2026 TP0] Prefill batch, #new-seq: 1, #new-token: 82, #cached-token: 0, token usage: 0.00, #running-req: 0,",
        "[2026 TP0] " + capture, "[2026 TP0] " + fa4_after, "Traceback (most recent call last):",
        "NotImplementedError: sgl_kernel.foo is a stand-in (cuda_only_stubs): the real package is not on this machine",
    ])
    f = logcheck.analyse(log)
    assert f["ready"] and f["warmup"] == [{"variants": 2, "seconds": 8.81, "compiled": 2, "loaded": 0,
                                           "from_shared_libraries": 1, "failed": 0, "fa4_imported": False,
                                           "before_ready": True}]
    # the summary line as it was before the shared-library store (older server logs)
    old = logcheck.analyse("sglang-fa4 warmup: 2 FA4 variant(s) in 0.02 s (0 compiled, 2 loaded from cache, 0 failed)")
    assert old["warmup"][0]["loaded"] == 2 and old["warmup"][0]["from_shared_libraries"] is None
    assert f["warmup_variant_lines"] == 1
    assert f["budgets"] == [{"graphs": 8, "budgets": [1024, 2048], "graph_mib": 244.0, "before_ready": True}]
    assert logcheck.scheduler_hooks(f)["applied"] == {"sglang_fa4": ["a.b"]}
    assert f["after_ready"] == {"fa4_compiles": 1, "graph_captures": 1}
    assert f["max_total_num_tokens"] == 1000 and f["kv_alloc"]["tokens"] == 1000
    assert f["tracebacks"] == 1 and f["stand_ins_called"] == ["sgl_kernel.foo"]
    assert f["prefill_batches_by_requests"] == {1: 1, 3: 1} and f["max_running_requests_seen"] == 2
    assert logcheck.analyse(log.replace(logcheck.READY, "x"))["ready"] is False


def test_on_off_pair_verdicts():
    def run(mode, ids, tokens, ttft):
        return {"run": f"0.5.23-qwen2_5_vl-{mode}", "version": "0.5.23", "model": "qwen2_5_vl", "mode": mode,
                "ready": True, "fixed": [{"name": "single-448", "ok": True, "output_ids": ids}],
                "ttft": {"448": {"median_ms": ttft, "ms": [ttft], "errors": []}},
                "random": [{"name": "random-00", "concurrent": {"ok": True, "output_ids": [1]},
                            "alone": {"ok": True, "name": "random-00", "output_ids": [1]}}],
                "log_facts": {"max_total_num_tokens": tokens, "budgets": [{"graph_mib": 244.0, "before_ready": True}],
                              "warmup": [{"before_ready": True}], "after_ready": {"fa4_compiles": 0, "graph_captures": 0}}}

    ev = check_server.evaluate([run("on", [5, 6], 1000, 10.0), run("off", [5, 7], 1000 + 2**17, 20.0)],
                               {"qwen2_5_vl": 8192})
    p = ev["pairs"]["0.5.23-qwen2_5_vl"]
    assert p["graphs_on_equals_off"] == {"equal": 1, "different": ["single-448"]}
    assert p["kv_tokens"]["delta"] == 2**17 and p["kv_bytes_taken_by_budgets_gib"] == 1.0
    assert p["ttft_ms"] == {"448": {"on": 10.0, "off": 20.0}}
    c = ev["per_run"]["0.5.23-qwen2_5_vl-on"]
    assert c["fa4_warmup_before_ready"] and c["budget_capture_before_ready"] and c["concurrent_equals_alone"]
    assert c["plugin_hooks_in_scheduler"] is False  # no evidence line in this log


def test_kv_bytes_per_token_from_the_configs():
    assert check_server.kv_bytes_per_token("qwen2_5_vl", 4) == 4 * 2 * 4 * 128 * 2
    assert check_server.kv_bytes_per_token("qwen3_vl", 4) == 4 * 2 * 8 * 128 * 2


def test_server_command_and_environment():
    args = check_server.server_args("/m", 1234)
    joined = " ".join(args)
    for piece in ("--load-format dummy", "--mm-attention-backend fa4", "--attention-backend triton",
                  "--sampling-backend pytorch", "--host 127.0.0.1", "--port 1234", "--enable-deterministic-inference"):
        assert piece in joined
    assert "--enable-deterministic-inference" not in check_server.server_args("/m", 1, deterministic=False)
    on, off = check_server.server_env(True, "P"), check_server.server_env(False, "P")
    assert on["SGLANG_VIT_ENABLE_CUDA_GRAPH"] == "1" and on["SGLANG_FA4_VIT_GRAPH_BUDGETS_ENABLE"] == "1"
    assert off["SGLANG_VIT_ENABLE_CUDA_GRAPH"] == "0" and on["SGLANG_FA4_JIT_MONITOR"] == "raise"
    assert on["PYTHONPATH"] == "P" and on["SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK"] == "1"


def test_run_estimate_uses_warm_startups():
    assert check_server.run_estimate([]) == 0
    first = {"ready": True, "startup_s": 90.0, "wall_s": 145.0}
    assert check_server.run_estimate([first]) == 55.0 + 54.0
    second = {"ready": True, "startup_s": 40.0, "wall_s": 90.0}
    assert check_server.run_estimate([first, second]) == 55.0 + 40.0
    assert check_server.run_estimate([{"ready": False, "wall_s": 27.0}]) == 27.0


def test_vit_call_hashes_find_an_image_whose_output_changed(caplog):
    """The check plugin's per-call line (what a tower returned for each image) and the log reader
    that flags an image whose rows differ between calls -- alone vs batched."""
    import torch

    from serve_check import check_plugin

    torch.manual_seed(0)
    a, b = torch.randn(16, 6).bfloat16(), torch.randn(8, 6).bfloat16()   # patch rows, grids below
    out_a, out_b = torch.randn(4, 3).bfloat16(), torch.randn(2, 3).bfloat16()  # merge 4
    ga, gb = [1, 4, 4], [1, 2, 4]
    with caplog.at_level("WARNING", logger="sglang_fa4_serve_check"):
        check_plugin.after_tower_forward(torch.cat([out_a, out_b]), None, torch.cat([a, b]), torch.tensor([ga, gb]))
        check_plugin.after_tower_forward(out_a.clone(), None, a.clone(), grid_thw=torch.tensor([ga]))
        check_plugin.after_tower_forward(out_b + 1, None, b.clone(), grid_thw=torch.tensor([gb]))  # b changed alone
    lines = [r.getMessage() for r in caplog.records if "vit call" in r.getMessage()]
    assert len(lines) == 3
    v = logcheck.analyse("\n".join(lines))["vit_calls"]
    assert v["calls"] == 3 and v["images"] == 2 and v["seen_in_several_calls"] == 2
    assert v["with_several_outputs"] == 1 and v["differing"][0]["grid"] == gb
    assert sorted(v["differing"][0]["images_per_call_by_output"].values()) == [[1], [2]]


def test_run_specs_and_diagnostic_variants():
    assert check_server.parse_run("0.5.23:qwen3_vl:on") == {"version": "0.5.23", "model": "qwen3_vl", "mode": "on"}
    assert check_server.parse_run("0.5.23:qwen3_vl:on:nooverlap")["variant"] == "nooverlap"
    for bad in ("0.5.23:qwen3_vl", "0.5.23:qwen3_vl:on:fast", "0.5.23:qwen3_vl:off:upstream", "0.5.23:llama:on"):
        with pytest.raises(Exception, match="bad run"):
            check_server.parse_run(bad)


def test_video_request_goes_out_as_sglang_takes_it(fake_server):
    """The clip as one ``video_url`` part with a base64 data URL of the committed bytes (what
    SGLang's openai front end hands its video decoder), through the real openai client; its
    prompt's <|video_pad|> count is recorded."""
    import base64

    import video

    req = client.video_request()
    assert req.images == [] and req.name == "single-video"
    parts = req.messages({})[0]["content"]
    assert [p["type"] for p in parts] == ["video_url", "text"]
    head, b64 = parts[0]["video_url"]["url"].split(",", 1)
    assert head == "data:video/mp4;base64" and base64.b64decode(b64) == video.CLIP.read_bytes()
    assert 10_000 < video.CLIP.stat().st_size < 200_000  # committed: small
    r = client.Client(fake_server, "m").send(req)
    assert r["ok"] and r["video_tokens"] == 1196 and r["image_tokens"] == 0
    assert FakeSGLang.requests[-1]["messages"][0]["content"][0]["type"] == "video_url"


def test_expected_video_geometry():
    """The clip's grid from the geometry alone: 4 s at 2 sampled fps = 8 frames = 4 temporal
    patches; 640x360 -> 644x364 (multiples of 28), then 640x352 for Qwen3-VL's 32."""
    import video

    assert (video.FRAMES, video.WIDTH, video.HEIGHT) == (32, 640, 360)
    assert video.expected_video_grid("qwen2_5_vl") == (4, 26, 46)
    assert video.expected_video_grid("qwen3_vl") == (4, 22, 40)
    assert video.expected_video_tokens("qwen2_5_vl") == 1196 and video.expected_video_tokens("qwen3_vl") == 880


def _run_with_video(mode: str, video_rec: dict | None, ids=(1, 2)) -> dict:
    run = {"run": f"0.5.23-qwen2_5_vl-{mode}", "version": "0.5.23", "model": "qwen2_5_vl", "mode": mode,
           "ready": True, "ttft": {}, "log_facts": {},
           "fixed": [{"name": "single-448", "ok": True, "output_ids": [9], "latency_s": 0.1}],
           "random": [{"name": "random-00", "concurrent": {"ok": True, "output_ids": [1]},
                       "alone": {"ok": True, "name": "random-00", "output_ids": [1]}}]}
    if video_rec is None:
        run["video"] = {"sent": False, "why": "ImportError: no decord"}
    else:
        run["fixed"].append({"name": "single-video", "ok": True, "output_ids": list(ids), "video_tokens": 1196,
                             "latency_s": 0.2})
        run["video"] = {"sent": True, "decoder": "decord 0.6.0", "request": "single-video",
                        "expected_video_tokens": 1196, **video_rec}
    return run


def test_video_verdicts_sent_and_skipped():
    ok = {"ok": True, "output_ids": [1, 2]}
    sent = _run_with_video("on", {"concurrent": ok, "alone": ok})
    bad = _run_with_video("on", {"concurrent": {"ok": True, "output_ids": [1, 3]}, "alone": ok})
    ev = check_server.evaluate([sent], {"qwen2_5_vl": 8192})["per_run"]["0.5.23-qwen2_5_vl-on"]
    assert ev["video"] == "sent" and ev["video_tokens_as_expected"] and ev["concurrent_equals_alone"]
    assert ev["requests_sent"] == 2 + 2 * 2
    ev = check_server.evaluate([bad], {"qwen2_5_vl": 8192})["per_run"]["0.5.23-qwen2_5_vl-on"]
    assert ev["concurrent_mismatches"] == ["single-video"] and ev["concurrent_equals_alone"] is False
    skipped = _run_with_video("on", None)
    ev = check_server.evaluate([skipped], {"qwen2_5_vl": 8192})["per_run"]["0.5.23-qwen2_5_vl-on"]
    assert ev["video"] == "not sent: ImportError: no decord" and "video_tokens" not in ev
    # graphs on vs off: requests paired by name, the video among them
    off = _run_with_video("off", {"concurrent": ok, "alone": ok}, ids=(1, 5))
    p = check_server.evaluate([sent, off], {"qwen2_5_vl": 8192})["pairs"]["0.5.23-qwen2_5_vl"]
    assert p["graphs_on_equals_off"] == {"equal": 2, "different": ["single-video"]}
    p = check_server.evaluate([skipped, off], {"qwen2_5_vl": 8192})["pairs"]["0.5.23-qwen2_5_vl"]
    assert p["graphs_on_equals_off"] == {"equal": 2, "different": [], "unpaired": ["single-video"]}


def test_video_in_the_markdown_and_notes(tmp_path):
    ok = {"ok": True, "output_ids": [1, 2]}
    res = {"command": "python3 benchmark/release/check_server.py ...", "notes": [],
           "meta": {"date": "d", "gpu": "g", "models": ["qwen2_5_vl"], "text_layers": 4, "concurrency": 8},
           "runs": [_run_with_video("on", {"concurrent": ok, "alone": ok}),
                    {**_run_with_video("off", None), "version": "0.5.20", "run": "0.5.20-qwen2_5_vl-off"}]}
    check_server.finish(res, tmp_path, 4)
    md = (tmp_path / "server.md").read_text()
    assert "1196 video tokens (expected 1196)" in md and "greedy ids equal to alone: True" in md
    assert "video not sent: ImportError: no decord" in md
    assert "| single-video | None / 1196 |" in md
    assert res["notes"] == ["video: not sent on SGLang 0.5.20: ImportError: no decord"]
    assert json.loads((tmp_path / "server.json").read_text())["checks"]["per_run"]["0.5.23-qwen2_5_vl-on"]["video"] == "sent"


#: a stand-in for ``python -m sglang.launch_server`` (a real file, copied into a fake sglang package)
FAKE_LAUNCH_SERVER = Path(__file__).resolve().parent / "sglang_scripts" / "fake_launch_server.py"


@pytest.mark.parametrize("video_ok", [True, False])
def test_one_run_sends_the_video_where_the_preflight_allows(tmp_path, video_ok):
    """check_server.one_run end to end against a stand-in launch_server (a real subprocess and
    HTTP): the video is sent alone, in the TTFT rounds and among the concurrent requests when the
    version's preflight read the clip; otherwise it is skipped with the preflight's reason."""
    pkg = tmp_path / "fake" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "launch_server.py").write_text(FAKE_LAUNCH_SERVER.read_text())
    pre = {"ok": True, "decoder": "decord 0.6.0 (x)"} if video_ok else {"ok": False, "why": "ImportError: no decord"}
    a = argparse.Namespace(deterministic=True, start_timeout_s=60, log_dir=tmp_path, work=tmp_path, repo=tmp_path,
                           max_tokens=3, requests=3, seed=0, ttft_rounds=1, concurrency=2, video={"0.5.23": pre})
    a.images = {}
    for req in client.fixed_requests()[:1] + client.random_requests(3, seed=0):
        req.messages(a.images)
    r = check_server.one_run({"version": "0.5.23", "model": "qwen2_5_vl", "mode": "on"}, a, tmp_path / "ckpt",
                             str(tmp_path / "fake"))
    assert r["ready"], r
    names = [q["name"] for q in r["fixed"]]
    assert all(q["ok"] for q in r["fixed"])
    if video_ok:
        assert names[-1] == "single-video" and r["fixed"][-1]["video_tokens"] == 1196
        assert "video" in r["ttft"] and r["ttft"]["video"]["median_ms"] > 0
        v = r["video"]
        assert v["sent"] and v["expected_video_tokens"] == 1196 and v["concurrent"]["name"] == "single-video"
        assert v["concurrent"]["output_ids"] == v["alone"]["output_ids"] == r["fixed"][-1]["output_ids"]
        assert len(r["random"]) == 3
        ev = check_server.evaluate([r], {"qwen2_5_vl": 8192})["per_run"][r["run"]]
        assert ev["video_tokens_as_expected"] and ev["concurrent_equals_alone"] and ev["all_requests_ok"]
    else:
        assert "single-video" not in names and "video" not in r["ttft"]
        assert r["video"] == {"sent": False, "why": "ImportError: no decord"}


def test_video_site_prefers_the_bundle_then_an_earlier_unpack(tmp_path, monkeypatch):
    monkeypatch.setattr(check_server, "VIDEO_SITE", tmp_path / "site")
    assert check_server.video_site(None) is None and check_server.video_site(str(tmp_path / "absent")) is None
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / ".done").touch()
    assert check_server.video_site(None) == str(tmp_path / "site")
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "install.sh").write_text("echo unpacking >&2; echo /somewhere/video\n")
    assert check_server.video_site(str(bundle)) == "/somewhere/video"
    (bundle / "install.sh").write_text("echo 'decord.tar.xz missing' >&2; exit 3\n")
    assert check_server.video_site(str(bundle)) == str(tmp_path / "site")  # falls back, does not raise
    a = argparse.Namespace(pythonpath=["0.5.23=BASE"], work=tmp_path)
    assert check_server.version_pythonpath(a, "0.5.23", "/v").split(":")[-2:] == ["BASE", "/v"]
    assert check_server.version_pythonpath(a, "0.5.23").endswith(":BASE")
