"""Import flash_attn.cute in the background while SGLang loads the model's weights.

``import flash_attn.cute`` (the CUTLASS DSL and its MLIR bindings) costs 6.5-8.6 s on the H200, and
the startup warmup at the end of ``ModelRunner.load_model`` needs it. :func:`start`, called when
load_model begins, runs the import in a daemon thread so that it overlaps weight loading (file
reads and host-to-device copies, which release the GIL); :func:`wait`, called by the warmup, joins
it. Python's import lock makes any other import of the module wait for this one, so nothing can see
a half-imported module. Measured, the import holds the GIL and overlaps little (benchmark/results/
h200/start.md); on a restart whose kernels are in the shared-library store
(:mod:`sglang_fa4.kernels.fa4.shared_libs`) FA4 is not imported at all, and the thread imports
only ``tvm_ffi``, the store's loader (0.34 s on the H200, start-lazy-run2.md), which the warmup would
otherwise import after the load. A failed import is only logged here: the warmup's own import
then raises with its own message.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from typing import Optional

logger = logging.getLogger("sglang_fa4")

MODULE = "flash_attn.cute"
#: what a restart with a warm shared-library store imports instead (the stored kernels' loader)
STORE_LOADER = "tvm_ffi"

_lock = threading.Lock()
_thread: Optional[threading.Thread] = None
_seconds: Optional[float] = None
_error: Optional[str] = None
_module: Optional[str] = None  # what the thread imports


def _import(module: str) -> None:
    global _seconds, _error
    t0 = time.perf_counter()
    try:
        importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - reported by wait(); the warmup's import raises
        _error = f"{type(exc).__name__}: {exc}"
    _seconds = time.perf_counter() - t0


def start(module: str = MODULE) -> bool:
    """Start importing ``module`` in the background, once per process (after FA4's disk-cache
    variables are set: FA4 reads them at import). False when it is already imported or started,
    or when the shared-library store holds kernels for this environment (a restart: the warmup
    loads them without FA4, and imports it only for a variant that is not there)."""
    import sys

    from sglang_fa4.startup.fa4_env import configure_fa4_disk_cache

    with _lock:
        if _thread is not None or module in sys.modules:
            return False
        configure_fa4_disk_cache()
        if module == MODULE and _store_is_warm():
            logger.info("sglang-fa4: FA4 kernels of this environment are stored as shared libraries: "
                        "%s is not imported at startup (%s, their loader, is)", module, STORE_LOADER)
            if STORE_LOADER not in sys.modules:
                _spawn(STORE_LOADER)
            return False
        _spawn(module)
    return True


def _spawn(module: str) -> None:
    """The background import thread of ``module`` (under ``_lock``)."""
    global _thread, _module
    _module = module
    _thread = threading.Thread(target=_import, args=(module,), name="sglang-fa4-preload", daemon=True)
    _thread.start()


def _store_is_warm() -> bool:
    try:
        from sglang_fa4.kernels import fa4

        store = fa4.default_store()
        return store is not None and store.has_entries(fa4.device_arch())
    except Exception as exc:  # noqa: BLE001 - no verdict: import as before
        logger.info("sglang-fa4: shared-library store not checked (%s: %s)", type(exc).__name__, exc)
        return False


def wait(timeout: Optional[float] = None) -> Optional[float]:
    """Join the background import, if one was started; its duration in seconds (None: none started
    or still running after ``timeout``)."""
    thread = _thread
    if thread is None:
        return None
    t0 = time.perf_counter()
    thread.join(timeout)
    if thread.is_alive():
        return None
    waited = time.perf_counter() - t0
    if _error:
        logger.warning("sglang-fa4: background import of %s failed (%s)", _module, _error)
    else:
        logger.info("sglang-fa4: %s imported in the background in %.2f s (the warmup waited %.2f s for it)",
                    _module, _seconds, waited)
    return _seconds


def reset() -> None:
    """Forget a finished background import (tests)."""
    global _thread, _seconds, _error, _module
    with _lock:
        if _thread is not None:
            _thread.join()
        _thread, _seconds, _error, _module = None, None, None, None
