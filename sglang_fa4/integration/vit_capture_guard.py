"""The guard shared by every ViT graph runner that captures its graphs at startup (the generic
runner's token budgets, :mod:`sglang_fa4.integration.vit_budgets`; the InternVL runner's tile
shapes, :mod:`sglang_fa4.integration.internvl_graphs`): once a runner is sealed, a graph captured
on the request path is counted by the caller and, like the FA4 compile monitor of
:mod:`sglang_fa4.startup.jit_monitor`, ignored, warned about or raised per ``SGLANG_FA4_JIT_MONITOR``.

Also here: what must happen before any startup capture (SGLang's batch-invariant kernels).
"""

from __future__ import annotations

import logging

from sglang_fa4.environ import envs

logger = logging.getLogger("sglang_fa4")


class GraphCaptureAfterStartup(RuntimeError):
    """SGLANG_FA4_JIT_MONITOR=raise: a ViT graph was captured after its runner was sealed at startup."""


def flag_capture_after_startup(message: str) -> None:
    """One graph capture on a sealed runner (the caller has counted it): off: nothing; warn: log
    ``message``; raise: :class:`GraphCaptureAfterStartup`."""
    mode = envs.SGLANG_FA4_JIT_MONITOR.get()
    if mode == "raise":
        raise GraphCaptureAfterStartup(message)
    if mode == "warn":
        logger.warning(message)


def enable_batch_invariant_first(model_runner) -> None:
    """With ``--enable-deterministic-inference`` SGLang turns its batch-invariant GEMM/softmax/mean
    kernels on right after load_model (``ModelRunner.maybe_enable_batch_invariant_mode``,
    idempotent); graphs captured before that would replay cuBLAS GEMMs while every eager forward
    uses the batch-invariant ones, so a startup capture turns it on first, as SGLang is about to."""
    enable = getattr(model_runner, "maybe_enable_batch_invariant_mode", None)
    if callable(enable):
        enable()
