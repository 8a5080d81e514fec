"""Held outputs of SGLang's generic ViT runner (Qwen2.5-VL-like and Qwen3-VL-like towers, exact-layout
and budget graphs) survive later replays, inside a REAL SGLang release: for
tests/test_vit_graph_outputs.py. Hold every output of many calls through each graph path; at the end
count the held outputs whose values changed since they were returned (an aliased output shows the
last replay's values)."""

import torch
from vit_budget_tower import C, D, call_run, faked_graphs, image_mix, reference, tower_with_runner

from emit import emit
from sglang_fa4.integration import vit_budgets as vb


def hold_pass(vit, runner, qwen3, layouts, calls):
    held = []
    for i in range(calls):
        total, full, win = layouts[i % len(layouts)]
        x = torch.randn(total, C)
        tables = (torch.randn(total, D), torch.randn(total, D))
        perm = None if qwen3 else torch.randperm(total // 4)
        got = call_run(runner, x, full, win, tables, qwen3, perm)
        want = reference(vit, x, full, win, tables, qwen3, perm)
        held.append((got, got.clone(), float((got - want).abs().max())))
    return {"changed": sum(not torch.equal(g, snap) for g, snap, _ in held),
            "max_err": max(err for _, _, err in held), "calls": calls}


result = {}
with faked_graphs():
    for qwen3 in (False, True):
        name = "qwen3" if qwen3 else "qwen25"
        layouts = [image_mix(qwen3) for _ in range(3)]  # few layouts: every exact-layout graph replays often
        # SGLang's own exact-layout graphs (no budgets on this runner)
        vit, runner, _ = tower_with_runner(qwen3)
        result[name + "_exact"] = hold_pass(vit, runner, qwen3, layouts, 24)
        result[name + "_exact"]["graphs"] = len(runner.block_graphs)
        # the startup budget graphs: random mixes, many share a budget
        vit, runner, mr = tower_with_runner(qwen3)
        vb.capture_budgets_after_load_model(None, mr)
        result[name + "_budgets"] = hold_pass(vit, runner, qwen3, [image_mix(qwen3) for _ in range(24)], 24)
        result[name + "_budgets"]["replays"] = vb.budget_state(runner).replays
emit(result)
