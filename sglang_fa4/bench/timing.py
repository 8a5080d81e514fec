"""GPU timing primitives: CUDA events, CUDA-graph replay, host launch cost, and the two ceilings
(bf16 matmul rate, device copy bandwidth). torch is imported inside the functions."""

from __future__ import annotations

import time
from typing import Callable, Sequence

from .stats import median, round_order


def sync() -> None:
    import torch

    torch.cuda.synchronize()


def event_time_ms(fn: Callable[[], object], iters: int) -> float:
    """Milliseconds per call of `iters` back-to-back calls between two CUDA events (eager: host
    launch cost is included whenever it exceeds the GPU time)."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def eager_median_ms(fn: Callable[[], object], iters: int = 20, warmup: int = 3) -> float:
    """Median milliseconds of ``iters`` single eager calls, each between two CUDA events, after
    ``warmup`` untimed calls (where a CUDA graph cannot capture ``fn``)."""
    sync()
    for _ in range(warmup):
        fn()
    sync()
    return median([event_time_ms(fn, 1) for _ in range(iters)])


def host_us_per_call(fn: Callable[[], object], iters: int) -> float:
    """Wall microseconds per call of a launch-bound loop (GPU work far shorter than the launch)."""
    sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - t0) * 1e6 / iters


def host_submit_us(fn: Callable[[], object], iters: int) -> tuple[float, float]:
    """(host us per call, wall us per call) of ``iters`` calls issued back to back: the host number
    stops the clock when the last call returns, before the GPU is waited for, so it is the calling
    thread's cost per call even where the kernel is longer than the launch (a 180-window layout
    runs ~40-90 us on the GPU: a loop's wall time there is the GPU's, not the launch path's).
    ``iters`` stays far below the driver's launch queue, which would block the host once full."""
    sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    t1 = time.perf_counter()
    sync()
    t2 = time.perf_counter()
    return (t1 - t0) * 1e6 / iters, (t2 - t0) * 1e6 / iters


def iters_for(est_ms: float, target_ms: float, lo: int = 1, hi: int = 200) -> int:
    if est_ms <= 0:
        return hi
    return max(lo, min(hi, int(round(target_ms / est_ms))))


class GraphedCalls:
    """`calls` (run in order, cycled to `count` launches) captured into one CUDA graph.
    outputs[i] is what call i returned during capture (static: replays overwrite it)."""

    def __init__(self, calls: Sequence[Callable[[], object]], count: int, warmup: int = 2):
        import torch

        self.count = count
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(warmup):
                for c in calls:
                    c()
        torch.cuda.current_stream().wait_stream(stream)
        sync()
        self.graph = torch.cuda.CUDAGraph()
        outputs: list = []
        with torch.cuda.graph(self.graph):
            for i in range(count):
                r = calls[i % len(calls)]()
                if i < len(calls):
                    outputs.append(r)
        self.outputs = outputs
        sync()

    def replay(self) -> None:
        self.graph.replay()

    def ms_per_call(self, replays: int) -> float:
        return event_time_ms(self.graph.replay, replays) / self.count

    def release(self) -> None:
        self.graph.reset()
        self.outputs = []


def graph_replay_ms(fn: Callable[[], object], replays: int = 20, warmup: int = 2, pre_replays: int = 3) -> float:
    """Median milliseconds of single CUDA-graph replays of ``fn`` (captured after ``warmup`` calls
    on a side stream, ``pre_replays`` untimed replays first); the graph is released after."""
    graphed = GraphedCalls([fn], 1, warmup=warmup)
    try:
        for _ in range(pre_replays):
            graphed.replay()
        times = [event_time_ms(graphed.replay, 1) for _ in range(replays)]
    finally:
        graphed.release()
    return median(times)


def _short_error(exc: BaseException, limit: int = 300) -> str:
    return f"{type(exc).__name__}: {str(exc)[:limit]}"


def timed_into(row: dict, label: str, fn: Callable[[], object], replays: int = 20) -> None:
    """``row[label]`` = median ms of CUDA-graph replays of ``fn`` (``row[label + "_how"]`` =
    "graph"), or of eager CUDA-event calls where capture fails (the capture error recorded in
    ``label + "_graph_error"``); None and ``label + "_error"`` where that fails too. Never raises:
    one failing variant must not stop a benchmark run."""
    try:
        row[label] = graph_replay_ms(fn, replays=replays)
        row[label + "_how"] = "graph"
    except Exception as exc:  # noqa: BLE001 - recorded, then timed eagerly
        sync()
        row[label + "_graph_error"] = _short_error(exc, 200)
        try:
            row[label] = eager_median_ms(fn, iters=replays, warmup=3)
            row[label + "_how"] = "eager events"
        except Exception as exc2:  # noqa: BLE001
            row[label] = None
            row[label + "_error"] = _short_error(exc2)


def interleaved_ms(calls: dict, rounds: int = 5, replays: int = 10, pre_replays: int = 3) -> dict:
    """Time several calls against each other: each captured into its own CUDA graph (all held at
    once; eager CUDA events where capture fails, the error recorded), then ``rounds`` interleaved
    rounds (:func:`stats.round_order`: every pair runs in both orders equally often), each timing
    ``replays`` single replays per call. Per name: {"ms": median of the round medians, "rounds",
    "how", and "graph_error" / "error" where something failed}. Never raises."""
    out: dict = {name: {} for name in calls}
    timers: dict = {}
    graphs: list = []
    try:
        for name, fn in calls.items():
            try:
                graphed = GraphedCalls([fn], 1)
                graphs.append(graphed)
                for _ in range(pre_replays):
                    graphed.replay()
                timers[name] = graphed.replay
                out[name]["how"] = "graph"
            except Exception as exc:  # noqa: BLE001 - recorded, then timed eagerly
                sync()
                out[name]["graph_error"] = _short_error(exc, 200)
                try:
                    for _ in range(pre_replays):
                        fn()
                    sync()
                    timers[name] = fn
                    out[name]["how"] = "eager events"
                except Exception as exc2:  # noqa: BLE001
                    out[name]["error"] = _short_error(exc2)
        for r in range(rounds):
            for name in round_order(list(timers), r):
                if name not in timers:
                    continue
                try:
                    times = [event_time_ms(timers[name], 1) for _ in range(replays)]
                    out[name].setdefault("rounds", []).append(median(times))
                except Exception as exc:  # noqa: BLE001
                    out[name]["error"] = _short_error(exc)
                    del timers[name]
        for o in out.values():
            if o.get("rounds") and "error" not in o:
                o["ms"] = median(o["rounds"])
    finally:
        for graphed in graphs:
            graphed.release()
    return out


def measure_matmul_tflops(n: int = 8192, iters: int = 20, repeats: int = 5) -> dict:
    """bf16 n x n x n matmul on random data through torch: median TFLOP/s of `repeats` samples."""
    import torch

    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    def mm():
        torch.mm(a, b, out=c)

    for _ in range(3):
        mm()
    samples = [2 * n**3 / (event_time_ms(mm, iters) * 1e-3) / 1e12 for _ in range(repeats)]
    return {"tflops": median(samples), "samples": samples, "shape": [n, n, n]}


def measure_copy_gbps(nbytes: int = 2 << 30, iters: int = 10, repeats: int = 5) -> dict:
    """Device-to-device copy of `nbytes`, counting bytes read plus written: median GB/s."""
    import torch

    src = torch.randn(nbytes // 4, device="cuda", dtype=torch.float32)
    dst = torch.empty_like(src)
    def copy():
        dst.copy_(src)

    for _ in range(3):
        copy()
    samples = [2 * nbytes / (event_time_ms(copy, iters) * 1e-3) / 1e9 for _ in range(repeats)]
    return {"gbps": median(samples), "samples": samples, "bytes": nbytes}
