"""FA4's compiled forward kernels kept as shared libraries of our own, so that a restart launches
them without importing flash_attn.cute or the CUTLASS DSL (issue #18 item 6: the import alone costs
6.5-8.6 s on an H200 at every server start, and FA4's own disk cache needs it to load a kernel).

When a configuration is resolved through FA4 (the process has FA4 imported), :meth:`Store.save`
writes the kernel as an object file (``Resolved.export``: the DSL's ``export_to_c``, or FA4's own
cache entry), links it with the system C compiler into a shared library against the DSL runtime
and TVM-FFI (``-Bsymbolic``: each library binds its own symbols), and records beside it, in
``meta.json``, the launcher's argument template. On a later start :meth:`Store.load` dlopens the
runtime libraries it was linked against and loads the library with ``tvm_ffi.load_module``: the
same TVM-FFI function FA4's disk cache would hand back, launched through the same template.

An entry lives at ``ROOT/<environment>/<configuration>/``. The environment is everything besides
the configuration that can change the kernel: the versions of FA4, quack, the DSL and TVM-FFI,
a hash of FA4's and quack's Python sources, every FA4/DSL setting in the environment
(``b36.KEY_ENV_PREFIXES``), Python's minor version, the kernel class and the GPU's SM count.
The configuration is the :class:`~sglang_fa4.kernels.fa4.config.FA4Config` the kernel cache keys
its launchers on. Both are also stored in ``meta.json`` and compared on load, with each library's
sha256 and the runtime libraries' sizes; anything that does not match, does not parse or does not
load is a miss (one warning): the caller takes FA4's own path, and its save replaces the entry.
Files are written under temporary names and renamed into place, so concurrent writers (TP ranks)
and readers never see a partial entry.

Imports neither flash_attn nor cutlass (``save`` asks the DSL, imported by then, for its runtime).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Optional

from sglang_fa4.environ import envs
from sglang_fa4.kernels.fa4 import b36
from sglang_fa4.kernels.fa4.b36 import CallLayout, Resolved
from sglang_fa4.kernels.fa4.config import FA4Config

logger = logging.getLogger("sglang_fa4")

FORMAT = 1  # of an entry; part of the environment key
SUBDIR = "shared-libs"  # under SGLANG_FA4_KERNEL_CACHE_DIR
META = "meta.json"
COMPILERS = ("cc", "gcc", "clang")
_LINK_TIMEOUT_S = 120


class NotStorable(Exception):
    """A resolved kernel that this store cannot keep (reported once, then FA4's path as before)."""


@dataclass
class Stored:
    """A configuration's kernel loaded from the store."""

    fn: Any  # tvm_ffi.Function
    template: list  # the launcher's argument template (per-call slots None)
    sched: Optional[Callable[[Any, int], tuple]]  # scheduler aids (> MANY_SEGMENTS), else None
    modules: list  # the tvm_ffi modules, kept alive with the functions


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _digest(obj) -> str:
    return _sha256(json.dumps(obj, sort_keys=True).encode())[:24]


def _sources_digest() -> str:
    """Hash of the .py sources of b36.SOURCE_PACKAGES (relative path, size, bytes), found
    without importing them."""
    h = hashlib.sha256()
    for name, root in source_dirs():
        h.update(name.encode())
        for path in sorted(root.rglob("*.py")):
            data = path.read_bytes()
            h.update(path.relative_to(root).as_posix().encode() + len(data).to_bytes(8, "little") + data)
    return h.hexdigest()


def source_dirs() -> list[tuple[str, Path]]:
    """(name, directory) of each of ``b36.SOURCE_PACKAGES`` installed (importlib finds them;
    nothing is imported)."""
    import importlib.util

    out = []
    for name in b36.SOURCE_PACKAGES:
        top, *rest = name.split("/")
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            spec = None
        for location in (spec.submodule_search_locations or ()) if spec is not None else ():
            path = Path(location).joinpath(*rest)
            if (path / "__init__.py").is_file():
                out.append((name, path))
                break
    return out


def _version(dist: str) -> Optional[str]:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _device_sms() -> Optional[int]:
    try:
        import torch

        if torch.cuda.is_available():
            return int(torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count)
    except Exception:  # noqa: BLE001 - no device: the SM count is not part of the key
        pass
    return None


def environment(arch: int) -> dict:
    """Everything besides the configuration a stored kernel is keyed by (see the module doc)."""
    settings = envs.raw_with_prefixes(b36.KEY_ENV_PREFIXES)
    return {
        "format": FORMAT,
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "machine": os.uname().machine if hasattr(os, "uname") else sys.platform,
        "versions": {d: _version(d) for d in b36.KEY_DISTRIBUTIONS},
        "sources": _sources_digest(),
        "settings": {k: v for k, v in settings.items() if k not in b36.KEY_ENV_IGNORED},
        "arch": int(arch),
        "sms": _device_sms(),
    }


# -- the argument template as JSON -----------------------------------------------------------


def encode_value(value):
    """None, bool, int, float, str as they are; tuples and lists as {"tuple": [...]} (FA4 passes
    tuples, e.g. its AuxData NamedTuple, which TVM-FFI converts like any tuple)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (tuple, list)):
        return {"tuple": [encode_value(v) for v in value]}
    raise NotStorable(f"a template argument of type {type(value).__name__}")


def decode_value(value):
    if isinstance(value, dict):
        if set(value) != {"tuple"} or not isinstance(value["tuple"], list):
            raise ValueError(f"bad template value {value!r}")
        return tuple(decode_value(v) for v in value["tuple"])
    if isinstance(value, list):
        raise ValueError("bad template value (list)")
    return value


# -- linking and loading -----------------------------------------------------------------------


def runtime_libraries() -> list[str]:
    """The shared libraries an exported kernel links against (the CUTLASS DSL's runtime and
    TVM-FFI's): ``cutlass.cute.runtime.find_runtime_libraries``; only called with FA4 (and so the
    DSL) imported, from :meth:`Store.save`."""
    from cutlass.cute import runtime

    return [str(p) for p in runtime.find_runtime_libraries(enable_tvm_ffi=True)]


def find_compiler() -> Optional[str]:
    for name in COMPILERS:
        path = shutil.which(name)
        if path:
            return path
    return None


def link(obj: Path, out: Path, libs: list[str], compiler: Optional[str] = None) -> None:
    """Link ``obj`` into the shared library ``out`` against ``libs`` (absolute paths)."""
    cc = compiler or find_compiler()
    if cc is None:
        raise NotStorable(f"no C compiler ({', '.join(COMPILERS)}) on PATH to link with")
    rpaths = [f"-Wl,-rpath,{d}" for d in dict.fromkeys(str(Path(lib).parent) for lib in libs)]
    cmd = [cc, "-shared", "-Wl,-Bsymbolic", "-o", str(out), str(obj), *libs, *rpaths]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=_LINK_TIMEOUT_S)
    if proc.returncode != 0:
        raise NotStorable(f"linking failed ({' '.join(cmd)}): {proc.stderr.strip()[-500:]}")


_runtime_handles: dict[str, ctypes.CDLL] = {}


def load_runtime(libs: list[dict]) -> None:
    """dlopen the runtime libraries an entry was linked against, globally (their symbols must be
    visible to the kernel library), once per process; a missing or changed one raises."""
    for lib in libs:
        path = Path(lib["path"])
        if not path.is_file() or path.stat().st_size != lib["size"]:
            raise FileNotFoundError(f"runtime library {path} is missing or changed")
        if lib["path"] not in _runtime_handles:
            _runtime_handles[lib["path"]] = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)


def load_function(path: Path, name: str):
    """(module, function): the TVM-FFI function ``name`` of the shared library at ``path``."""
    import tvm_ffi

    module = tvm_ffi.load_module(str(path))
    return module, module[name]


# -- the store ----------------------------------------------------------------------------------


class Store:
    """The shared-library kernels under ``root`` (one per environment x configuration)."""

    def __init__(self, root: Path, *, compiler: Optional[str] = None):
        self.root = Path(root)
        self.compiler = compiler
        self._environments: dict[int, tuple[dict, str]] = {}
        self._warned: set[str] = set()
        self._lock = threading.Lock()

    def environment(self, arch: int) -> tuple[dict, str]:
        """(environment, its digest) for kernels of ``arch``, computed once per process."""
        if arch not in self._environments:
            env = environment(arch)
            self._environments[arch] = (env, _digest(env))
        return self._environments[arch]

    def entry_dir(self, config: FA4Config) -> Path:
        return self.root / self.environment(config.arch)[1] / _digest(_config_json(config))

    def has_entries(self, arch: int) -> bool:
        """Whether any kernel of this environment is stored (a restart that may import nothing)."""
        directory = self.root / self.environment(arch)[1]
        return directory.is_dir() and any(directory.glob(f"*/{META}"))

    def load(self, config: FA4Config, layout: CallLayout) -> Optional[Stored]:
        """The stored kernel of ``config``, or None (a miss: absent, stale or corrupt; logged)."""
        directory = self.entry_dir(config)
        meta_path = directory / META
        if not meta_path.is_file():
            return None
        try:
            return self._load(directory, json.loads(meta_path.read_text()), config, layout)
        except Exception as exc:  # noqa: BLE001 - any bad entry is a miss, never a wrong kernel
            self._warn(str(directory), f"sglang-fa4: stored FA4 kernel {directory} not used "
                       f"({type(exc).__name__}: {exc}); FA4's own path resolves {config}")
            return None

    def _load(self, directory: Path, meta: dict, config: FA4Config, layout: CallLayout) -> Stored:
        env, _ = self.environment(config.arch)
        if meta.get("format") != FORMAT:
            raise ValueError(f"format {meta.get('format')!r}, expected {FORMAT}")
        if meta.get("environment") != env:
            raise ValueError("stored for another environment: " + _env_difference(meta.get("environment"), env))
        if meta.get("config") != _config_json(config):
            raise ValueError(f"stored for configuration {meta.get('config')}")
        template = [decode_value(v) for v in meta["template"]]
        if len(template) != layout.nargs or meta.get("nargs") != layout.nargs:
            raise ValueError(f"{len(template)} template arguments, the layout has {layout.nargs}")
        if config.many_segments != bool(meta.get("sched_spec")):
            raise ValueError("scheduler aids do not match the configuration")
        load_runtime(meta["runtime_libraries"])
        functions, modules = {}, []
        for role, lib in sorted(meta["libraries"].items()):
            path = directory / lib["file"]
            if Path(lib["file"]).name != lib["file"] or _sha256(path.read_bytes()) != lib["sha256"]:
                raise ValueError(f"{lib['file']} is not the library that was stored")
            module, functions[role] = load_function(path, lib["function"])
            modules.append(module)
        if "forward" not in functions:
            raise ValueError("no forward kernel")
        spec = meta.get("sched_spec")
        sched = b36.stored_sched(spec, {k: v for k, v in functions.items() if k != "forward"}) if spec else None
        return Stored(functions["forward"], template, sched, modules)

    def save(self, config: FA4Config, resolved: Resolved, template: list, layout: CallLayout) -> bool:
        """Store the kernel FA4 just resolved for ``config`` (``template``: the launcher's
        argument template). Best effort: False, with one warning, when it cannot be stored."""
        try:
            if resolved.export is None:
                raise NotStorable("its scheduler aids are not exportable (SM100 block -> batch index)")
            with self._lock:
                self._save(config, resolved, template, layout)
            return True
        except Exception as exc:  # noqa: BLE001 - the kernel still runs; a restart imports FA4
            self._warn(f"save:{type(exc).__name__}", f"sglang-fa4: FA4 kernel {config} not stored as a "
                       f"shared library ({type(exc).__name__}: {exc}); a restart imports FA4 to load it")
            return False

    def _save(self, config: FA4Config, resolved: Resolved, template: list, layout: CallLayout) -> None:
        env, _ = self.environment(config.arch)
        directory = self.entry_dir(config)
        directory.mkdir(parents=True, exist_ok=True)
        runtime = [{"path": p, "size": Path(p).stat().st_size} for p in runtime_libraries()]
        encoded = [encode_value(v) for v in template]
        libraries = {}
        with tempfile.TemporaryDirectory(dir=directory, prefix=".tmp-") as tmp:
            for role, obj, function in resolved.export(Path(tmp)):
                built = Path(tmp) / f"{role}.so"
                link(obj, built, [lib["path"] for lib in runtime], self.compiler)
                digest = _sha256(built.read_bytes())
                name = f"{role}-{digest[:16]}.so"
                os.replace(built, directory / name)
                libraries[role] = {"file": name, "sha256": digest, "function": function}
            meta = {"format": FORMAT, "environment": env, "config": _config_json(config),
                    "nargs": layout.nargs, "template": encoded, "sched_spec": resolved.sched_spec,
                    "libraries": libraries, "runtime_libraries": runtime, "fa4_key": repr(resolved.key)}
            staged = Path(tmp) / META
            staged.write_text(json.dumps(meta, indent=1, sort_keys=True))
            os.replace(staged, directory / META)
        logger.info("sglang-fa4: FA4 kernel %s stored as a shared library in %s", config, directory)

    def _warn(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message)


def _config_json(config: FA4Config) -> dict:
    return json.loads(json.dumps(config.as_dict()))  # tuples as lists, as stored


def _env_difference(stored, current: dict) -> str:
    if not isinstance(stored, dict):
        return "no environment"
    keys = sorted(k for k in set(stored) | set(current) if stored.get(k) != current.get(k))
    return ", ".join(f"{k}: {stored.get(k)!r} -> {current.get(k)!r}" for k in keys)


_default: Optional[Store] = None
_default_lock = threading.Lock()


def default_store() -> Optional[Store]:
    """The process's store (SGLANG_FA4_KERNEL_CACHE and SGLANG_FA4_SHARED_LIBS on), else None."""
    global _default
    if not (envs.SGLANG_FA4_KERNEL_CACHE.get() and envs.SGLANG_FA4_SHARED_LIBS.get()):
        return None
    with _default_lock:
        root = Path(envs.SGLANG_FA4_KERNEL_CACHE_DIR.get()).expanduser() / SUBDIR
        if _default is None or _default.root != root:
            _default = Store(root)
        return _default
