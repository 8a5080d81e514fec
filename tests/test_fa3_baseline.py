"""The FA3 baseline built from source (benchmark/fa3_build, sglang_fa4.bench.fa3): the ctypes mirror
matches the C struct, an absent library makes the `fa3` kernel backend skip cleanly, the kernels
report gets its `x fa3` column, and the FP8-KV route check's report carries FA3-FP8 beside fa4-fp8
with the upgrade bar's verdict. On an H200 with .fa3/libfa3fwd.so built, both FA3 calls are checked
against fp32 references."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from sglang_fa4.bench import fa3, report
from sglang_fa4.bench.backends import OPTIONAL_BACKENDS

ROOT = Path(__file__).resolve().parents[1]
CAPI = ROOT / "benchmark" / "fa3_build" / "fa3_capi.cu"


def test_ctypes_mirror_matches_the_c_struct():
    src = CAPI.read_text()
    body = re.search(r"struct fa3_args \{(.*?)\n\};", src, re.S).group(1)
    body = re.sub(r"//[^\n]*", "", body)
    fields = []
    for decl in body.split(";"):
        decl = decl.strip()
        if not decl:
            continue
        ctype, names = decl.split(None, 1)
        assert ctype in ("int64_t", "double"), decl  # all 64-bit: no padding rules to mirror
        for n in names.split(","):
            fields.append((n.strip(), ctype))
    assert [n for n, _ in fields] == fa3._FIELDS
    assert [t for _, t in fields if _ == "softmax_scale"] == ["double"]
    assert fa3._Args.softmax_scale.size == 8 and len(fields) * 8 == __import__("ctypes").sizeof(fa3._Args)


def test_build_script_pins_and_kernels():
    """The build pins its sources; every paged kernel comes as a pair, one split and split-KV, as
    sgl-kernel's FA3 has them (SGLang's num_splits=0 lets FA3 pick either), with the combine; the
    decode set covers what a decode step launches (d128 keeps causal, d256 drops it); the C side
    finds kernels through the generated table, so no kernel is named by hand."""
    sh = (ROOT / "benchmark" / "fa3_build" / "build.sh").read_text()
    assert re.search(r"^FA3_COMMIT=[0-9a-f]{40}\b", sh, re.M) and re.search(r"^CUTLASS_COMMIT=[0-9a-f]{40}\b", sh, re.M)
    rows = re.findall(r"^(fa3k_\w+) (\d+) (e4m3|bf16) ([01]) ([01]) ([01]) (decode|all)$", sh, re.M)
    assert len(rows) == len(re.findall(r"^fa3k_", sh, re.M)) == 15
    paged = {(dt, int(hd), c): set() for _, hd, dt, c, p, _, _ in rows if p == "1"}
    for name, hd, dt, c, p, split, _ in rows:
        assert name == f"fa3k_{dt}_d{hd}_{'paged' if p == '1' else 'varlen'}{'_causal' if c == '1' else ''}" + (
            "_split" if split == "1" else "")
        if p == "1":
            paged[(dt, int(hd), c)].add(split)
    assert all(splits == {"0", "1"} for splits in paged.values()), paged
    decode = {(dt, int(hd), c, split) for _, hd, dt, c, p, split, s in rows if s == "decode"}
    assert decode == {(dt, hd, c, sp) for dt in ("e4m3", "bf16") for hd, c in ((128, "1"), (256, "0")) for sp in "01"}
    assert "-DFLASHATTENTION_DISABLE_SPLIT" not in sh
    for flag in ("BACKWARD", "SOFTCAP", "LOCAL", "APPENDKV", "FP16", "CLUSTER", "SM8x"):
        assert f"-DFLASHATTENTION_DISABLE_{flag}" in sh
    assert "run_mha_fwd_combine_<cutlass::bfloat16_t, float, 128>" in sh
    capi = CAPI.read_text()
    assert not re.search(r"\bfa3k_\w+\(", capi), "kernels are found through fa3_kernels.inc's table"
    assert "FA3_KERNEL(name, dtype, hdim, causal, paged, split)" in capi and "num_splits_heuristic(" in capi
    assert "run_mha_fwd_combine_<cutlass::bfloat16_t, float, 128>(p, stream, true" in capi


def test_absent_library_is_unavailable(tmp_path):
    missing = tmp_path / "libfa3fwd.so"
    assert not fa3.available(missing)
    with pytest.raises(fa3.Fa3Unavailable, match="not built"):
        fa3.load(missing)
    assert fa3.build_source(missing) is None
    (tmp_path / "BUILD_INFO").write_text("flash-attention 0251105a2fb19d2957484b7f023cd8c115286ced (hopper/)\n"
                                         "cutlass 7127592069c2fe01b041e174ba4345ef9b279671 (include/)\nnvcc V13.0.88\n")
    assert fa3.build_source(missing) == "flash-attention 0251105a2fb1 (nvcc V13.0.88)"
    bogus = tmp_path / "bogus.so"
    bogus.write_text("not an ELF")
    with pytest.raises(fa3.Fa3Unavailable, match="does not load"):
        fa3.load(bogus)


def test_fa3_backend_is_opt_in_and_skips_cleanly(monkeypatch, tmp_path):
    torch = pytest.importorskip("torch")
    from sglang_fa4.bench import backends

    assert "fa3" in OPTIONAL_BACKENDS and "fa3" not in backends.BACKENDS
    p = backends.make_problem([64, 32], heads=2, head_dim=64, device="cpu")
    with pytest.raises(backends.BackendUnavailable):  # CPU tensors, or an absent library on a GPU
        backends.make_runner("fa3", p)
    if torch.cuda.is_available():
        monkeypatch.setattr(fa3, "DEFAULT_PATH", tmp_path / "none.so")
        g = backends.make_problem([64, 32], heads=2, head_dim=64)
        with pytest.raises(backends.BackendUnavailable):
            backends.make_runner("fa3", g)


def test_kernels_markdown_has_the_fa3_column(tmp_path):
    rows, pairs = [], []
    for b, us in (("fa4", 100.0), ("fa3", 130.0)):
        rows.append({"backend": b, "head_dim": 80, "layout": "8x4096", "mode": "graph", "median_us": us,
                     "rel_err": 2e-3, "tflops": 300.0, "frac_matmul_ceiling": 0.4, "hbm_floor_us": 10.0})
    pairs.append({"layout": "8x4096", "head_dim": 80, "mode": "graph", "a": "fa4", "b": "fa3", "rounds": 5,
                  "median_ratio": 1.3, "wins_a": 5, "wins_b": 0})
    meta = {"gpu": {"name": "Test GPU"}, "command": "sglang-fa4 bench kernels --backends fa4 fa3",
            "versions": {"torch": "x", "fa3": "flash-attention 0251105a2fb1 (nvcc V13.0.88)"},
            "ceilings": {"bf16_matmul_tflops": 700.0, "copy_gbps": 4000.0}}
    res = {"meta": meta, "rows": rows, "pairs": pairs}
    assert report.validate(res, "kernels") == []
    report.write_kernels_markdown(res, tmp_path / "k.md")
    md = (tmp_path / "k.md").read_text()
    assert "| d | layout | fa4 | fa3 | fa4 TFLOP/s | %mm | floor µs | x triton | x sdpa | x fa3 | max rel err |" in md
    assert "| 80 | 8x4096 | 100.0 | 130.0 |" in md and "1.30 (5/5)" in md
    assert "fa3 flash-attention 0251105a2fb1" in md


def _route_module():
    spec = importlib.util.spec_from_file_location("check_fp8_kv_route", ROOT / "benchmark" / "release" / "check_fp8_kv_route.py")
    mod = importlib.util.module_from_spec(spec)
    pytest.importorskip("torch")
    spec.loader.exec_module(mod)
    return mod


def test_route_report_sets_fa3_beside_fa4():
    mod = _route_module()
    r = {"command": "python3 benchmark/release/check_fp8_kv_route.py --out X", "notes": [],
         "env": {"gpu": "H200", "torch": "2.11", "fa4": "4.0.0b36", "fa3": "flash-attention 0251105a2fb1"},
         "correctness": [{"impl": "fa3-fp8", "d": 256, "page_size": 16, "case": "decode", "cached": [5], "new": [1],
                          "rel_err": 6e-3, "finite": True, "pass": True}],
         "speed": [{"shape": "prefill 8k", "page_size": 16, "fa4_fp8_routed_ms": 0.7, "fa3_fp8_ms": 0.8,
                    "fa4_fp8_routed_speedup_vs_fa3_fp8": 0.8 / 0.7},
                   {"shape": "decode b64 ctx4k", "page_size": 1, "fa4_fp8_routed_ms": 1.0, "fa3_fp8_ms": 0.1,
                    "fa4_fp8_routed_speedup_vs_fa3_fp8": 0.1}]}
    md = mod.markdown(r)
    assert "| fa3-fp8 | 256 | 16 | decode |" in md
    assert "## Against FA3-FP8" in md and "| prefill 8k | 16 | 0.800 | 0.700 |" in md
    assert "NOT MET (slower on: decode b64 ctx4k P=1)" in md
    r["speed"].pop()
    assert "(fa4-fp8 at least as fast as FA3-FP8 on every shape): MET" in mod.markdown(r)


def test_sgl_kernel_signature_maps_sglangs_fa3_call_onto_paged_fp8():
    """The positional order SGLang's flash_attention_v3 wrapper passes to sgl-kernel, mapped onto
    paged_fp8's arguments; what the build lacks is refused by name."""
    seen = []
    call = fa3.sgl_kernel_kvcache(lambda *a, **k: seen.append((a, k)) or "out")
    q, kc, vc, table, seqlens, cu, kd, vd = (object() for _ in range(8))
    # q k_cache v_cache k v qv rotary_cos rotary_sin cache_seqlens cache_batch_idx cache_leftpad page_table
    # cu_seqlens_q cu_seqlens_k_new max_seqlen_q rotary_seqlens q_descale k_descale v_descale softmax_scale
    # causal window_size attention_chunk softcap rotary_interleaved scheduler_metadata num_splits pack_gqa
    args = (q, kc, vc, None, None, None, None, None, seqlens, None, None, table, cu, "cu_k", 1, None, None, kd, vd,
            0.088, True, (-1, -1), None, 0.0, True, None, 0, None)
    assert call(*args, sm_margin=0, only_qv=False, return_softmax_lse=False, sinks=None, out="o") == "out"
    assert seen == [((q, kc, vc, table, seqlens, cu, 1), dict(k_descale=kd, v_descale=vd, q_descale=None,
                                                               softmax_scale=0.088, causal=True, out="o",
                                                               num_splits=0, pack_gqa=None))]
    # FA3's scheduling arguments reach it as given: a forced split count and GQA packing
    seen.clear()
    forced = list(args)
    forced[26], forced[27] = 5, True
    call(*forced)
    assert seen[0][1]["num_splits"] == 5 and seen[0][1]["pack_gqa"] is True
    for i, value, name in ((3, object(), "k"), (21, (127, 0), "window_size"), (23, 30.0, "softcap"),
                           (25, object(), "scheduler_metadata")):
        bad = list(args)
        bad[i] = value
        with pytest.raises(fa3.Fa3Unavailable, match=name):
            call(*bad)
    with pytest.raises(fa3.Fa3Unavailable, match="return_softmax_lse"):
        call(*args, return_softmax_lse=True)
    with pytest.raises(TypeError, match="unexpected argument"):
        call(*args, score_mod=None)
    with pytest.raises(fa3.Fa3Unavailable, match="paged varlen call only"):
        call(q, kc, vc, cache_seqlens=seqlens, cu_seqlens_q=cu, max_seqlen_q=1)


def test_sglang_seam_skips_cleanly_without_the_library(monkeypatch, tmp_path):
    from benchmark.sglang_on_gpu import fa3_seam
    monkeypatch.setattr(fa3, "DEFAULT_PATH", tmp_path / "libfa3fwd.so")
    reason = fa3_seam.install()
    assert reason.startswith("FA3-FP8 not measured:") and "not built" in reason


def _gpu_lib():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an SM90 GPU")
    if not fa3.available():
        pytest.skip(".fa3/libfa3fwd.so not built")
    return torch


def test_gpu_fa3_bf16_varlen_matches_fp32():
    torch = _gpu_lib()
    from sglang_fa4.bench import backends

    from sglang_fa4.bench import fa3

    for d in (64, 72, 80, 128):
        p = backends.make_problem([300, 17, 1024], heads=4, head_dim=d)
        p.out.fill_(float("nan"))
        try:
            out = backends.make_runner("fa3", p)()
        except fa3.Fa3Unavailable as exc:  # FA3_ONLY=decode builds no varlen kernel
            if "this build has no" not in str(exc):
                raise
            pytest.skip(str(exc))
        torch.cuda.synchronize()
        assert backends.rel_err(out, backends.reference_fp32(p)) < 1e-2, d


@pytest.mark.parametrize("dtype,d,page,lens,new,num_splits", [
    ("e4m3", 128, 16, [300, 77], [40, 1], 1),        # an extend + a decode row, one split forced
    ("e4m3", 128, 16, [20000, 9000, 1], [1, 1, 1], 0),  # decode at 20k: FA3 splits on its own
    ("e4m3", 128, 1, [5000, 333], [1, 1], 7),         # a forced split count, page size 1
    ("e4m3", 256, 64, [30000, 64], [1, 1], 0),        # d256 decode (causal dropped), FA3's choice
    ("e4m3", 256, 1, [300, 77], [40, 1], 1),          # d256 causal extend
    ("bf16", 128, 16, [20000, 5], [1, 1], 0),         # the bf16 pool, FA3's choice
    ("bf16", 256, 16, [9000, 3000], [1, 1], 3),
])
def test_gpu_fa3_paged_matches_fp32(dtype, d, page, lens, new, num_splits):
    """FA3's paged call as SGLang makes it, on E4M3 and bf16 pools, with one split, a forced count
    and FA3's own choice (num_splits=0: the Split kernel + combine where it splits), against the
    fp32 contract, output NaN-poisoned first; a variant the library was not built with skips."""
    torch = _gpu_lib()
    from sglang_fa4.bench import backends
    from sglang_fa4.testing import paged_attention_fp32

    fp8, hq, hkv = torch.float8_e4m3fn, 8, 2
    pages = [-(-n // page) for n in lens]
    kc = torch.randn(sum(pages) + 2, page, hkv, d, device="cuda") * 20
    vc = torch.randn(sum(pages) + 2, page, hkv, d, device="cuda") * 20
    table = torch.zeros(len(lens), max(pages), dtype=torch.int32)
    perm, at = (torch.randperm(sum(pages)) + 1).tolist(), 0
    for b, n in enumerate(pages):
        table[b, :n] = torch.tensor(perm[at:at + n])
        at += n
    table, seqlens = table.cuda(), torch.tensor(lens, dtype=torch.int32, device="cuda")
    cu_q = torch.tensor([0] + list(__import__("itertools").accumulate(new)), dtype=torch.int32, device="cuda")
    q = torch.randn(sum(new), hq, d, device="cuda")
    out = torch.full((sum(new), hq, d), float("nan"), dtype=torch.bfloat16, device="cuda")
    if dtype == "e4m3":
        q, kc, vc = q.to(fp8), kc.to(fp8), vc.to(fp8)
        ks, vs = torch.tensor([0.02], device="cuda"), torch.tensor([0.015], device="cuda")
        kw, ref_kw = dict(k_descale=ks.expand(len(lens), hkv), v_descale=vs.expand(len(lens), hkv)), dict(
            k_descale=ks, v_descale=vs)
        call = fa3.paged_fp8
    else:
        q, kc, vc = q.bfloat16(), (kc * 0.02).bfloat16(), (vc * 0.015).bfloat16()
        kw, ref_kw, call = {}, {}, fa3.paged_bf16
    plan = fa3.plan(q, kc, vc, table, seqlens, cu_q, max(new), causal=True, num_splits=num_splits)
    if not plan.built:
        pytest.skip(f"this build has no {dtype} d{d} kernel for {plan}")
    call(q, kc, vc, table, seqlens, cu_q, max(new), out=out, num_splits=num_splits, scratch=fa3.Scratch(), **kw)
    torch.cuda.synchronize()
    if dtype == "e4m3":
        ref = paged_attention_fp32(q, kc, vc, table, seqlens, cu_q, causal=True, **ref_kw)
    else:  # the bf16 pool's own values, gathered by slot
        from sglang_fa4.testing import attention_fp32, offsets

        slots = torch.cat([table[b].long()[torch.arange(n, device="cuda") // page] * page
                           + torch.arange(n, device="cuda") % page for b, n in enumerate(lens)])
        ref = attention_fp32(q.float(), kc.view(-1, hkv, d)[slots].float(), vc.view(-1, hkv, d)[slots].float(), cu_q,
                             offsets(lens), causal=True)
    assert backends.rel_err(out, ref) < 3e-2, (plan, backends.rel_err(out, ref))
    if num_splits == 0 and max(lens) >= 9000:
        assert plan.num_splits > 1, plan  # a long decode at this batch: FA3 splits


def test_committed_fa3_results():
    """The H200 run committed with the FA3 build: every correctness case within the bar, FA3-FP8 timed
    beside fa4-fp8 on every speed shape, and the ViT kernels with fa3 beside fa4 within 1e-2 of fp32."""
    import json

    route = json.loads((ROOT / "benchmark/results/h200/fp8_kv_route_fa3.json").read_text())
    assert route["env"]["fa3"].startswith("flash-attention 0251105a2fb1")
    assert {c["impl"] for c in route["correctness"]} == {"fa4-fp8 route", "fa3-fp8"}
    assert all(c["pass"] and c["finite"] for c in route["correctness"])
    assert all(s["fa3_fp8_ms"] and s["fa4_fp8_routed_ms"] for s in route["speed"])
    kern = report.read_json(ROOT / "benchmark/results/h200/kernels_fa3.json.gz")
    assert report.validate(kern, "kernels") == [] and kern["meta"]["partial"] is False
    rows = [r for r in kern["rows"] if r["mode"] == "graph"]
    assert {r["backend"] for r in rows} == {"fa4", "fa3"} and {r["head_dim"] for r in rows} == {64, 72, 80, 128}
    assert all(r["rel_err"] < 1e-2 for r in rows)
