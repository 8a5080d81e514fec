"""The kernels' routing settings, read from the environment once per process into one object.

Three variables choose routes: which precision a ViT attention call may run in, how short a ViT
layout's segments must be to leave FA4, and how few new tokens per sequence send a paged FP8 KV
call to the split-KV kernel. The public attention functions (:mod:`sglang_fa4.kernels.varlen`,
:mod:`sglang_fa4.kernels.fp8_paged_kv`) decide each call from its host facts and this object;
nothing on a call path reads the environment. The plugin reads it at startup (``plugin.register``,
after a malformed value of ours has fallen back to its default); anything else gets it on first use.
:func:`reload` reads the environment again (tests, and the measuring scripts that change a variable).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Optional

from sglang_fa4.environ import envs

#: SGLANG_FA4_VIT_ATTN_DTYPE's values
BF16, FP8 = "bf16", "fp8"


@dataclass(frozen=True)
class RoutingSettings:
    """What the environment says about routing (each field names its variable)."""

    #: SGLANG_FA4_VIT_ATTN_DTYPE: "fp8" lets a ViT call run the SM90 FP8 forward where measured faster
    vit_attn_dtype: str = BF16
    #: SGLANG_FA4_SHORT_SEQLEN_ROUTE_MAX: longest ViT segment routed to the short-window kernels (0: none)
    short_route_max_seqlen: int = 64
    #: SGLANG_FA4_FP8_KV_SPLIT_KV_MAX_Q: most new tokens per sequence the paged split-KV kernel takes
    split_kv_max_q: int = 16

    @classmethod
    def from_env(cls) -> "RoutingSettings":
        """Read the three variables (a malformed one raises the registry's EnvValueError, which
        names it and what it accepts)."""
        return cls(
            vit_attn_dtype=envs.SGLANG_FA4_VIT_ATTN_DTYPE.get(),
            short_route_max_seqlen=envs.SGLANG_FA4_SHORT_SEQLEN_ROUTE_MAX.get(),
            split_kv_max_q=envs.SGLANG_FA4_FP8_KV_SPLIT_KV_MAX_Q.get(),
        )

    @property
    def vit_fp8(self) -> bool:
        return self.vit_attn_dtype == FP8


_current: Optional[RoutingSettings] = None
_lock = threading.Lock()


def settings() -> RoutingSettings:
    """This process's settings, read from the environment on the first call."""
    current = _current
    return current if current is not None else reload()


def reload() -> RoutingSettings:
    """Read the environment again and use what it says from now on."""
    global _current
    fresh = RoutingSettings.from_env()
    with _lock:
        _current = fresh
    return fresh


def install(value: Optional[RoutingSettings]) -> Optional[RoutingSettings]:
    """Use ``value`` (None: read the environment on the next call); returns the previous one (tests)."""
    global _current
    with _lock:
        previous, _current = _current, value
    return previous
