"""Startup ViT CUDA graphs over token budgets (opt-in: ``SGLANG_FA4_VIT_GRAPH_BUDGETS_ENABLE=1``
beside ``SGLANG_VIT_ENABLE_CUDA_GRAPH=1``, fa4 backend).

SGLang's generic ``ViTCudaGraphRunner`` (0.5.20 and 0.5.23) captures one graph per exact image
layout on the request path and keeps it forever. Here the runner instead gets one graph per token
budget (``SGLANG_FA4_VIT_GRAPH_BUDGETS``), all captured by :func:`capture_budgets` before serving:

* an image batch of ``T`` tokens runs in the smallest budget ``B >= T`` (or the fastest holding
  one, :mod:`~sglang_fa4.integration.vit_budget_routing`): ``x`` and the rotary tables are copied
  into the budget's static buffers, rows ``T..B`` zeroed;
* every cu_seqlens tensor of a budget has a FIXED length (a fixed address and shape), the real
  boundaries then padding segments then empty ones (:mod:`sglang_fa4.integration.vit_budget_layouts`);
* max_seqlen is fixed per budget and layout, baked into the graph at capture: ``B`` for full
  attention, the window's token count for Qwen2.5-VL's windowed blocks;
* after replay the padded output rows (merger, and Qwen3-VL deepstack mergers, rows past
  ``T / merge``) are zeroed and the real rows returned as a tensor of their own (through
  ``output_indices`` when given, else a copy): the next replay rewrites the graph's output buffer,
  and SGLang keeps what the tower returns (:mod:`sglang_fa4.integration.vit_graph_outputs`);
* a layout with more segments than the smallest budget holding its tokens holds replays in the
  next budget that holds them (smaller budgets hold fewer full-attention segment slots,
  ``vit_budget_layouts.full_slots``);
* above the largest budget, or for a layout that fits no budget holding its tokens, the
  tower runs EAGERLY (:func:`eager_run`: the runner's own per-block layout logic, no graph), not
  through the original ``run``, which would capture and keep a new graph for that layout. For
  Qwen2.5-VL a batch above the budgets is seen from ``grid_thw`` before the graph path
  (``integration.hooks.qwen2_5_vit_forward``) and takes the tower's eager forward (no device sync, no
  graph-path input preparation).

A guard counts graph captures after :func:`capture_budgets` sealed the runner and, like the FA4
compile monitor of :mod:`sglang_fa4.startup.jit_monitor`, warns or raises per
``SGLANG_FA4_JIT_MONITOR``; FA4 compiles after startup are that monitor's job (budget capture is
counted as startup there).
"""

from __future__ import annotations

import itertools
import logging
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from sglang_fa4.environ import envs
from sglang_fa4.integration.vit_budget_layouts import (
    LayoutDoesNotFit,
    budgets_from_env,
    budgets_holding,
    capture_layout,
    full_capacity,
    full_pad_segment,
    pad_layout,
    segment_capacity,
)
from sglang_fa4.integration.vit_capture_guard import (  # noqa: F401 - GraphCaptureAfterStartup re-exported
    GraphCaptureAfterStartup,
    enable_batch_invariant_first,
    flag_capture_after_startup,
)
from sglang_fa4.integration.vit_budget_eager import as_dtype, eager_run, host_layout
from sglang_fa4.integration.vit_budget_routing import replay_order, route_fastest, time_budgets
from sglang_fa4.integration.vit_graph_outputs import owned
from sglang_fa4.integration.vit_host_metadata import grid_rows, upload_ints
from sglang_fa4.selection import FA4
from sglang_fa4 import sglang_model
from sglang_fa4.startup import jit_monitor

logger = logging.getLogger("sglang_fa4")

#: the graph-key tag of budget graphs in the runner's dicts
BUDGET_TAG = "sglang_fa4_budget"
STATE_ATTR = "_sglang_fa4_budgets"


def enabled() -> bool:
    return bool(envs.SGLANG_FA4_VIT_GRAPH_BUDGETS_ENABLE.get())


@dataclass
class BudgetState:
    budgets: tuple[int, ...]
    window_tokens: Optional[int]  # Qwen2.5-VL windowed blocks; None: full attention only
    rope_kind: str  # "position_embeddings" (Qwen2.5-VL) | "rotary" (Qwen3-VL cos/sin)
    table_dtype: Any = None  # the dtype the graphs read the rotary tables in
    keys: dict[int, Any] = field(default_factory=dict)
    capacity: dict[int, int] = field(default_factory=dict)  # windowed layout
    capacity_full: dict[int, int] = field(default_factory=dict)
    cu_full: dict[int, Any] = field(default_factory=dict)
    cu_window: dict[int, Any] = field(default_factory=dict)
    graph_bytes: dict[int, Optional[int]] = field(default_factory=dict)
    replay_ms: dict[int, float] = field(default_factory=dict)  # measured at startup (route "fastest")
    sealed: bool = False
    replays: int = 0
    last_budget: Optional[int] = None  # the budget the latest replay ran in
    eager_runs: int = 0
    captures_after_startup: int = 0

    def report(self) -> dict[str, Any]:
        measured = [b for b in self.graph_bytes.values() if b is not None]
        return {
            "budgets": list(self.budgets),
            "graphs": len(self.keys),
            "window_tokens": self.window_tokens,
            "segment_capacity_full": {str(b): c for b, c in self.capacity_full.items()},
            "segment_capacity_window": ({str(b): c for b, c in self.capacity.items()}
                                        if self.window_tokens is not None else None),
            "graph_bytes": {str(b): v for b, v in self.graph_bytes.items()},
            "graph_bytes_total": sum(measured) if measured else None,
            "replay_ms": {str(b): round(v, 4) for b, v in self.replay_ms.items()},
            "replays": self.replays,
            "eager_runs": self.eager_runs,
            "captures_after_startup": self.captures_after_startup,
        }


def budget_state(runner) -> Optional[BudgetState]:
    return getattr(runner, STATE_ATTR, None)


@contextmanager
def shared_graph_pool(on: bool):
    """With ``on`` (SGLANG_FA4_VIT_GRAPH_SHARED_POOL), every ``torch.cuda.graph`` capture inside this
    block (the runner's, one per budget) draws on
    ONE private memory pool. Safe here: the budget graphs never replay concurrently (one runner,
    one stream) and the runner keeps every graph's inputs and outputs alive, so a capture reuses
    only earlier captures' temporaries. A pool per graph keeps a reserve per budget (16 budgets:
    14 GiB reserved for 2.9 GiB allocated, benchmark/results/h200/vit_graphs-fine.md), which a
    ladder dense enough for little padding cannot afford (vit_budget_layouts.dense_ladder)."""
    if not on:
        yield
        return
    import torch

    original = torch.cuda.graph
    pool = torch.cuda.graph_pool_handle()

    def graph(cuda_graph, *args, **kwargs):
        if not args and kwargs.get("pool") is None:
            kwargs["pool"] = pool
        return original(cuda_graph, *args, **kwargs)

    torch.cuda.graph = graph
    try:
        yield
    finally:
        torch.cuda.graph = original


def capture_budgets(runner, *, hidden: int, rope_dim: int, rope_kind: Optional[str] = None,
                    budgets: Optional[Sequence[int]] = None, table_dtype=None) -> BudgetState:
    """Capture one graph per budget on ``runner`` (a generic ``ViTCudaGraphRunner`` whose backend
    is fa4) and seal it: from then on ``run`` replays these graphs (or runs eagerly) and any new
    capture is flagged. ``hidden``: width of ``x`` (the tower's embed dim); ``rope_dim``: columns
    of the rotary tables; ``rope_kind``: "position_embeddings" (Qwen2.5-VL, the default for a
    tower with windowed blocks) or "rotary" (Qwen3-VL cos/sin); ``table_dtype``: the dtype of the
    rotary tables the tower hands ``run`` (default: the runner's dtype), in which the graphs read
    them: SGLang's bf16 workspace rounded Qwen3-VL's fp32 cos/sin in a replay but not in an eager
    run above the budgets, so an image's rows differed alone vs batched (issue #14)."""
    import torch

    if runner._attn_backend != FA4:
        raise ValueError(f"ViT graph budgets need the fa4 backend, the runner has {runner._attn_backend!r}")
    budgets = tuple(sorted(budgets)) if budgets is not None else budgets_from_env()
    window = sglang_model.window_tokens(runner.vit) if runner._fullatt_block_indexes else None
    if rope_kind is None:
        rope_kind = "position_embeddings" if runner._fullatt_block_indexes else "rotary"
    if rope_kind not in ("position_embeddings", "rotary"):
        raise ValueError(f"rope_kind {rope_kind!r}")
    device, dtype = runner.device, runner.dtype
    table_dtype = table_dtype or dtype
    state = BudgetState(budgets, window, rope_kind, table_dtype=table_dtype)
    setattr(runner, STATE_ATTR, state)
    cuda = torch.device(device).type == "cuda"
    if table_dtype != dtype:
        # SGLang's _get_sin_cos_ws reuses a workspace large enough; its graphs take views of it
        runner.sin_cos_ws = tuple(torch.zeros(max(budgets), rope_dim, dtype=table_dtype, device=device)
                                  for _ in range(2))
    with jit_monitor.expected_compiles(), shared_graph_pool(cuda and envs.SGLANG_FA4_VIT_GRAPH_SHARED_POOL.get()):
        # largest first: the runner's shared rotary workspace is allocated once, at full size
        for budget in sorted(budgets, reverse=True):
            cap, cap_full = segment_capacity(budget, window), full_capacity(budget, max(budgets))
            cu_full = torch.tensor(capture_layout(budget, cap_full, budget), dtype=torch.int32, device=device)
            cu_window = None
            if window is not None:
                cu_window = torch.tensor(capture_layout(budget, cap, window), dtype=torch.int32, device=device)
            x_3d = torch.zeros(budget, 1, hidden, dtype=dtype, device=device)
            table = torch.zeros(budget, rope_dim, dtype=table_dtype, device=device)
            kwargs: dict[str, Any] = {"position_embeddings": None}
            if rope_kind == "position_embeddings":
                kwargs["position_embeddings"] = (table, table.clone())
            else:
                kwargs["rotary_pos_emb_cos"], kwargs["rotary_pos_emb_sin"] = table, table.clone()
            before = torch.cuda.memory_allocated(device) if cuda else None
            key = runner.create_graph(x_3d=x_3d, cu_seqlens=cu_full, cu_window_seqlens=cu_window,
                                      attention_layout_key=(BUDGET_TAG, budget), **kwargs)
            if cuda:
                torch.cuda.synchronize(device)
            state.graph_bytes[budget] = (torch.cuda.memory_allocated(device) - before) if cuda else None
            state.keys[budget] = key
            state.capacity[budget] = cap
            state.capacity_full[budget] = cap_full
            state.cu_full[budget] = runner.cu_full_len[key]  # the captured tensors themselves
            if window is not None:
                state.cu_window[budget] = runner.cu_window_len[key]
            logger.info("sglang-fa4: ViT graph for a %d-token budget captured (%s)", budget,
                        "n/a on CPU" if not cuda else f"{state.graph_bytes[budget] / 2**20:.1f} MiB")
    if cuda and route_fastest():
        state.replay_ms = time_budgets({b: runner.block_graphs[state.keys[b]] for b in budgets})
    state.sealed = True
    rep = state.report()
    logger.info("sglang-fa4: %d ViT budget graph(s) %s captured at startup; graph memory %s",
                rep["graphs"], list(budgets),
                "not measured (CPU)" if rep["graph_bytes_total"] is None else f"{rep['graph_bytes_total'] / 2**20:.1f} MiB")
    return state


def _budget_layouts(state: BudgetState, budget: int, host_full: Sequence[int],
                    host_window: Optional[Sequence[int]]):
    """The padded (full, window-or-None) host layouts of a request in ``budget``; raises
    LayoutDoesNotFit."""
    full = pad_layout(host_full, budget, state.capacity_full[budget], max_seqlen=budget,
                      pad_segment=full_pad_segment(budget, host_full[-1] if host_full else 0))
    window = None
    if state.window_tokens is not None:
        window = pad_layout(host_window, budget, state.capacity[budget],
                            max_seqlen=min(state.window_tokens, budget))
    return full, window


def host_layouts(cu_seqlens, cu_window_seqlens, attention_layout_key):
    """The request's (full, window) cu_seqlens as host lists. SGLang's graph forwards (0.5.20,
    0.5.23) pass both as host tuples in ``attention_layout_key`` (Qwen2.5-VL: (full, window);
    Qwen3-VL: (full, None)); taken from there when their lengths match the tensors' (a shape, no
    device read), else read back from the tensors (a device sync)."""
    key = attention_layout_key if isinstance(attention_layout_key, tuple) and len(attention_layout_key) == 2 else (None, None)

    def pick(tensor, given):
        if tensor is None:
            return None
        if isinstance(given, (tuple, list)) and len(given) == int(tensor.shape[0]):
            values = list(given)
            if all(map(isinstance, values, itertools.repeat(int))):
                return values
        return host_layout(tensor)

    return pick(cu_seqlens, key[0]), pick(cu_window_seqlens, key[1])


def _replay_budget(runner, state: BudgetState, budget: int, full, window, x, tables, output_indices):
    tokens = x.shape[0]
    key = state.keys[budget]
    upload_ints(state.cu_full[budget], full)
    if window is not None:
        upload_ints(state.cu_window[budget], window)
    block_input = runner.block_input[key]
    block_input[:tokens].copy_(x.unsqueeze(1))
    block_input[tokens:].zero_()
    for ws, src in zip(runner._sin_cos_ws_by_graph[key], tables):
        ws[:tokens].copy_(src)
        ws[tokens:].zero_()
    runner.block_graphs[key].replay()
    out = runner.block_output[key]
    rows = tokens // (budget // out.shape[0])
    out[rows:].zero_()  # padded rows: no stale or padding values leave the graph
    state.replays += 1
    state.last_budget = budget
    if output_indices is not None:
        return out.index_select(0, output_indices)
    return owned(out[:rows], out)  # the next replay rewrites `out`; the caller keeps what we return


def run_around(original, self, x, cu_seqlens, cu_window_seqlens=None, position_embeddings=None,
               rotary_pos_emb_cos=None, rotary_pos_emb_sin=None, output_indices=None,
               attention_layout_key=None):
    """AROUND ViTCudaGraphRunner.run: on a runner sealed by :func:`capture_budgets`, replay the
    smallest budget that fits, else run eagerly; any other runner runs upstream's ``run``."""
    state = budget_state(self)
    if state is None or not state.sealed:
        return original(self, x, cu_seqlens, cu_window_seqlens, position_embeddings,
                        rotary_pos_emb_cos, rotary_pos_emb_sin, output_indices, attention_layout_key)
    tokens = x.shape[0]
    holding = budgets_holding(tokens, state.budgets)
    host_full, host_window = host_layouts(cu_seqlens, cu_window_seqlens, attention_layout_key)
    if holding:
        tables = position_embeddings if state.rope_kind == "position_embeddings" else (rotary_pos_emb_cos, rotary_pos_emb_sin)
        merge = holding[0] // int(self.block_output[state.keys[holding[0]]].shape[0])
        misfit = None
        if tables is None or any(t is None for t in tables):
            misfit = LayoutDoesNotFit(f"the budget graphs were captured with {state.rope_kind}")
        elif tokens % merge:
            misfit = LayoutDoesNotFit(f"{tokens} tokens are not a multiple of the merger's {merge}")
        for budget in ([] if misfit else replay_order(holding, state.replay_ms)):  # a misfit tries the next
            try:
                full, window = _budget_layouts(state, budget, host_full, host_window)
            except LayoutDoesNotFit as exc:
                misfit = exc
                continue
            return _replay_budget(self, state, budget, full, window, x, tables, output_indices)
        logger.info("sglang-fa4: ViT batch of %d tokens runs eagerly: %s", tokens, misfit)
    state.eager_runs += 1  # below: the tables in the dtype a replay reads them in
    position_embeddings, rotary_pos_emb_cos, rotary_pos_emb_sin = (
        as_dtype(t, state.table_dtype) for t in (position_embeddings, rotary_pos_emb_cos, rotary_pos_emb_sin))
    return eager_run(self, x, cu_seqlens, cu_window_seqlens, position_embeddings,
                     rotary_pos_emb_cos, rotary_pos_emb_sin, output_indices,
                     host=(host_full, host_window))


def exceeds_budgets(state: BudgetState, grid_thw) -> bool:
    """From host data (grid_thw): a batch no budget graph holds (more tokens than the largest
    budget, or more images than the full-attention layout's slots)."""
    rows = grid_rows(grid_thw)
    tokens = sum(t * h * w for t, h, w in rows)
    return tokens > max(state.budgets) or len(rows) > envs.SGLANG_FA4_VIT_GRAPH_MAX_SEGMENTS.get()


def create_graph_around(original, self, *args, **kwargs):
    """AROUND ViTCudaGraphRunner.create_graph: the capture guard. On a sealed runner a capture is
    counted and warned about or raised per SGLANG_FA4_JIT_MONITOR (off / warn / raise)."""
    state = budget_state(self)
    if state is not None and state.sealed:
        state.captures_after_startup += 1
        flag_capture_after_startup(f"sglang-fa4: ViT CUDA graph captured after the startup budgets "
                                   f"(#{state.captures_after_startup}); budgets {list(state.budgets)}")
    return original(self, *args, **kwargs)


def infer_capture_dims(vit) -> dict[str, Any]:
    """``hidden``, ``rope_kind`` and ``rope_dim`` of a Qwen2.5-VL / Qwen3-VL vision tower, read
    from the modules that produce them: the width of block 0's ``norm1``; Qwen2.5-VL
    (``fullatt_block_indexes``): ``position_embeddings`` = cat(rot, rot) over 2 position axes,
    4 * len(rotary_pos_emb.inv_freq) columns; Qwen3-VL: rotary cos/sin of
    ``rotary_pos_emb.rotary_dim`` columns, in the dtype of ``rotary_pos_emb.cos_sin_cache``
    (``table_dtype``; None: the tower's). Raises ValueError when a tower has neither."""
    norm = getattr(vit.blocks[0], "norm1", None)
    weight = getattr(norm, "weight", None)
    if weight is None:
        raise ValueError("cannot read the tower's width: blocks[0].norm1.weight is missing")
    rope = getattr(vit, "rotary_pos_emb", None)
    windowed = bool(getattr(vit, "fullatt_block_indexes", None))
    if getattr(rope, "inv_freq", None) is not None:
        rope_dim = 4 * int(rope.inv_freq.numel())
    elif getattr(rope, "rotary_dim", None) is not None:
        rope_dim = int(rope.rotary_dim)
    else:
        raise ValueError("cannot read the rotary table width: rotary_pos_emb has neither inv_freq nor rotary_dim")
    # Qwen3-VL's cos/sin are slices of SGLang's rotary cache (fp32 on CUDA); Qwen2.5-VL casts its own
    cache = getattr(rope, "cos_sin_cache", None)
    table_dtype = None if windowed or cache is None else cache.dtype
    return {"hidden": int(weight.shape[0]), "rope_kind": "position_embeddings" if windowed else "rotary",
            "rope_dim": rope_dim, "table_dtype": table_dtype}


def find_runners(model) -> list:
    """The generic ViT graph runners a loaded model holds (Qwen2.5-VL ``cuda_graph_runner``,
    Qwen3-VL ``graph_runners``), each once."""
    from sglang.srt.multimodal.vit_cuda_graph_runner import ViTCudaGraphRunner

    found, seen = [], set()
    modules = model.modules() if hasattr(model, "modules") else ()
    for module in modules:
        for name in ("cuda_graph_runner", "graph_runners"):
            runner = getattr(module, name, None)
            if isinstance(runner, ViTCudaGraphRunner) and id(runner) not in seen:
                seen.add(id(runner))
                found.append(runner)
    return found


def capture_model_budgets(model) -> list[BudgetState]:
    """Startup: capture the budgets on every fa4 generic ViT runner of ``model``. A runner that
    fails (dims not readable, capture error) is logged and left to upstream's per-layout path."""
    states = []
    for runner in find_runners(model):
        if runner._attn_backend != FA4:
            continue
        try:
            dims = infer_capture_dims(runner.vit)
            import torch

            with torch.no_grad():
                states.append(capture_budgets(runner, **dims))
        except Exception as exc:  # noqa: BLE001 - the server still runs, upstream's way
            if hasattr(runner, STATE_ATTR):
                delattr(runner, STATE_ATTR)
            logger.warning("sglang-fa4: ViT graph budgets not captured (%s: %s); the runner captures "
                           "per image layout as upstream does", type(exc).__name__, exc)
    return states


def capture_budgets_after_load_model(result, self, *args, **kwargs):
    """AFTER ModelRunner.load_model (after the FA4 startup warmup hook): capture the ViT budget
    graphs before serving. Returns None: SGLang keeps load_model's own result. SGLang's
    batch-invariant kernels are turned on first (``vit_capture_guard.enable_batch_invariant_first``)."""
    if enabled() and envs.SGLANG_VIT_ENABLE_CUDA_GRAPH.get():
        enable_batch_invariant_first(self)
        capture_model_budgets(getattr(self, "model", None))
    return None
