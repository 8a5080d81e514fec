"""The startup capture of the ViT budget graphs (:mod:`sglang_fa4.integration.vit_budgets` replays
them): the runner's state (:class:`BudgetState`), one graph per budget through the runner's own
``create_graph``, smallest budget first within the memory bound
(:mod:`sglang_fa4.integration.vit_budget_memory`), measured on CUDA, and the one log line of what
was captured, what it took and what was trimmed."""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from sglang_fa4.environ import envs
from sglang_fa4.integration import vit_budget_memory
from sglang_fa4.integration.vit_budget_layouts import budgets_from_env, capture_layout, full_capacity, segment_capacity
from sglang_fa4.integration.vit_budget_routing import route_fastest, time_budgets
from sglang_fa4.selection import FA4
from sglang_fa4 import sglang_model
from sglang_fa4.startup import jit_monitor

logger = logging.getLogger("sglang_fa4")

#: the graph-key tag of budget graphs in the runner's dicts
BUDGET_TAG = "sglang_fa4_budget"
STATE_ATTR = "_sglang_fa4_budgets"


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
    graph_bytes: dict[int, Optional[int]] = field(default_factory=dict)  # allocated growth (CUDA)
    reserved_bytes: dict[int, Optional[int]] = field(default_factory=dict)  # reserved growth (CUDA)
    estimate_bytes: dict[int, int] = field(default_factory=dict)  # vit_budget_memory's, every asked budget
    asked: tuple[int, ...] = ()  # the ladder asked for (SGLANG_FA4_VIT_GRAPH_BUDGETS)
    trimmed: tuple[int, ...] = ()  # asked, not captured: over SGLANG_FA4_VIT_GRAPH_MEMORY_MB
    memory_limit: int = 0  # bytes
    replay_ms: dict[int, float] = field(default_factory=dict)  # measured at startup (route "fastest")
    sealed: bool = False
    replays: int = 0
    last_budget: Optional[int] = None  # the budget the latest replay ran in
    eager_runs: int = 0
    captures_after_startup: int = 0

    def report(self) -> dict[str, Any]:
        measured = [b for b in self.graph_bytes.values() if b is not None]
        reserved = [b for b in self.reserved_bytes.values() if b is not None]
        return {
            "budgets": list(self.budgets),
            "graphs": len(self.keys),
            "window_tokens": self.window_tokens,
            "segment_capacity_full": {str(b): c for b, c in self.capacity_full.items()},
            "segment_capacity_window": ({str(b): c for b, c in self.capacity.items()}
                                        if self.window_tokens is not None else None),
            "graph_bytes": {str(b): v for b, v in self.graph_bytes.items()},
            "graph_bytes_total": sum(measured) if measured else None,
            "reserved_bytes": {str(b): v for b, v in self.reserved_bytes.items()},
            "reserved_bytes_total": sum(reserved) if reserved else None,
            "estimate_bytes": {str(b): self.estimate_bytes[b] for b in self.budgets if b in self.estimate_bytes},
            "estimate_bytes_total": sum(self.estimate_bytes.get(b, 0) for b in self.budgets),
            "memory_limit_mb": self.memory_limit // vit_budget_memory.MIB,
            "asked": list(self.asked),
            "trimmed": list(self.trimmed),
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
    14 GiB reserved for 2.9 GiB allocated, ``git show 244b9bd:benchmark/results/h200/vit_graphs-fine.md``), which a
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


def reserved_bytes(device) -> Optional[int]:
    """The caching allocator's reserved bytes on ``device`` (CUDA), None elsewhere (nothing to
    measure: the ladder is then bounded by the estimate alone)."""
    import torch

    if torch.device(device).type != "cuda":
        return None
    torch.cuda.synchronize(device)
    return int(torch.cuda.memory_reserved(device))


def capture_budgets(runner, *, hidden: int, rope_dim: int, rope_kind: Optional[str] = None,
                    budgets: Optional[Sequence[int]] = None, table_dtype=None,
                    memory_limit: Optional[int] = None) -> BudgetState:
    """Capture one graph per budget on ``runner`` (a generic ``ViTCudaGraphRunner`` whose backend
    is fa4) and seal it: from then on ``run`` replays these graphs (or runs eagerly) and any new
    capture is flagged. ``hidden``: width of ``x`` (the tower's embed dim); ``rope_dim``: columns
    of the rotary tables; ``rope_kind``: "position_embeddings" (Qwen2.5-VL, the default for a
    tower with windowed blocks) or "rotary" (Qwen3-VL cos/sin); ``table_dtype``: the dtype of the
    rotary tables the tower hands ``run`` (default: the runner's dtype), in which the graphs read
    them: SGLang's bf16 workspace rounded Qwen3-VL's fp32 cos/sin in a replay but not in an eager
    run above the budgets, so an image's rows differed alone vs batched (issue #14).

    ``memory_limit``: bytes the graphs may take (default SGLANG_FA4_VIT_GRAPH_MEMORY_MB): the ladder
    is trimmed to fit, largest budgets first (:mod:`sglang_fa4.integration.vit_budget_memory`), and
    the budgets are captured smallest first, each measured on CUDA. With no budget fitting, the
    runner is sealed with none: every batch runs eagerly, none is captured while serving."""
    import torch

    if runner._attn_backend != FA4:
        raise ValueError(f"ViT graph budgets need the fa4 backend, the runner has {runner._attn_backend!r}")
    asked = tuple(sorted(budgets)) if budgets is not None else budgets_from_env()
    window = sglang_model.window_tokens(runner.vit) if runner._fullatt_block_indexes else None
    if rope_kind is None:
        rope_kind = "position_embeddings" if runner._fullatt_block_indexes else "rotary"
    if rope_kind not in ("position_embeddings", "rotary"):
        raise ValueError(f"rope_kind {rope_kind!r}")
    device, dtype = runner.device, runner.dtype
    table_dtype = table_dtype or dtype
    cuda = torch.device(device).type == "cuda"
    shared = cuda and envs.SGLANG_FA4_VIT_GRAPH_SHARED_POOL.get()
    widths = vit_budget_memory.tower_widths(
        runner.vit, rope_dim=rope_dim, dtype_bytes=torch.empty((), dtype=dtype).element_size(),
        table_bytes=torch.empty((), dtype=table_dtype).element_size())
    limit = vit_budget_memory.limit_bytes() if memory_limit is None else memory_limit
    estimates = vit_budget_memory.ladder_costs(asked, widths, shared_pool=shared)
    planned, _ = vit_budget_memory.fit_ladder(estimates, limit)
    account = vit_budget_memory.MemoryAccount(limit, estimates)
    state = BudgetState(planned, window, rope_kind, table_dtype=table_dtype)
    state.asked, state.memory_limit, state.estimate_bytes = asked, limit, estimates
    setattr(runner, STATE_ATTR, state)
    before = reserved_bytes(device)  # the workspace below counts towards the first budget
    if planned:
        # one rotary workspace for every budget, at the largest's size (SGLang's _get_sin_cos_ws takes
        # views of one large enough; budgets captured smallest first would otherwise retire a
        # workspace at each step)
        runner.sin_cos_ws = tuple(torch.zeros(max(planned), rope_dim, dtype=table_dtype, device=device)
                                  for _ in range(2))
    with jit_monitor.expected_compiles(), shared_graph_pool(shared):
        for budget in planned:  # smallest first: the bound trims from the top
            if not account.allows(budget):
                break  # measured on CUDA above the estimate: the planned largest holds the full
                # MAX_SEGMENTS slots, a smaller last one fewer (batches with more images run eagerly)
            allocated = torch.cuda.memory_allocated(device) if cuda else None
            _capture_one(runner, state, budget, hidden, rope_dim, max(planned))
            after = reserved_bytes(device)
            account.record(budget, None if before is None else after - before)
            before = after
            state.reserved_bytes[budget] = account.measured[budget]
            state.graph_bytes[budget] = (torch.cuda.memory_allocated(device) - allocated) if cuda else None
    state.budgets = tuple(account.captured)
    state.trimmed = tuple(b for b in asked if b not in state.budgets)
    if cuda and route_fastest() and state.budgets:
        state.replay_ms = time_budgets({b: runner.block_graphs[state.keys[b]] for b in state.budgets})
    state.sealed = True
    _log_capture(state)
    return state


def _capture_one(runner, state: BudgetState, budget: int, hidden: int, rope_dim: int, largest: int) -> None:
    """Capture ``budget``'s graph through the runner's own ``create_graph`` (its eager warmup, then
    the capture) and keep its fixed-length cu_seqlens tensors."""
    import torch

    device, dtype, window = runner.device, runner.dtype, state.window_tokens
    cap, cap_full = segment_capacity(budget, window), full_capacity(budget, largest)
    cu_full = torch.tensor(capture_layout(budget, cap_full, budget), dtype=torch.int32, device=device)
    cu_window = None
    if window is not None:
        cu_window = torch.tensor(capture_layout(budget, cap, window), dtype=torch.int32, device=device)
    x_3d = torch.zeros(budget, 1, hidden, dtype=dtype, device=device)
    table = torch.zeros(budget, rope_dim, dtype=state.table_dtype, device=device)
    kwargs: dict[str, Any] = {"position_embeddings": None}
    if state.rope_kind == "position_embeddings":
        kwargs["position_embeddings"] = (table, table.clone())
    else:
        kwargs["rotary_pos_emb_cos"], kwargs["rotary_pos_emb_sin"] = table, table.clone()
    key = runner.create_graph(x_3d=x_3d, cu_seqlens=cu_full, cu_window_seqlens=cu_window,
                              attention_layout_key=(BUDGET_TAG, budget), **kwargs)
    state.keys[budget] = key
    state.capacity[budget] = cap
    state.capacity_full[budget] = cap_full
    state.cu_full[budget] = runner.cu_full_len[key]  # the captured tensors themselves
    if window is not None:
        state.cu_window[budget] = runner.cu_window_len[key]


def _log_capture(state: BudgetState) -> None:
    """The one line of what the startup captured, what it took and what the bound trimmed."""
    rep = state.report()
    mib = vit_budget_memory.mib
    measured = []
    if rep["graph_bytes_total"] is not None:
        measured.append(f"{mib(rep['graph_bytes_total'])} allocated")
    if rep["reserved_bytes_total"] is not None:
        measured.append(f"{mib(rep['reserved_bytes_total'])} reserved")
    bound = f"the {mib(state.memory_limit)} bound (SGLANG_FA4_VIT_GRAPH_MEMORY_MB)"
    args = (rep["graphs"], list(state.budgets), ", ".join(measured) or "not measured (CPU)",
            mib(rep["estimate_bytes_total"]), f"trimmed {list(state.trimmed)} to fit {bound}" if state.trimmed
            else f"within {bound}")
    # benchmark/serve_check/logcheck.py reads this line from server logs
    line = "sglang-fa4: %d ViT budget graph(s) %s captured at startup; graph memory %s, estimate %s; %s"
    if not state.budgets:
        logger.warning(line + ": no budget fits, every ViT batch runs eagerly (raise the bound, or "
                       "SGLANG_FA4_VIT_GRAPH_BUDGETS_ENABLE=0 for SGLang's per-layout graphs)", *args)
    else:
        logger.info(line, *args)
