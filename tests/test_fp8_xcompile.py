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


def xcompile(pythonpath: str, dump: Path, variants: list[str], flags: str = "", ptxas: bool = False) -> dict:
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
    cmd = [sys.executable, str(ROOT / "tests" / "fp8_xcompile.py"), "--dump-dir", str(dump), "--flags", flags]
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


@pytest.fixture(scope="module")
def defaults(dsl_pythonpath, tmp_path_factory) -> dict:
    """Every default kernel (layout.all_variants: d 64/96/128/192/256, full / causal / windowed;
    the paged-KV route launches the same ones), cross-compiled once in one subprocess."""
    return xcompile(dsl_pythonpath, tmp_path_factory.mktemp("fp8_defaults") / "ptx", ["defaults"], ptxas=True)


def test_default_kernels_ptx_is_the_recorded_ptx(defaults):
    """The sm_90a PTX of every default kernel is byte for byte what tests/fp8_default_ptx.json
    records (kernel entry symbols renamed: fp8_xcompile.ptx_sha256) -- the kernels measured on the
    H200.  A deliberate kernel change re-records it (fp8_xcompile.py --variant defaults --record)."""
    recorded = json.loads((ROOT / "tests" / "fp8_default_ptx.json").read_text())
    assert defaults["cutlass_dsl"] == recorded["cutlass_dsl"]
    got = {spec: defaults[spec]["sha256"] for spec in recorded["sha256"]}
    changed = sorted(spec for spec in got if got[spec] != recorded["sha256"][spec])
    assert not changed, f"PTX changed for (head_dim,causal,local) {changed}"
    assert sorted(k for k in defaults if "," in k) == sorted(recorded["sha256"])  # no default unrecorded


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
    # persistent kernel (layout.WIDE_DEFAULT_SWITCHES), a 1-D grid walked by a grid-stride loop
    assert d128["ctaid"] == d64["ctaid"] == ["x", "y"]
    assert wide["ctaid"] == wide["nctaid"] == ["x"] and wide["stmatrix"] == 8 and wide["tma_stores"] >= 1
    assert wide["votes"] == []  # no warp vote (lazy_max / stale_exp are switches)
    # S = Q K^T: m64n128k32 over d/32 steps; O = P V: m64n<d>k32 over 128/32 key steps, and with
    # it the row sums as P x ones, m64n8k32 over the same steps (forward.rowsum_mma); the
    # overlapped main loop holds each GEMM twice (QK: first tile + loop; PV: loop + last tile)
    assert d128["wgmma_e4m3"] == ["m64n128k32.e4m3.e4m3", "m64n8k32.e4m3.e4m3"]
    assert d128["wgmma_count"] == 2 * (128 // 32 + 128 // 32 + 128 // 32)
    assert d64["wgmma_e4m3"] == ["m64n128k32.e4m3.e4m3", "m64n64k32.e4m3.e4m3", "m64n8k32.e4m3.e4m3"]
    assert d64["wgmma_count"] == 2 * (64 // 32 + 128 // 32 + 128 // 32)
    # d=128 non-causal (the wide tile, results/h200/fp8_attention_speed4.md): S over 192 keys
    # (m64n192k32), O += P V over 192/32 key steps into O itself (one level: no m64n8 row sums);
    # the first key tile's QK^T also at 64 and 96 keys (narrow, layout.WIDE_DEFAULT_SWITCHES)
    assert wide["wgmma_e4m3"] == ["m64n128k32.e4m3.e4m3", "m64n192k32.e4m3.e4m3", "m64n64k32.e4m3.e4m3",
                                  "m64n96k32.e4m3.e4m3"]
    assert wide["wgmma_count"] == 2 * (128 // 32 + 192 // 32) + 2 * 128 // 32
    # ping-pong of the consumer warpgroups (named barriers 1/2): on at d=128 (the turn passed once
    # S is complete with the 128-key tile, results/h200/fp8_attention_speed3.md; right after the
    # GEMM issue with the wide tile), off at other head dims
    assert d128["named_bar_arrive"] >= 3 and wide["named_bar_arrive"] >= 3
    assert d64["named_bar_arrive"] == 0
    # P (64 values of a 64x128 tile per thread, 96 of a 64x192 one) becomes E4M3 two at a time, in
    # registers
    assert d128["cvt_e4m3x2"] == d64["cvt_e4m3x2"] == 2 * 32  # first tile + loop
    # (+ the narrow first tiles' 64 and 96 keys: 16 + 24, their zero k steps one constant)
    assert 2 * 48 + (64 + 96) // 4 <= wide["cvt_e4m3x2"] <= 2 * 48 + (64 + 96) // 4 + 1


def test_fp8_forward_mufu_gate_variant_cross_compiles(dsl_pythonpath, tmp_path):
    """The not-yet-measured 'mufu_gate' variant (a warpgroup's exp2s wait until the other one has
    issued its GEMMs) builds: same GEMMs, the extra arrives and waits on the ISSUED barriers."""
    r = xcompile(dsl_pythonpath, tmp_path / "ptx", ["128,0,0"],
                 flags="w:two_level,w:n128,pp_late,no_fold_early,mufu_gate")  # the 128-key two-level loop
    v = r["128,0,0"]
    assert v["wgmma_e4m3"] == ["m64n128k32.e4m3.e4m3", "m64n8k32.e4m3.e4m3"] and v["wgmma_other"] == []
    assert v["reg_bar_arrive"] >= 3  # issue #0 (warpgroup 1), each loop issue, the last PV (warpgroup 0)
    assert v["reg_bar_sync_256"] >= 3  # the ping-pong turn waits and the gate before the exp2s


def test_fp8_forward_wide_head_dims_cross_compile_one_level(defaults):
    """d=192 and d=256 (forward.two_level off): the PV GEMM accumulates into O itself, so the
    PTX has no m64n8 row-sum GEMM; both GEMMs FP8; the overlapped schedule (wait for 1 group).
    d=256 causal runs 96-key tiles by default (layout.D256_CAUSAL_DEFAULT_SWITCHES), spill-free."""
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



def test_fp8_forward_persistent_variant_cross_compiles(dsl_pythonpath, tmp_path):
    """'w:persist' (the d=128 non-causal kernel with persistent CTAs, persistent_entry.py; here
    without the narrow / kv_split defaults, tested on their own) and its 'o_direct' sub-variant build for sm_90a without register spills: the same FP8 GEMMs as the
    wide-tile default, a 1-D grid walked by a grid-stride loop (%nctaid.x), O through stmatrix and a
    TMA store (waited for before the buffer is reused) -- or, with o_direct, stored from registers."""
    for flags, tma_o in (("w:persist,w:no_narrow,w:no_kv_split", True),
                         ("w:persist,w:o_direct,w:no_narrow,w:no_kv_split", False)):
        r = xcompile(dsl_pythonpath, tmp_path / flags.replace(":", "_").replace(",", "_"), ["128,0,0"], flags=flags,
                     ptxas=True)
        v = r["128,0,0"]
        assert len(v["ptx_files"]) == 1 and v["target"] == "sm_90a"
        assert r["ptxas"] and all(stores == loads == 0 for _, stores, loads in r["ptxas"]), r["ptxas"]
        assert v["wgmma_e4m3"] == ["m64n128k32.e4m3.e4m3", "m64n192k32.e4m3.e4m3"] and v["wgmma_other"] == []
        assert v["wgmma_count"] == 2 * (128 // 32 + 192 // 32)
        assert sorted(tuple(x) for x in v["setmaxnreg"]) == [("dec", "24"), ("inc", "240")]
        assert v["ctaid"] == ["x"] and v["nctaid"] == ["x"]
        assert v["tma_loads"] >= 3 and v["cvt_e4m3x2"] == 2 * 48
        assert v["named_bar_arrive"] >= 3  # the ping-pong turns, running on across tiles
        if tma_o:
            assert v["stmatrix"] == 8 and v["tma_stores"] >= 1 and v["bulk_wait_read"] == 1
        else:
            assert v["stmatrix"] == 0 and v["tma_stores"] == 0


def test_fp8_forward_mufu_token_variant_cross_compiles(dsl_pythonpath, tmp_path):
    """'mufu_token' (the consumer warpgroups take turns at their exp2 streams, forward.mufu_token)
    builds without spills for the d=128 non-causal default (persistent) and the d=256 causal
    kernel: the same FP8 GEMMs, and every P exp2 of a tile between the turn's wait -- behind a
    shared-memory store of the row maxima and followed by the load of the word of 0.0 the exp2s'
    bias depends on -- and its hand-over; only the two rescale-factor exp2s of a tile may lie
    outside (the first key tile and the loop: two softmaxes in the code; d=128 without the narrow
    first tiles, which would add two)."""
    for flags, spec, keys in (("w:mufu_token,w:no_narrow", "128,0,0", 192), ("d256:mufu_token", "256,1,0", 96)):
        r = xcompile(dsl_pythonpath, tmp_path / spec.replace(",", "_"), [spec], flags=flags, ptxas=True)
        v = r[spec]
        assert r["ptxas"] and all(stores == loads == 0 for _, stores, loads in r["ptxas"]), r["ptxas"]
        d = int(spec.split(",")[0])
        assert v["wgmma_e4m3"] == sorted([f"m64n{d}k32.e4m3.e4m3" if d != 128 else "m64n128k32.e4m3.e4m3",
                                          f"m64n{keys}k32.e4m3.e4m3"]) and v["wgmma_other"] == []
        spans = v["mufu_spans"]
        per_tile = 64 * keys // 128  # a thread's P values of one key tile
        assert spans["inside"] == [per_tile, per_tile], spans
        assert spans["total"] - sum(spans["inside"]) == 2 * 2, spans


def test_fp8_forward_pp_max_and_sum_mma_cross_compile(dsl_pythonpath, tmp_path):
    """'w:pp_max,w:sum_mma' (measured slower, kept to reproduce fp8_attention_ppmax.md /
    _summma.md) builds without spills: each softmax hands the ping-pong turn on after its row
    maxima (96 + 4 max.f32 and only the two rescale-factor exp2s before the arrive, the tile's 96
    P exp2s after it; warpgroup 0's and 1's arrives sit in two branches), and the row sums come
    from m64n8 WGMMAs beside each PV GEMM (6 k steps, in the loop and for the last tile)."""
    r = xcompile(dsl_pythonpath, tmp_path / "ppmax_summma", ["128,0,0"], flags="w:pp_max,w:sum_mma,w:no_narrow",
                 ptxas=True)
    v = r["128,0,0"]
    assert r["ptxas"] and all(stores == loads == 0 for _, stores, loads in r["ptxas"]), r["ptxas"]
    assert v["wgmma_e4m3"] == ["m64n128k32.e4m3.e4m3", "m64n192k32.e4m3.e4m3", "m64n8k32.e4m3.e4m3"]
    assert v["wgmma_count"] == 2 * (128 // 32) + 2 * 2 * (192 // 32)
    spans = v["turn_spans"]
    assert len(spans) == 4, spans  # first key tile and the loop, a branch per warpgroup
    for n_max, ex2_before, ex2_after in spans:
        assert n_max >= 96 and ex2_before == 2 and ex2_after >= 96, spans


def test_fp8_forward_three_consumer_warpgroups_cross_compile(dsl_pythonpath, tmp_path):
    """'w:wg3,w:o_direct' (measured slower, kept to reproduce fp8_attention_wg3.md / _wg3b.md):
    512 threads, the consumers raised to 160 registers without spills, 192 x 96 tiles (QK^T
    m64n96, PV m64n128 over 3 k steps), Q in three 64-row pieces, the ping-pong a ring over named
    barriers 1, 2, 3; asked for outside the persistent kernel it is an error naming what."""
    r = xcompile(dsl_pythonpath, tmp_path / "wg3", ["128,0,0"], flags="w:wg3,w:o_direct", ptxas=True)
    v = r["128,0,0"]
    assert r["ptxas"] and all(stores == loads == 0 for _, stores, loads in r["ptxas"]), r["ptxas"]
    assert v["reqntid"] == ["512"]
    assert sorted(tuple(x) for x in v["setmaxnreg"]) == [("dec", "24"), ("inc", "160")]
    assert v["wgmma_e4m3"] == ["m64n128k32.e4m3.e4m3", "m64n96k32.e4m3.e4m3"]
    assert v["wgmma_count"] == 2 * (128 // 32 + 96 // 32)
    assert v["bar_arrive_ids"] == ["1", "2", "3"]
    assert v["tma_loads"] >= 5 and v["tma_stores"] == 0  # o_direct: O from the registers
    with pytest.raises(AssertionError, match="three consumer warpgroups"):
        xcompile(dsl_pythonpath, tmp_path / "wg3_d64", ["64,0,0"], flags="wg3")


def test_fp8_forward_lazy_max_and_stale_exp_cross_compile(dsl_pythonpath, tmp_path):
    """'w:lazy_max' and 'w:stale_exp' (measured no faster / 17% slower, kept to reproduce
    fp8_attention_stale.md): without spills; lazy_max puts O's two rescales (the loop's and the
    tile's last) behind a warp vote, stale_exp adds the vote.all choosing the stale path and the
    vote.any of P's rescale (the default has none: test_fp8_forward_cross_compiles_to_e4m3_wgmma).
    Outside the persistent kernel: an error."""
    r = xcompile(dsl_pythonpath, tmp_path / "lazy", ["128,0,0"], flags="w:lazy_max", ptxas=True)
    assert r["ptxas"] and all(stores == loads == 0 for _, stores, loads in r["ptxas"]), r["ptxas"]
    assert r["128,0,0"]["votes"] == ["any", "any"]
    r = xcompile(dsl_pythonpath, tmp_path / "stale", ["128,0,0"], flags="w:stale_exp,w:no_narrow", ptxas=True)
    assert r["ptxas"] and all(stores == loads == 0 for _, stores, loads in r["ptxas"]), r["ptxas"]
    assert r["128,0,0"]["votes"] == ["all", "any", "any", "any"]
    assert r["128,0,0"]["wgmma_count"] == 2 * (128 // 32 + 192 // 32)
    with pytest.raises(AssertionError, match="persistent kernel"):
        xcompile(dsl_pythonpath, tmp_path / "lazy_d64", ["64,0,0"], flags="lazy_max")


def test_fp8_forward_narrow_first_tile_and_kv_split_cross_compile(dsl_pythonpath, tmp_path):
    """The d=128 non-causal defaults 'narrow' and 'kv_split'.  'narrow' (first_key_tile.py): the first key tile's QK^T written once per width -- m64n64 and
    m64n96 beside the 192-key tile of the d=128 persistent kernel, m64n64 beside d=256's 128 keys --
    plus the full one, without spills.  'kv_split' (kv_pipes.py) on top: V^T behind its own
    barriers, waited for by the producer (its buffer free) and before each PV GEMM (the loop's and
    the last one), so three barrier waits more, the same GEMMs, no spills.  Either in the two-level
    loop (d=128 causal), or kv_split with xover: an error."""
    r = xcompile(dsl_pythonpath, tmp_path / "d128", ["128,0,0"], flags="w:no_kv_split", ptxas=True)
    v = r["128,0,0"]
    assert r["ptxas"] and all(stores == loads == 0 for _, stores, loads in r["ptxas"]), r["ptxas"]
    assert v["wgmma_e4m3"] == ["m64n128k32.e4m3.e4m3", "m64n192k32.e4m3.e4m3", "m64n64k32.e4m3.e4m3",
                               "m64n96k32.e4m3.e4m3"]
    assert v["wgmma_count"] == 2 * (128 // 32 + 192 // 32) + 2 * 128 // 32  # + the n64 and n96 first tiles
    r = xcompile(dsl_pythonpath, tmp_path / "d128_split", ["128,0,0"], ptxas=True)  # the default: both
    s = r["128,0,0"]
    assert r["ptxas"] and all(stores == loads == 0 for _, stores, loads in r["ptxas"]), r["ptxas"]
    assert (s["wgmma_e4m3"], s["wgmma_count"], s["tma_loads"]) == (v["wgmma_e4m3"], v["wgmma_count"], v["tma_loads"])
    assert s["mbar_waits"] == v["mbar_waits"] + 3
    r = xcompile(dsl_pythonpath, tmp_path / "d256", ["256,0,0"], flags="narrow", ptxas=True)
    assert r["ptxas"] and all(stores == loads == 0 for _, stores, loads in r["ptxas"]), r["ptxas"]
    assert "m64n64k32.e4m3.e4m3" in r["256,0,0"]["wgmma_e4m3"]
    with pytest.raises(AssertionError, match="narrow: a switch of the one-level loop"):
        xcompile(dsl_pythonpath, tmp_path / "causal", ["128,1,0"], flags="narrow")
    with pytest.raises(AssertionError, match="kv_split: a switch of the persistent kernel"):
        xcompile(dsl_pythonpath, tmp_path / "xover", ["128,0,0"], flags="w:kv_split,w:xover")


def test_fp8_forward_persistent_xover_cross_compiles(dsl_pythonpath, tmp_path):
    """'w:persist,w:xover' (the tile boundaries overlapped, persistent_xover.py) builds for sm_90a
    without register spills: the persistent kernel's GEMMs, each issue block written three times
    -- QK^T for a tile's lone first key tile, the loop and the cross step; PV for the loop, the cross
    step and a lone last one -- P converted after each QK^T, the PV wait pinned below the softmax in
    the loop and in the cross step; O still through stmatrix + TMA.  Also its 'xover_pvfirst' order."""
    for flags, pv_first in (("w:persist,w:xover", False), ("w:persist,w:xover,w:xover_pvfirst", True)):
        r = xcompile(dsl_pythonpath, tmp_path / str(pv_first), ["128,0,0"], flags=flags, ptxas=True)
        v = r["128,0,0"]
        assert len(v["ptx_files"]) == 1 and v["target"] == "sm_90a"
        assert r["ptxas"] and all(stores == loads == 0 for _, stores, loads in r["ptxas"]), r["ptxas"]
        assert v["wgmma_e4m3"] == ["m64n128k32.e4m3.e4m3", "m64n192k32.e4m3.e4m3"] and v["wgmma_other"] == []
        assert v["wgmma_count"] == 3 * (128 // 32 + 192 // 32)
        assert v["cvt_e4m3x2"] == 3 * 48
        # xover_pvfirst: the cross step waits for its PV GEMM (1 group) and needs no pin
        assert v["wgmma_wait_1"] == 2 and v["warp_sync"] == (1 if pv_first else 2)
        assert v["pin_skip"] == ["eq"] * v["warp_sync"]
        assert sorted(tuple(x) for x in v["setmaxnreg"]) == [("dec", "24"), ("inc", "240")]
        assert v["ctaid"] == ["x"] and v["nctaid"] == ["x"]
        # the epilogue: once (after the cross step or the lone last PV), or also in the cross step
        assert v["stmatrix"] == (16 if pv_first else 8) and v["tma_stores"] >= 1
        assert v["named_bar_arrive"] >= 4  # the turns: opened once, passed after each of three issue blocks


def test_fp8_forward_d256_tile_variants_cross_compile(dsl_pythonpath, tmp_path):
    """The d=256 tuning switches (check_fp8_attention --variants, scoped "d256:" / "d256c:") build
    for sm_90a without register spills: a 64-key tile with 5 K/V^T stages and ping-pong (FA3's
    scheduler barrier for FP8 at d >= 128) in the causal kernel -- QK^T m64n64, 8 + 2 k-steps,
    16 P conversions a tile -- while a "d256c:" switch leaves the unmasked kernel's 128-key tile."""
    r = xcompile(dsl_pythonpath, tmp_path / "causal", ["256,1,0"], flags="d256:n64,d256:s5,d256:pingpong", ptxas=True)
    v = r["256,1,0"]
    assert len(v["ptx_files"]) == 1 and v["target"] == "sm_90a"
    assert r["ptxas"] and all(stores == loads == 0 for _, stores, loads in r["ptxas"]), r["ptxas"]
    assert v["wgmma_e4m3"] == ["m64n256k32.e4m3.e4m3", "m64n64k32.e4m3.e4m3"] and v["wgmma_other"] == []
    assert v["wgmma_count"] == 2 * (256 // 32 + 64 // 32) and v["cvt_e4m3x2"] == 2 * 16
    assert v["named_bar_arrive"] >= 3  # the ping-pong turns
    assert sorted(tuple(x) for x in v["setmaxnreg"]) == [("dec", "24"), ("inc", "240")]
    full = xcompile(dsl_pythonpath, tmp_path / "full", ["256,0,0"], flags="d256c:n96,d256f:pingpong")["256,0,0"]
    assert full["wgmma_e4m3"] == ["m64n128k32.e4m3.e4m3", "m64n256k32.e4m3.e4m3"]  # d256c:n96 not applied
    assert full["named_bar_arrive"] >= 3
