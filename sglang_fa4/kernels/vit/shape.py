"""What the ViT kernels compile per: a model's attention shape (head dim, heads, kv heads, dtype).

The rotary and short-window Triton kernels specialize on it, and the FP8 ViT path compiles its
quantize kernels per (head dim, dtype) and runs the FP8 forward variant of the padded head dim; the
warmup registry's ViT families take one of these per shape a model has."""

from __future__ import annotations

from typing import Any, NamedTuple


class VitShape(NamedTuple):
    head_dim: int
    heads: int
    kv_heads: int
    dtype: str  # "bfloat16" / "float16"

    @property
    def fp8_kernel(self):
        """The FP8 forward variant the FP8 ViT path runs for this shape (head dim zero-padded)."""
        from sglang_fa4.kernels.fp8_sm90 import Fp8Variant, padded_head_dim

        return Fp8Variant(padded_head_dim(self.head_dim), False, False)

    def describe(self) -> str:
        return f"d={self.head_dim} heads={self.heads}/{self.kv_heads} {self.dtype}"

    def as_dict(self) -> dict[str, Any]:
        return self._asdict()
