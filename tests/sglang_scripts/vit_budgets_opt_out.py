"""The opt-out (SGLANG_FA4_VIT_GRAPH_BUDGETS_ENABLE=0) on SGLang's real generic runner, inside a REAL
SGLang release: for tests/test_vit_budgets.py::test_opt_out_gives_sglangs_per_layout_runner."""

import torch
from vit_budget_tower import C, D, call_run, faked_graphs, reference, tower_with_runner
from vit_graph_fakes import STATE
from vit_budget_hooks import hook_list, registered_startup

from emit import emit
from sglang_fa4.integration import vit_budgets as vb

hooks = hook_list()
with faked_graphs():
    vit, runner, mr = tower_with_runner(True)
    hooks["startup_hooks"] = registered_startup(mr)
    startup = STATE["captures"]
    errs = []
    for full in ([0, 16, 40], [0, 8, 20, 36]):
        total = full[-1]; x = torch.randn(total, C); tables = (torch.randn(total, D), torch.randn(total, D))
        got = call_run(runner, x, full, None, tables, True, None)
        errs.append(float((got - reference(vit, x, full, None, tables, True, None)).abs().max()))
hooks["startup_captures"] = startup
hooks["serving_captures"] = STATE["captures"] - startup
hooks["state"] = vb.budget_state(runner) is not None
hooks["err"] = max(errs)
emit(hooks)
