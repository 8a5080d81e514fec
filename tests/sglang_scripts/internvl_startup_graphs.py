"""SGLang's real InternViTCudaGraphRunner with graphs faked, driven by the plugin's AFTER-load_model
hook on an InternVL-shaped model, inside a REAL SGLang release: for
tests/test_internvl_startup_graphs.py (its docstring says what is checked)."""

import logging
import os
from types import SimpleNamespace as NS
from unittest import mock

import torch
import torch.nn as nn
from vit_budget_tower import C
from vit_graph_fakes import STATE, FakeGraph, fake_graph, log
from vit_internvl_layers import Layer, ir, replaying_capture
from sglang.srt.plugins.hook_registry import HookRegistry

from emit import emit
from sglang_fa4.integration import internvl_graphs as ig
from sglang_fa4.integration.vit_capture_guard import GraphCaptureAfterStartup


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
recording_capture = replaying_capture(captured)

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
