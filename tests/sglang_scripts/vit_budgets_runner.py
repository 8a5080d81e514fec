"""The budget graphs on SGLang's real generic runner (Qwen2.5-VL-like and Qwen3-VL-like towers), the
startup path as the plugin registered it, the capture guard and the memory bound, inside a REAL
SGLang release: for tests/test_vit_budgets.py::test_budget_graphs_on_real_runner."""

import os
from contextlib import ExitStack
from unittest import mock

import torch
from vit_budget_tower import C, D, call_run, faked_graphs, image_mix, reference, tower_with_runner
from vit_graph_fakes import STATE, log
from vit_budget_hooks import hook_list, registered_startup

from emit import emit
from sglang_fa4.integration import vit_budget_layouts as budget_layouts
from sglang_fa4.integration import vit_budgets as vb

result = {"hooks": hook_list()}
with faked_graphs():
    for qwen3 in (False, True):
        name = "qwen3" if qwen3 else "qwen25"
        vit, runner, mr = tower_with_runner(qwen3)
        # the startup path: the AFTER ModelRunner.load_model hook finds the runner, reads its dims
        STATE["startup"] = True
        assert registered_startup(mr) == 1  # the switch left at its default: registered
        STATE["startup"] = False
        state = vb.budget_state(runner)
        startup_captures = STATE["captures"]
        cases = []
        for trial in range(12):
            total, full, win = image_mix(qwen3)
            x = torch.randn(total, C)
            tables = (torch.randn(total, D), torch.randn(total, D))
            perm = None if qwen3 else torch.randperm(total // 4)
            got = call_run(runner, x, full, win, tables, qwen3, perm)
            want = reference(vit, x, full, win, tables, qwen3, perm)
            budget = budget_layouts.pick_budget(total, state.budgets)
            static = runner.block_output[state.keys[budget]] if budget else None
            cases.append({
                "tokens": total, "budget": budget,
                "max_err": float((got - want).abs().max()), "shape_ok": list(got.shape) == list(want.shape),
                "nan": bool(got.isnan().any()),
                "pad_rows_zero": None if static is None else bool((static[total // 4:] == 0).all()),
                "static_nan": None if static is None else bool(static.isnan().any()),
            })
        # a batch above the largest budget: eager, no capture
        total = 160
        x = torch.randn(total, C); tables = (torch.randn(total, D), torch.randn(total, D))
        full = [0, 160] if qwen3 else [0, 0, 160]
        win = None if qwen3 else list(range(0, 161, 16))
        perm = None if qwen3 else torch.randperm(40)
        big = call_run(runner, x, full, win, tables, qwen3, perm)
        big_err = float((big - reference(vit, x, full, win, tables, qwen3, perm)).abs().max())
        # more images than the smallest budget holding their tokens has slots: the next budget
        # that holds them (the largest holds SGLANG_FA4_VIT_GRAPH_MAX_SEGMENTS), not eager
        full = list(range(0, 49, 4)) if qwen3 else [0] + list(range(0, 49, 4))
        win = None if qwen3 else list(range(0, 49, 4))
        x = torch.randn(48, C); tables = (torch.randn(48, D), torch.randn(48, D))
        perm = None if qwen3 else torch.randperm(12)
        replays, eager = state.replays, state.eager_runs
        got = call_run(runner, x, full, win, tables, qwen3, perm)
        many = {"err": float((got - reference(vit, x, full, win, tables, qwen3, perm)).abs().max()),
                "budget": state.last_budget, "replays": state.replays - replays, "eager": state.eager_runs - eager}
        # measured routing (SGLANG_FA4_VIT_GRAPH_BUDGET_ROUTE=fastest): with 128 timed fastest, a
        # 20-token batch replays there, still right
        state.replay_ms = {32: 3.0, 64: 2.0, 128: 1.0}
        full = [0, 8, 20] if qwen3 else [0, 0, 8, 20]
        win = None if qwen3 else [0, 8, 20]
        x = torch.randn(20, C); tables = (torch.randn(20, D), torch.randn(20, D))
        perm = None if qwen3 else torch.randperm(5)
        got = call_run(runner, x, full, win, tables, qwen3, perm)
        routed = {"err": float((got - reference(vit, x, full, win, tables, qwen3, perm)).abs().max()),
                  "budget": state.last_budget}
        state.replay_ms = {}
        misfit_err = None
        if not qwen3:  # a window longer than the captured window max_seqlen: eager, not wrong
            x = torch.randn(32, C); tables = (torch.randn(32, D), torch.randn(32, D)); perm = torch.randperm(8)
            got = call_run(runner, x, [0, 0, 32], [0, 32], tables, qwen3, perm)
            misfit_err = float((got - reference(vit, x, [0, 0, 32], [0, 32], tables, qwen3, perm)).abs().max())
        result[name] = {"cases": cases, "startup_captures": startup_captures, "misfit_err": misfit_err, "many": many,
                        "routed": routed,
                        "captures_after": STATE["captures"] - startup_captures, "big_err": big_err,
                        "report": state.report(), "graphs": len(runner.block_graphs)}
        STATE["captures"] = 0
    # the guard: a capture forced after startup
    for mode in ("warn", "raise"):
        os.environ["SGLANG_FA4_JIT_MONITOR"] = mode
        x = torch.randn(8, 1, C); t = torch.randn(8, D)
        try:
            runner.create_graph(x_3d=x, cu_seqlens=torch.tensor([0, 8], dtype=torch.int32), cu_window_seqlens=None,
                                position_embeddings=None, rotary_pos_emb_cos=t, rotary_pos_emb_sin=t)
            result[f"guard_{mode}"] = "ok"
        except Exception as exc:
            result[f"guard_{mode}"] = type(exc).__name__
    result["guard_count"] = vb.budget_state(runner).captures_after_startup
    result["log"] = log.getvalue()
    result["warming"] = sorted(STATE["warming"])
os.environ["SGLANG_FA4_JIT_MONITOR"] = "raise"  # below: a capture while serving would raise

# The memory bound (vit_budget_memory) through the real runner: the limit at the exact estimated cost
# of [32, 64], one byte under it, under the smallest budget alone; then (CUDA stand-in) a reserved
# probe that measures twice each estimate. Every kept ladder serves: replays in range, eager above.
from sglang_fa4.integration import vit_budget_memory as vbm
from sglang_fa4.integration import vit_budget_capture as vbc

def bounded(qwen3, limit, probe=None, serve=()):
    vit, runner, mr = tower_with_runner(qwen3)
    dims = vb.infer_capture_dims(vit)
    costs = vbm.ladder_costs((32, 64, 128), vbm.tower_widths(vit, rope_dim=dims["rope_dim"], dtype_bytes=4, table_bytes=4))
    log.truncate(0); log.seek(0)
    with faked_graphs(), torch.no_grad(), ExitStack() as stack:
        if probe is not None:
            stack.enter_context(mock.patch.object(vbc, "reserved_bytes", probe["read"]))
            real = vbc._capture_one
            def measured_capture(runner_, state_, budget, *a):
                real(runner_, state_, budget, *a); probe["reserved"] += probe["factor"] * costs[budget]
            stack.enter_context(mock.patch.object(vbc, "_capture_one", measured_capture))
        start = STATE["captures"]
        state = vb.capture_budgets(runner, budgets=(32, 64, 128), memory_limit=limit(costs), **dims)
        captured = STATE["captures"] - start
        served = {}
        for total in serve:
            full = [0, total] if qwen3 else [0, 0, total]
            win = None if qwen3 else list(range(0, total + 1, 4))
            x = torch.randn(total, C); tables = (torch.randn(total, D), torch.randn(total, D))
            perm = None if qwen3 else torch.randperm(total // 4)
            replays = state.replays
            got = call_run(runner, x, full, win, tables, qwen3, perm)
            served[total] = {"err": float((got - reference(vit, x, full, win, tables, qwen3, perm)).abs().max()),
                             "budget": state.last_budget if state.replays > replays else None}
        return {"costs": {str(b): c for b, c in costs.items()}, "budgets": list(state.budgets),
                "trimmed": list(state.trimmed), "captured": captured, "serving_captures": STATE["captures"] - start - captured,
                "graphs": len(runner.block_graphs), "served": served, "report": state.report(), "log": log.getvalue()}

bound = {name: {"exact": bounded(qwen3, lambda c: c[32] + c[64], serve=(20, 60, 100))}
         for name, qwen3 in (("qwen25", False), ("qwen3", True))}
bound["qwen3"]["byte_over"] = bounded(True, lambda c: c[32] + c[64] - 1, serve=(60,))
bound["qwen3"]["none"] = bounded(True, lambda c: c[32] - 1, serve=(20,))
probe = {"reserved": 0, "factor": 2}
probe["read"] = lambda device: probe["reserved"]
bound["qwen3"]["measured"] = bounded(True, lambda c: c[32] + c[64] + c[128], probe)
result["bound"] = bound
emit(result)
