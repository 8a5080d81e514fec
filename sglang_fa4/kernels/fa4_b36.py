"""Everything sglang-fa4 knows about flash-attn-4 4.0.0b36 in particular: the version check, its
private names, the constants copied from it, the argument layout of its compiled forward kernel,
and the backend that runs its forward once per configuration and records what it launched.
An FA4 upgrade is a diff of this file (and its tests).

Written against ``flash_attn/cute/interface.py`` of b36:

* ``_flash_attn_fwd`` looks its compiled kernel up in ``_flash_attn_fwd.compile_cache`` (a
  ``JITCache``, or ``JITPersistentCache`` with ``FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1``) and
  calls ``compile_cache[compile_key](*call_args)`` exactly once for a non-MLA forward;
* above ``BIN_BATCH_SEARCH_THRESH`` (256) segments it first computes a per-call block cumsum
  (``_compute_tile_cumsum``) and, on SM100, a block -> segment index (``_compute_blocks_to_batch``).

While one call runs, the compile cache attribute is swapped for a recording proxy (``__setitem__``
tells whether FA4 compiled) and ``_compute_tile_cumsum`` for a wrapper that keeps its static
arguments, so later calls can recompute the scheduler aids themselves. FA4's caches are used, not
bypassed, so its in-memory and on-disk caches stay consistent.

flash_attn is imported inside the functions only; this module imports neither torch nor SGLang.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import sys
import threading
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Optional

logger = logging.getLogger("sglang_fa4")

#: the flash-attn-4 release everything below was read from
FA4_VERSION = "4.0.0b36"
#: other flash-attn-4 releases whose forward-kernel call was checked to be the layout below, and
#: on which kernel classes (tests/test_fa4_version_drift.py: the recorded-call check on a CPU; the
#: H200 run of tests/fa4_drift_check.py --gpu)
CALL_LAYOUT_CHECKED = {"4.0.0b30": ("sm90", "sm100")}
#: FA4's varlen scheduler switches to a block-cumsum lookup above this many segments
#: (``BIN_BATCH_SEARCH_THRESH`` in flash_attn/cute/interface.py)
MANY_SEGMENTS = 256
#: SM100/SM110 non-MLA forward tile_m (``_get_fwd_config``'s default 128x128)
SM100_TILE_M = 128
#: FA4's ``maybe_contiguous``: pointers and strides aligned to this many bytes, unit last stride
ALIGN_BYTES = 16
#: the module FA4 reads its persistent-cache variables in, once, at import
CACHE_UTILS_MODULE = "flash_attn.cute.cache_utils"


class FA4LayoutError(RuntimeError):
    """FA4's kernel call no longer looks like the one this module was written against (b36)."""


# --------------------------------------------------------------------------------------------
# The installed flash-attn-4
# --------------------------------------------------------------------------------------------


def fa4_available() -> bool:
    """Whether ``flash_attn.cute`` (flash-attn-4) is installed, without importing anything.

    ``importlib.util.find_spec("flash_attn")`` is also true for FlashAttention-2 alone, and
    flash-attn-4 alone installs ``flash_attn`` as a namespace package holding only ``cute``
    (no ``flash_attn_interface``), so the answer is whether a ``flash_attn`` search location
    holds the ``cute`` package. ``find_spec("flash_attn.cute")`` would import ``flash_attn``
    itself, which for FA2 loads its CUDA extension.
    """
    if "flash_attn.cute" in sys.modules:
        return True
    try:
        spec = importlib.util.find_spec("flash_attn")
    except (ImportError, ValueError):
        return False
    if spec is None:
        return False
    for location in spec.submodule_search_locations or ():
        if (Path(location) / "cute" / "__init__.py").is_file():
            return True
    return False


def installed_version() -> Optional[str]:
    try:
        return metadata.version("flash-attn-4")
    except metadata.PackageNotFoundError:
        return None


_version_checked = False


def check_version() -> None:
    """Log once when the installed flash-attn-4 is not the release this module was written
    against; the argument-layout checks below still refuse a call that changed."""
    global _version_checked
    if _version_checked:
        return
    _version_checked = True
    version = installed_version()
    if version is not None and version != FA4_VERSION:
        logger.warning(
            "sglang-fa4: flash-attn-4 %s is installed; sglang-fa4 is written against %s "
            "(its private names and kernel-call layout are checked on each new configuration)",
            version, FA4_VERSION,
        )


def loaded_disk_cache() -> Optional[tuple[bool, Optional[str]]]:
    """None when FA4 has not read its persistent-cache variables yet (its cache_utils is not
    imported); else (enabled, directory) as FA4 read them."""
    loaded = sys.modules.get(CACHE_UTILS_MODULE)
    if loaded is None:
        return None
    enabled = bool(getattr(loaded, "CUTE_DSL_CACHE_ENABLED", False))
    path = str(loaded.get_cache_path()) if enabled and hasattr(loaded, "get_cache_path") else None
    return enabled, path


# --------------------------------------------------------------------------------------------
# The compiled kernel's argument list
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CallLayout:
    """Where each per-call value sits in the argument list FA4 passes its compiled kernel."""

    nargs: int
    q: int = 0
    k: int = 1
    v: int = 2
    out: int = 3
    lse: int = 4
    softmax_scale: int = 5
    cu_seqlens_q: int = 6
    cu_seqlens_k: int = 7
    window_left: int = 11
    window_right: int = 12
    sink: int = 13
    sched: tuple[int, ...] = ()  # scheduler aids for > MANY_SEGMENTS segments
    max_seqlen: Optional[int] = None  # runtime max_seqlen_q (SM100/SM110)


#: ``_flash_attn_fwd`` call_args, non-MLA. SM80/SM90/SM120: 14 common args, block-sparse
#: tensors, AuxData, cu_total_m_blocks, cu_total_splits_m_blocks.
LAYOUT_SM90 = CallLayout(nargs=18, sched=(16, 17))
#: SM100/SM110: 14 common args, descale, block-sparse, AuxData, num_splits_dynamic,
#: tile_count_semaphore, virtual_batch_idx, num_nheads_in_l2, cu_total_m_blocks,
#: cu_total_splits_m_blocks, blocks_to_batch_idx, max_seqlen_q.
LAYOUT_SM100 = CallLayout(nargs=25, sched=(21, 22, 23), max_seqlen=24)


def sm100_class(arch: int) -> bool:
    """The SM100/SM110 forward (FlashAttentionForwardSm100): its own layout and seqlen key."""
    return arch // 10 in (10, 11)


def layout_for_arch(arch: int) -> CallLayout:
    return LAYOUT_SM100 if sm100_class(arch) else LAYOUT_SM90


@dataclass
class Resolved:
    """What FA4's forward launched while it ran one call of a new configuration."""

    fn: Callable[..., Any]  # FA4's compiled kernel (TVM-FFI function)
    args: list  # the argument list FA4 passed it
    fa4_compiled: bool  # FA4 ran cute.compile (False: its memory or disk cache had it)
    #: (cu_seqlens, total_q) -> tensors for layout.sched, when FA4 computed scheduler aids
    sched: Optional[Callable[[Any, int], tuple]] = None


# --------------------------------------------------------------------------------------------
# The backend: FA4's own forward, recorded
# --------------------------------------------------------------------------------------------

_SCHED_STATIC = ("tile_size", "q_stage", "cluster_shape_m", "qhead_per_kvhead", "pack_gqa")
_swap_lock = threading.Lock()


def _interface():
    from flash_attn.cute import interface

    return interface


class _RecordingCache:
    """Stands in for ``_flash_attn_fwd.compile_cache`` during one call."""

    def __init__(self, inner):
        self.inner = inner
        self.compiled = False
        self.launches: list[tuple[Any, Any, list]] = []  # (key, fn, args)

    def __contains__(self, key) -> bool:
        return key in self.inner

    def __setitem__(self, key, fn) -> None:
        self.compiled = True
        self.inner[key] = fn

    def __getitem__(self, key):
        fn = self.inner[key]

        def launch(*args):
            self.launches.append((key, fn, list(args)))
            return fn(*args)

        return launch

    def __getattr__(self, name):
        return getattr(self.inner, name)


class FA4Backend:
    """flash-attn-4 (flash_attn.cute) b36 behind the :class:`~sglang_fa4.kernels.fa4_kernel_cache.Backend` seam."""

    requires_cuda = True

    def __init__(self):
        check_version()

    def arch(self) -> int:
        return int(_interface()._get_device_arch())

    def compile_and_run(self, call) -> Resolved:
        iface = _interface()
        fwd = iface._flash_attn_fwd
        sched_kwargs: dict[str, Any] = {}
        original_cumsum = iface._compute_tile_cumsum

        @functools.wraps(original_cumsum)  # also copies .compile_cache, which FA4 reads
        def recording_cumsum(**kwargs):  # through the module global while it runs
            sched_kwargs.update(kwargs)
            return original_cumsum(**kwargs)

        with _swap_lock:
            inner = fwd.compile_cache
            recorder = _RecordingCache(inner)
            fwd.compile_cache = recorder
            iface._compute_tile_cumsum = recording_cumsum
            try:
                fwd(
                    call.q, call.k, call.v, **_varlen_kwargs(call), causal=False,
                    window_size_left=call.window_left, window_size_right=call.window_right,
                    num_splits=1, out=call.out,
                )
            finally:
                fwd.compile_cache = inner
                iface._compute_tile_cumsum = original_cumsum
        if len(recorder.launches) != 1:
            raise FA4LayoutError(
                f"FA4's forward launched {len(recorder.launches)} cached kernels for one call "
                f"(expected 1; sglang-fa4 is written against flash-attn-4 4.0.0b36)"
            )
        _, fn, args = recorder.launches[0]
        sched = None
        if sched_kwargs:
            if sched_kwargs.get("num_m_blocks") is not None or sched_kwargs.get("seqused") is not None:
                raise FA4LayoutError("FA4 built its scheduler cumsum from unexpected inputs")
            sched = _make_sched(iface, {k: sched_kwargs[k] for k in _SCHED_STATIC}, self.arch())
        return Resolved(fn=fn, args=args, fa4_compiled=recorder.compiled, sched=sched)

    def public(self, call):
        from flash_attn.cute import flash_attn_varlen_func

        result = flash_attn_varlen_func(
            call.q, call.k, call.v, **_varlen_kwargs(call),
            window_size=(call.window_left, call.window_right),
        )
        return result[0] if isinstance(result, tuple) else result


def _varlen_kwargs(call) -> dict[str, Any]:
    """The arguments FA4's private and public varlen forwards share, for one self-attention call."""
    return {
        "cu_seqlens_q": call.cu_seqlens, "cu_seqlens_k": call.cu_seqlens,
        "max_seqlen_q": call.max_seqlen, "max_seqlen_k": call.max_seqlen,
        "softmax_scale": call.softmax_scale, "learnable_sink": call.sinks,
    }


def _make_sched(iface, static: dict, arch: int):
    """Per-call scheduler aids for > 256 segments, computed the way FA4 computes them."""
    cumsum = iface._compute_tile_cumsum
    if not sm100_class(arch):

        def sched(cu_seqlens, total_q):
            return cumsum(cu_seqlens=cu_seqlens, **static)

        return sched

    to_batch = iface._compute_blocks_to_batch
    size = iface._blocks_to_batch_size
    tile_m, qpk, pack_gqa = static["tile_size"], static["qhead_per_kvhead"], static["pack_gqa"]

    if not iface.USE_BLOCKS_TO_BATCH:

        def sched_sm100_no_index(cu_seqlens, total_q):
            return (*cumsum(cu_seqlens=cu_seqlens, **static), None)

        return sched_sm100_no_index

    def sched_sm100(cu_seqlens, total_q):
        total_blocks, total_splits = cumsum(cu_seqlens=cu_seqlens, **static)
        num_blocks = size(total_q, cu_seqlens.shape[0] - 1, tile_m, qpk, pack_gqa)
        return total_blocks, total_splits, to_batch(total_blocks, num_blocks, total_blocks.device)

    return sched_sm100
