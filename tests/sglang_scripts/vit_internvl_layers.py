"""InternViT-shaped layers for SGLang's InternVL runner (it reads layers[0].attn.attn's backend
name), on the fa4 backend of tests/sglang_scripts/vit_budget_tower.py; imported by the scripts of
tests/test_vit_graph_outputs.py and tests/test_internvl_startup_graphs.py."""

import torch
import torch.nn as nn
from vit_budget_tower import C, D, H, Attn  # first: loads the plugin
from sglang.srt.multimodal import internvl_vit_cuda_graph_runner as ir  # noqa: F401  (for the scripts)


class Outer(nn.Module):  # InternAttention: VisionAttention as .attn
    def __init__(self, backend="fa4"):
        super().__init__()
        self.attn = Attn()
        self.attn.qkv_backend_name = backend


class Layer(nn.Module):  # InternViT: [B, S, H] tiles, attention over each tile
    def __init__(self, backend="fa4"):
        super().__init__()
        self.attn = Outer(backend)
        self.proj = nn.Linear(C, C)

    def forward(self, x, cu_seqlens=None, output_ws=None):
        b, s, h = x.shape
        q = x.reshape(b * s, H, D)
        o = self.attn.attn.backend.forward(q, q, q, cu_seqlens=cu_seqlens, bsz=b, seq_len=s)
        return x + self.proj(o.reshape(x.shape))


hooked_capture = ir.InternViTCudaGraphRunner._capture_graph  # SGLang's, with the plugin's hooks


def replaying_capture(captured=None):
    """A stand-in for InternViTCudaGraphRunner._capture_graph: SGLang's capture (graphs faked), then
    the fake graph's replay re-runs the captured body over the same static buffers into the same
    output tensor, as a real graph does; each captured key is appended to ``captured`` if given."""
    def recording_capture(self, key):
        if captured is not None:
            captured.append(list(key))
        hooked_capture(self, key)
        static = self.out[key]

        def again():
            with torch.no_grad():
                y = self.inp[key]
                for blk in self.encoder.layers:
                    y = blk(y, cu_seqlens=[self.cu[key], int(self.cu_kk[key].max())], output_ws=self.ws[key])
            static.copy_(y)
        self.graphs[key].again = again
    return recording_capture
