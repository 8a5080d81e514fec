"""Stand-ins for SGLang's CUDA-only binary dependencies (sgl_kernel, flashinfer), so the REAL
SGLang Python code (vision towers, ViT graph runners, VisionAttention) runs on a GPU machine that
cannot receive those wheels (the device machine takes 64 MiB per call; sgl_kernel alone is far
larger, and nothing can be installed there from a registry).

Only what cannot travel is replaced, and only the ops the ViT towers and the server path call have a
body (plain torch, written here): RMSNorm (plain and with a fused residual add), the gated
activations, and ``sgl_kernel.utils.is_arch_support_pdl`` (read by the triton attention backend). Every other
name of these packages imports as a callable that raises, naming itself, so a code path we did not
expect fails loudly instead of computing something else. Attention itself is not stubbed: fa4 goes
through sglang_fa4 (flash_attn.cute), the others through torch.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

import torch
import torch.nn.functional as F

ROOTS = ("sgl_kernel", "flashinfer")


def _rms(x, weight, eps):
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.float()).to(x.dtype)


def _into(y, out):
    if out is not None:
        out.copy_(y)
        return out
    return y


def rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None):
    return _into(_rms(input, weight, eps), out)


def fused_add_rmsnorm(input, residual, weight, eps=1e-6, enable_pdl=None):
    # sgl_kernel semantics: residual += input; input = rmsnorm(residual), both in place
    residual.add_(input)
    input.copy_(_rms(residual, weight, eps))


def gemma_rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None):
    """sgl_kernel.gemma_rmsnorm: rmsnorm(x) * (1 + weight) (Gemma's stored norm weights are offsets)."""
    return _into(_rms(input, weight.float() + 1.0, eps), out)


def gemma_fused_add_rmsnorm(input, residual, weight, eps=1e-6, enable_pdl=None):
    # residual += input; input = rmsnorm(residual) * (1 + weight), both in place
    residual.add_(input)
    input.copy_(_rms(residual, weight.float() + 1.0, eps))


def _gated(act):
    def op(input, out=None, enable_pdl=None):
        d = input.shape[-1] // 2
        return _into(act(input[..., :d].float()).to(input.dtype) * input[..., d:], out)

    return op


silu_and_mul = _gated(F.silu)
gelu_and_mul = _gated(lambda t: F.gelu(t, approximate="none"))
gelu_tanh_and_mul = _gated(lambda t: F.gelu(t, approximate="tanh"))

def weak_ref_tensor(t):
    """sgl_kernel.weak_ref_tensor (SGLang's decode CUDA-graph runner keeps graph outputs through it):
    the tensor itself -- a strong reference, so the graph's output memory stays held (a few MiB)."""
    return t


def is_arch_support_pdl() -> bool:
    """sgl_kernel.utils.is_arch_support_pdl: programmatic dependent launch needs compute capability
    9.0 or newer (SGLang's triton attention backend reads it once, at construction)."""
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9


IMPLEMENTED = {
    "sgl_kernel": {"rmsnorm": rmsnorm, "fused_add_rmsnorm": fused_add_rmsnorm, "silu_and_mul": silu_and_mul,
                   "gelu_and_mul": gelu_and_mul, "gelu_tanh_and_mul": gelu_tanh_and_mul,
                   # Gemma-4's Gemma4RMSNorm with scale_shift 1 (benchmark/release/serve_llm.py)
                   "gemma_rmsnorm": gemma_rmsnorm, "gemma_fused_add_rmsnorm": gemma_fused_add_rmsnorm,
                   # decode CUDA graphs on (benchmark/release/serve_llm.py)
                   "weak_ref_tensor": weak_ref_tensor},
    # the server path (benchmark/release/check_server.py): SGLang's triton attention backend
    "sgl_kernel.utils": {"is_arch_support_pdl": is_arch_support_pdl},
}

called_missing: list[str] = []  # names of raising stand-ins that were called (for the report)


class _Missing:
    """What any other name resolves to: raises when called, names itself; usable as a base class
    or a decorator target at import time."""

    def __init__(self, qualname):
        self._qualname = qualname

    def __call__(self, *args, **kwargs):
        called_missing.append(self._qualname)
        raise NotImplementedError(f"{self._qualname} is a stand-in (cuda_only_stubs): the real "
                                  "package is not on this machine")

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Missing(f"{self._qualname}.{name}")

    def __mro_entries__(self, bases):
        return (type(self._qualname.rsplit(".", 1)[-1], (), {}),)


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        impl = IMPLEMENTED.get(self.__name__, {}).get(name)
        return impl if impl is not None else _Missing(f"{self.__name__}.{name}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in ROOTS:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        mod = _StubModule(spec.name)
        mod.__path__ = []
        mod.__version__ = "0.0.0+stub"
        return mod

    def exec_module(self, module):
        pass


def install() -> None:
    """Put the stand-ins for every package in ROOTS first on sys.meta_path (before anything
    imports SGLang)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def install_missing() -> list[str]:
    """Stand-ins only for the packages of ROOTS that are not installed; returns their names."""
    import importlib.util

    global ROOTS
    ROOTS = tuple(name for name in ROOTS if importlib.util.find_spec(name) is None)
    if ROOTS:
        install()
    return list(ROOTS)
