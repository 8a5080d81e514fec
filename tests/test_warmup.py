"""Startup warmup (sglang_fa4/startup/warmup.py) on CPU: which FA4 variants a vision model hits, that the
warmup resolves each exactly once through the kernel cache (fake FA4 backend), the JIT monitor,
FA4's persistent-cache variables, the env opt-out, and the lazy-import guarantees (including a
flash-attn-4-only install, where ``flash_attn`` holds nothing but ``cute``)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from sglang_fa4.integration import hooks
from sglang_fa4.kernels import fa4, varlen
from sglang_fa4.kernels.fa4 import b36 as fa4_b36
from sglang_fa4.kernels.fa4.b36 import MANY_SEGMENTS
from sglang_fa4.kernels.fa4.config import FA4Config, config_for
from sglang_fa4.kernels.fa4.cache import KernelCache
from sglang_fa4.startup import fa4_env, jit_monitor, warmup
from sglang_fa4.startup.variants import WarmItem, enumerate_variants
from sglang_fa4.testing import cu_seqlens
from fake_vision_models import (  # noqa: F401 - re-exported: other tests import them from here
    VLM, Block, FakeVisionAttention, InternEmbeddings, InternViT, MiMoTower, QwenTower, internvl, qwen3_vl, qwen25_vl,
)
from test_fa4_kernel_cache import FakeBackend

ROOT = Path(__file__).resolve().parent.parent


def configs(variants):
    return {v.config for v in variants}


def cfg(arch, d, seqlen="any", many=False, dtype="bfloat16", qpk=1, window=(False, False), sink=None):
    return FA4Config(arch, dtype, d, d, qpk, seqlen, False, window[0], window[1], sink, many, None)


# ---- enumeration ----------------------------------------------------------------------------


def test_qwen25_vl_sm90_windowed_and_full_collapse_to_segment_classes():
    variants = enumerate_variants(qwen25_vl(), 90)
    # on SM90 max_seqlen is not part of the kernel: windows and full images share a kernel, and
    # only more-than-256 segments (many windows) adds one
    assert configs(variants) == {cfg(90, 80), cfg(90, 80, many=True)}
    assert {v.layout for v in variants} == {"windowed"}  # block 0 is windowed, found first
    few = next(v for v in variants if not v.config.many_segments)
    assert len(few.modules) == 8  # every block's attention hits it


def test_qwen25_vl_sm100_seqlen_classes_per_layout():
    variants = enumerate_variants(qwen25_vl(), 100)
    by_layout = {}
    for v in variants:
        by_layout.setdefault(v.layout, set()).add((v.config.seqlen_class, v.config.many_segments))
    # windows are <= 64 tokens: one class; full images reach all three classes
    assert by_layout["windowed"] == {("q_stage1-static", False), ("q_stage1-static", True)}
    assert by_layout["full"] == {(c, m) for c in ("q_stage2-static", "q_stage2") for m in (False, True)}
    assert len(variants) == 6
    for v in variants:  # the representative inputs really produce the variant's class
        total = v.max_seqlen + v.num_segments - 1
        assert config_for(100, v.dtype, 80, 80, 1, v.max_seqlen, total, v.window, None, v.num_segments) == v.config


def test_qwen25_vl_window_tokens_from_tower():
    # a tower with 256-token windows reaches q_stage2-static in its windowed blocks too
    variants = enumerate_variants(qwen25_vl(window_size=224), 100)
    windowed = {v.config.seqlen_class for v in variants if v.layout == "windowed"}
    assert windowed == {"q_stage1-static", "q_stage2-static"}


def test_qwen3_vl_d72_full_only():
    variants = enumerate_variants(qwen3_vl(), 90)
    assert configs(variants) == {cfg(90, 72), cfg(90, 72, many=True)}
    assert {v.layout for v in variants} == {"full"}


def test_internvl_d64_fixed_resolution():
    assert configs(enumerate_variants(internvl(), 90)) == {cfg(90, 64), cfg(90, 64, many=True)}
    # 1025 tokens per tile: on SM100 only the > 256 class, not all three
    assert configs(enumerate_variants(internvl(), 100)) == {
        cfg(100, 64, "q_stage2"), cfg(100, 64, "q_stage2", many=True)
    }


def test_mimo_sliding_window_with_sinks():
    variants = enumerate_variants(VLM(MiMoTower()), 90)
    assert configs(variants) == {
        cfg(90, 64, window=(True, True), sink="bfloat16"),
        cfg(90, 64, window=(True, True), sink="bfloat16", many=True),
        cfg(90, 64),
        cfg(90, 64, many=True),
    }
    assert {v.layout for v in variants} == {"sliding+sinks", "full"}  # no 64-token window layout


def test_non_fa4_model_has_no_variants():
    assert enumerate_variants(VLM(InternViT(backend="triton_attn")), 90) == []
    assert enumerate_variants(nn.Linear(2, 2), 90) == []
    assert enumerate_variants(None, 90) == []


def test_dtype_gqa_and_segment_bound():
    model = VLM(QwenTower(64, heads=16, kv_heads=4, dtype=torch.float16))
    assert configs(enumerate_variants(model, 90, max_segments=MANY_SEGMENTS)) == {
        cfg(90, 64, dtype="float16", qpk=4)
    }


def test_config_for_is_the_kernel_cache_key():
    """config_for (used by the enumeration) predicts exactly what KernelCache resolves."""
    g = torch.Generator().manual_seed(0)
    for arch in (90, 100, 103, 120):
        cache = KernelCache(FakeBackend(arch))
        expected = []
        for i in range(60):
            d = [64, 72, 80, 128][i % 4]
            nkv = [16, 8, 4][i % 3]
            nseg = [1, 3, 256, 257, 300][i % 5]
            max_len = int(torch.randint(1, 400, (1,), generator=g))
            window = [(None, None), (-1, -1), (32, 32), (None, 0), (16, None)][i % 5]
            sinks = torch.zeros(16, dtype=torch.float32) if (i % 7 == 0 and arch // 10 not in (8, 12)) else None
            lens = [max_len] + [1] * (nseg - 1)
            cu = cu_seqlens(lens)
            total = sum(lens)
            dtype = torch.float16 if i % 2 else torch.bfloat16
            q = torch.empty(total, 16, d, dtype=dtype)  # the key reads shapes and dtypes only
            k = torch.empty(total, nkv, d, dtype=dtype)
            ms = None if i % 11 == 0 else max_len
            cache(q, k, k.clone(), cu, ms, None, window, sinks, None)
            c = config_for(arch, dtype, d, d, 16 // nkv, ms, total, window,
                           None if sinks is None else sinks.dtype, nseg)
            if c not in expected:
                expected.append(c)
        assert cache.configs_seen() == expected


# ---- running it -----------------------------------------------------------------------------


def run_warmup(variants, device):
    """FA4 variants through the one warmup loop (the registry's fa4 family)."""
    return warmup.warm([WarmItem("fa4", v) for v in variants], device)


@pytest.fixture
def fake_fa4(monkeypatch):
    """A KernelCache with a fake FA4 backend installed process-wide, fresh warmup state."""
    backend = FakeBackend(90)
    previous = fa4.install_kernel_cache(KernelCache(backend))
    jit_monitor.reset_state()
    monkeypatch.delenv("SGLANG_FA4_WARMUP", raising=False)
    monkeypatch.delenv("SGLANG_FA4_JIT_MONITOR", raising=False)
    monkeypatch.setenv("SGLANG_FA4_KERNEL_CACHE", "0")
    yield backend
    jit_monitor.reset_state()
    fa4.install_kernel_cache(previous)


def test_warmup_compiles_each_variant_once(fake_fa4, caplog):
    variants = enumerate_variants(qwen25_vl(), 90) + enumerate_variants(qwen3_vl(), 90)
    assert len(variants) == 4
    with caplog.at_level(logging.INFO, logger="sglang_fa4"):
        report = run_warmup(variants, "cpu")
    assert len(fake_fa4.compiles) == 4 and report.resolved == 4 and report.compiled == 4
    assert not report.failures and not report.mismatches
    assert [c.config for c in fa4.kernel_cache().compile_events()] == [v.config for v in variants]
    many = [c for c in fake_fa4.compiles if c.cu_seqlens.shape[0] - 1 > MANY_SEGMENTS]
    assert len(many) == 2  # the > 256-segment variants really got > 256 segments
    lines = [r.getMessage() for r in caplog.records if "warmup [" in r.getMessage()]
    assert len(lines) == 4 and all(" s (compiled)" in line for line in lines)
    assert "d=80" in lines[0] and "d=72" in lines[2]
    # a second warmup (another model loaded, a restart of the runner) compiles nothing
    again = run_warmup(variants, "cpu")
    assert len(fake_fa4.compiles) == 4 and again.resolved == 0 and again.as_dict()["compiled"] == 0


def test_warmup_failure_is_reported_not_raised(fake_fa4):
    variants = enumerate_variants(VLM(MiMoTower()), 120)  # FA4 has no sinks on sm_120
    fake_fa4._arch = 120
    fa4.install_kernel_cache(KernelCache(fake_fa4))
    report = run_warmup(variants, "cpu")
    assert len(report.failures) == 2 and report.resolved == 2  # the two full variants still compiled
    assert all("FA4FeatureError" in msg for _, msg in report.failures)


def test_after_warmup_the_monitor_warns(fake_fa4, caplog):
    run_warmup(enumerate_variants(qwen3_vl(), 90), "cpu")
    assert jit_monitor.arm_jit_monitor() and jit_monitor.arm_jit_monitor()  # idempotent
    q = torch.randn(8, 16, 72, dtype=torch.bfloat16)
    cu = torch.tensor([0, 8], dtype=torch.int32)
    with caplog.at_level(logging.WARNING, logger="sglang_fa4"):
        varlen.fa4_varlen_attention(q, q, q, cu, 8)  # a warmed variant: nothing
        assert jit_monitor.compiles_after_warmup() == 0
        q2 = torch.randn(8, 16, 128, dtype=torch.bfloat16)  # not warmed
        varlen.fa4_varlen_attention(q2, q2, q2, cu, 8)
    assert jit_monitor.compiles_after_warmup() == 1
    warned = [r.getMessage() for r in caplog.records if "after the startup warmup" in r.getMessage()]
    assert len(warned) == 1 and "head_dim=128" in warned[0]
    # a later warmup's own compiles are expected, not flagged
    run_warmup(enumerate_variants(internvl(), 90), "cpu")
    assert jit_monitor.compiles_after_warmup() == 1


def test_after_warmup_the_monitor_raises(fake_fa4, monkeypatch):
    monkeypatch.setenv("SGLANG_FA4_JIT_MONITOR", "raise")
    run_warmup([], "cpu")
    jit_monitor.arm_jit_monitor()
    q = torch.randn(8, 16, 64, dtype=torch.bfloat16)
    with pytest.raises(jit_monitor.FA4CompileAfterWarmup, match="head_dim=64"):
        varlen.fa4_varlen_attention(q, q, q, torch.tensor([0, 8], dtype=torch.int32), 8)


def test_monitor_off(fake_fa4, monkeypatch):
    monkeypatch.setenv("SGLANG_FA4_JIT_MONITOR", "off")
    run_warmup([], "cpu")
    assert jit_monitor.arm_jit_monitor() is False
    q = torch.randn(8, 16, 64, dtype=torch.bfloat16)
    varlen.fa4_varlen_attention(q, q, q, torch.tensor([0, 8], dtype=torch.int32), 8)
    assert jit_monitor.compiles_after_warmup() == 0


def test_load_model_hook_warms_and_arms(fake_fa4, monkeypatch):
    monkeypatch.setattr(fa4_b36, "fa4_available", lambda: True)

    class Runner:
        model = qwen25_vl()

    sentinel = object()
    assert hooks.warm_fa4_after_load_model(sentinel, Runner()) is None  # AFTER hook: keep load_model's result
    assert len(fake_fa4.compiles) == 2  # arch from the kernel cache (the fake says sm_90)
    assert jit_monitor.warmup_finished() and jit_monitor.armed()


def test_env_opt_out(fake_fa4, monkeypatch):
    monkeypatch.setattr(fa4_b36, "fa4_available", lambda: True)
    monkeypatch.setenv("SGLANG_FA4_WARMUP", "0")
    assert warmup.warm_model(qwen25_vl()) is None
    assert fake_fa4.compiles == [] and not jit_monitor.warmup_finished()


def test_no_fa4_installed_skips_with_a_warning(fake_fa4, monkeypatch, caplog):
    monkeypatch.setattr(fa4_b36, "fa4_available", lambda: False)
    with caplog.at_level(logging.WARNING, logger="sglang_fa4"):
        assert warmup.warm_model(qwen25_vl()) is None
    assert fake_fa4.compiles == [] and "not installed" in caplog.text


# ---- FA4's persistent cache variables -------------------------------------------------------

FA4_VARS = ("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR")


@pytest.fixture
def clean_cache_env(monkeypatch, tmp_path):
    for name in FA4_VARS:
        monkeypatch.setenv(name, "placeholder")  # recorded, so monkeypatch restores the original
        monkeypatch.delenv(name)
    monkeypatch.delenv("SGLANG_FA4_KERNEL_CACHE", raising=False)
    monkeypatch.delenv("SGLANG_FA4_KERNEL_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delitem(sys.modules, "flash_attn.cute.cache_utils", raising=False)
    return tmp_path


def test_disk_cache_on_by_default(clean_cache_env):
    assert fa4_env.configure_fa4_disk_cache() == str(clean_cache_env / ".cache/sglang-fa4/kernels")
    assert os.environ["FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"] == "1"  # FA4 compares with "1"
    assert os.environ["FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"] == str(clean_cache_env / ".cache/sglang-fa4/kernels")


def test_disk_cache_dir_and_user_choices(clean_cache_env, monkeypatch):
    monkeypatch.setenv("SGLANG_FA4_KERNEL_CACHE_DIR", str(clean_cache_env / "k"))
    monkeypatch.setenv("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "true")  # FA4 reads it as off: so do we
    assert fa4_env.configure_fa4_disk_cache() is None
    assert os.environ["FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"] == "true"
    monkeypatch.delenv("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED")
    assert fa4_env.configure_fa4_disk_cache() == str(clean_cache_env / "k")
    assert os.environ["FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"] == "1"
    monkeypatch.setenv("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", "/elsewhere")  # the user's dir wins
    assert fa4_env.configure_fa4_disk_cache() == "/elsewhere"
    monkeypatch.setenv("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "0")  # the user's "off" wins
    assert fa4_env.configure_fa4_disk_cache() is None
    assert os.environ["FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"] == "0"


def test_disk_cache_empty_dir_is_unset(clean_cache_env, monkeypatch, tmp_path):
    """An empty SGLANG_FA4_KERNEL_CACHE_DIR (or FA4's own dir variable) is the default, never the
    working directory (Path("") is ".")."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SGLANG_FA4_KERNEL_CACHE_DIR", "")
    monkeypatch.setenv("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", "")
    assert fa4_env.configure_fa4_disk_cache() == str(clean_cache_env / ".cache/sglang-fa4/kernels")
    assert os.environ["FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"] == str(clean_cache_env / ".cache/sglang-fa4/kernels")


def test_disk_cache_opt_out(clean_cache_env, monkeypatch):
    monkeypatch.setenv("SGLANG_FA4_KERNEL_CACHE", "0")
    assert fa4_env.configure_fa4_disk_cache() is None
    assert not any(name in os.environ for name in FA4_VARS)


def test_disk_cache_too_late_warns(clean_cache_env, monkeypatch, caplog):
    import types

    monkeypatch.setitem(sys.modules, "flash_attn.cute.cache_utils", types.SimpleNamespace(CUTE_DSL_CACHE_ENABLED=False))
    with caplog.at_level(logging.WARNING, logger="sglang_fa4"):
        assert fa4_env.configure_fa4_disk_cache() is None
    assert "imported before" in caplog.text
    assert "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED" not in os.environ


# ---- lazy imports and a flash-attn-4-only install -------------------------------------------


def run_py(code: str, extra_path=None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join([*([str(extra_path)] if extra_path else []), str(ROOT), str(ROOT / "tests")])
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=env, cwd=str(ROOT), timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


HEAVY = "[m for m in sys.modules if m.split('.')[0] in ('cutlass', 'flash_attn', 'sglang', 'tvm_ffi', 'quack')]"


def test_importing_the_package_imports_no_fa4_or_cutlass():
    out = run_py(f"""
        import sys, json
        import sglang_fa4, sglang_fa4.plugin, sglang_fa4.integration.hooks, sglang_fa4.kernels.varlen, sglang_fa4.startup.warmup
        import sglang_fa4.startup.variants
        import sglang_fa4.kernels.fa4.cache, sglang_fa4.integration.vision_fa4, sglang_fa4.integration.vit_graph_runners
        from test_warmup import qwen25_vl
        variants = sglang_fa4.startup.variants.enumerate_variants(qwen25_vl(), 100)
        print(json.dumps({{"heavy": {HEAVY}, "n": len(variants)}}))
    """)
    assert out == {"heavy": [], "n": 6}


def _fake_fa4_only(root: Path) -> Path:
    """flash-attn-4 alone: flash_attn is a namespace package holding only cute (no __init__.py,
    no flash_attn_interface / FA2). Importing cute here would fail loudly."""
    cute = root / "flash_attn" / "cute"
    cute.mkdir(parents=True)
    (cute / "__init__.py").write_text("raise ImportError('fake flash_attn.cute must not be imported')\n")
    (cute / "interface.py").write_text("")
    return root


def test_fa4_only_install_is_detected_without_importing_it(tmp_path):
    site = _fake_fa4_only(tmp_path)
    out = run_py(f"""
        import importlib.util, json, sys, logging
        from sglang_fa4.startup import warmup
        from sglang_fa4.kernels import fa4, varlen
        from sglang_fa4.kernels.fa4 import b36 as fa4_b36
        from sglang_fa4.kernels.fa4.cache import KernelCache
        from test_fa4_kernel_cache import FakeBackend
        from test_warmup import qwen25_vl
        try:
            import flash_attn.flash_attn_interface
            fa2 = True
        except ImportError:
            fa2 = False
        spec = importlib.util.find_spec("flash_attn") is not None
        available = fa4_b36.fa4_available()
        # the plugin's startup path with this install: warms through the kernel cache (fake
        # backend), never imports flash_attn.cute itself
        fa4.install_kernel_cache(KernelCache(FakeBackend(90)))
        report = warmup.warm_model(qwen25_vl())
        print(json.dumps({{"spec": spec, "fa2": fa2, "available": available, "resolved": report.resolved,
                          "heavy": [m for m in {HEAVY} if m != "flash_attn"]}}))
    """, extra_path=site)
    assert out == {"spec": True, "fa2": False, "available": True, "resolved": 2, "heavy": []}


def test_fa2_only_install_is_not_fa4(tmp_path):
    pkg = tmp_path / "flash_attn"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise ImportError('FA2 CUDA extension must not be loaded')\n")
    (pkg / "flash_attn_interface.py").write_text("")
    out = run_py(f"""
        import json, sys
        from sglang_fa4.kernels.fa4 import b36 as fa4_b36
        print(json.dumps({{"available": fa4_b36.fa4_available(), "heavy": {HEAVY}}}))
    """, extra_path=tmp_path)
    assert out == {"available": False, "heavy": []}
