"""The sm_103 tcgen05.ld.red patch, proven without a GPU: cross-compile the PATCHED SGLang 0.5.20
vendored FA4 SM100 forward (hd=128, non-causal, varlen, bf16) on the CPU for sm_103a and sm_100a and
read the PTX. Needs .cache/xc-venv (tests/setup_xcompile_env.sh builds it from pinned wheels)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from _sglang_wheel import ROOT, sglang_wheel, unpack
from sglang_fa4.patching import apply as ops

VERSION = "0.5.20"
VENV_PY = ROOT / ".cache" / "xc-venv" / "bin" / "python"


@pytest.fixture(scope="module")
def xc_python() -> Path:
    subprocess.run(["bash", str(ROOT / "tests" / "setup_xcompile_env.sh")], check=True)
    return VENV_PY


@pytest.fixture(scope="module")
def patched_root(tmp_path_factory) -> Path:
    root = unpack(sglang_wheel(VERSION), tmp_path_factory.mktemp("sglang20"), ("sglang/",))
    ops.apply(ops.resolve_target(root, VERSION))
    return root


def xcompile(python: Path, root: Path, dump: Path, arch: str, flags: list[str]) -> dict:
    dump.mkdir(parents=True)  # the DSL silently writes nothing into a missing directory
    env = {
        **os.environ,
        "CUTE_DSL_ARCH": f"{arch}a",  # compilation target, read when cutlass is imported
        "FLASH_ATTENTION_ARCH": arch,  # FA4 kernel class selection
        "CUTE_DSL_KEEP": "ptx",
        "CUTE_DSL_DUMP_DIR": str(dump),
        "SGLANG_CUTE_AOT_CACHE_DIR": "",  # in-memory cache only: every variant really compiles
    }
    env.pop("SGLANG_FA4_TMEM_LOAD_RED_MAX", None)
    cmd = [str(python), str(ROOT / "tests" / "fa4_xcompile.py"), "--sglang-root", str(root),
           "--dump-dir", str(dump)]
    for f in flags:
        cmd += ["--flag", f]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.sglang
def test_sm103_uses_tcgen05_ld_red_only_with_the_flag(xc_python, patched_root, tmp_path):
    r = xcompile(xc_python, patched_root, tmp_path / "ptx", "sm_103", ["on", "off"])
    on, off = r["on"], r["off"]
    # each variant compiled once, under its own key
    assert len(on["new_compile_keys"]) == 1 and len(off["new_compile_keys"]) == 1
    assert on["new_compile_keys"] != off["new_compile_keys"]
    assert on["ptx_files"] and off["ptx_files"]
    assert all(p.endswith(".sm_103a.ptx") for p in on["ptx_files"] + off["ptx_files"])
    # one reducing load per 32-column chunk of the 128-wide S tile, all of them max.f32
    assert on["ld_red"] == on["ld_red_max"] == 4
    assert off["ld_red"] == 0
    # the reducing loads replace plain ones for the unmasked tiles only; masked tiles keep them
    assert 0 < on["ld_plain"] == off["ld_plain"] - 4


@pytest.mark.sglang
def test_sm100_never_uses_tcgen05_ld_red(xc_python, patched_root, tmp_path):
    r = xcompile(xc_python, patched_root, tmp_path / "ptx", "sm_100", ["on", "off"])
    on, off = r["on"], r["off"]
    assert len(on["new_compile_keys"]) == 1 and on["ptx_files"]
    assert all(p.endswith(".sm_100a.ptx") for p in on["ptx_files"])
    assert on["ld_red"] == 0 and on["ld_plain"] > 0
    # the flag is ignored off sm_103: same key, so the second request reuses the first kernel
    assert off["new_compile_keys"] == [] and off["ptx_files"] == []
