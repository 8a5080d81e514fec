"""Our CuTe kernels cross-compile on the CPU under every CUTLASS DSL a supported SGLang pins (4.6.2:
0.5.20 / 0.5.21; 4.8.0: 0.5.22 / 0.5.23); the newest (4.8.1) is covered in depth by
tests/test_fp8_xcompile.py and tests/test_fa4_shared_libs_xcompile.py. Through
tests/xcompile_dsl_smoke.py: every SM90 FP8 kernel the product compiles (the 15 defaults), and
FA4 b36's ViT forward in every form the warmup compiles (d80, d72, a sliding window with sinks, > 256
segments) for sm_90a and sm_103a (SM100's kernel with the tcgen05.ld.red row max of sm_103 on top). One process per target and version.
Each version's answers must match the version gate (sglang_fa4/kernels/dsl_versions.py): a kernel
that fails to build under a version the gate lets through fails here. Under 4.8.0 every FP8 kernel's
PTX must be the one recorded under 4.8.1 (tests/fp8_default_ptx.json), as measured there.

Needs the layers .cache/cutlass-dsl-{4.6.2,4.8.0} and .cache/fa4-b36 (tests/setup_env.sh).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_fa4.kernels import dsl_versions
from sglang_fa4.kernels.fp8_sm90.kernel_config import DEFAULT_CONFIGS

ROOT = Path(__file__).resolve().parents[1]
FA4 = ROOT / ".cache" / "fa4-b36"
# the DSL each supported SGLang pins (tests/test_install_pins.py reads the pins from the wheels)
PINNED = {"4.6.2": ("0.5.20", "0.5.21"), "4.8.0": ("0.5.22", "0.5.23")}
#: every SM90 FP8 kernel the product compiles (the 15 of DEFAULT_CONFIGS: d 64/96/128/192/256 x full /
#: causal / windowed), as xcompile_dsl_smoke.fp8's head_dim,causal,local
FP8 = tuple(f"{v.head_dim},{int(v.causal)},{int(v.local)}" for v in DEFAULT_CONFIGS)
#: FA4 b36's ViT forward in every form the startup warmup compiles (xcompile_dsl_smoke.fa4's spec):
#: d80 (Qwen2.5-VL), d72 (Qwen3-VL, padded to 80 inside), MiMo-VL's 64-token sliding window with
#: attention sinks at d64, and > 256 segments (FA4's scheduler kernels) at d128 (InternViT-6B)
FA4_FORMS = ("80", "72", "64,64,1", "128,0,0,300")


def smoke(layer: Path, dump: Path, arch: int, args: list[str]) -> dict:
    dump.mkdir(parents=True)  # the DSL silently writes nothing into a missing directory
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUTE_DSL_", "FLASH_ATTENTION_"))}
    env.update(
        # the version's DSL (and the quack its SGLang pins) before flash-attn-4 b36 and this repo
        PYTHONPATH=os.pathsep.join(map(str, (layer / "nvidia_cutlass_dsl" / "dsl_packages", layer, FA4, ROOT))),
        CUTE_DSL_ARCH=f"sm_{arch}a", CUTE_DSL_KEEP="ptx", CUTE_DSL_DUMP_DIR=str(dump),
        FLASH_ATTENTION_ARCH=f"sm_{arch}", FLASH_ATTENTION_NUM_SMS="132" if arch == 90 else "148",
    )
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "xcompile_dsl_smoke.py"), "--dump-dir", str(dump),
                           *args], env=env, capture_output=True, text=True, timeout=600, cwd=dump)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(params=sorted(PINNED))
def layer(request) -> Path:
    path = ROOT / ".cache" / f"cutlass-dsl-{request.param}"
    for need in (path, FA4):
        if not (need / ".requirements.sha256").is_file():
            pytest.skip(f"no {need.relative_to(ROOT)} (tests/setup_env.sh builds it)")
    return path


def test_kernels_cross_compile_under_each_pinned_dsl(layer, tmp_path):
    version = layer.name.removeprefix("cutlass-dsl-")
    fa4_args = [a for f in FA4_FORMS for a in ("--fa4", f)]
    hopper = smoke(layer, tmp_path / "sm90", 90, [a for v in FP8 for a in ("--fp8", v)] + fa4_args)
    # Blackwell: sm_103a compiles FA4's SM100 kernel class with its sm_103 branch on top (the one
    # part that needs a newer DSL op, LdRed32x32bOp); sm_100a only leaves that branch out
    ultra = smoke(layer, tmp_path / "sm103", 103, fa4_args)
    for out in (hopper, ultra):
        assert out["nvidia-cutlass-dsl"] == version  # the layer, not the venv's DSL
        assert set(out["builds"]) == set(dsl_versions.KERNELS)  # the gate lets every family through
        errors = {name: k["error"] for name, k in out["kernels"].items() if "error" in k}
        assert errors == {}, f"cutlass-dsl {version} (SGLang {', '.join(PINNED[version])}): {errors}"
    recorded = json.loads((ROOT / "tests" / "fp8_default_ptx.json").read_text())
    for spec in FP8:
        k = hopper["kernels"][f"fp8 {spec}"]
        # both GEMMs FP8 (E4M3 WGMMA only), P converted to E4M3 in registers
        assert k["target"] == "sm_90a" and k["wgmma_e4m3"] > 0 and k["wgmma_other"] == 0 and k["cvt_e4m3x2"] > 0
        if version == "4.8.0":
            # SGLang 0.5.22-0.5.23's pin builds the very PTX measured under 4.8.1 (docs/fp8-kernel.md,
            # benchmark/results/cpu/fp8_dsl_diff.md): the speed bars carry over to it
            assert k["sha256"] == recorded["sha256"][spec], spec
    for form in FA4_FORMS:
        fa4_90, fa4_103 = (o["kernels"][f"fa4 {form}"] for o in (hopper, ultra))
        assert fa4_90["target"] == "sm_90a" and fa4_90["wgmma_bf16"] > 0 and fa4_90["tcgen05_mma"] == 0, form
        # B300: the S tile's row max comes out of the TMEM load itself
        assert fa4_103["target"] == "sm_103a" and fa4_103["tcgen05_mma"] > 0 and fa4_103["ld_red_max"] > 0, form


@pytest.mark.parametrize("version, ok", [
    ("4.6.2", True), ("4.8.0", True), ("4.8.1", True),  # what SGLang pins, and the newest
    ("4.6.1", False), ("4.6.2rc1", False),  # just below the oldest built with
    ("5.0.0", True), ("not-a-version", False),
])
def test_the_gate(version, ok):
    assert (dsl_versions.builds(version) == set(dsl_versions.KERNELS)) is ok
    for family in dsl_versions.KERNELS:
        if ok:
            dsl_versions.require(family, version)
            assert dsl_versions.report(version)[family] == "builds (needs nvidia-cutlass-dsl>=4.6.2)"
        else:
            with pytest.raises(dsl_versions.DslVersionError, match=rf"needs nvidia-cutlass-dsl>=4\.6\.2 .*installed {version} "):
                dsl_versions.require(family, version)
            assert dsl_versions.report(version)[family] == f"cannot build: needs nvidia-cutlass-dsl>=4.6.2, not {version}"


def test_the_gate_stops_a_compile_before_the_dsl(monkeypatch):
    """Both compile entry points ask the gate first: an old DSL gets our message, not the DSL's."""
    from sglang_fa4.kernels.fa4 import b36 as fa4_b36
    from sglang_fa4.kernels.fp8_sm90 import launch
    from sglang_fa4.kernels.fp8_sm90.layout import Fp8Variant

    monkeypatch.setattr(dsl_versions, "installed_version", lambda: "4.5.0")
    with pytest.raises(dsl_versions.DslVersionError, match="SM90 FP8 .* installed 4.5.0"):
        launch.compile_variant(Fp8Variant(128, False, False))
    backend = object.__new__(fa4_b36.FA4Backend)  # (its constructor wants flash-attn-4 installed)
    with pytest.raises(dsl_versions.DslVersionError, match="FlashAttention-4.* installed 4.5.0"):
        backend.compile_and_run(None)
    # without a distribution to read (the DSL on PYTHONPATH only) nothing is refused
    monkeypatch.setattr(dsl_versions, "installed_version", lambda: None)
    assert dsl_versions.require("fp8_sm90") is None
    assert dsl_versions.report()["fa4"] == "nvidia-cutlass-dsl not installed"


def test_doctor_says_what_the_installed_dsl_builds(monkeypatch):
    from sglang_fa4 import doctor

    real = doctor._dist_version
    for version, state in (("4.5.0", "cannot build: needs nvidia-cutlass-dsl>=4.6.2, not 4.5.0"),
                           ("4.6.2", "builds (needs nvidia-cutlass-dsl>=4.6.2)"),
                           (None, "nvidia-cutlass-dsl not installed")):
        monkeypatch.setattr(doctor, "_dist_version", lambda name, v=version: v if name == "nvidia-cutlass-dsl" else real(name))
        report = doctor.collect("9.0")
        assert report["fa4"]["cutlass_dsl_builds"] == {"fp8_sm90": state, "fa4": state}
        text = doctor.format_text(report)
        assert f"  fp8_sm90     {state}\n" in text and f"  fa4          {state}\n" in text
