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
from sglang_harness import run_file


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


_runs: dict = {}  # one run of tests/sglang_scripts/internvl_startup_graphs.py per version serves every test


def startup_run(version: str) -> dict:
    if version not in _runs:
        _runs[version] = run_file(version, "internvl_startup_graphs.py", env={
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
