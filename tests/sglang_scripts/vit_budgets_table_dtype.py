"""The dtype of the rotary tables the budget graphs (and the eager path above them) hand each block,
inside a REAL SGLang release: for
tests/test_vit_budgets.py::test_graphs_read_the_rotary_tables_in_the_towers_table_dtype."""

import torch
import torch.nn as nn
from vit_budget_tower import C, D, Block, call_run, faked_graphs, tower_with_runner

from emit import emit
from sglang_fa4.integration import vit_budgets as vb

# Qwen3-VL on CUDA: SGLang's rotary cache is fp32 while the tower (and so the runner's own rotary
# workspace) is bf16. Here: the tower float32, its rotary cache float64; every block records the
# dtype of the cos/sin it is handed (then computes in the tower's dtype).
seen = []
block_forward = Block.forward
def recording(self, x, cu_seqlens=None, position_embeddings=None, output_ws=None,
              rotary_pos_emb_cos=None, rotary_pos_emb_sin=None):
    seen.append(str(rotary_pos_emb_cos.dtype).replace("torch.", ""))
    return block_forward(self, x, cu_seqlens=cu_seqlens, rotary_pos_emb_cos=rotary_pos_emb_cos.to(x.dtype),
                         rotary_pos_emb_sin=rotary_pos_emb_sin.to(x.dtype))
Block.forward = recording
result = {}
with faked_graphs():
    vit, runner, mr = tower_with_runner(True)
    vit.rotary_pos_emb = nn.Module()
    vit.rotary_pos_emb.rotary_dim = D
    vit.rotary_pos_emb.register_buffer("cos_sin_cache", torch.zeros(64, D, dtype=torch.float64))
    result["dims"] = {k: str(v) for k, v in vb.infer_capture_dims(vit).items()}
    assert vb.capture_budgets_after_load_model(None, mr) is None
    state = vb.budget_state(runner)
    seen.clear()
    for total in (24, 160):  # a budget replay, then an eager run above the budgets
        tables = (torch.randn(total, D, dtype=torch.float64), torch.randn(total, D, dtype=torch.float64))
        call_run(runner, torch.randn(total, C), [0, total], None, tables, True, None)
        result[str(total)] = sorted(set(seen)); seen.clear()
    result["report"] = state.report()
emit(result)
