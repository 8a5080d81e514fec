"""The LLM serving harness's own SGLang general plugin (entry point ``sglang_fa4_serve_llm``, written by
benchmark/release/serve_llm.py beside check_plugin's; never part of the product). In every server
process:

1. With ``SERVE_LLM_FA3_SEAM=1`` (the harness sets it in every arm, so the arms differ only in the
   switch under test): SGLang's FA3 loader returns the FA3 source build (``.fa3/libfa3fwd.so``,
   benchmark/sglang_on_gpu/fa3_seam.py), and each fa3 FlashAttentionBackend built has its FA3
   scheduler-metadata precompute off (the build has no ``get_scheduler_metadata``). One line
   ``serve-llm: fa3 seam ...`` says whether it is in.
2. A Triton compile hook: one line ``serve-llm: triton kernel loaded NAME`` per kernel binary a
   process builds or loads from Triton's cache (any Triton kernel: SGLang's, the route's), so the
   log reader counts those after the ready line (a JIT on the request path).

The weights are check_plugin.py's (its redraw after the dummy loader), registered by its own entry
point.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

logger = logging.getLogger("sglang_fa4_serve_llm")

FA_BACKEND_INIT = "sglang.srt.layers.attention.flashattention_backend.FlashAttentionBackend.__init__"
TRITON_LINE = "serve-llm: triton kernel loaded"


def _fa3_seam():
    here = Path(__file__).resolve().parent
    stubs = here.parent / "sglang_on_gpu"
    if str(stubs) not in sys.path:
        sys.path.append(str(stubs))
    import fa3_seam

    return fa3_seam


def after_fa_backend_init(result, self, *args, **kwargs):
    """AFTER FlashAttentionBackend.__init__: an fa3 backend gets no scheduler-metadata precompute."""
    if getattr(self, "fa_impl_ver", None) == 3:
        _fa3_seam().prepare(self)
        logger.warning("serve-llm: fa3 backend built (FA3 source build through the seam, no scheduler metadata)")
    return None


def _on_triton_compile(*args, **kwargs):
    name = kwargs.get("fn") or kwargs.get("key") or (args[0] if args else "?")
    name = getattr(getattr(name, "fn", name), "__name__", None) or getattr(name, "name", None) or str(name)[:120]
    logger.warning("%s %s", TRITON_LINE, name)
    return False


def install_triton_hook() -> str:
    """Which Triton hook took the callback (``none`` where this Triton has neither)."""
    try:
        import triton

        knobs = getattr(triton, "knobs", None)
        if knobs is not None and hasattr(knobs.runtime, "jit_post_compile_hook"):
            knobs.runtime.jit_post_compile_hook = _on_triton_compile
            return "knobs.runtime.jit_post_compile_hook"
        from triton.runtime.jit import JITFunction

        if hasattr(JITFunction, "compiled_hook"):
            JITFunction.compiled_hook = _on_triton_compile
            return "JITFunction.compiled_hook"
    except Exception as exc:  # noqa: BLE001 - evidence only
        return f"none ({type(exc).__name__}: {exc})"
    return "none"


def register() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    hook = install_triton_hook()
    seam = "off"
    if os.environ.get("SERVE_LLM_FA3_SEAM") == "1":
        try:
            why = _fa3_seam().install()
            seam = "installed" if why is None else f"not installed: {why}"
        except Exception as exc:  # noqa: BLE001 - the fa3 arm then fails loudly at its first call
            seam = f"not installed: {type(exc).__name__}: {exc}"
        HookRegistry.register(FA_BACKEND_INIT, after_fa_backend_init, HookType.AFTER)
    logger.warning("serve-llm: pid %d fa3 seam %s; triton hook %s", os.getpid(), seam, hook)
