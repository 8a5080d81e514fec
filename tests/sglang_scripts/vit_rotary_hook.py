"""The plugin's ViT rotary hook inside a REAL SGLang release: SGLang's graph-path rotary routed to the
fused kernel (Triton interpreted on the CPU), for tests/test_vit_rotary.py."""

from emit import emit

import torch
from unittest import mock
import sglang.srt.plugins as plugins
plugins.load_plugins()
from sglang.srt.layers.attention import vision
from sglang.srt.layers.rotary_embedding import utils as rope_utils
from sglang_fa4.kernels import vit
from sglang_fa4.kernels.vit import rotary as vit_rotary

calls = []
real_apply = vit.apply_rotary  # the hook calls the ViT kernels' face
def spy(*a, **kw):
    calls.append(1)
    return real_apply(*a, **kw)
vit.apply_rotary = spy

d, heads = 8, 2
g = torch.Generator().manual_seed(1)
q, k = (torch.randn(5, heads, d, generator=g).half() for _ in range(2))
cos, sin = (torch.randn(5, d, generator=g).half() for _ in range(2))
ref = rope_utils.apply_rotary_pos_emb_native_eager.__wrapped__(q, k, cos, sin)

res = {"wrapped": hasattr(vision.apply_rotary_pos_emb_native_eager, "__wrapped__"),
       "compiled_rotary_sees_wrapper": rope_utils.apply_rotary_pos_emb_native_eager is vision.apply_rotary_pos_emb_native_eager}
vision.apply_rotary_pos_emb_native_eager(q, k, cos, sin)
res["calls_before_warm"] = len(calls)  # not warmed: the original
vit_rotary.warm(d, heads, heads, "float16", table_dtypes=("float16",), device="cpu")
calls.clear()
got = vision.apply_rotary_pos_emb_native_eager(q, k, cos, sin)
res["calls_after_warm"] = len(calls)
res["equal_to_native"] = torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
calls.clear()
vision.apply_rotary_pos_emb_native_eager(q.unsqueeze(0), k.unsqueeze(0), cos.unsqueeze(0), sin.unsqueeze(0), 2)
res["calls_other_shape"] = len(calls)
calls.clear()
with mock.patch("torch.compiler.is_compiling", return_value=True):  # traced by torch.compile
    vision.apply_rotary_pos_emb_native_eager(q, k, cos, sin)
res["calls_compiling"] = len(calls)
emit(res)
