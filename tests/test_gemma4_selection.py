"""Issue #44 item 3: Gemma-4 on an FP8 KV cache on Hopper gets fa4 with our route only where the route
runs every layer (:mod:`sglang_fa4.gemma4_selection`).

Each reason the rule keeps SGLang's backend, on its own; then the rule through SGLang 0.5.23's and
0.5.20's real server-args resolution (``ServerArgs.resolve_once`` on Gemma-4 model directories, the
platform faked with SGLang's ``override_platform``, the plugin loaded by SGLang's loader), both with
today's route (no head dim 512, no image masks: SGLang's triton kept, one log line naming what is
missing) and with the capabilities pretended to what they will be once the kernels run head dim 512
(and the image masks), so both outcomes are tested today; the refusal of an explicit fa4 at backend
init is in tests/test_gemma4_backend_cpu.py."""

from __future__ import annotations

import pytest

from gemma4_configs import MODELS
from sglang_fa4 import gemma4_selection as g4
from sglang_fa4.gemma4_selection import Gemma4Facts, LayerKind, RouteCaps
from sglang_harness import run_file

TODAY = g4.route_caps()
BEFORE_D512 = RouteCaps(tuple(d for d in TODAY.head_dims if d != 512), (), False)  # the kernels before d512
D512 = RouteCaps(tuple(sorted({*TODAY.head_dims, 512})), (512,), False)  # head dim 512 without the image masks
ALL = RouteCaps(D512.head_dims, (512,), True)  # and the image prefill masks
SLIDING = LayerKind("sliding", 256, 256, 32, 16, 1023)
FULL = LayerKind("full", 512, 512, 32, 4)
G31 = g4.KNOWN_MODELS["gemma-4-31B-it"]
TEXT = Gemma4Facts("Gemma4ForConditionalGeneration", (SLIDING, FULL))  # no vision tower


def pick(upstream="triton", version="0.5.23", cap=(9, 0), kv="fp8_e4m3", explicit=False, det=False, facts=TEXT,
         caps=ALL):
    return g4.gemma4_upgrade(upstream, sglang_version=version, capability=cap, kv_cache_dtype=kv,
                             explicit_backend=explicit, deterministic=det, facts=facts, caps=caps)


@pytest.fixture()
def upgrade_on(monkeypatch):
    monkeypatch.setenv("SGLANG_FA4_FP8_KV_UPGRADE", "1")


def test_caps_follow_the_kernels_and_the_route():
    from sglang_fa4.integration import llm_fp8_kv
    from sglang_fa4.kernels import fp8_paged_kv

    assert TODAY == RouteCaps(tuple(fp8_paged_kv.HEAD_DIMS), tuple(llm_fp8_kv.BF16_QUERY_HEAD_DIMS),
                              g4.IMAGE_PREFILL_MASKS)
    # doctor's torch-free read of the kernels' head dims is the imported value
    assert g4.kernel_head_dims() == tuple(fp8_paged_kv.HEAD_DIMS)


def test_what_the_route_lacks_today_for_the_31b():
    """Before head dim 512 landed: d512 and the image masks; each goes from the list as it lands."""
    want = []
    if 512 not in TODAY.head_dims:
        want.append(f"head dim 512 not run by the FP8 KV kernels ({', '.join(map(str, TODAY.head_dims))})")
    elif 512 not in TODAY.bf16_query_head_dims:
        want.append("head dim 512: SGLang hands these layers a bf16 q, which the route does not take")
    if not TODAY.image_prefill_masks:
        want.append("image prefill masks (SGLang's bidirectional image mask_mod) not run by the route")
    assert g4.missing(G31, TODAY) == want


def test_upgrade_when_the_route_runs_every_layer(upgrade_on):
    choice = pick()
    assert (choice.backend, choice.upgraded) == ("fa4", True)
    assert "sliding d256, full d512" in choice.reason
    assert pick(facts=G31).upgraded  # the -it with a vision tower, image masks run
    # every head dim one the kernels run today (a Gemma-4 with d256 full layers, no vision tower)
    d256 = Gemma4Facts("Gemma4ForConditionalGeneration", (SLIDING, LayerKind("full", 256, 256, 32, 4)))
    assert pick(facts=d256, caps=TODAY).upgraded


@pytest.mark.parametrize(
    "kwargs,why",
    [
        (dict(explicit=True), "explicitly"),
        (dict(upstream="trtllm_mha"), "triton default"),
        (dict(upstream="fa3"), "triton default"),
        (dict(cap=(10, 0)), "not an SM90"),
        (dict(cap=None), "not an SM90"),
        (dict(kv="auto"), "'auto'"),
        (dict(kv="fp8_e5m2"), "'fp8_e5m2'"),
        (dict(version="0.5.20"), "SGLang 0.5.20 accepts no fa4 for Gemma-4"),
        (dict(version="0.5.21"), "SGLang 0.5.21 accepts no fa4 for Gemma-4"),
        (dict(det=True), "deterministic"),
        (dict(facts=None), "unknown"),
        # each capability missing on its own
        (dict(caps=RouteCaps((64, 128, 256), (512,), True)), "head dim 512 not run by the FP8 KV kernels"),
        (dict(caps=RouteCaps((64, 128, 512), (512,), True)), "head dim 256 not run by the FP8 KV kernels"),
        (dict(caps=RouteCaps(ALL.head_dims, (), True)), "head dim 512: SGLang hands these layers a bf16 q"),
        (dict(facts=G31, caps=RouteCaps(ALL.head_dims, (512,), False)), "image prefill masks"),
        (dict(facts=Gemma4Facts("Gemma4ForCausalLM", (SLIDING, FULL), softcap=50.0)), "softcap 50.0"),
        (dict(facts=Gemma4Facts("Gemma4ForCausalLM", (SLIDING, FULL), sinks=True)), "attention sinks"),
        (dict(facts=Gemma4Facts("Gemma4ForCausalLM", (SLIDING, LayerKind("full", 512, 256, 32, 4)))),
         "v head dim 256 differs from head dim 512"),
    ],
)
def test_every_reason_keeps_sglangs_backend(upgrade_on, kwargs, why):
    choice = pick(**kwargs)
    assert not choice.upgraded and choice.backend == kwargs.get("upstream", "triton")
    assert why in choice.reason, choice.reason
    assert choice.reason.count("\n") == 0  # one line


def test_off_by_default(monkeypatch):
    monkeypatch.delenv("SGLANG_FA4_FP8_KV_UPGRADE", raising=False)
    choice = pick()
    assert not choice.upgraded and "SGLANG_FA4_FP8_KV_UPGRADE is off" in choice.reason


def test_facts_from_a_resolved_config():
    """SGLang's resolved Gemma-4 config: head_dim is the full layers', swa_* the sliding layers'."""
    from types import SimpleNamespace as NS

    text = NS(head_dim=512, v_head_dim=512, swa_head_dim=256, swa_v_head_dim=256, num_attention_heads=32,
              num_key_value_heads=4, swa_num_key_value_heads=16, sliding_window=1024,
              layer_types=["sliding_attention"] * 5 + ["full_attention"], attention_k_eq_v=True)
    facts = g4.facts_from_config(NS(architectures=["Gemma4ForConditionalGeneration"], text_config=text,
                                    vision_config=NS()))
    assert facts == G31
    assert g4.facts_from_config(NS(architectures=["Qwen2ForCausalLM"], head_dim=128)) is None


def test_doctor_prints_the_rule_and_todays_verdict(monkeypatch):
    from sglang_fa4 import doctor

    monkeypatch.setenv("SGLANG_FA4_FP8_KV_UPGRADE", "1")
    report = doctor.collect("9.0")
    g = report["gemma4_fp8_kv"]
    assert "Gemma-4 triton becomes fa4" in g["rule"]
    v31 = g["models"]["gemma-4-31B-it"]
    # the SGLang the verdict is for: the installed one, else the newest supported
    accepts = g["sglang"].split()[0] in ("0.5.22", "0.5.23")
    # today's kernels run every layer (d512 with bf16 q, the image mask): fa4 where SGLang takes it
    assert g4.route_caps() == ALL
    assert v31["upgrade"] == accepts and v31["backend"] == ("fa4" if accepts else "triton")
    text = doctor.format_text(report)
    assert "Gemma-4, fp8 KV:" in text and f"gemma-4-31B-it: {v31['backend']}" in text
    # the verdict follows the capabilities: without d512 the rule is off, naming it
    monkeypatch.setattr(g4, "route_caps", lambda: BEFORE_D512)
    before = doctor.collect("9.0")["gemma4_fp8_kv"]["models"]["gemma-4-31B-it"]
    assert not before["upgrade"] and before["backend"] == "triton"
    if accepts:
        assert "head dim 512 not run by the FP8 KV kernels" in before["reason"]


# ---- through SGLang's real server-args resolution ----------------------------------------------

FP8 = {"kv_cache_dtype": "fp8_e4m3"}
# (model, platform, server args, expected backend per capability set: before d512, d512, d512 + image masks)
CASES = [
    ("gemma4_31b", "sm90", FP8, ("triton", "triton", "fa4")),
    ("gemma4_26b_a4b", "sm90", FP8, ("triton", "triton", "fa4")),
    ("gemma4_small", "sm90", FP8, ("triton", "fa4", "fa4")),          # no vision tower: d512 is all it needs
    ("gemma4_small_d256", "sm90", FP8, ("fa4", "fa4", "fa4")),        # every head dim run today
    ("gemma4_31b", "sm90", {}, ("triton",) * 3),                      # bf16 cache
    ("gemma4_31b", "sm90", {**FP8, "attention_backend": "triton"}, ("triton",) * 3),
    ("gemma4_small_d256", "sm90", {**FP8, "attention_backend": "triton"}, ("triton",) * 3),
    ("gemma4_31b", "sm90", {**FP8, "attention_backend": "fa4"}, ("fa4",) * 3),   # explicit: SGLang's (refused at init)
    ("gemma4_small_d256", "sm90", {**FP8, "enable_deterministic_inference": True}, ("triton",) * 3),
    ("gemma4_31b", "sm100", FP8, ("trtllm_mha",) * 3),
]
CAPS = {"today": None, "d512": D512, "all": ALL}
D512_TODAY = 512 in TODAY.head_dims and 512 in TODAY.bf16_query_head_dims
#: the expected column of today's route: it moves as the capabilities land
TODAY_COLUMN = 2 if D512_TODAY and TODAY.image_prefill_masks else 1 if D512_TODAY else 0


def _caps_param(caps):
    return None if caps is None else {"head_dims": list(caps.head_dims),
                                      "bf16_query_head_dims": list(caps.bf16_query_head_dims),
                                      "image_prefill_masks": caps.image_prefill_masks}


def _resolve(version, tmp_path, caps, upgrade=True, cases=CASES):
    return run_file(version, "gemma4_server_args.py",
                    {"models": MODELS, "cases": [{"model": m, "platform": p, "args": a} for m, p, a, _ in cases],
                     "root": str(tmp_path), "caps": _caps_param(caps)},
                    env={"SGLANG_IS_FLASHINFER_AVAILABLE": "false",
                         "SGLANG_FA4_FP8_KV_UPGRADE": "1" if upgrade else "0"}, timeout=600)


@pytest.mark.parametrize("caps", list(CAPS))
def test_rule_through_sglang_0_5_23(tmp_path, caps):
    from sglang_harness import require_version

    require_version("0.5.23")
    out = _resolve("0.5.23", tmp_path, CAPS[caps])
    col = TODAY_COLUMN if caps == "today" else list(CAPS).index(caps)
    got = [r.get("backend", r.get("error")) for r in out]
    want = [expected[col] for _, _, _, expected in CASES]
    assert got == want, list(zip([c[:3] for c in CASES], got, want))
    # the 31B as SGLang resolves its config: sliding d256 32q/16kv window 1023, full d512 32q/4kv
    f31 = out[0]["facts"]
    assert [(x["name"], x["head_dim"], x["q_heads"], x["kv_heads"], x["window"]) for x in f31["layers"]] == [
        ("sliding", 256, 32, 16, 1023), ("full", 512, 32, 4, None)]
    assert f31["image_inputs"] and f31["k_eq_v"] and f31["softcap"] == 0.0 and not f31["sinks"]
    f26 = out[1]["facts"]
    assert [(x["head_dim"], x["q_heads"], x["kv_heads"]) for x in f26["layers"]] == [(256, 16, 8), (512, 16, 2)]
    # one startup line per resolution on SM90 + fp8_e4m3 without a backend, naming what is missing
    for (model, platform, args, _), r in zip(CASES, out):
        expect_line = platform == "sm90" and args.get("kv_cache_dtype") == "fp8_e4m3" and "attention_backend" not in args
        assert len(r["log"]) == (1 if expect_line else 0), (model, args, r["log"])
    if caps == "today" and TODAY_COLUMN == 0:  # both missing, each named; the text-only model lacks d512 alone
        assert "head dim 512 not run by the FP8 KV kernels" in out[0]["log"][0]
        assert "image prefill masks" in out[0]["log"][0]
        assert out[2]["log"][0].endswith("head dim 512 not run by the FP8 KV kernels (64, 96, 128, 192, 256)")
    if caps == "d512" or (caps == "today" and TODAY_COLUMN == 1):  # the image masks alone keep the -it on triton
        assert out[0]["log"][0].endswith("image prefill masks (SGLang's bidirectional image mask_mod) not run by the route")
    if caps == "all":
        assert "fa4 with sglang-fa4's FP8 KV route" in out[0]["log"][0]


def test_split_backend_given_is_explicit(tmp_path):
    """Only --prefill-attention-backend given: SGLang's Gemma-4 override fills attention_backend with
    triton for the other side; the plugin leaves that alone (an explicit choice wins)."""
    from sglang_harness import require_version

    require_version("0.5.23")
    cases = [("gemma4_small_d256", "sm90", {**FP8, "prefill_attention_backend": "triton"}, None)]
    (r,) = _resolve("0.5.23", tmp_path, ALL, cases=cases)
    assert (r["backend"], r["prefill"], r["log"]) == ("triton", "triton", [])


def test_upgrade_off_keeps_triton(tmp_path):
    from sglang_harness import require_version

    require_version("0.5.23")
    cases = CASES[:4]
    out = _resolve("0.5.23", tmp_path, ALL, upgrade=False, cases=cases)
    assert [r["backend"] for r in out] == ["triton"] * 4
    assert all(r["log"] == [] for r in out)  # the feature is not even hooked (plugin.py: opt-in)


def test_sglang_0_5_20_accepts_no_fa4_for_gemma4(tmp_path):
    """0.5.20 knows Gemma-4 but its arg_groups/model_hook.py allows no fa4: the rule stays off with
    that reason even with every capability, and an explicit fa4 is SGLang's own AssertionError."""
    from sglang_harness import require_version

    require_version("0.5.20")
    cases = [("gemma4_small_d256", "sm90", FP8, None), ("gemma4_31b", "sm90", FP8, None),
             ("gemma4_31b", "sm90", {**FP8, "attention_backend": "fa4"}, None)]
    out = _resolve("0.5.20", tmp_path, ALL, cases=cases)
    assert [r.get("backend") for r in out[:2]] == ["triton", "triton"]
    assert "SGLang 0.5.20 accepts no fa4 for Gemma-4 (from 0.5.22)" in out[0]["log"][0]
    assert "AssertionError" in out[2]["error"] and "Gemma4 only supports" in out[2]["error"]


def test_describe_rule_on_sglang_0_5_20_says_why_not(monkeypatch):
    """0.5.20 / 0.5.21: doctor's verdict names the release (its Gemma-4 check allows no fa4)."""
    monkeypatch.setenv("SGLANG_FA4_FP8_KV_UPGRADE", "1")
    for version in ("0.5.20", "0.5.21"):
        rule = g4.describe_rule((9, 0), version, caps=ALL)
        v31 = rule["models"]["gemma-4-31B-it"]
        assert not v31["upgrade"] and f"SGLang {version} accepts no fa4 for Gemma-4 (from 0.5.22)" in v31["reason"]
        assert v31["missing"] == [] and rule["sglang"] == version
    assert g4.describe_rule((9, 0), "0.5.22", caps=ALL)["models"]["gemma-4-31B-it"]["upgrade"]
    assert not g4.describe_rule((10, 0), "0.5.23", caps=ALL)["models"]["gemma-4-31B-it"]["upgrade"]
