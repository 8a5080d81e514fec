"""benchmark/release/check_fp8_attention.py --isolate --sections variants, without a GPU: a variant that hangs
or kills its child process is recorded and left out, the others run again side by side; and the
per-variant quick-correctness case sets are well formed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def bench():
    spec = importlib.util.spec_from_file_location("check_fp8_attention", ROOT / "benchmark" / "release" / "check_fp8_attention.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_hanging_variant_is_left_out_and_the_rest_rerun(bench, tmp_path, monkeypatch):
    calls = []

    def fake_child(argv, out_dir, name, budget_end, resumable):
        specs = argv[argv.index("--variants") + 1]
        calls.append(specs)
        if "persist=" in specs:  # the first child hangs in the persistent variant's cases
            return {"sections": {"child_failures": [{"part": name, "rc": "killed: no output for 50s (hang?)",
                                                     "hang": True}]},
                    "last_variant": ["VARIANTSTART", "persist"]}
        rows = [{"name": n.split("=")[0], "flags": n.split("=", 1)[1], "ok": True, "speed": []}
                for n in specs.split(";")]
        return {"sections": {"variants": rows, "variant_rounds": 7}, "env": {"gpu": "fake"},
                "winner": {"name": "base", "flags": ""}}

    monkeypatch.setattr(bench, "run_child", fake_child)
    bench.VARIANTS = "base=;persist=w:persist;pdirect=w:persist,w:o_direct"
    bench.run_variants_isolated(tmp_path, 1e9, ["--rounds", "7"])
    assert calls == ["base=;persist=w:persist;pdirect=w:persist,w:o_direct", "base=;pdirect=w:persist,w:o_direct"]
    assert [v["name"] for v in bench.RESULT["sections"]["variants"]] == ["base", "pdirect"]
    fail = bench.RESULT["sections"]["variant_failures"]
    assert len(fail) == 1 and fail[0]["variant"] == "persist" and fail[0]["phase"] == "VARIANTSTART"
    assert bench.RESULT["winner"] == {"name": "base", "flags": ""}
    assert "persist in VARIANTSTART" in bench.markdown()


def test_no_marker_no_retry(bench, tmp_path, monkeypatch):
    """A child that dies before naming a variant (e.g. at import) is recorded once, not retried."""
    calls = []

    def fake_child(argv, out_dir, name, budget_end, resumable):
        calls.append(argv)
        return {"sections": {"child_failures": [{"part": name, "rc": 1}]}}

    monkeypatch.setattr(bench, "run_child", fake_child)
    bench.VARIANTS = "base=;persist=w:persist"
    bench.run_variants_isolated(tmp_path, 1e9, [])
    assert len(calls) == 1
    assert bench.RESULT["sections"]["variant_failures"][0]["variant"] is None


def test_case_sets(bench):
    for cases in bench.VARIANT_CASE_SETS.values():
        for name, lens_q, lens_k, hq, hkv, d, causal, data in cases:
            assert len(lens_q) == len(lens_k) and hq % hkv == 0 and data in ("randn", "zeros", "randn_no_fa4")
    full = bench.VARIANT_CASE_SETS["d128full"]
    assert all(c[5] == 128 and not c[6] for c in full)  # the d=128 non-causal kernel only
    seg_counts = [len(c[1]) for c in full]
    assert max(seg_counts) > 256 and any(1 < n <= 128 for n in seg_counts)  # both schedule orders
    assert any(0 in c[1] and 1 in c[1] for c in full)  # empty and 1-token segments


def test_d256_case_sets_and_timed_shapes(bench):
    """--variant-cases d256causal: the d=256 causal kernel alone, with partial tiles for every key
    tile of 64..160 keys, GQA and seqlen_q != seqlen_k; a shape is timed only where the cases
    compiled its kernel, so d256causal times the LLM prefill shapes (causal, 16 q / 4 kv heads,
    one 8k sequence among them) and no variant compiles during the timing."""
    causal = bench.VARIANT_CASE_SETS["d256causal"]
    assert all(c[5] == 256 and c[6] for c in causal)
    assert any(c[3] > c[4] for c in causal)  # GQA
    assert any(c[1] != c[2] for c in causal)  # seqlen_q != seqlen_k
    lens = {n for c in causal for n in c[1] + c[2] if n}
    for tile in (64, 96, 128, 160):
        assert any(n % tile for n in lens) and max(lens) >= 4 * tile  # partial and whole tiles
    shapes = bench.variant_shapes(causal, (256,))
    assert shapes and all(sh[4] == 256 and sh[5] for sh in shapes)
    assert ("1x8192 causal gqa16/4", [8192], 16, 4, 256, True) in shapes
    both = bench.variant_shapes(bench.VARIANT_CASE_SETS["d256"], (256,))
    assert {sh[5] for sh in both} == {True, False} and len(both) > len(shapes)
    # the d64/d128 defaults: the same shapes as before the d=256 ones were added
    assert [(sh[0], sh[4]) for sh in bench.variant_shapes(bench.VARIANT_CASE_SETS["default"], (64, 128))] == [
        ("8x4096", 128), ("1x16384", 128), ("8x4096", 64), ("1x16384", 64)]
    assert bench.variant_shapes(causal, (64, 128)) == []
