"""The SM90 FP8 attention forward, proven to build without a GPU: cross-compile it for sm_90a with
the pinned CUTLASS DSL (tests/setup_pip_layer.sh) and read the PTX -- both GEMMs must be
FP8 WGMMA with E4M3 operands, P converted to E4M3 in registers, K/V^T/Q loaded by TMA."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYER = ROOT / ".cache" / "cutlass-dsl-4.8.1"


@pytest.fixture(scope="module")
def dsl_pythonpath() -> str:
    subprocess.run(["bash", str(ROOT / "tests" / "setup_pip_layer.sh"), "cutlass-dsl-4.8.1",
                    "tests/requirements-fp8-xcompile.txt", sys.executable], check=True)
    return os.pathsep.join([str(LAYER / "nvidia_cutlass_dsl" / "dsl_packages"), str(LAYER), str(ROOT)])


def xcompile(pythonpath: str, dump: Path, variants: list[str], ptxas: bool = False) -> dict:
    """Facts of each variant's PTX (tests/fp8_xcompile.py; "defaults": every default kernel);
    ``ptxas``: also ptxas's resource lines (CUTE_DSL_COMPILER_OPT=remarks{ptx}, on stderr) as
    "ptxas": [(stack, spill stores, spill loads) per compiled kernel], overall and per variant."""
    dump.mkdir(parents=True)  # the DSL silently writes nothing into a missing directory
    env = {
        **os.environ,
        "PYTHONPATH": pythonpath,
        "CUTE_DSL_ARCH": "sm_90a",
        "CUTE_DSL_KEEP": "ptx",
        "CUTE_DSL_DUMP_DIR": str(dump),
    }
    if ptxas:
        env["CUTE_DSL_COMPILER_OPT"] = "remarks{ptx}"
    cmd = [sys.executable, str(ROOT / "tests" / "fp8_xcompile.py"), "--dump-dir", str(dump)]
    for v in variants:
        cmd += ["--variant", v]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    out = {**result["variants"], "cutlass_dsl": result["cutlass_dsl"]}
    if ptxas:
        spills = lambda text: [tuple(int(x) for x in m) for m in re.findall(  # noqa: E731
            r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", text)]
        out["ptxas"] = spills(proc.stderr)
        for part in proc.stderr.split("== variant ")[1:]:
            spec, _, text = part.partition("\n")
            out[spec]["ptxas"] = spills(text)
    return out


#: Two configs other than the table's (kernel_config.Fp8KernelConfig.replace, what a benchmark
#: passes): the d=128 non-causal kernel without persistent CTAs, and in the two-level 128-key loop.
NOT_PERSISTENT = "128,0,0:persistent=0,pingpong=0,stages=4"
TWO_LEVEL_128 = "128,0,0:tile_n=128,two_level=1,persistent=0,pingpong=0,stages=4"


@pytest.fixture(scope="module")
def defaults(dsl_pythonpath, tmp_path_factory) -> dict:
    """Every default kernel (layout.all_variants: d 64/96/128/192/256, full / causal / windowed;
    the paged-KV route launches the same ones) and the two configs above, cross-compiled once in
    one subprocess."""
    return xcompile(dsl_pythonpath, tmp_path_factory.mktemp("fp8_defaults") / "ptx",
                    ["defaults", NOT_PERSISTENT, TWO_LEVEL_128], ptxas=True)


def test_default_kernels_ptx_is_the_recorded_ptx(defaults):
    """The sm_90a PTX of every default kernel is byte for byte what tests/fp8_default_ptx.json
    records (kernel entry symbols renamed: fp8_xcompile.ptx_sha256) -- the kernels measured on the
    H200.  A deliberate kernel change re-records it (fp8_xcompile.py --variant defaults --record)."""
    recorded = json.loads((ROOT / "tests" / "fp8_default_ptx.json").read_text())
    assert defaults["cutlass_dsl"] == recorded["cutlass_dsl"]
    got = {spec: defaults[spec]["sha256"] for spec in recorded["sha256"]}
    changed = sorted(spec for spec in got if got[spec] != recorded["sha256"][spec])
    assert not changed, f"PTX changed for (head_dim,causal,local) {changed}"
    assert sorted(k for k in defaults if "," in k and ":" not in k) == sorted(recorded["sha256"])


def test_default_kernels_build_without_spills(defaults):
    for spec in (k for k in defaults if "," in k):
        v = defaults[spec]
        assert len(v["ptx_files"]) == 1 and v["target"] == "sm_90a", spec
        assert v["ptxas"] and all(stores == loads == 0 for _, stores, loads in v["ptxas"]), (spec, v["ptxas"])
        assert v["wgmma_other"] == [], spec  # both GEMMs FP8 everywhere


def test_fp8_forward_cross_compiles_to_e4m3_wgmma(defaults):
    d128, d64, wide = defaults["128,1,0"], defaults["64,1,0"], defaults["128,0,0"]
    for v in (d128, d64, wide):
        assert len(v["ptx_files"]) == 1 and v["target"] == "sm_90a"
        assert v["wgmma_other"] == []  # no bf16/f16 GEMM anywhere: both GEMMs are FP8
        # two consumer warpgroups, producer with fewer registers
        assert sorted(tuple(x) for x in v["setmaxnreg"]) == [("dec", "24"), ("inc", "240")]
        assert v["tma_loads"] >= 3  # Q, K, V^T
        # the softmax of tile i runs while P_{i-1} V_{i-1} is in flight: wait for 1 group, not 0,
        # and the wait for 0 sits behind a branch (bar.warp.sync) so ptxas keeps it there
        assert v["wgmma_wait_1"] >= 1
        assert v["warp_sync"] == 1 and v["pin_skip"] == ["eq"]  # no lane skips it, NaN or not
    # one list of q tiles over all sequences x heads (no batch axis); d=128 non-causal: the
    # persistent kernel (kernel_config.DEFAULT_CONFIGS), a 1-D grid walked by a grid-stride loop
    assert d128["ctaid"] == d64["ctaid"] == ["x", "y"]
    assert wide["ctaid"] == wide["nctaid"] == ["x"] and wide["stmatrix"] == 8 and wide["tma_stores"] >= 1
    assert wide["bulk_wait_read"] == 1  # a staging buffer reused only once its TMA store has read it
    # S = Q K^T: m64n128k32 over d/32 steps; O = P V: m64n<d>k32 over 128/32 key steps, and with
    # it the row sums as P x ones, m64n8k32 over the same steps (forward.rowsum_mma); the
    # overlapped main loop holds each GEMM twice (QK: first tile + loop; PV: loop + last tile)
    assert d128["wgmma_e4m3"] == ["m64n128k32.e4m3.e4m3", "m64n8k32.e4m3.e4m3"]
    assert d128["wgmma_count"] == 2 * (128 // 32 + 128 // 32 + 128 // 32)
    assert d64["wgmma_e4m3"] == ["m64n128k32.e4m3.e4m3", "m64n64k32.e4m3.e4m3", "m64n8k32.e4m3.e4m3"]
    assert d64["wgmma_count"] == 2 * (64 // 32 + 128 // 32 + 128 // 32)
    # d=128 non-causal (the wide tile, git show 244b9bd:benchmark/results/h200/fp8_attention_speed4.md): S over 192 keys
    # (m64n192k32), O += P V over 192/32 key steps into O itself (one level: no m64n8 row sums);
    # the first key tile's QK^T also at 64 and 96 keys (narrow, kernel_config.Fp8KernelConfig)
    assert wide["wgmma_e4m3"] == ["m64n128k32.e4m3.e4m3", "m64n192k32.e4m3.e4m3", "m64n64k32.e4m3.e4m3",
                                  "m64n96k32.e4m3.e4m3"]
    assert wide["wgmma_count"] == 2 * (128 // 32 + 192 // 32) + 2 * 128 // 32
    # ping-pong of the consumer warpgroups (named barriers 1/2): on at d=128 (the turn passed once
    # S is complete with the 128-key tile, git show 244b9bd:benchmark/results/h200/fp8_attention_speed3.md; right after the
    # GEMM issue with the wide tile), off at other head dims
    assert d128["named_bar_arrive"] >= 3 and wide["named_bar_arrive"] >= 3
    assert d64["named_bar_arrive"] == 0
    # P (64 values of a 64x128 tile per thread, 96 of a 64x192 one) becomes E4M3 two at a time, in
    # registers
    assert d128["cvt_e4m3x2"] == d64["cvt_e4m3x2"] == 2 * 32  # first tile + loop
    # (+ the narrow first tiles' 64 and 96 keys: 16 + 24, their zero k steps one constant)
    assert 2 * 48 + (64 + 96) // 4 <= wide["cvt_e4m3x2"] <= 2 * 48 + (64 + 96) // 4 + 1


def test_fp8_forward_wide_head_dims_cross_compile_one_level(defaults):
    """d=192 and d=256 (forward.two_level off): the PV GEMM accumulates into O itself, so the
    PTX has no m64n8 row-sum GEMM; both GEMMs FP8; the overlapped schedule (wait for 1 group).
    d=256 causal runs 96-key tiles by default (kernel_config.DEFAULT_CONFIGS), spill-free."""
    r = defaults
    for d, spec, keys in ((192, "192,0,0", 128), (256, "256,1,0", 96)):
        v = r[spec]
        assert len(v["ptx_files"]) == 1 and v["target"] == "sm_90a"
        assert v["wgmma_other"] == []
        assert v["wgmma_e4m3"] == sorted([f"m64n{keys}k32.e4m3.e4m3", f"m64n{d}k32.e4m3.e4m3"])
        # QK^T: d/32 k-steps, PV: keys/32, each written twice (first tile + loop / loop + last)
        assert v["wgmma_count"] == 2 * (d // 32 + keys // 32)
        assert sorted(tuple(x) for x in v["setmaxnreg"]) == [("dec", "24"), ("inc", "240")]
        assert v["tma_loads"] >= 3
        assert v["wgmma_wait_1"] >= 1 and v["warp_sync"] == 1 and v["pin_skip"] == ["eq"]
        assert v["cvt_e4m3x2"] == 2 * (keys // 4)  # 64 x keys P values over 128 threads, two a cvt



def test_other_configs_build_what_they_say(defaults):
    """A config's fields reach the kernel: without ``persistent`` the d=128 non-causal kernel has a
    (q tiles, heads) grid, no grid-stride loop, no TMA store of O, no narrow first-tile GEMMs and no
    ping-pong; with ``two_level`` and 128-key tiles, the two-level loop's GEMMs (m64n8 row sums)."""
    for spec in (NOT_PERSISTENT, TWO_LEVEL_128):
        v = defaults[spec]
        assert v["ptxas"] and all(stores == loads == 0 for _, stores, loads in v["ptxas"]), (spec, v["ptxas"])
        assert v["ctaid"] == ["x", "y"] and v["nctaid"] == [] and v["tma_stores"] == 0 and v["stmatrix"] == 0
        assert v["named_bar_arrive"] == 0 and v["wgmma_other"] == []
    assert defaults[NOT_PERSISTENT]["wgmma_e4m3"] == ["m64n128k32.e4m3.e4m3", "m64n192k32.e4m3.e4m3"]
    assert defaults[NOT_PERSISTENT]["wgmma_count"] == 2 * (128 // 32 + 192 // 32)
    assert defaults[TWO_LEVEL_128]["wgmma_e4m3"] == defaults["128,1,0"]["wgmma_e4m3"]
    assert defaults[TWO_LEVEL_128]["wgmma_count"] == defaults["128,1,0"]["wgmma_count"]

