"""torch.compile tracing SGLang's ViT rotary through the plugin's hook, inside a REAL SGLang release,
for tests/test_vit_rotary.py."""

from emit import emit

import torch
import sglang.srt.plugins as plugins
plugins.load_plugins()
from sglang.srt.layers.rotary_embedding import utils as rope_utils
from sglang_fa4.kernels import vit
from sglang_fa4.kernels.vit import rotary as vit_rotary

calls = []
real = vit.apply_rotary  # the hook calls the ViT kernels' face
vit.apply_rotary = lambda *a, **k: calls.append(1) or real(*a, **k)
# SGLang's compiled rotary calls the rebound name: dynamo must trace through the hook in one graph
traced = torch.compile(rope_utils.apply_rotary_pos_emb_native_eager, backend="eager", fullgraph=True, dynamic=True)
g = torch.Generator().manual_seed(2)
q, k = (torch.randn(5, 2, 8, generator=g).half() for _ in range(2))
cos, sin = (torch.randn(5, 8, generator=g).half() for _ in range(2))
vit_rotary._warmed.add(vit_rotary.launch_key(q, k, cos, sin))  # as if warmed: a traced call must still be SGLang's
out = traced(q, k, cos, sin)
ref = rope_utils.apply_rotary_pos_emb_native_eager.__wrapped__(q, k, cos, sin)
emit({"equal": bool(torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])), "fused_calls": len(calls)})
