"""Cross-compile one of our Triton kernels to sm_90 PTX on the CPU (no GPU needed), with the
specialization a real launch gets: the tests then read the PTX for the instructions that matter
(vector widths, tensor-core MMAs, IEEE division)."""

from __future__ import annotations

import pytest


def sm90_ptx(fn, signature: dict, constexprs: dict, aligned=(), num_warps: int = 4) -> str:
    """``fn``'s PTX for sm_90. ``signature`` maps every non-constexpr parameter to its Triton type
    (constexprs are filled in); ``aligned`` names parameters that a real launch specializes as
    divisible by 16 (pointers, strides). Skips where this Triton's compile API differs."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = [p.name for p in fn.params]
    sig = {n: "constexpr" if n in constexprs else signature[n] for n in names}
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in aligned if n not in constexprs}
    try:
        src = ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
    except TypeError as exc:
        pytest.skip(f"this Triton's ASTSource differs: {exc}")
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps}).asm["ptx"]
