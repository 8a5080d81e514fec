"""Qwen2.5-VL's eager ViT forward with its layouts from host data (vit_host_metadata).

Same computation as SGLang's ``Qwen2_5_VisionTransformer.forward`` (0.5.20 and 0.5.23 have the
same one), minus what made it read the device: the window permutation, both cu_seqlens sets and
the rotary position ids arrive in one non-blocking copy, and each block gets a
``VisionAttentionMetadata`` whose ``max_seqlen`` is a host int, so no attention backend computes
it with ``.item()``. SGLang-independent: the caller passes SGLang's metadata class.
"""

from __future__ import annotations

import torch

from sglang_fa4.integration import vit_host_metadata
from sglang_fa4.sglang_model import full_attention_blocks


def eager_forward(vit, x: torch.Tensor, grid_thw, metadata_cls) -> torch.Tensor:
    """`vit`: a Qwen2_5_VisionTransformer; x: (patches, C*T*P*P); returns (patches / unit, out)."""
    x = x.to(device=vit.device, dtype=vit.dtype)
    x = vit.patch_embed(x)

    layout = vit_host_metadata.to_device(
        vit_host_metadata.host_layout(grid_thw, vit_host_metadata.ViTGeometry.of(vit)), x.device
    )
    seq_len = x.shape[0]
    unit = vit.spatial_merge_unit
    x = x.reshape(seq_len // unit, unit, -1)[layout.window_index].reshape(seq_len, -1)

    # the rotary table is built on the device from a length (no copy); the ids are already in
    # window order, so the gather gives upstream's rows in upstream's order
    freqs = vit.rotary_pos_emb(torch.arange(layout.max_grid, device=x.device))
    rotary = freqs[layout.pos_ids].flatten(1).to(dtype=x.dtype)
    emb = torch.cat((rotary, rotary), dim=-1)
    position_embeddings = (emb.cos(), emb.sin())

    full = metadata_cls(cu_seqlens=layout.cu_full, seq_lens=layout.seq_lens_full, max_seqlen=layout.max_full)
    window = metadata_cls(
        cu_seqlens=layout.cu_window, seq_lens=layout.seq_lens_window, max_seqlen=layout.max_window
    )
    full_blocks = full_attention_blocks(vit)

    x = x.unsqueeze(1)
    for i, block in enumerate(vit.blocks):
        metadata = full if i in full_blocks else window
        x = block(
            x,
            cu_seqlens=metadata.cu_seqlens,
            position_embeddings=position_embeddings,
            forward_metadata=metadata,
        )
    x = vit.merger(x)
    return x[layout.reverse_index, :]
