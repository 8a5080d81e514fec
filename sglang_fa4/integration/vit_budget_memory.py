"""How much device memory the ViT budget graphs may take (``SGLANG_FA4_VIT_GRAPH_MEMORY_MB``) and
which budgets fit in it. Pure Python (no torch, no SGLang): the tower is read duck-typed.

What counts, per budget ``B``: what the server loses to its graph, i.e. the allocator's reserved
growth across the capture: the static buffers (input, attention workspace, output, the rotary
tables, the fixed-length cu_seqlens) and the graph's private memory pool, which keeps one block's
peak temporaries (reused block to block, so the depth does not count). Before capture it is
ESTIMATED from block 0's shapes (:func:`tower_widths`, :func:`budget_cost`); on CUDA every capture
is also MEASURED (``torch.cuda.memory_reserved`` before / after) and :class:`MemoryAccount` stops
the ladder when the memory measured so far plus the next budget's estimate, scaled up by how far
the estimates have fallen short, would pass the bound.

The ladder is trimmed largest budgets first: the budgets are taken smallest first while their
running cost fits (:func:`fit_ladder`); a batch above the largest kept budget runs eagerly, as any
batch above the ladder always did.

The estimate, per token of the budget (``dtype``: the tower's element size; ``linear_out``: the
output widths of block 0's linear layers summed, per tensor-parallel rank):

    static = dtype * 3 * hidden + table_dtype * 2 * rope_dim     (input, workspace, output; cos, sin)
    pool   = dtype * (2 * linear_out + 3 * hidden)                (one block's temporaries)

Against the H200's reserved growth over the 9-budget default ladder (1494 MiB Qwen2.5-VL-7B,
1512 MiB Qwen3-VL-8B; benchmark/results/h200/vit_graphs-ladder896-0.5.23.json.gz) it gives 2103 and
1666 MiB: 1.41x and 1.10x over.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Optional, Sequence

from sglang_fa4.environ import EnvValueError, envs

MIB = 2**20


@dataclass(frozen=True)
class TowerWidths:
    """What the estimate reads from a vision tower (per tensor-parallel rank)."""

    hidden: int  # width of x (block 0's norm1)
    linear_out: int  # block 0's linear layers' output widths, summed (qkv, proj, MLP up/gate, down)
    rope_dim: int  # columns of each rotary table
    dtype_bytes: int = 2  # the tower's element size
    table_bytes: int = 2  # the rotary tables' element size (Qwen3-VL: fp32 cos/sin)

    def __post_init__(self):
        for name in ("hidden", "linear_out", "rope_dim", "dtype_bytes", "table_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"TowerWidths.{name} must be a positive integer, got {value!r}")


#: the two towers the budgets were measured with on the H200 (SGLang's configs, bf16, TP 1): what
#: doctor reports the ladder for
REFERENCE_TOWERS = {
    # hidden 1280, MLP 3420, 16 heads of 80: qkv 3840 + proj 1280 + gate_up 6840 + down 1280
    "Qwen2.5-VL-7B": TowerWidths(hidden=1280, linear_out=13240, rope_dim=80),
    # hidden 1152, MLP 4304, 16 heads of 72: qkv 3456 + proj 1152 + fc1 4304 + fc2 1152; fp32 cos/sin
    "Qwen3-VL-8B": TowerWidths(hidden=1152, linear_out=10064, rope_dim=36, table_bytes=4),
}


def limit_bytes() -> int:
    """SGLANG_FA4_VIT_GRAPH_MEMORY_MB in bytes (environ.yaml bounds it)."""
    return int(envs.SGLANG_FA4_VIT_GRAPH_MEMORY_MB.get()) * MIB


def static_bytes(budget: int, w: TowerWidths) -> int:
    return budget * (w.dtype_bytes * 3 * w.hidden + w.table_bytes * 2 * w.rope_dim)


def pool_bytes(budget: int, w: TowerWidths) -> int:
    return budget * w.dtype_bytes * (2 * w.linear_out + 3 * w.hidden)


def budget_cost(budget: int, w: TowerWidths, *, shared_pool: bool = False, previous: Optional[int] = None) -> int:
    """Estimated bytes budget ``budget`` adds to the ladder. With one shared pool
    (SGLANG_FA4_VIT_GRAPH_SHARED_POOL) the pool is as large as the largest budget's temporaries, so a
    budget adds its static buffers and the pool's growth over ``previous`` (the next smaller kept one)."""
    if budget <= 0:
        raise ValueError(f"budget must be positive, got {budget}")
    pool = pool_bytes(budget, w)
    if shared_pool and previous is not None:
        pool = max(0, pool - pool_bytes(previous, w))
    return static_bytes(budget, w) + pool


def ladder_costs(budgets: Iterable[int], w: TowerWidths, *, shared_pool: bool = False) -> dict[int, int]:
    """Estimated bytes each budget adds, smallest first (the order they are kept in)."""
    costs: dict[int, int] = {}
    previous = None
    for b in sorted(set(budgets)):
        costs[b] = budget_cost(b, w, shared_pool=shared_pool, previous=previous)
        previous = b
    return costs


def fit_ladder(costs: Mapping[int, int], limit: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(kept, trimmed): the budgets of ``costs`` (budget -> bytes), smallest first, while their total
    stays within ``limit`` bytes (an exact fit is kept); every larger one is trimmed."""
    if limit < 0:
        raise ValueError(f"limit must be >= 0 bytes, got {limit}")
    kept: list[int] = []
    total = 0
    ordered = sorted(costs)
    for i, b in enumerate(ordered):
        if total + costs[b] > limit:
            return tuple(kept), tuple(ordered[i:])
        total += costs[b]
        kept.append(b)
    return tuple(kept), ()


class MemoryAccount:
    """The bound during capture (smallest budget first). Each budget is asked for before its
    capture (:meth:`allows`) and recorded after it (:meth:`record`, the measured bytes, or None where
    nothing can be measured: CPU). The next budget is charged its estimate, times the ratio of the
    memory measured so far to its estimate when that ratio exceeds 1 (the estimate fell short)."""

    def __init__(self, limit: int, estimates: Mapping[int, int]):
        self.limit = limit
        self.estimates = dict(estimates)
        self.captured: list[int] = []
        self.measured: dict[int, Optional[int]] = {}
        self.stopped: Optional[int] = None  # the first budget refused

    @property
    def measured_total(self) -> Optional[int]:
        values = [v for v in self.measured.values() if v is not None]
        return sum(values) if values else None

    def _charged(self) -> int:
        """Bytes charged to the captured budgets: measured where measured, else estimated."""
        return sum(self.estimates[b] if self.measured[b] is None else self.measured[b] for b in self.captured)

    def _shortfall(self) -> float:
        measured = [b for b in self.captured if self.measured[b] is not None]
        est = sum(self.estimates[b] for b in measured)
        return max(1.0, sum(self.measured[b] for b in measured) / est) if measured and est else 1.0

    def predicted(self, budget: int) -> int:
        return int(self.estimates[budget] * self._shortfall())

    def allows(self, budget: int) -> bool:
        if self.stopped is not None:
            return False
        if self._charged() + self.predicted(budget) > self.limit:
            self.stopped = budget
            return False
        return True

    def record(self, budget: int, measured: Optional[int]) -> None:
        self.captured.append(budget)
        self.measured[budget] = measured


def tower_widths(vit, *, rope_dim: int, dtype_bytes: int, table_bytes: int) -> TowerWidths:
    """The widths of a Qwen2.5-VL / Qwen3-VL tower (any tower with ``blocks[0]``): ``hidden`` from
    block 0's ``norm1``, ``linear_out`` from every 2-D weight under block 0 (its linear layers; the
    first dimension is the output width, per TP rank for sharded layers). Raises ValueError when a
    width cannot be read."""
    block = vit.blocks[0]
    norm = getattr(getattr(block, "norm1", None), "weight", None)
    if norm is None:
        raise ValueError("cannot read the tower's width: blocks[0].norm1.weight is missing")
    linear_out = 0
    for module in block.modules():
        weight = getattr(module, "weight", None)
        if weight is not None and getattr(weight, "dim", lambda: 0)() == 2:
            linear_out += int(weight.shape[0])
    if linear_out == 0:
        raise ValueError("cannot read the tower's layer widths: blocks[0] has no 2-D weight")
    return TowerWidths(hidden=int(norm.shape[0]), linear_out=linear_out, rope_dim=int(rope_dim),
                       dtype_bytes=int(dtype_bytes), table_bytes=int(table_bytes))


def mib(n: Optional[int]) -> str:
    """Bytes for a log line: MiB, or bytes below one MiB (small towers, tests)."""
    if n is None:
        return "n/a"
    return f"{n / MIB:.1f} MiB" if abs(n) >= MIB else f"{n} bytes"


def doctor_report(budgets: Optional[Sequence[int]] = None, limit: Optional[int] = None,
                  shared_pool: Optional[bool] = None,
                  towers: Mapping[str, TowerWidths] = REFERENCE_TOWERS) -> dict:
    """What doctor shows: whether the budgets replace SGLang's per-layout capture (on by default,
    acting when SGLANG_VIT_ENABLE_CUDA_GRAPH is on and the ViT backend is fa4), the bound, the
    configured ladder, and for each reference tower the ladder that will be captured (the estimate;
    on a GPU the startup log and ``budget_state(runner).report()`` have the measured memory).
    A malformed variable gives ``{"error": ...}`` (the registry's message) instead of a traceback."""
    try:
        budgets = tuple(sorted(budgets if budgets is not None else envs.SGLANG_FA4_VIT_GRAPH_BUDGETS.get()))
        limit = limit_bytes() if limit is None else limit
        shared_pool = bool(envs.SGLANG_FA4_VIT_GRAPH_SHARED_POOL.get()) if shared_pool is None else shared_pool
        enabled = bool(envs.SGLANG_FA4_VIT_GRAPH_BUDGETS_ENABLE.get())
        vit_cuda_graph = bool(envs.SGLANG_VIT_ENABLE_CUDA_GRAPH.get())
    except EnvValueError as exc:
        return {"error": str(exc)}
    out = {"enabled": enabled, "vit_cuda_graph": vit_cuda_graph, "memory_limit_mb": limit // MIB, "budgets": list(budgets),
           "shared_pool": shared_pool, "towers": {}}
    for name, w in towers.items():
        costs = ladder_costs(budgets, w, shared_pool=shared_pool)
        kept, trimmed = fit_ladder(costs, limit)
        out["towers"][name] = {"kept": list(kept), "trimmed": list(trimmed),
                               "estimate_mb": round(sum(costs[b] for b in kept) / MIB, 1)}
    return out


def doctor_lines(report: Optional[dict] = None) -> list[str]:
    """:func:`doctor_report` as doctor's text lines."""
    rep = doctor_report() if report is None else report
    if "error" in rep:
        return [f"ViT graphs:   {rep['error']}"]
    state = ("startup budget graphs (with SGLANG_VIT_ENABLE_CUDA_GRAPH=1 and the fa4 ViT backend; "
             "SGLANG_FA4_VIT_GRAPH_BUDGETS_ENABLE=0 opts out)" if rep["enabled"]
             else "SGLang's per-layout graphs (SGLANG_FA4_VIT_GRAPH_BUDGETS_ENABLE=0)")
    if not rep["vit_cuda_graph"]:
        state += "; SGLANG_VIT_ENABLE_CUDA_GRAPH is off: no ViT graphs now"
    lines = [f"ViT graphs:   {state}",
             f"  memory bound {rep['memory_limit_mb']} MiB (SGLANG_FA4_VIT_GRAPH_MEMORY_MB); budgets "
             f"{rep['budgets']}" + (" in one shared pool" if rep["shared_pool"] else "")]
    for name, t in rep["towers"].items():
        lines.append(f"  {name}: captures {t['kept']}, estimate {t['estimate_mb']} MiB"
                     + (f"; trimmed {t['trimmed']}" if t["trimmed"] else ""))
    return lines
