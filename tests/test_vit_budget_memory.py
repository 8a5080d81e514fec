"""The ViT budget graphs' memory bound (sglang_fa4.integration.vit_budget_memory): the estimate, the
ladder trimmed to fit (exact fit kept, one byte over dropped), the account kept during capture
(measured on CUDA), the setting, and what doctor reports. Pure: no torch, no SGLang (the real
runners are driven in tests/test_vit_budgets.py)."""

import types

import pytest

from sglang_fa4.environ import EnvValueError, envs
from sglang_fa4.integration import vit_budget_memory as vbm

W = vbm.TowerWidths(hidden=100, linear_out=700, rope_dim=10, dtype_bytes=2, table_bytes=4)


def test_budget_cost_formula():
    # per token: static = 2*3*100 + 4*2*10 = 680; pool = 2*(2*700 + 3*100) = 3400
    assert vbm.static_bytes(1, W) == 680 and vbm.pool_bytes(1, W) == 3400
    assert vbm.budget_cost(64, W) == 64 * (680 + 3400)
    # one shared pool: a budget adds its static buffers and the pool's growth over the next smaller
    assert vbm.budget_cost(64, W, shared_pool=True, previous=32) == 64 * 680 + 32 * 3400
    assert vbm.budget_cost(64, W, shared_pool=True) == 64 * (680 + 3400)  # the first: the whole pool
    assert vbm.ladder_costs((64, 32, 64), W) == {32: 32 * 4080, 64: 64 * 4080}
    assert vbm.ladder_costs((64, 32), W, shared_pool=True) == {32: 32 * 4080, 64: 64 * 680 + 32 * 3400}
    with pytest.raises(ValueError, match="budget must be positive, got 0"):
        vbm.budget_cost(0, W)


def test_reference_towers_against_the_h200_measurement():
    # the 9-budget default ladder; H200 reserved growth 1494 / 1512 MiB (vit_graphs-ladder896-0.5.23.json.gz):
    # the estimate is above both (the bound errs towards trimming)
    ladder = (896, 1024, 1536, 2048, 3072, 4096, 5120, 6144, 8192)
    q25, q3 = vbm.REFERENCE_TOWERS["Qwen2.5-VL-7B"], vbm.REFERENCE_TOWERS["Qwen3-VL-8B"]
    per_token_q25 = 2 * 3 * 1280 + 2 * 2 * 80 + 2 * (2 * (3840 + 1280 + 6840 + 1280) + 3 * 1280)
    per_token_q3 = 2 * 3 * 1152 + 4 * 2 * 36 + 2 * (2 * (3456 + 1152 + 4304 + 1152) + 3 * 1152)
    assert sum(vbm.ladder_costs(ladder, q25).values()) == sum(ladder) * per_token_q25
    assert sum(vbm.ladder_costs(ladder, q3).values()) == sum(ladder) * per_token_q3
    assert 1494 * vbm.MIB < sum(ladder) * per_token_q25 < 3072 * vbm.MIB  # default bound keeps the ladder
    assert 1512 * vbm.MIB < sum(ladder) * per_token_q3 < 3072 * vbm.MIB


def test_fit_ladder_boundaries():
    costs = {32: 10, 64: 20, 128: 40}
    assert vbm.fit_ladder(costs, 70) == ((32, 64, 128), ())  # exact fit of the whole ladder
    assert vbm.fit_ladder(costs, 69) == ((32, 64), (128,))  # one byte short: the largest goes
    assert vbm.fit_ladder(costs, 30) == ((32, 64), (128,))  # exact fit of [32, 64]
    assert vbm.fit_ladder(costs, 29) == ((32,), (64, 128))
    assert vbm.fit_ladder(costs, 10) == ((32,), (64, 128))
    assert vbm.fit_ladder(costs, 9) == ((), (32, 64, 128))
    assert vbm.fit_ladder(costs, 0) == ((), (32, 64, 128))
    assert vbm.fit_ladder({}, 5) == ((), ())
    # trimmed from the top: a larger budget is never kept when a smaller one is not
    assert vbm.fit_ladder({32: 50, 64: 1}, 10) == ((), (32, 64))
    with pytest.raises(ValueError, match="limit must be >= 0 bytes, got -1"):
        vbm.fit_ladder(costs, -1)


def test_memory_account_on_cpu_is_the_estimate():
    acc = vbm.MemoryAccount(30, {32: 10, 64: 20, 128: 40})
    assert acc.allows(32)
    acc.record(32, None)
    assert acc.allows(64)  # 10 + 20 == 30: exact fit
    acc.record(64, None)
    assert not acc.allows(128) and acc.stopped == 128
    assert acc.measured_total is None and acc.captured == [32, 64]


def test_memory_account_scales_a_short_estimate_and_never_shrinks_it():
    est = {32: 10, 64: 20, 128: 40}
    acc = vbm.MemoryAccount(70, est)  # the estimate fits all three exactly
    acc.record(32, 15)  # measured 1.5x the estimate
    assert acc.predicted(64) == 30 and acc.allows(64)  # 15 + 30 <= 70
    acc.record(64, 30)
    assert acc.predicted(128) == 60 and not acc.allows(128)  # 45 + 60 > 70
    assert not acc.allows(32)  # stopped: nothing after the first refusal
    assert acc.measured_total == 45
    low = vbm.MemoryAccount(70, est)
    low.record(32, 5)  # measured under the estimate: the estimate stands (charged 5, predicted 20, 40)
    assert low.predicted(64) == 20 and low.allows(64)
    low.record(64, 10)
    assert low.allows(128)  # 15 + 40 <= 70
    # the boundary with measurements: shortfall (15 + 25) / 30 = 4/3, so 128 is predicted 53 (not 40)
    for limit, fits in ((93, True), (92, False)):  # 40 charged + 53 == 93: exact fit; 92: one byte short
        edge = vbm.MemoryAccount(limit, est)
        edge.record(32, 15)
        assert edge.allows(64)
        edge.record(64, 25)
        assert edge.predicted(128) == 53 and edge.allows(128) is fits


@pytest.mark.parametrize("field", ["hidden", "linear_out", "rope_dim", "dtype_bytes", "table_bytes"])
@pytest.mark.parametrize("bad", [0, -1, 2.0, True, None])
def test_tower_widths_rejects_each_field(field, bad):
    kwargs = dict(hidden=1, linear_out=1, rope_dim=1, dtype_bytes=1, table_bytes=1)
    kwargs[field] = bad
    with pytest.raises(ValueError, match=f"TowerWidths.{field} must be a positive integer"):
        vbm.TowerWidths(**kwargs)


class _W:  # a weight: dim() and shape, as torch's
    def __init__(self, *shape):
        self.shape = shape

    def dim(self):
        return len(self.shape)


def _module(weight=None, children=()):
    m = types.SimpleNamespace(weight=weight)
    m.modules = lambda: [m] + [c for child in children for c in child.modules()]
    return m


def test_tower_widths_read_from_block_zero():
    # norm1 (1-D weight, not a linear), qkv 3x96, proj 96, MLP up 2x200 and down 96, one bias-only module
    norm = _module(_W(96))
    block = _module(children=[norm, _module(_W(288, 96)), _module(_W(96, 96)), _module(_W(400, 96)),
                              _module(_W(96, 200)), _module()])
    block.norm1 = norm
    vit = types.SimpleNamespace(blocks=[block, _module(_W(9999, 1))])  # only block 0 counts
    w = vbm.tower_widths(vit, rope_dim=24, dtype_bytes=2, table_bytes=4)
    assert w == vbm.TowerWidths(hidden=96, linear_out=288 + 96 + 400 + 96, rope_dim=24, dtype_bytes=2, table_bytes=4)
    block.norm1 = _module()
    with pytest.raises(ValueError, match="blocks\\[0\\].norm1.weight is missing"):
        vbm.tower_widths(vit, rope_dim=24, dtype_bytes=2, table_bytes=4)
    bare = _module(children=[norm])
    bare.norm1 = norm
    with pytest.raises(ValueError, match="blocks\\[0\\] has no 2-D weight"):
        vbm.tower_widths(types.SimpleNamespace(blocks=[bare]), rope_dim=24, dtype_bytes=2, table_bytes=4)


def test_memory_setting(monkeypatch):
    var = envs.SGLANG_FA4_VIT_GRAPH_MEMORY_MB
    monkeypatch.delenv(var.name, raising=False)
    assert vbm.limit_bytes() == 3072 * vbm.MIB
    monkeypatch.setenv(var.name, "1")  # the minimum
    assert vbm.limit_bytes() == vbm.MIB
    monkeypatch.setenv(var.name, "1048576")  # the maximum (1 TiB)
    assert vbm.limit_bytes() == 1048576 * vbm.MIB
    for bad in ("0", "1048577", "-5", "1.5", "lots", "", "1e23"):
        monkeypatch.setenv(var.name, bad)
        with pytest.raises(EnvValueError, match=f"{var.name}="):
            vbm.limit_bytes()


def test_doctor_report_and_lines(monkeypatch):
    for name in ("SGLANG_FA4_VIT_GRAPH_BUDGETS_ENABLE", "SGLANG_FA4_VIT_GRAPH_MEMORY_MB",
                 "SGLANG_FA4_VIT_GRAPH_BUDGETS", "SGLANG_FA4_VIT_GRAPH_SHARED_POOL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SGLANG_VIT_ENABLE_CUDA_GRAPH", "0")
    assert vbm.doctor_lines()[0].endswith("SGLANG_VIT_ENABLE_CUDA_GRAPH is off: no ViT graphs now")
    monkeypatch.setenv("SGLANG_VIT_ENABLE_CUDA_GRAPH", "1")
    rep = vbm.doctor_report()
    ladder = [896, 1024, 1536, 2048, 3072, 4096, 5120, 6144, 8192]
    assert rep["enabled"] is True and rep["memory_limit_mb"] == 3072 and rep["budgets"] == ladder
    for name, w in vbm.REFERENCE_TOWERS.items():  # the default ladder fits both measured towers
        t = rep["towers"][name]
        assert t["kept"] == ladder and t["trimmed"] == []
        assert t["estimate_mb"] == round(sum(vbm.ladder_costs(ladder, w).values()) / vbm.MIB, 1)
    lines = vbm.doctor_lines(rep)
    assert lines[0].startswith("ViT graphs:   startup budget graphs") and lines[0].endswith("BUDGETS_ENABLE=0 opts out)")
    assert "memory bound 3072 MiB (SGLANG_FA4_VIT_GRAPH_MEMORY_MB)" in lines[1]
    # a bound that trims: the ladder that will be used, per tower, and what goes
    monkeypatch.setenv("SGLANG_FA4_VIT_GRAPH_MEMORY_MB", "500")
    monkeypatch.setenv("SGLANG_FA4_VIT_GRAPH_BUDGETS_ENABLE", "0")
    rep = vbm.doctor_report()
    q25 = vbm.REFERENCE_TOWERS["Qwen2.5-VL-7B"]
    kept, trimmed = vbm.fit_ladder(vbm.ladder_costs(ladder, q25), 500 * vbm.MIB)
    assert rep["towers"]["Qwen2.5-VL-7B"] == {"kept": list(kept), "trimmed": list(trimmed),
                                              "estimate_mb": rep["towers"]["Qwen2.5-VL-7B"]["estimate_mb"]}
    assert trimmed and trimmed[0] > kept[-1]
    lines = vbm.doctor_lines(rep)
    assert lines[0] == "ViT graphs:   SGLang's per-layout graphs (SGLANG_FA4_VIT_GRAPH_BUDGETS_ENABLE=0)"
    assert f"  Qwen2.5-VL-7B: captures {list(kept)}" in lines[2] and f"; trimmed {list(trimmed)}" in lines[2]
    # a malformed setting: the registry's message, no traceback
    monkeypatch.setenv("SGLANG_FA4_VIT_GRAPH_MEMORY_MB", "lots")
    rep = vbm.doctor_report()
    assert set(rep) == {"error"} and "SGLANG_FA4_VIT_GRAPH_MEMORY_MB='lots'" in rep["error"]
    assert vbm.doctor_lines(rep) == [f"ViT graphs:   {rep['error']}"]


def test_mib_formatting():
    assert vbm.mib(None) == "n/a"
    assert vbm.mib(vbm.MIB - 1) == f"{vbm.MIB - 1} bytes"
    assert vbm.mib(vbm.MIB) == "1.0 MiB"
    assert vbm.mib(3 * vbm.MIB // 2) == "1.5 MiB"


def test_doctor_shows_the_vit_graph_section(monkeypatch):
    from sglang_fa4 import doctor

    monkeypatch.setenv("SGLANG_FA4_VIT_GRAPH_MEMORY_MB", "700")
    monkeypatch.setenv("SGLANG_VIT_ENABLE_CUDA_GRAPH", "1")
    report = doctor.collect("9.0")
    assert report["vit_graphs"] == vbm.doctor_report() and report["vit_graphs"]["memory_limit_mb"] == 700
    text = doctor.format_text(report)
    for line in vbm.doctor_lines(report["vit_graphs"]):
        assert line in text.splitlines()
