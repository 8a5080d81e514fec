"""FlashAttention-4 (pip ``flash-attn-4`` 4.0.0b36) as the package runs it: what is installed, the
kernel cache that resolves each configuration once and then launches it directly, its stored
shared libraries.

* :mod:`.installation` -- installed or not, its version, the kernel class, its disk cache
  (imports neither torch nor FA4: the doctor asks here);
* :mod:`.b36` -- everything specific to that release (private names, call layout, the backend);
* :mod:`.config` -- what one compiled configuration is; :mod:`.cache` -- the cache and the
  process's one instance; :mod:`.launcher` -- one configuration's direct launch;
  :mod:`.shared_libs` -- kernels stored as shared libraries, loaded without FA4 on a restart.

Outside this package only the names below are used. The torch-using ones are imported on first
access, so ``sglang-fa4 doctor`` reads the installation without torch.
"""

from sglang_fa4.kernels.fa4.b36 import FA4LayoutError
from sglang_fa4.kernels.fa4.installation import (
    CALL_LAYOUT_CHECKED,
    MANY_SEGMENTS,
    WRITTEN_AGAINST,
    available,
    device_arch,
    installed_version,
    loaded_disk_cache,
)

__all__ = [
    # installation (no torch)
    "WRITTEN_AGAINST", "CALL_LAYOUT_CHECKED", "MANY_SEGMENTS", "available", "installed_version", "device_arch",
    "loaded_disk_cache", "FA4LayoutError",
    # the kernel cache
    "KernelCache", "kernel_cache", "process_cache", "install_kernel_cache",
    # configurations
    "FA4Config", "CompileEvent", "config_for",
    # stored shared libraries
    "default_store",
    # the warmup registry's entry (family "fa4")
    "FAMILIES",
]

_CACHE = ("KernelCache", "kernel_cache", "process_cache", "install_kernel_cache", "FAMILIES")
_CONFIG = ("FA4Config", "CompileEvent", "config_for")


def __getattr__(name: str):
    """The torch-using names, imported on first access."""
    if name in _CACHE:
        from sglang_fa4.kernels.fa4 import cache as module
    elif name in _CONFIG:
        from sglang_fa4.kernels.fa4 import config as module
    elif name == "default_store":
        from sglang_fa4.kernels.fa4 import shared_libs as module
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = globals()[name] = getattr(module, name)  # looked up here once
    return value
