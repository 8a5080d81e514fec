"""CPU tests of the shared-library store (sglang_fa4/kernels/fa4/shared_libs.py), no FA4 needed:
FA4's exported kernel is played by a C stub with the TVM-FFI calling convention that records the
arguments it is called with, compiled and linked by the system C compiler as the store links FA4's.
Checked: a stored kernel is loaded and launched through the kernel cache by a backend that must not
be asked (FA4 never involved), with our argument template; the > 256-segment scheduler aid; every
kind of stale or corrupt entry falls back to FA4's path (which rewrites it); what the key holds;
the warmup and the preload use it. The real FA4 kernel's round trip (cross-compiled, exported,
linked, loaded in a fresh process without cutlass) is tests/test_fa4_shared_libs_xcompile.py."""

from __future__ import annotations

import ctypes
import json
import logging
import math
import subprocess
from pathlib import Path

import pytest

from sglang_fa4.kernels import fa4
from sglang_fa4.kernels.fa4 import b36 as fa4_b36
from sglang_fa4.kernels.fa4 import shared_libs as fa4_shared_libs
from sglang_fa4.kernels.fa4.b36 import LAYOUT_SM90, Resolved
from sglang_fa4.kernels.fa4.cache import KernelCache
from sglang_fa4.kernels.fa4.shared_libs import Store
from sglang_fa4.startup import fa4_preload, jit_monitor, warmup
from sglang_fa4.startup.variants import WarmItem, enumerate_variants
from sglang_fa4.testing import cu_seqlens
from test_fa4_kernel_cache import STATIC, FakeBackend, qkv

tvm_ffi = pytest.importorskip("tvm_ffi")
if fa4_shared_libs.find_compiler() is None:
    pytest.skip("no C compiler to link with", allow_module_level=True)

STUB_C = r"""
#include <stdint.h>
typedef struct { int32_t type_index; uint32_t pad; union { int64_t i; double f; void* p; } v; } Any;
int32_t stub_calls, stub_nargs, stub_types[64], cumsum_calls, cumsum_nargs, cumsum_types[8];
double stub_f64[64];
int __tvm_ffi_stub_kernel(void* self, const Any* args, int32_t n, Any* result) {
  stub_calls++; stub_nargs = n;
  for (int i = 0; i < n && i < 64; i++) { stub_types[i] = args[i].type_index; stub_f64[i] = args[i].v.f; }
  result->type_index = 0; result->v.i = 0; return 0;
}
int __tvm_ffi_stub_cumsum(void* self, const Any* args, int32_t n, Any* result) {
  cumsum_calls++; cumsum_nargs = n;
  for (int i = 0; i < n && i < 8; i++) cumsum_types[i] = args[i].type_index;
  result->type_index = 0; result->v.i = 0; return 0;
}
"""
NONE, INT, BOOL, FLOAT, TENSOR, ARRAY = 0, 1, 2, 3, 70, 71  # TVM-FFI type indices


def _stub_object(directory: Path, name: str) -> Path:
    src, obj = directory / "stub.c", directory / name
    src.write_text(STUB_C)
    subprocess.run([fa4_shared_libs.find_compiler(), "-c", "-fPIC", "-o", str(obj), str(src)], check=True)
    return obj


class StubBackend(FakeBackend):
    """FakeBackend whose resolved kernel exports as the C stub (what FA4's exports as)."""

    def compile_and_run(self, call):
        r = super().compile_and_run(call)
        args = [(None, None) if a is STATIC else a for a in r.args]  # FA4's AuxData(None, None)

        def export(directory):
            out = [("forward", _stub_object(directory, "forward.o"), "stub_kernel")]
            if r.sched is not None:
                out.append(("tile_cumsum", _stub_object(directory, "cumsum.o"), "stub_cumsum"))
            return out

        spec = {"tile_cumsum": [192, 1, True, False, False, False]} if r.sched is not None else None
        return Resolved(fn=r.fn, args=args, fa4_compiled=True, sched=r.sched, export=export,
                        sched_spec=spec, key=("fa4-key",))


class NoFA4(FakeBackend):
    """A restart's backend: being asked means FA4's path was taken."""

    def compile_and_run(self, call):
        self.compiles.append(call)
        raise AssertionError("FA4's path taken")


@pytest.fixture(autouse=True)
def runtime(monkeypatch):
    """The stub needs only TVM-FFI (FA4's kernels also link the CUTLASS DSL runtime)."""
    monkeypatch.setattr(fa4_shared_libs, "runtime_libraries", lambda: [str(tvm_ffi.libinfo.find_libtvm_ffi())])
    for name in [k for k in fa4_shared_libs.envs.raw_with_prefixes(fa4_b36.KEY_ENV_PREFIXES)]:
        monkeypatch.delenv(name)


def _stub_state(lib: Path, prefix: str = "stub"):
    so = ctypes.CDLL(str(lib))
    n = ctypes.c_int32.in_dll(so, f"{prefix}_nargs").value
    size = 64 if prefix == "stub" else 8
    return ctypes.c_int32.in_dll(so, f"{prefix}_calls").value, list((ctypes.c_int32 * size).in_dll(so, f"{prefix}_types")[:n])


def _store_one(root: Path, lens=(40, 24), d=64, window=(None, None)):
    """A first start: FA4 (the stub backend) resolves one configuration and the store keeps it."""
    cache = KernelCache(StubBackend(90), Store(root))
    q, k, v = qkv(sum(lens), d=d)
    cache(q, k, v, cu_seqlens(lens), max(lens), None, window, None, None)
    (config,) = cache.configs_seen()
    return config, cache.store.entry_dir(config)


def test_a_restart_launches_the_stored_kernel_without_fa4(tmp_path):
    config, entry = _store_one(tmp_path)
    meta = json.loads((entry / "meta.json").read_text())
    assert meta["config"]["head_dim"] == 64 and meta["nargs"] == LAYOUT_SM90.nargs
    assert meta["fa4_key"] == repr(("fa4-key",)) and set(meta["libraries"]) == {"forward"}
    assert meta["template"][15] == {"tuple": [None, None]}  # AuxData, as TVM-FFI sees it
    # a fresh kernel cache (a restart) whose backend must not be asked
    backend = NoFA4(90)
    cache = KernelCache(backend, Store(tmp_path))
    q, k, v = qkv(64)
    out = cache(q, k, v, cu_seqlens([40, 24]), 40, 0.3, (None, None), None, None)
    assert out.shape == q.shape and backend.compiles == []
    (event,) = cache.compile_events()
    assert event.from_shared_library and not event.fa4_compiled and event.config == config
    lib = entry / meta["libraries"]["forward"]["file"]
    calls, types = _stub_state(lib)
    assert calls == 1 and len(types) == LAYOUT_SM90.nargs
    assert types[:4] == [TENSOR] * 4 and types[4] == NONE and types[5] == FLOAT
    assert types[6:8] == [TENSOR, TENSOR] and types[11:14] == [NONE] * 3
    assert types[15] == ARRAY and types[16:] == [NONE, NONE]
    scale = (ctypes.c_double * 64).in_dll(ctypes.CDLL(str(lib)), "stub_f64")[5]
    assert scale == 0.3
    cache(q, k, v, cu_seqlens([40, 24]), 40, None, (None, None), None, None)  # the direct launch, default scale
    assert _stub_state(lib)[0] == 2 and len(cache.compile_events()) == 1
    assert (ctypes.c_double * 64).in_dll(ctypes.CDLL(str(lib)), "stub_f64")[5] == 1.0 / math.sqrt(64)


def test_many_segments_run_the_stored_tile_cumsum(tmp_path):
    lens = (4,) * 300
    config, entry = _store_one(tmp_path, lens=lens)
    assert config.many_segments
    meta = json.loads((entry / "meta.json").read_text())
    assert set(meta["libraries"]) == {"forward", "tile_cumsum"} and meta["sched_spec"]
    backend = NoFA4(90)
    cache = KernelCache(backend, Store(tmp_path))
    q, k, v = qkv(sum(lens))
    cache(q, k, v, cu_seqlens(lens), 4, None, (None, None), None, None)
    assert backend.compiles == []
    calls, types = _stub_state(entry / meta["libraries"]["tile_cumsum"]["file"], "cumsum")
    assert calls == 1 and types == [TENSOR, NONE, TENSOR, NONE, NONE, NONE]  # (blocks, -, cu_seqlens, -, -, -)
    calls, types = _stub_state(entry / meta["libraries"]["forward"]["file"])
    assert types[16:] == [TENSOR, NONE]  # the block cumsum reaches the kernel


def _corrupt_so(entry):
    meta = json.loads((entry / "meta.json").read_text())
    path = entry / meta["libraries"]["forward"]["file"]
    path.write_bytes(path.read_bytes()[:-16] + b"\0" * 16)


def _edit_meta(**changes):
    def edit(entry):
        meta = json.loads((entry / "meta.json").read_text())
        for key, fn in changes.items():
            meta[key] = fn(meta[key])
        (entry / "meta.json").write_text(json.dumps(meta))
    return edit


CORRUPTIONS = {
    "library bytes changed": _corrupt_so,
    "library missing": lambda e: [p.unlink() for p in e.glob("*.so")],
    "meta.json not JSON": lambda e: (e / "meta.json").write_text("{truncated"),
    "another environment": _edit_meta(environment=lambda env: dict(env, sources="0" * 64)),
    "another configuration": _edit_meta(config=lambda c: dict(c, head_dim=80)),
    "another format": _edit_meta(format=lambda f: f + 1),
    "template of another length": _edit_meta(template=lambda t: t[:-1]),
    "template value not ours": _edit_meta(template=lambda t: t[:15] + [[1, 2]] + t[16:]),
    "no such function": _edit_meta(libraries=lambda libs: {"forward": dict(libs["forward"], function="nope")}),
    "library file outside the entry": _edit_meta(
        libraries=lambda libs: {"forward": dict(libs["forward"], file="../" + libs["forward"]["file"])}),
    "runtime library changed": _edit_meta(runtime_libraries=lambda libs: [dict(libs[0], size=libs[0]["size"] + 1)]),
    "scheduler aids not stored": _edit_meta(sched_spec=lambda s: {"tile_cumsum": [1]}),
}


@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_a_stale_or_corrupt_entry_falls_back_to_fa4_and_is_rewritten(tmp_path, corruption, caplog):
    config, entry = _store_one(tmp_path)
    CORRUPTIONS[corruption](entry)
    backend = StubBackend(90)
    cache = KernelCache(backend, Store(tmp_path))
    q, k, v = qkv(64)
    with caplog.at_level(logging.WARNING, logger="sglang_fa4"):
        out = cache(q, k, v, cu_seqlens([40, 24]), 40, None, (None, None), None, None)
    assert len(backend.compiles) == 1 and float(out[0, 0, 0]) == 1.0  # FA4's path wrote the output
    (event,) = cache.compile_events()
    assert not event.from_shared_library
    assert any("not used" in r.getMessage() and str(entry) in r.getMessage() for r in caplog.records)
    # FA4's path stored it again: the next restart loads it
    restart = KernelCache(NoFA4(90), Store(tmp_path))
    restart(q, k, v, cu_seqlens([40, 24]), 40, None, (None, None), None, None)
    assert restart.backend.compiles == [] and restart.compile_events()[0].from_shared_library


def test_a_kernel_that_rejects_the_call_falls_back(tmp_path, monkeypatch, caplog):
    config, entry = _store_one(tmp_path)

    def rejecting(path, name):
        def fn(*args):
            raise ValueError("Mismatched Tensor on argument #0")
        return None, fn

    monkeypatch.setattr(fa4_shared_libs, "load_function", rejecting)
    backend = StubBackend(90)
    cache = KernelCache(backend, Store(tmp_path))
    q, k, v = qkv(64)
    with caplog.at_level(logging.WARNING, logger="sglang_fa4"):
        cache(q, k, v, cu_seqlens([40, 24]), 40, None, (None, None), None, None)
    assert len(backend.compiles) == 1 and any("rejected a call" in r.getMessage() for r in caplog.records)


def test_the_key(tmp_path, monkeypatch):
    store = Store(tmp_path)
    base = store.environment(90)[1]

    def digest(**setenv):
        with monkeypatch.context() as m:
            for k, v in setenv.items():
                m.setenv(k, v)
            return Store(tmp_path).environment(90)[1]

    # every FA4 / DSL / quack setting changes it, the cache locations do not
    for name in ("FA_LOG_LEVEL", "FLASH_ATTENTION_NUM_SMS", "CUTE_DSL_ARCH", "QUACK_ARCH", "FA_CLC"):
        assert digest(**{name: "1"}) != base, name
    assert digest(FLASH_ATTENTION_CUTE_DSL_CACHE_DIR="/x", FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED="1") == base
    assert store.environment(100)[1] != base  # the kernel class
    # the versions of FA4 and of everything that builds its kernels
    def with_versions(version):
        with monkeypatch.context() as m:
            m.setattr(fa4_shared_libs, "_version", version)
            return Store(tmp_path).environment(90)[1]

    none = with_versions(lambda d: None)
    for dist in fa4_b36.KEY_DISTRIBUTIONS:
        assert with_versions(lambda d, dist=dist: "other" if d == dist else None) != none, dist
    # FA4's (and quack's) sources, byte for byte
    src = tmp_path / "src" / "flash_attn" / "cute"
    src.mkdir(parents=True)
    (src / "__init__.py").write_text("")
    (src / "interface.py").write_text("x = 1\n")
    monkeypatch.setattr(fa4_shared_libs, "source_dirs", lambda: [("flash_attn/cute", src)])
    before = Store(tmp_path).environment(90)[1]
    (src / "interface.py").write_text("x = 2\n")
    assert Store(tmp_path).environment(90)[1] != before
    # the configuration: every field of FA4Config
    config, _ = _store_one(tmp_path / "one")
    dirs = {store.entry_dir(config._replace(**{f: v})) for f, v in (
        ("dtype", "float16"), ("head_dim", 72), ("head_dim_v", 72), ("qhead_per_kvhead", 2),
        ("seqlen_class", "q_stage1"), ("causal", True), ("window_left", True), ("window_right", True),
        ("sink_dtype", "float32"), ("many_segments", True), ("broadcast", ((True, False, False),) * 3))}
    assert len(dirs) == 11 and store.entry_dir(config) not in dirs


def test_what_cannot_be_stored_still_runs(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(fa4_shared_libs, "find_compiler", lambda: None)
    backend = StubBackend(90)
    cache = KernelCache(backend, Store(tmp_path))
    q, k, v = qkv(64)
    with caplog.at_level(logging.WARNING, logger="sglang_fa4"):
        cache(q, k, v, cu_seqlens([40, 24]), 40, None, (None, None), None, None)
        cache(q, k, v, cu_seqlens([40, 24]), 40, None, (64, 64), None, None)
    assert len(backend.compiles) == 2 and not list(tmp_path.rglob("meta.json"))
    assert sum("not stored as a shared library" in r.getMessage() for r in caplog.records) == 1  # once
    with pytest.raises(fa4_shared_libs.NotStorable):
        fa4_shared_libs.encode_value(object())
    resolved = Resolved(fn=None, args=[], fa4_compiled=True, export=None)
    assert not Store(tmp_path).save(cache.configs_seen()[0], resolved, [None] * 18, LAYOUT_SM90)


def test_the_warmup_loads_every_variant_from_the_store(tmp_path, monkeypatch):
    from test_warmup import qwen25_vl

    monkeypatch.setenv("SGLANG_FA4_KERNEL_CACHE", "0")
    variants = enumerate_variants(qwen25_vl(), 90)
    previous = fa4.install_kernel_cache(KernelCache(StubBackend(90), Store(tmp_path)))
    jit_monitor.reset_state()
    try:
        first = warmup.warm([WarmItem("fa4", v) for v in variants], "cpu")
        assert first.compiled == len(variants) == 2 and first.from_shared_library == 0
        backend = NoFA4(90)
        fa4.install_kernel_cache(KernelCache(backend, Store(tmp_path)))
        again = warmup.warm([WarmItem("fa4", v) for v in variants], "cpu")
    finally:
        jit_monitor.reset_state()
        fa4.install_kernel_cache(previous)
    assert backend.compiles == [] and not again.failures
    assert again.resolved == again.from_shared_library == 2 and again.compiled == 0
    assert again.as_dict()["from_shared_library"] == 2


def test_the_preload_is_skipped_when_the_store_is_warm(tmp_path, monkeypatch):
    monkeypatch.setenv("SGLANG_FA4_KERNEL_CACHE", "1")
    monkeypatch.setenv("SGLANG_FA4_KERNEL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "1")  # start() sets them: restored after
    monkeypatch.setenv("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", str(tmp_path / "fa4"))
    monkeypatch.setenv("FLASH_ATTENTION_ARCH", "sm_90")
    monkeypatch.setattr(fa4_preload, "_thread", None)
    store = fa4_shared_libs.default_store()
    assert store is not None and store.root == tmp_path / fa4_shared_libs.SUBDIR
    assert not store.has_entries(90)
    _store_one(store.root)
    assert store.has_entries(90) and not store.has_entries(100)
    assert fa4_preload.start("flash_attn.cute") is False and fa4_preload._thread is None
    monkeypatch.setenv("SGLANG_FA4_SHARED_LIBS", "0")
    assert fa4_shared_libs.default_store() is None and not fa4_preload._store_is_warm()


@pytest.mark.parametrize("value,arch", [("sm_90", 90), ("sm_90a", 90), ("100", 100), ("SM_103a", 103)])
def test_device_arch_without_fa4(monkeypatch, value, arch):
    import sys

    monkeypatch.setenv("FLASH_ATTENTION_ARCH", value)
    assert fa4_b36.device_arch() == arch and "flash_attn.cute.interface" not in sys.modules


def test_the_store_module_imports_no_fa4_at_import():
    import ast

    tree = ast.parse(Path(fa4_shared_libs.__file__).read_text())
    top = {a.name.split(".")[0] for n in tree.body if isinstance(n, ast.Import) for a in n.names}
    top |= {(n.module or "").split(".")[0] for n in tree.body if isinstance(n, ast.ImportFrom)}
    assert not top & {"flash_attn", "cutlass", "quack", "tvm_ffi"}  # cutlass only inside save
