"""Which multimodal (ViT) attention backend a model gets: a pure function of its inputs.

Priority is SGLang's: ``--mm-attention-backend`` > the backend the model passed > the platform
default. On CUDA the default comes from environ.yaml's per-compute-capability table (or the
``SGLANG_FA4_MM_ATTENTION_BACKEND_DEFAULT`` override); other platforms keep SGLang's own default.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Mapping, Optional

from sglang_fa4.environ import EnvRegistry, envs

#: SGLang's name of the FlashAttention-4 ViT backend (``--mm-attention-backend fa4``)
FA4 = "fa4"

# SGLang's is_blackwell: CUDA majors 10, 11 and 12 (with CUDA >= 12.8).
BLACKWELL_MAJORS = (10, 11, 12)

#: compute-capability majors a ViT backend runs on, for those that do not run on every CUDA GPU:
#: fa4 as sglang-fa4 runs it (Hopper SM90, Blackwell SM100-SM110); fa3 is sgl-kernel's
#: FlashAttention-3 build (sm_80-sm_89, sm_90a; SGLang refuses it on Blackwell)
BACKEND_MAJORS = {FA4: (9, 10, 11), "fa3": (8, 9)}

logger = logging.getLogger("sglang_fa4")
_warned: set = set()


class BackendSelectionError(ValueError):
    """The requested backend cannot run on this GPU."""


@dataclass(frozen=True)
class BackendChoice:
    backend: Optional[str]  # None: not ours to decide (non-CUDA platform) -> SGLang's default
    reason: str
    source: str  # "server_arg" | "model" | "env_override" | "table" | "upstream"
    warning: Optional[str] = None  # the override names a backend this GPU cannot run


def cannot_run(backend: str, capability: tuple[int, int]) -> Optional[str]:
    """Why ``backend`` does not run on a GPU of ``capability``, or None when it does (as far as
    :data:`BACKEND_MAJORS` knows)."""
    majors = BACKEND_MAJORS.get(backend)
    if majors is None or capability[0] in majors:
        return None
    shown = ", ".join(f"{m}.x" for m in majors)
    return f"{backend} does not run on compute capability {capability[0]}.{capability[1]} (it runs on {shown})"


def parse_capability(text: str) -> tuple[int, int]:
    """'10.3' -> (10, 3); a clear error for anything else."""
    parts = text.strip().split(".")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise ValueError(f"compute capability must look like MAJOR.MINOR (e.g. 10.3), got {text!r}")
    return int(parts[0]), int(parts[1])


def default_for_capability(
    capability: tuple[int, int], table: Mapping[str, str]
) -> tuple[str, str]:
    """Look a capability up in the defaults table: exact "major.minor", then "major", then "default"."""
    major, minor = capability
    for key in (f"{major}.{minor}", f"{major}"):
        if key in table:
            return table[key], f"table entry {key!r}"
    return table["default"], "table entry 'default'"


def select_mm_attention_backend(
    server_arg: Optional[str],
    passed_backend: Optional[str],
    capability: Optional[tuple[int, int]],
    platform: str = "cuda",
    registry: EnvRegistry = envs,
    warn: bool = True,
) -> BackendChoice:
    """The backend and why. An env override this GPU cannot run is kept (SGLang reports the
    failure itself) but carries a warning, logged once per process unless ``warn`` is False."""
    if server_arg is not None:
        choice = BackendChoice(server_arg, f"--mm-attention-backend={server_arg}", "server_arg")
    elif passed_backend is not None:
        choice = BackendChoice(passed_backend, f"the model asked for {passed_backend}", "model")
    elif platform != "cuda":
        return BackendChoice(None, f"platform {platform}: SGLang's own default applies", "upstream")
    elif capability is None:
        raise ValueError("a CUDA platform needs a compute capability to pick a default backend")
    else:
        cc = f"{capability[0]}.{capability[1]}"
        override = registry.SGLANG_FA4_MM_ATTENTION_BACKEND_DEFAULT.get()
        if override:
            problem = cannot_run(override, capability)
            warning = (f"SGLANG_FA4_MM_ATTENTION_BACKEND_DEFAULT={override}: {problem}; unset it or pick "
                       "another backend" if problem else None)
            choice = BackendChoice(
                override, f"SGLANG_FA4_MM_ATTENTION_BACKEND_DEFAULT={override} (sm {cc})", "env_override", warning
            )
            if warning and warn and warning not in _warned:
                _warned.add(warning)
                logger.warning("sglang-fa4: %s", warning)
        else:
            backend, entry = default_for_capability(capability, registry.mm_attention_backend_defaults)
            choice = BackendChoice(backend, f"default for compute capability {cc} ({entry})", "table")
    if (
        choice.backend == "fa3"
        and platform == "cuda"
        and capability is not None
        and capability[0] in BLACKWELL_MAJORS
    ):
        raise BackendSelectionError(
            f"The 'fa3' backend is not supported on Blackwell GPUs (compute capability "
            f"{capability[0]}.{capability[1]}; chosen by {choice.reason})"
        )
    return choice
