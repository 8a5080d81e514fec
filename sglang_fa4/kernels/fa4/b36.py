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
bypassed, so its in-memory and on-disk caches stay consistent. ``Resolved.export`` writes the
kernels as object files; the last section is what :mod:`sglang_fa4.kernels.fa4.shared_libs` needs
to key, link and launch them without FA4 (b36's kernel class, its tile-cumsum call, its settings).

flash_attn is imported inside the functions only; this module imports neither torch nor SGLang.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import logging
import pickle
import re
import shutil
import sys
import threading
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Optional

from sglang_fa4.environ import envs
from sglang_fa4.kernels import dsl_versions

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


# -- The installed flash-attn-4 --


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


# -- The compiled kernel's argument list --


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
    #: directory -> [(role, object file, function name)]: the kernel and its scheduler aid as
    #: object files (shared_libs); None: not exportable
    export: Optional[Callable[[Path], list]] = None
    sched_spec: Optional[dict] = None  # the scheduler aid's kernels (stored_sched), None: no aid
    key: Any = None  # FA4's compile key (diagnostics)


# -- The backend: FA4's own forward, recorded --

_SCHED_STATIC = ("tile_size", "q_stage", "cluster_shape_m", "qhead_per_kvhead", "pack_gqa")
_SCHED_DYNAMIC = ("num_m_blocks", "seqused", "num_splits_dynamic", "virtual_batch_idx")
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
    """flash-attn-4 (flash_attn.cute) b36 behind the :class:`~sglang_fa4.kernels.fa4.cache.Backend` seam."""

    requires_cuda = True

    def __init__(self):
        check_version()

    def arch(self) -> int:
        return device_arch()

    def compile_and_run(self, call) -> Resolved:
        dsl_versions.require("fa4")  # a DSL that cannot build it: our message, not the DSL's
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
        key, fn, args = recorder.launches[0]
        sched = spec = None
        kernels = [("forward", inner, key, fn)]
        if sched_kwargs:
            if any(sched_kwargs.get(k) is not None for k in _SCHED_DYNAMIC):
                raise FA4LayoutError("FA4 built its scheduler cumsum from unexpected inputs")
            static = {k: sched_kwargs[k] for k in _SCHED_STATIC}
            sched = _make_sched(iface, static, self.arch())
            if not sm100_class(self.arch()):  # SM100's block -> batch index is not stored
                spec = {"tile_cumsum": _cumsum_key(static)}
                kernels.append(("tile_cumsum", original_cumsum.compile_cache, spec["tile_cumsum"], None))
        export = None if sched is not None and spec is None else functools.partial(_export, kernels)
        return Resolved(fn=fn, args=args, fa4_compiled=recorder.compiled, sched=sched, export=export,
                        sched_spec=spec, key=key)

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


# -- Without FA4 imported: the kernel class, and what a stored kernel (shared_libs) needs --

#: distributions whose versions are part of a stored kernel's key
KEY_DISTRIBUTIONS = ("flash-attn-4", "quack-kernels", "nvidia-cutlass-dsl", "nvidia-cutlass-dsl-libs-base",
                     "nvidia-cutlass-dsl-libs-core", "nvidia-cutlass-dsl-libs-cu13",
                     "nvidia-cutlass-dsl-libs-cu12", "apache-tvm-ffi")
#: FA4 (FLASH_ATTENTION_*, FA_*), quack and the CUTLASS DSL read their settings from variables with
#: these prefixes: every one set is part of a stored kernel's key, except the cache locations
KEY_ENV_PREFIXES = ("FLASH_ATTENTION_", "FA_", "CUTE_DSL_", "QUACK_")
KEY_ENV_IGNORED = frozenset({"FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR",
                             "QUACK_CACHE_ENABLED", "QUACK_CACHE_DIR"})
SOURCE_PACKAGES = ("flash_attn/cute", "quack")  # their sources make the kernels (FA4 hashes its own)
_ARCH = re.compile(r"^(?:sm_?|SM_?)?(\d+)(\d)([af]?)$")  # FA4's _parse_arch_str


def device_arch() -> int:
    """FA4's kernel class (``_get_device_arch``: FLASH_ATTENTION_ARCH, else the current GPU's
    capability), without importing FA4 unless it is imported already."""
    loaded = sys.modules.get("flash_attn.cute.interface")
    match = _ARCH.match(envs.FLASH_ATTENTION_ARCH.get()) if envs.FLASH_ATTENTION_ARCH.is_set() else None
    if loaded is not None or (match is None and envs.FLASH_ATTENTION_ARCH.is_set()):
        return int(_interface()._get_device_arch())  # FA4's own answer, or its own error
    if match is not None:
        return int(match.group(1)) * 10 + int(match.group(2))
    import torch

    major, minor = torch.cuda.get_device_capability()
    return major * 10 + int(minor)


def _cumsum_key(static: dict) -> tuple:
    """``_compute_tile_cumsum``'s compile key for a cu_seqlens-only call."""
    qpk, tile = static["qhead_per_kvhead"], static["tile_size"] * static["q_stage"] * static["cluster_shape_m"]
    return (tile, qpk if static["pack_gqa"] and qpk > 1 else 1, True, False, False, False)


def _export(kernels: list, directory: Path) -> list:
    """Each (role, compile cache, key, fn) kernel as an object file in ``directory``: one compiled
    in this process exports itself (the DSL's ``export_to_c``); one FA4 loaded from its persistent
    cache is that cache's object file. Returns [(role, path, exported function name)]."""
    out = []
    for role, cache, key, fn in kernels:
        fn, path, name = cache[key] if fn is None else fn, directory / f"{role}.o", f"sglang_fa4_{role}"
        if hasattr(fn, "export_to_c"):
            fn.export_to_c(object_file_path=str(path), function_name=name)
        else:
            # JITPersistentCache's entry name: sha256 of the pickled key
            stored = Path(cache.cache_path) / f"{hashlib.sha256(pickle.dumps(key)).hexdigest()}.o"
            if not stored.is_file():
                raise FA4LayoutError(f"no object file of the {role} kernel ({stored})")
            shutil.copyfile(stored, path)
            name = cache.EXPORT_FUNCTION_PREFIX
        out.append((role, path, name))
    return out


def stored_sched(spec: dict, functions: dict) -> Callable[[Any, int], tuple]:
    """The SM90 scheduler aid of a > MANY_SEGMENTS call from the stored tile-cumsum kernel, as
    ``_compute_tile_cumsum(cu_seqlens=...)`` computes it: a fresh int32 (segments + 1,) block
    cumsum, no split counts."""
    import torch

    fn = functions["tile_cumsum"]

    def sched(cu_seqlens, total_q):
        blocks = torch.empty(cu_seqlens.shape[0], dtype=torch.int32, device=cu_seqlens.device)
        fn(blocks, None, cu_seqlens, None, None, None)
        return blocks, None

    return sched
