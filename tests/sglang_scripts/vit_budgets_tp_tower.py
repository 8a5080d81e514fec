"""SGLang's real Qwen2.5-VL tower, tensor-parallel over 2 CPU processes (gloo), its budgets captured by
the startup path on each rank, inside a REAL SGLang release: for
tests/test_vit_budgets.py::test_budget_graphs_on_tensor_parallel_tower (benchmark/sglang_on_gpu's
init_sglang, shared with the GPU checks)."""

import random
import socket
from unittest import mock

import torch
import torch.multiprocessing as mp
import torch.nn as nn
from vit_graph_fakes import STATE, FakeGraph, fake_graph, recording_create, vision, vr
from sglang.srt.models import qwen2_5_vl
from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig

from emit import emit
from sglang_fa4.integration import vit_budgets as vb


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); return s.getsockname()[1]

def rank_main(rank, port, queue):
    try:
        queue.put(run_rank(rank, port))
    except BaseException:
        import traceback
        queue.put({"rank": rank, "error": traceback.format_exc()[-3000:]})
        raise

def run_rank(rank, port):
    from sglang.srt.distributed import parallel_state as ps
    from benchmark.sglang_on_gpu.sglang_towers import init_sglang
    init_sglang("fa4", tp_size=2, rank=rank, port=port)  # gloo groups on a CPU
    with mock.patch.object(vision, "_is_cuda", True), mock.patch.object(qwen2_5_vl, "_is_cuda", True):
        cfg = Qwen2_5_VLVisionConfig(depth=4, hidden_size=64, hidden_act="silu", intermediate_size=96,
                                     num_heads=4, in_channels=3, patch_size=14, spatial_merge_size=2,
                                     temporal_patch_size=2, window_size=112, out_hidden_size=32,
                                     fullatt_block_indexes=[1, 3])
        vit = qwen2_5_vl.Qwen2_5_VisionTransformer(cfg)
    torch.manual_seed(1 + rank)  # each rank its own shard of the weights
    with torch.no_grad():
        for p in vit.parameters():
            p.normal_(0, 0.05)
    runner = vit.cuda_graph_runner
    model = nn.Module(); model.visual = vit
    class ModelRunner: pass
    mr = ModelRunner(); mr.model = model
    out = {"rank": rank, "heads_per_rank": vit.blocks[0].attn.num_attention_heads_per_partition, "cases": []}
    with mock.patch.object(torch.cuda, "CUDAGraph", FakeGraph), mock.patch.object(torch.cuda, "graph", fake_graph), \
         mock.patch.object(torch.cuda, "synchronize", lambda *a: None), \
         mock.patch.object(vr.ViTCudaGraphRunner, "_create_graph", recording_create):
        vb.capture_budgets_after_load_model(None, mr)  # the startup path, on every rank
        state = vb.budget_state(runner)
        startup = STATE["captures"]
        random.seed(5)  # the same image mixes on both ranks (TP: every rank sees every token)
        for trial in range(6):
            grid = torch.tensor([[1, 2 * random.randint(2, 9), 2 * random.randint(2, 9)]
                                 for _ in range(random.randint(1, 3))])
            x = torch.randn(int(grid.prod(-1).sum()), 3 * 2 * 14 * 14, generator=torch.Generator().manual_seed(trial))
            with torch.no_grad():
                vit.enable_cg = True
                replays = state.replays
                got = vit(x, grid).clone()
                replayed = state.replays == replays + 1
                vit.enable_cg = False
                want = vit(x, grid)
            out["cases"].append({"tokens": x.shape[0], "replayed": replayed,
                                 "max_err": float((got - want).abs().max()), "scale": float(want.abs().max())})
        # above the largest budget: the tower's own eager forward, decided from grid_thw before the
        # graph path (the runner is not called at all)
        runner_calls = []
        hooked_run = runner.run
        runner.run = lambda **kw: runner_calls.append(1) or hooked_run(**kw)
        grid = torch.tensor([[1, 28, 28]])
        x = torch.randn(784, 3 * 2 * 14 * 14, generator=torch.Generator().manual_seed(99))
        eager_runs = state.eager_runs
        # ... keeping SGLang's graph-mode rotary (the unfused one): the compiled one would be
        # compiled by Inductor on the request path
        rotary = {"compiled": 0, "unfused": 0, "no_sync_forward": 0, "sglang_window_index": 0, "sglang_rot_pos_emb": 0}
        def counted(name, fn):
            def call(*a, **k):
                rotary[name] += 1
                return fn(*a, **k)
            return call
        # ... through our no-sync forward, not SGLang's (whose window index and rotary ids are read
        # back from the device)
        from sglang_fa4.integration import qwen2_5_vit_forward as no_sync
        with torch.no_grad(), \
             mock.patch.object(vision, "apply_rotary_pos_emb", counted("compiled", vision.apply_rotary_pos_emb)), \
             mock.patch.object(vision, "apply_rotary_pos_emb_native_eager",
                               counted("unfused", vision.apply_rotary_pos_emb_native_eager)), \
             mock.patch.object(no_sync, "eager_forward", counted("no_sync_forward", no_sync.eager_forward)), \
             mock.patch.object(vit, "get_window_index", counted("sglang_window_index", vit.get_window_index)), \
             mock.patch.object(vit, "rot_pos_emb", counted("sglang_rot_pos_emb", vit.rot_pos_emb)):
            vit.enable_cg = True
            got = vit(x, grid).clone()
            flag_restored = vit.enable_cg
        with torch.no_grad():
            vit.enable_cg = False
            want = vit(x, grid)
        out["big"] = {"runner_calls": len(runner_calls), "eager_runs": state.eager_runs - eager_runs, "rotary": rotary,
                      "max_err": float((got - want).abs().max()), "enable_cg_restored": flag_restored}
        out["captures_after"] = STATE["captures"] - startup
        out["report"] = state.report()
    ps.destroy_model_parallel(); ps.destroy_distributed_environment()
    return out

ctx = mp.get_context("fork")
queue = ctx.Queue()
port = free_port()
procs = [ctx.Process(target=rank_main, args=(r, port, queue)) for r in range(2)]
for p in procs: p.start()
results = sorted((queue.get(timeout=180) for _ in procs), key=lambda r: r["rank"])
for p in procs: p.join(60)
emit({"ranks": results, "exitcodes": [p.exitcode for p in procs]})
