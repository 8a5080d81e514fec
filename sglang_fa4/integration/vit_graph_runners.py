"""fa4 in SGLang's ViT CUDA-graph runners (generic: Qwen2.5-VL / Qwen3-VL family; InternVL: InternVL,
InternS1, RADIO), for SGLang versions whose runners reject fa4.

fa4 takes the same seqlens layout as fa3, ``[cu_seqlens, max_seqlen]``, so the runners' own fa3 path is
right for it once two things hold: the runner builds that layout for fa4, and every FA4 kernel variant
the captured blocks will hit is compiled before capture starts (a compile inside stream capture breaks
it). Qwen2.5-VL has two layouts (64-token windows and full images) and FA4 compiles per layout, so both
are warmed, not just the one block 0 uses.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, Optional

# the runners' name for the backend whose layout fa4 shares
FA4_LAYOUT_TWIN = "fa3"


@contextmanager
def runner_layout_as_fa3(runner) -> Iterator[None]:
    """While the runner builds seqlens layouts, let it see fa4 as fa3 (same [cu_seqlens, max_seqlen])."""
    saved = runner._attn_backend
    runner._attn_backend = FA4_LAYOUT_TWIN
    try:
        yield
    finally:
        runner._attn_backend = saved


def generic_runner_layouts(runner, graph_key) -> list[list[Any]]:
    """Every distinct [cu_seqlens, max_seqlen] layout the captured blocks of ``graph_key`` will use:
    windowed + full for Qwen2.5-VL, full otherwise. max_seqlen comes from the runner's own
    per-segment length buffers (the runner syncs there too, once per capture)."""
    layouts = []
    if runner._fullatt_block_indexes:
        layouts.append([runner.cu_window_len[graph_key], int(runner.cu_window_len_kk[graph_key].max().item())])
    layouts.append([runner.cu_full_len[graph_key], int(runner.cu_full_len_kk[graph_key].max().item())])
    return layouts


def warm_generic_runner(
    runner,
    graph_key,
    position_embeddings: Optional[tuple] = None,
    rotary_pos_emb_cos=None,
    rotary_pos_emb_sin=None,
) -> int:
    """Run block 0 eagerly once per layout so FA4 compiles every variant before capture."""
    import torch

    kwargs: dict[str, Any] = {"output_ws": runner.block_ws[graph_key]}
    if position_embeddings is not None:
        kwargs["position_embeddings"] = position_embeddings
    elif rotary_pos_emb_cos is not None and rotary_pos_emb_sin is not None:
        kwargs["rotary_pos_emb_cos"] = rotary_pos_emb_cos
        kwargs["rotary_pos_emb_sin"] = rotary_pos_emb_sin
    layouts = generic_runner_layouts(runner, graph_key)
    with torch.no_grad():
        for layout in layouts:
            runner.vit.blocks[0](runner.block_input[graph_key], cu_seqlens=layout, **kwargs)
    torch.cuda.synchronize()
    return len(layouts)
