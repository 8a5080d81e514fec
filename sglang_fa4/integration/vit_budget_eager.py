"""The eager path of the ViT budget graphs (:mod:`sglang_fa4.integration.vit_budgets`): a batch no
budget holds runs the captured computation (blocks + merger + deepstack mergers) eagerly with its
own layouts, never through upstream's ``run``, which would capture and keep a graph for it."""

from __future__ import annotations

from typing import Any, Sequence

from sglang_fa4 import sglang_model


def host_layout(cu) -> list[int]:
    return [int(v) for v in (cu.tolist() if hasattr(cu, "tolist") else cu)]


def _max_len(layout: Sequence[int]) -> int:
    return max((b - a for a, b in zip(layout, layout[1:])), default=0)


def eager_run(runner, x, cu_seqlens, cu_window_seqlens, position_embeddings=None,
              rotary_pos_emb_cos=None, rotary_pos_emb_sin=None, output_indices=None, host=None):
    """The captured computation (blocks + merger + deepstack mergers) run eagerly with the
    request's own layouts: the runner's per-block layout choice, fa4's [cu_seqlens, max_seqlen].
    ``host``: the (full, window) layouts as host lists where the caller has them (no read-back)."""
    import torch

    vit = runner.vit
    host_full, host_window = host if host is not None else (None, None)
    full = [cu_seqlens, _max_len(host_full if host_full is not None else host_layout(cu_seqlens))]
    window = None
    if runner._fullatt_block_indexes:
        window = [cu_window_seqlens,
                  _max_len(host_window if host_window is not None else host_layout(cu_window_seqlens))]
    rope: dict[str, Any] = {}
    if position_embeddings is not None:
        rope["position_embeddings"] = position_embeddings
    elif rotary_pos_emb_cos is not None and rotary_pos_emb_sin is not None:
        rope = {"rotary_pos_emb_cos": rotary_pos_emb_cos, "rotary_pos_emb_sin": rotary_pos_emb_sin}
    deep = []
    deep_idx = 0
    full_blocks = sglang_model.full_attention_blocks(vit)
    with torch.no_grad():
        y = x.unsqueeze(1)
        for layer_num, blk in enumerate(vit.blocks):
            layout = full if window is None or layer_num in full_blocks else window
            y = blk(y, cu_seqlens=layout, **rope)
            if runner._deepstack_visual_indexes and layer_num in runner._deepstack_visual_indexes:
                deep.append(runner._deepstack_merger_list[deep_idx](y))
                deep_idx += 1
        out = vit.merger(y)
        if deep:
            out = torch.cat([out] + deep, dim=1)
    if output_indices is not None:
        out = out.index_select(0, output_indices)
    return out


def as_dtype(table, dtype):
    """A rotary table (or a (cos, sin) pair, or None) in ``dtype`` (None: as it is)."""
    if table is None or dtype is None:
        return table
    if isinstance(table, (tuple, list)):
        return type(table)(as_dtype(t, dtype) for t in table)
    return table if table.dtype == dtype else table.to(dtype)
