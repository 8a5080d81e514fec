"""InternVL ViT graphs captured at startup (sglang_fa4.integration.internvl_graphs, issue #18 item 5).

SGLang's real InternViTCudaGraphRunner (0.5.20 and 0.5.23), graphs faked (a replay re-runs the
captured body into the same static output, as in test_vit_graph_outputs.py), driven by the
plugin's real AFTER-load_model hook on an InternVL-shaped model (config with vision_config,
max_dynamic_patch, use_thumbnail): the startup hook captures exactly the config's (tiles, tokens)
shapes; serving them captures nothing more and equals the eager encoder; a shape outside the
config is counted and warned about / raised per SGLANG_FA4_JIT_MONITOR; with the feature off, an
unreadable config or a non-InternVL encoder (RADIO), nothing is captured at startup and upstream's
lazy capture still serves.
"""

from types import SimpleNamespace as NS

import pytest

from sglang_fa4.integration import internvl_graphs as ig
from sglang_harness import run_with_sglang
from test_vit_budgets import MODEL
from test_vit_graph_outputs import INTERNVL_LAYERS


def config(tiles=12, thumbnail=True, image=448, patch=14, hidden=1024, force=None):
    return NS(vision_config=NS(image_size=image, patch_size=patch, hidden_size=hidden, intermediate_size=4 * hidden),
              max_dynamic_patch=tiles, use_thumbnail=thumbnail, force_image_size=force)


def test_tile_shapes_from_the_config():
    s = ig.tile_shapes(config(), processor_defaults=(None, False))
    assert s.batches == tuple(range(1, 14)) and s.tokens == 1025 and s.hidden == 1024  # 448/14: 32^2 + 1
    assert ig.tile_shapes(config(thumbnail=False), (None, False)).batches == tuple(range(1, 13))
    assert ig.tile_shapes(config(tiles=1), (None, False)).batches == (1,)  # one tile: no thumbnail
    # SGLang's processor cuts up to IMAGE_MAX_NUM tiles and adds thumbnails whatever the config says
    assert ig.tile_shapes(config(tiles=6, thumbnail=False), (12, True)).batches == tuple(range(1, 14))
    assert ig.tile_shapes(config(image=[448, 448], patch=[14, 14], force=224), (None, False)).tokens == 257
    assert ig.tile_shapes(NS(vision_config=config().vision_config), (12, True)).batches == tuple(range(1, 14))
    for bad in (NS(), NS(vision_config=NS(image_size=448, patch_size=14)),
                NS(vision_config=config().vision_config), config(image=450)):
        with pytest.raises(ig.ShapesUnknown):
            ig.tile_shapes(bad, (None, False))


def test_memory_estimate_from_the_shapes():
    s = ig.tile_shapes(config(), (None, False))  # InternViT-300M: H 1024, MLP 4096
    est = ig.estimate_graph_bytes(s, 2)
    assert est == sum(range(1, 14)) * 1025 * (6 * 1024 + 4096) * 2
    assert 1.5 * 2**30 < est < 2.5 * 2**30  # ~1.8 GiB for 13 graphs in bf16


SNIPPET = MODEL + INTERNVL_LAYERS + r"""
import os
from types import SimpleNamespace as NS
from sglang.srt.multimodal import internvl_vit_cuda_graph_runner as ir
from sglang_fa4.integration import internvl_graphs as ig
from sglang_fa4.integration.vit_capture_guard import GraphCaptureAfterStartup
from sglang.srt.plugins.hook_registry import HookRegistry

logging.getLogger("sglang_fa4").setLevel(logging.INFO)
S = 17  # tiles of 8 px, 2 px patches: 4^2 + 1 class token
class Encoder(nn.Module):
    def __init__(self, backend):
        super().__init__(); self.layers = nn.ModuleList([Layer(backend) for _ in range(2)])
        self.cuda_graph_runner = ir.InternViTCudaGraphRunner(self)  # as InternVisionEncoder does

class VisionModel(nn.Module):  # InternVisionModel: class-token embeddings + encoder
    def __init__(self, backend, radio):
        super().__init__()
        if radio:
            self.patch_generator = nn.Identity()
        else:
            self.embeddings = nn.Identity()
        self.encoder = Encoder(backend)

def make(tiles=12, backend="fa4", radio=False, cfg=True):
    m = nn.Module(); m.vision_model = VisionModel(backend, radio)
    m.config = NS(max_dynamic_patch=tiles, use_thumbnail=True, force_image_size=None)
    if cfg:
        m.config.vision_config = NS(image_size=8, patch_size=2, hidden_size=C, intermediate_size=2 * C)
    return NS(model=m), m.vision_model.encoder

captured = []
hooked_capture = ir.InternViTCudaGraphRunner._capture_graph
def recording_capture(self, key):
    captured.append(list(key))
    hooked_capture(self, key)
    static = self.out[key]
    def again():  # the captured body over the same static buffers, into the same output
        with torch.no_grad():
            y = self.inp[key]
            for blk in self.encoder.layers:
                y = blk(y, cu_seqlens=[self.cu[key], int(self.cu_kk[key].max())], output_ws=self.ws[key])
        static.copy_(y)
    self.graphs[key].again = again

def eager(enc, x):
    with torch.no_grad():
        y = x
        for blk in enc.layers:
            s = x.shape[1]  # tokens per tile
            y = blk(y, cu_seqlens=[torch.arange(0, x.shape[0] * s + 1, s, dtype=torch.int32), s])
    return y

def serve(enc, shapes):
    errs = []
    for b, s in shapes:
        x = torch.randn(b, s, C)
        got = enc.cuda_graph_runner.run(x)
        errs.append(float((got - eager(enc, x)).abs().max()))
    return max(errs)

def monitor(mode):
    os.environ["SGLANG_FA4_JIT_MONITOR"] = mode

reg = HookRegistry._hooks
result = {"load_model": [fn.__module__ + "." + fn.__qualname__ for ht, fn, src in
                         reg.get("sglang.srt.model_executor.model_runner.ModelRunner.load_model", [])],
          "create_graph": [(ht.value, fn.__qualname__) for ht, fn, src in
                           reg.get(ir.__name__ + ".InternViTCudaGraphRunner.create_graph", [])]}
with mock.patch.object(torch.cuda, "CUDAGraph", FakeGraph), mock.patch.object(torch.cuda, "graph", fake_graph), \
     mock.patch.object(torch.cuda, "synchronize", lambda *a: None), \
     mock.patch.object(ir.InternViTCudaGraphRunner, "_capture_graph", recording_capture):
    # 1. the startup hook: 12 tiles + thumbnail -> B = 1..13 of S tokens
    mr, enc = make()
    STATE["warming"].clear(); log.truncate(0); log.seek(0)
    ig.capture_after_load_model(None, mr)
    result["startup"] = sorted(captured); result["startup_warming"] = sorted(STATE["warming"])
    result["startup_log"] = log.getvalue()
    # 2. serving the configured shapes, each several times: no capture, equal to eager
    del captured[:]; STATE["warming"].clear()
    result["served_err"] = serve(enc, [(b, S) for b in list(range(1, 14)) + [13, 5, 1, 2]])
    result["served_captures"] = len(captured); result["serve_warming"] = sorted(STATE["warming"])
    state = ig.startup_state(enc.cuda_graph_runner)
    result["after_serving"] = state.captures_after_startup
    # 3. outside the config (two 12-tile images + thumbnails in one call, odd shapes): eager, never
    # a capture while serving, whatever the monitor says; right results
    log.truncate(0); log.seek(0)
    errs = []
    for mode, shapes in (("warn", [(26, S), (26, S)]), ("raise", [(2, 9)]), ("off", [(15, S)])):
        monitor(mode)
        errs.append(serve(enc, shapes))
    result["outside"] = {"err": max(errs), "captured": sorted(captured), "count": state.captures_after_startup,
                         "eager_runs": state.eager_runs, "log": log.getvalue()}
    # ... and a capture forced after startup (the runner's create_graph called directly) is flagged
    monitor("warn"); log.truncate(0); log.seek(0)
    enc.cuda_graph_runner.create_graph(torch.randn(26, S, C))
    result["warn"] = {"count": state.captures_after_startup, "captured": sorted(captured), "log": log.getvalue()}
    monitor("raise")
    try:
        enc.cuda_graph_runner.create_graph(torch.randn(2, 9, C))
        result["raise"] = "nothing raised"
    except GraphCaptureAfterStartup as exc:
        result["raise"] = [type(exc).__name__, state.captures_after_startup, str(exc)]
    monitor("off"); log.truncate(0); log.seek(0)
    enc.cuda_graph_runner.create_graph(torch.randn(15, S, C))
    result["off"] = {"count": state.captures_after_startup, "log": log.getvalue()}
    monitor("warn")
    # 4. no startup capture: feature off, config unreadable, RADIO-like encoder, unsupported backend
    cases = {"feature_off": dict(), "no_vision_config": dict(cfg=False), "radio": dict(radio=True),
             "sdpa": dict(backend="sdpa")}
    for name, kw in cases.items():
        if name == "feature_off":
            os.environ["SGLANG_FA4_VIT_GRAPH_INTERNVL_STARTUP"] = "0"
        mr, enc = make(**kw)
        del captured[:]; log.truncate(0); log.seek(0)
        ig.capture_after_load_model(None, mr)
        r = {"startup": len(captured), "state": ig.startup_state(enc.cuda_graph_runner) is not None,
             "log": log.getvalue()}
        if name != "sdpa":  # upstream's lazy capture still serves, unflagged
            r["lazy_err"] = serve(enc, [(2, S)]); r["lazy"] = sorted(captured)
        r["log"] = log.getvalue()
        result[name] = r
        os.environ.pop("SGLANG_FA4_VIT_GRAPH_INTERNVL_STARTUP", None)
emit(result)
"""

_runs: dict = {}


def startup_run(version: str) -> dict:
    if version not in _runs:
        _runs[version] = run_with_sglang(version, SNIPPET, env={
            "SGLANG_VIT_ENABLE_CUDA_GRAPH": "1", "SGLANG_FA4_VIT_GRAPH_INTERNVL_STARTUP": None,
            "SGLANG_FA4_JIT_MONITOR": "warn"})
    return _runs[version]


def test_hooks_registered_after_the_warmup(sglang_version):
    out = startup_run(sglang_version)
    assert out["create_graph"] == [["around", "create_graph_around"]]
    load = out["load_model"]
    assert load.index("sglang_fa4.integration.hooks.warm_fa4_after_load_model") < \
        load.index("sglang_fa4.integration.internvl_graphs.capture_after_load_model")


def test_startup_captures_exactly_the_config_shapes(sglang_version):
    out = startup_run(sglang_version)
    assert out["startup"] == [[b, 17] for b in range(1, 14)], out["startup"]  # 12 tiles + thumbnail
    # FA4 runs during the startup capture count as expected compiles for the JIT monitor
    assert out["startup_warming"] == [[False, 1]], out["startup_warming"]
    assert "13 InternVL ViT graphs captured at startup" in out["startup_log"]
    assert "estimated graph memory" in out["startup_log"]


def test_serving_config_shapes_captures_nothing_and_equals_eager(sglang_version):
    out = startup_run(sglang_version)
    assert out["served_captures"] == 0 and out["after_serving"] == 0, out
    assert out["served_err"] < 1e-5, out
    assert out["serve_warming"] == [[False, 0]]  # replays ran outside any expected-compile window


def test_shape_outside_the_config_runs_eagerly(sglang_version):
    out = startup_run(sglang_version)["outside"]
    assert out["captured"] == [] and out["count"] == 0, out  # serving never captured
    assert out["eager_runs"] == 4 and out["err"] < 1e-5, out  # ... under warn, raise and off alike
    assert out["log"].count("runs eagerly (no capture while serving)") == 1, out["log"]


def test_capture_after_startup_is_flagged(sglang_version):
    out = startup_run(sglang_version)
    warn = out["warn"]
    assert warn["captured"] == [[26, 17]] and warn["count"] == 1, warn
    assert "InternVL ViT CUDA graph captured after startup for (26, 17) (#1)" in warn["log"], warn["log"]
    assert out["raise"][0] == "GraphCaptureAfterStartup" and out["raise"][1] == 2, out["raise"]
    assert "(2, 9)" in out["raise"][2]
    assert out["off"]["count"] == 3 and "captured after startup" not in out["off"]["log"]


@pytest.mark.parametrize("case", ["feature_off", "no_vision_config", "radio", "sdpa"])
def test_no_startup_capture(sglang_version, case):
    r = startup_run(sglang_version)[case]
    assert r["startup"] == 0 and not r["state"], r
    if case in ("no_vision_config", "radio"):  # one clear warning, upstream's lazy capture
        assert r["log"].count("InternVL ViT graphs not captured at startup") == 1, r["log"]
    else:
        assert "InternVL" not in r["log"], r["log"]
    if case != "sdpa":
        assert r["lazy"] == [[2, 17]] and r["lazy_err"] < 1e-5, r
        assert "captured after startup" not in r["log"]
