"""ViT CUDA-graph outputs that own their memory.

A captured graph writes its output into one static tensor on every replay. SGLang's ViT graph
runners (generic: Qwen2.5-VL / Qwen3-VL family; InternVL: InternVL, InternS1, RADIO) return that
tensor, or a view of it, to the model, and SGLang keeps what the tower returns: the multimodal
embedding cache stores it, chunked prefill reads it again later, and several requests' embeddings
are concatenated only after all their ViT calls. The next replay of the same graph (another request
of the same layout or budget) then silently rewrites a held embedding. Qwen2.5-VL escaped only
because its output goes through ``index_select`` (a fresh tensor).

:func:`owned` copies an output exactly when it shares storage with a graph's static memory (the
copy vLLM also makes after an encoder replay); outputs that are already fresh pass through.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional


def _storage_ptr(t: Any) -> int:
    return t.untyped_storage().data_ptr()


def shares_storage(out: Any, statics: Iterable[Optional[Any]]) -> bool:
    """True when ``out`` lives in the storage of any of ``statics`` (None entries are skipped)."""
    ptr = _storage_ptr(out)
    return any(s is not None and _storage_ptr(s) == ptr for s in statics)


def owned(out: Any, *statics: Optional[Any]) -> Any:
    """``out``, or a copy of it when it shares storage with one of the graph's static tensors: the
    caller may keep the result for as long as it likes."""
    return out.clone() if shares_storage(out, statics) else out
