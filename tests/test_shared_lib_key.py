"""Every field of a stored FA4 kernel's key (sglang_fa4/kernels/fa4/shared_libs.py) moves the entry:
each environment field (entry format, Python minor, machine, FA4/DSL versions, FA4/quack sources,
FA4/DSL settings, kernel class, the GPU's SM count) and each FA4Config field. The rows are keyed by
field name, so a field added to the key without a row here, or a row whose field left the key,
fails -- a kernel built for another GPU or DSL must never be loaded as this one."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from sglang_fa4.kernels.fa4 import shared_libs as fa4_shared_libs
from sglang_fa4.kernels.fa4.config import FA4Config
from sglang_fa4.kernels.fa4.shared_libs import Store

#: environment field -> a change of the world that must move it (applied with monkeypatch)
ENVIRONMENT_CHANGES = {
    "format": lambda m: m.setattr(fa4_shared_libs, "FORMAT", fa4_shared_libs.FORMAT + 1),
    "python": lambda m: m.setattr(fa4_shared_libs, "sys", SimpleNamespace(
        version_info=SimpleNamespace(major=3, minor=99), platform="linux")),
    "machine": lambda m: m.setattr(fa4_shared_libs.os, "uname", lambda: SimpleNamespace(machine="riscv64")),
    "versions": lambda m: m.setattr(fa4_shared_libs, "_version", lambda d: "9.9" if d == "apache-tvm-ffi" else None),
    "sources": lambda m: m.setattr(fa4_shared_libs, "_sources_digest", lambda: "other sources"),
    "settings": lambda m: m.setenv("CUTE_DSL_OPT_LEVEL", "2"),
    "arch": None,  # a different kernel class: environment(100) vs environment(90), below
    "sms": lambda m: m.setattr(fa4_shared_libs, "_device_sms", lambda: 78),
}

BASE_CONFIG = FA4Config(90, "bfloat16", 80, 80, 1, "any", False, False, False, None, False, None)
#: FA4Config field -> another value it can take
CONFIG_CHANGES = {
    "arch": 100, "dtype": "float16", "head_dim": 72, "head_dim_v": 64, "qhead_per_kvhead": 2,
    "seqlen_class": "q_stage1", "causal": True, "window_left": True, "window_right": True,
    "sink_dtype": "float32", "many_segments": True, "broadcast": ((True, False, False),) * 3,
}


@pytest.fixture
def pinned(monkeypatch):
    """A reproducible environment: no SM count, fixed versions and sources, no FA4/DSL settings."""
    monkeypatch.setattr(fa4_shared_libs, "_device_sms", lambda: 132)
    monkeypatch.setattr(fa4_shared_libs, "_version", lambda d: None)
    monkeypatch.setattr(fa4_shared_libs, "_sources_digest", lambda: "sources")
    for name in list(os.environ):
        if name.startswith(("FLASH_ATTENTION_", "FA_", "CUTE_DSL_", "QUACK_")):
            monkeypatch.delenv(name)
    return monkeypatch


def test_every_environment_field_has_a_row(pinned, tmp_path):
    assert set(Store(tmp_path).environment(90)[0]) == set(ENVIRONMENT_CHANGES)


@pytest.mark.parametrize("field", sorted(ENVIRONMENT_CHANGES))
def test_each_environment_field_moves_the_entry(pinned, tmp_path, field):
    env, base = Store(tmp_path).environment(90)
    if field == "arch":
        assert Store(tmp_path).environment(100)[1] != base
        return
    with pinned.context() as m:
        ENVIRONMENT_CHANGES[field](m)
        changed, digest = Store(tmp_path).environment(90)
    assert changed[field] != env[field]
    assert {k for k in env if env[k] != changed[k]} == {field}  # that field alone
    assert digest != base


def test_every_config_field_has_a_row():
    assert set(CONFIG_CHANGES) == set(FA4Config._fields)


@pytest.mark.parametrize("field", sorted(CONFIG_CHANGES))
def test_each_config_field_moves_the_entry(pinned, tmp_path, field):
    store = Store(tmp_path)
    other = BASE_CONFIG._replace(**{field: CONFIG_CHANGES[field]})
    assert store.entry_dir(other) != store.entry_dir(BASE_CONFIG)
    assert store.entry_dir(BASE_CONFIG._replace()) == store.entry_dir(BASE_CONFIG)  # and it is a function of them
