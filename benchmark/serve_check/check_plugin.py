"""The server check's own SGLang general plugin (entry point ``sglang_fa4_serve_check``, written by
check_server.py into a dist-info on the server's PYTHONPATH; never part of the product).

Two things, both in the process that loads the model (the scheduler):

1. Weights. SGLang's ``--load-format dummy`` draws every parameter from U(-1e-3, 1e-3), norm
   weights included. Then each decoder layer adds ~1e-3 of the residual stream's size, below bf16's
   rounding (2^-8), and the logits are ~1e-5 apart: the greedy tokens would not depend on the image
   at all, and comparing them across requests or servers would prove nothing. After the dummy
   loader has run (AFTER hook on ``DummyModelLoader.load_model``, inside ``ModelRunner.load_model``,
   so before sglang_fa4's warmup and budget capture), the parameters are redrawn in place as
   transformers initialises such models: norm weights 1, biases 0, every other weight
   N(0, 0.02), each from a generator seeded by the parameter's name (the same weights in every
   server of a model). One exception (:data:`UNSCALED_QK_MODELS`): where attention does not scale
   q.k (Gemma-4: q and k RMS-normed, then scaling 1.0), the q_norm / k_norm weights are
   head_dim**-0.25, so the attention logits spread ~1 as a trained model's do; with weights 1 they
   spread sqrt(head_dim) (16 at d256) and attention is nearly an argmax that FP8 rounding of K can
   move (H200 run 4: SGLang's own triton server's prefill and decode logprobs of the same tokens were
   1.6-4.7 nats apart on average; this cause is reasoned, not yet measured).
2. Evidence. One log line (logged after SGLang configured the scheduler's logging) with the process
   title, pid, the hooks SGLang's HookRegistry applied per plugin, and sglang_fa4's plan:
   ``serve-check: hooks in <title> pid N: {...}``.
3. Per vision-tower call (AFTER hook on the Qwen2.5-VL / Qwen3-VL tower's ``forward``), one line
   ``serve-check: vit call {...}``: per image its grid, a hash of its input patch rows and a hash
   of its output rows (bits of the bf16 values; one device sync per call, the check's cost only).
   The same image must give the same output hash in every call, alone or batched with others: this
   separates the vision tower from the language model when a request's greedy tokens differ.
   The line also holds what the call ran under (``call_context``): the budget graphs' replay and
   eager counters of the tower's runner (cumulative: the difference to the previous line is this
   call's path), whether SGLang's batch-invariant kernels are on, inference mode, the CUDA stream,
   and the input's dtype / contiguity -- what differs between a server process and the tower
   checks, where the same images give the same rows.
4. With ``SERVE_CHECK_VIT_PROBE=1`` (check_server.py's ``probe`` variant; the check's own switch, not
   the product's), after each tower call of several images, each image (at most
   ``PROBE_IMAGES`` per call) is run again alone, once through the tower's normal path (a budget
   replay when it fits) and once with the budget graphs set aside (the eager path), and one line
   ``serve-check: vit probe {...}`` gives per image the max |difference| of its rows between the
   batched call, alone and alone-eager: which of batch dependence and graph-vs-eager makes a
   request's image rows differ, measured inside the server process itself.
"""

from __future__ import annotations

import json
import logging
import os
import zlib

logger = logging.getLogger("sglang_fa4_serve_check")

LOADER_TARGET = "sglang.srt.model_loader.loader.DummyModelLoader.load_model"
TOWER_TARGETS = ("sglang.srt.models.qwen2_5_vl.Qwen2_5_VisionTransformer.forward",
                 "sglang.srt.models.qwen3_vl.Qwen3VLMoeVisionModel.forward")
STD = 0.02
PROBE_IMAGES = 4
_probing = False


def _is_norm(name: str) -> bool:
    """A normalisation layer's parameter: its module's name holds "norm" (norm1, input_layernorm,
    q_norm, model.norm, ...) or is Qwen2.5-VL's merger "ln_q"."""
    owner = name.rsplit(".", 1)[0].rsplit(".", 1)[-1]
    return "norm" in owner or owner == "ln_q"


#: model classes (name prefixes) whose attention takes q.k unscaled after RMS-normed q and k
UNSCALED_QK_MODELS = ("Gemma4",)


def _qk_norm_fill(model, name: str, p) -> float | None:
    """The q_norm / k_norm weight of an :data:`UNSCALED_QK_MODELS` model: head_dim**-0.25 (the
    weight's length is the head dim); None for every other parameter and model."""
    if not type(model).__name__.startswith(UNSCALED_QK_MODELS) or not name.endswith(("q_norm.weight", "k_norm.weight")):
        return None
    return float(p.shape[-1]) ** -0.25


def redraw_(model) -> dict:
    """Redraw ``model``'s floating-point parameters in place (see the module docstring); returns
    counts for the log."""
    import torch

    counts = {"normal": 0, "ones": 0, "zeros": 0, "qk_norm": 0}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not torch.is_floating_point(p):
                continue
            leaf = name.rsplit(".", 1)[-1]
            qk = _qk_norm_fill(model, name, p)
            if qk is not None:
                p.fill_(qk)
                counts["qk_norm"] += 1
            elif _is_norm(name):
                p.fill_(1.0 if leaf == "weight" else 0.0)
                counts["ones" if leaf == "weight" else "zeros"] += 1
            elif leaf == "bias":
                p.zero_()
                counts["zeros"] += 1
            else:
                gen = torch.Generator(device=p.device).manual_seed(zlib.crc32(name.encode()))
                tmp = torch.empty(p.shape, dtype=torch.float32, device=p.device)
                tmp.normal_(0.0, STD, generator=gen)
                p.copy_(tmp.to(p.dtype))
                counts["normal"] += 1
    return counts


def applied_hooks() -> dict:
    """Targets SGLang's HookRegistry patched in this process, per plugin that registered them."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    out: dict[str, list[str]] = {}
    for target, hooks in HookRegistry._hooks.items():
        if target not in HookRegistry._patched:
            continue
        for _, _, source in hooks:
            name = getattr(source, "plugin_name", None) or "?"
            out.setdefault(name, [])
            if target not in out[name]:
                out[name].append(target)
    return {k: sorted(v) for k, v in out.items()}


def process_title() -> str:
    try:
        import setproctitle

        return setproctitle.getproctitle()
    except Exception:  # noqa: BLE001 - only for the log line
        return "?"


def after_dummy_load(result, *args, **kwargs):
    """AFTER DummyModelLoader.load_model: redraw the weights, log the evidence line."""
    counts = redraw_(result)
    plan = None
    try:
        from sglang_fa4 import plugin

        p = plugin._registered_plan
        plan = {"sglang": p.sglang_version, "hooked": p.hooked, "upstream": p.upstream} if p else None
    except Exception as exc:  # noqa: BLE001
        plan = f"unavailable: {exc}"
    logger.warning("serve-check: weights redrawn %s", json.dumps(counts))
    logger.warning("serve-check: hooks in %s pid %d: %s", process_title(), os.getpid(),
                   json.dumps({"applied": applied_hooks(), "sglang_fa4_plan": plan}))
    return None


_HASH_CHUNK = 1 << 24  # elements per step: bounds the int64 temporaries (128 MiB)


def _bits_hash(t) -> str:
    """A digest of ``t``'s bits computed where ``t`` lives: the position-weighted sum of its 16/32-bit
    words mod 2^64 (integer sums do not depend on the reduction order), one scalar read back. A CPU
    crc32 of the same rows copied every call's input and output to the host (~370 MB for a 4K
    Qwen3-VL picture): that cost landed in the graph servers' TTFT, and not in the no-graph runs
    made before the hashes existed."""
    import torch

    raw = t.detach().contiguous().view(-1).view(torch.int16 if t.element_size() == 2 else torch.int32)
    acc = torch.zeros((), dtype=torch.int64, device=raw.device)
    for start in range(0, raw.numel(), _HASH_CHUNK):
        words = raw[start:start + _HASH_CHUNK].to(torch.int64)
        pos = torch.arange(start, start + words.numel(), dtype=torch.int64, device=raw.device)
        acc += (words * (pos * 0x9E3779B1 % 0x7FFFFFFF + 1)).sum()
    return format(int(acc) & 0xFFFFFFFFFFFFFFFF, "016x")


def call_context(tower, x) -> dict:
    """What a tower call ran under (see the module docstring); every entry best-effort."""
    import torch

    ctx: dict = {"x_dtype": str(x.dtype), "x_contiguous": bool(x.is_contiguous()),
                 "inference_mode": torch.is_inference_mode_enabled(), "grad": torch.is_grad_enabled()}
    try:
        ctx["stream"] = int(torch.cuda.current_stream().cuda_stream) if x.is_cuda else None
    except Exception:  # noqa: BLE001
        ctx["stream"] = None
    try:
        from sglang.srt.batch_invariant_ops.batch_invariant_ops import is_batch_invariant_mode_enabled

        ctx["batch_invariant"] = bool(is_batch_invariant_mode_enabled())
    except Exception as exc:  # noqa: BLE001
        ctx["batch_invariant"] = f"unknown: {type(exc).__name__}"
    try:
        from sglang_fa4.integration.vit_budgets import budget_state, find_runners

        states = [budget_state(r) for r in find_runners(tower)]
        ctx["budget"] = [{"replays": st.replays, "eager_runs": st.eager_runs} for st in states if st is not None]
    except Exception as exc:  # noqa: BLE001
        ctx["budget"] = f"unknown: {type(exc).__name__}"
    return ctx


def _image_rows(grid_thw, x, result):
    """Per image: (index, grid, input row slice, output row slice)."""
    grids = [[int(v) for v in g] for g in (grid_thw.tolist() if hasattr(grid_thw, "tolist") else grid_thw)]
    sizes = [t * h * w for t, h, w in grids]
    merge = sum(sizes) // int(result.shape[0])
    start = 0
    for i, (g, n) in enumerate(zip(grids, sizes)):
        yield i, g, slice(start, start + n), slice(start // merge, (start + n) // merge)
        start += n


def _max_diff(a, b) -> float:
    if a.shape != b.shape:
        return float("nan")
    return float((a.float() - b.float()).abs().max()) if a.numel() else 0.0


def probe(tower, x, grid_thw, result, args, kwargs) -> dict:
    """Each image of a batched call alone: through the normal path, then with the budget graphs set
    aside (the eager path); max |difference| of its output rows (see the module docstring)."""
    from sglang_fa4.integration.vit_budgets import budget_state, find_runners

    states = [st for st in (budget_state(r) for r in find_runners(tower)) if st is not None]
    rows = []
    for i, g, xs, ys in list(_image_rows(grid_thw, x, result))[:PROBE_IMAGES]:
        one = grid_thw[i:i + 1]
        before = [(st.replays, st.eager_runs) for st in states]
        alone = tower.forward(x[xs], one, *args, **kwargs)
        path = ["replay" if st.replays > b[0] else "eager" for st, b in zip(states, before)]
        saved = [st.budgets for st in states]
        try:
            for st in states:
                st.budgets = (0,)  # every call is above the budgets: the eager path
            alone_eager = tower.forward(x[xs], one, *args, **kwargs)
        finally:
            for st, b in zip(states, saved):
                st.budgets = b
        batched = result[ys]
        rows.append({"grid": g, "alone_path": path,
                     "batched_vs_alone": _max_diff(batched, alone),
                     "batched_vs_alone_eager": _max_diff(batched, alone_eager),
                     "alone_eager_vs_alone": _max_diff(alone_eager, alone)})
    return {"images": len(grid_thw), "probed": rows}


def after_tower_forward(result, self, x, grid_thw, *args, **kwargs):
    """AFTER the vision tower's forward: the per-image hashes line (see the module docstring)."""
    global _probing
    if _probing:  # the probe's own tower calls
        return None
    try:
        images = [{"grid": g, "in": _bits_hash(x[xs]), "out": _bits_hash(result[ys])}
                  for _, g, xs, ys in _image_rows(grid_thw, x, result)]
        logger.warning("serve-check: vit call %s", json.dumps({"images": images, "call_context": call_context(self, x)}))
    except Exception as exc:  # noqa: BLE001 - evidence only; never break the server
        logger.warning("serve-check: vit call not hashed: %s", exc)
    if os.environ.get("SERVE_CHECK_VIT_PROBE") == "1" and len(grid_thw) > 1:
        _probing = True
        try:
            logger.warning("serve-check: vit probe %s", json.dumps(probe(self, x, grid_thw, result, args, kwargs)))
        except Exception as exc:  # noqa: BLE001 - evidence only
            logger.warning("serve-check: vit probe failed: %r", exc)
        finally:
            _probing = False
    return None


def register() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(LOADER_TARGET, after_dummy_load, HookType.AFTER)
    for target in TOWER_TARGETS:
        HookRegistry.register(target, after_tower_forward, HookType.AFTER)
