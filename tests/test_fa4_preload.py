"""flash_attn.cute imported in the background while SGLang loads weights (sglang_fa4.startup.fa4_preload),
started by the plugin's BEFORE hook on ModelRunner.load_model only where the ViT will run fa4."""

import sys
import time
import types

import pytest

from sglang_fa4.integration import hooks
from sglang_fa4.startup import fa4_preload


@pytest.fixture
def slow_module(tmp_path, monkeypatch):
    """A module whose import takes 0.5 s (stands in for flash_attn.cute)."""
    name = f"sglang_fa4_slow_{time.monotonic_ns()}"
    (tmp_path / f"{name}.py").write_text("import time\ntime.sleep(0.5)\nLOADED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("SGLANG_FA4_KERNEL_CACHE", "0")  # start() sets FA4's cache variables otherwise
    fa4_preload.reset()
    yield name
    fa4_preload.reset()
    sys.modules.pop(name, None)


def test_import_runs_in_the_background_and_wait_joins_it(slow_module):
    t0 = time.perf_counter()
    assert fa4_preload.start(slow_module) is True
    assert time.perf_counter() - t0 < 0.3  # the caller goes on (weights load meanwhile)
    assert fa4_preload.start(slow_module) is False  # once per process
    seconds = fa4_preload.wait()
    assert seconds is not None and seconds >= 0.5
    assert sys.modules[slow_module].LOADED


def test_wait_without_start_and_already_imported(slow_module):
    assert fa4_preload.wait() is None
    __import__(slow_module)
    assert fa4_preload.start(slow_module) is False  # nothing left to overlap


def test_warm_store_imports_only_the_loader_in_the_background(slow_module, monkeypatch, caplog):
    """A restart whose FA4 kernels are stored as shared libraries: FA4 is not imported, the store's
    loader (tvm_ffi; here a slow stand-in) is, in the background, and wait() joins it."""
    monkeypatch.setattr(fa4_preload, "_store_is_warm", lambda: True)
    monkeypatch.setattr(fa4_preload, "STORE_LOADER", slow_module)
    imported = []
    real_import = fa4_preload.importlib.import_module
    monkeypatch.setattr(fa4_preload.importlib, "import_module", lambda m: (imported.append(m), real_import(m))[1])
    t0 = time.perf_counter()
    assert fa4_preload.start(fa4_preload.MODULE) is False  # FA4: not imported
    assert time.perf_counter() - t0 < 0.3
    with caplog.at_level("INFO", logger="sglang_fa4"):
        seconds = fa4_preload.wait()
    assert seconds is not None and seconds >= 0.5 and sys.modules[slow_module].LOADED
    assert f"{slow_module} imported in the background" in caplog.text
    assert imported == [slow_module]  # the loader only, never flash_attn.cute
    fa4_preload.reset()
    assert fa4_preload.start(fa4_preload.MODULE) is False and fa4_preload.wait() is None  # loader already imported


def test_failed_import_is_logged_not_raised(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("SGLANG_FA4_KERNEL_CACHE", "0")
    fa4_preload.reset()
    assert fa4_preload.start("sglang_fa4_no_such_module_xyz")
    with caplog.at_level("WARNING", logger="sglang_fa4"):
        assert fa4_preload.wait() is not None
    assert "background import of" in caplog.text and "ModuleNotFoundError" in caplog.text
    fa4_preload.reset()


@pytest.mark.parametrize("server_arg, capability, multimodal, env, started", [
    ("fa4", (9, 0), True, "1", True),       # asked for
    (None, (10, 0), True, "1", True),       # B200 default: fa4
    (None, (9, 0), True, "1", False),       # H200 default: fa3, no FA4 import to overlap
    ("triton_attn", (10, 0), True, "1", False),
    ("fa4", (9, 0), False, "1", False),     # a language model: no ViT
    ("fa4", (9, 0), True, "0", False),      # SGLANG_FA4_PRELOAD=0
])
def test_before_load_model_starts_only_for_a_fa4_vit(monkeypatch, server_arg, capability, multimodal, env, started):
    calls = []
    monkeypatch.setenv("SGLANG_FA4_PRELOAD", env)
    monkeypatch.delenv("SGLANG_FA4_MM_ATTENTION_BACKEND_DEFAULT", raising=False)
    vision = types.SimpleNamespace(is_cuda=lambda: True, get_device_capability=lambda: capability)
    monkeypatch.setattr(hooks, "_vision", lambda: vision)
    monkeypatch.setattr(fa4_preload, "start", lambda *a: calls.append("start") or True)
    runner = types.SimpleNamespace(model_config=types.SimpleNamespace(is_multimodal=multimodal),
                                   server_args=types.SimpleNamespace(mm_attention_backend=server_arg))
    assert hooks.preload_fa4_before_load_model(runner) is None  # SGLang's arguments unchanged
    assert calls == (["start"] if started else [])
