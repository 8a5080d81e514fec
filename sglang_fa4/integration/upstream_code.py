"""Which of our features the installed SGLang's own code already has, read from its source files.

The plugin hooks a feature only where SGLang lacks it. The answer comes from SGLang's code (parsed
with ``ast``, never imported: doctor must not import SGLang), with features.py's ``upstream_since``
only as a cross-check: where the two disagree the code wins and one warning says so. A feature
without a detector here, or whose code is not found (a file or method renamed), falls back to the
version table.
"""

from __future__ import annotations

import ast
import functools
import logging
from importlib import metadata
from pathlib import Path
from typing import Callable, Optional

from packaging.version import InvalidVersion, Version

from sglang_fa4 import features

logger = logging.getLogger("sglang_fa4")

VISION = "sglang/srt/layers/attention/vision.py"
GENERIC_RUNNER = "sglang/srt/multimodal/vit_cuda_graph_runner.py"
INTERNVL_RUNNER = "sglang/srt/multimodal/internvl_vit_cuda_graph_runner.py"


def _method(tree: ast.Module, cls: str, name: Optional[str] = None) -> Optional[ast.AST]:
    """Class `cls` of the module (or its method `name`), None where absent."""
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            if name is None:
                return node
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == name:
                    return item
    return None


def _compares_with(node: ast.AST, value: str) -> bool:
    """A comparison in `node` against the string constant `value` (``x == "fa4"``, ``x in ("fa3", "fa4")``)."""
    for cmp in ast.walk(node):
        if not isinstance(cmp, ast.Compare):
            continue
        for side in (cmp.left, *cmp.comparators):
            consts = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
            if any(isinstance(c, ast.Constant) and c.value == value for c in consts):
                return True
    return False


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _backend_default_table(read: Callable[[str], Optional[ast.Module]]) -> Optional[bool]:
    # 0.5.20: `elif major == 10 and minor != 3: backend = "fa4"` (sm_103 falls to triton_attn);
    # 0.5.21+: `elif major == 10:`. Upstream has it when the default reads no minor version.
    tree = read(VISION)
    fn = tree and _method(tree, "VisionAttention", "_determine_attention_backend")
    if fn is None or "fa4" not in ast.unparse(fn):
        return None
    return not any("minor" in _names(cmp) for cmp in ast.walk(fn) if isinstance(cmp, ast.Compare))


def _fa4_list_seqlens(read: Callable[[str], Optional[ast.Module]]) -> Optional[bool]:
    # 0.5.21+: `elif isinstance(cu_seqlens, list): cu_seqlens_gpu, max_seqlen = cu_seqlens[0], [1]`
    tree = read(VISION)
    fn = tree and _method(tree, "VisionFlash4Attention", "forward")
    if fn is None:
        return None
    return any(
        isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "isinstance"
        and len(call.args) == 2 and isinstance(call.args[0], ast.Name) and call.args[0].id == "cu_seqlens"
        and isinstance(call.args[1], ast.Name) and call.args[1].id == "list"
        for call in ast.walk(fn)
    )


def _vit_graph_runners_fa4(read: Callable[[str], Optional[ast.Module]]) -> Optional[bool]:
    # 0.5.21+: both runners build fa4's [cu_seqlens, max_seqlen] layout (`backend in ("fa3", "fa4")`)
    # and the generic one warms every layout before capture (`backend == "fa4" and ...`).
    generic, internvl = read(GENERIC_RUNNER), read(INTERNVL_RUNNER)
    create = generic and _method(generic, "ViTCudaGraphRunner", "_create_graph")
    runner = internvl and _method(internvl, "InternViTCudaGraphRunner")
    if create is None or runner is None:
        return None
    return _compares_with(create, "fa4") and _compares_with(runner, "fa4")


# feature name -> what in SGLang's code shows that upstream has it (True / False; None: not found)
DETECTORS: dict[str, Callable[[Callable[[str], Optional[ast.Module]]], Optional[bool]]] = {
    "backend_default_table": _backend_default_table,
    "fa4_list_seqlens": _fa4_list_seqlens,
    "vit_graph_runners_fa4": _vit_graph_runners_fa4,
}


def _installed_sglang_root() -> Optional[tuple[str, Path]]:
    """(public version, the directory holding the ``sglang`` package) of the installed distribution."""
    try:
        dist = metadata.distribution("sglang")
    except metadata.PackageNotFoundError:
        return None
    try:
        version = Version(dist.version).public
    except InvalidVersion:
        version = dist.version
    return version, Path(str(dist.locate_file("")))


@functools.lru_cache(maxsize=None)
def _detect_all(root: Path) -> dict[str, Optional[bool]]:
    trees: dict[str, Optional[ast.Module]] = {}

    def read(rel: str) -> Optional[ast.Module]:
        if rel not in trees:
            try:
                trees[rel] = ast.parse((root / rel).read_text(encoding="utf-8"))
            except (OSError, SyntaxError, ValueError):
                trees[rel] = None
        return trees[rel]

    return {name: detect(read) for name, detect in DETECTORS.items()}


def detected(sglang_version: str) -> dict[str, Optional[bool]]:
    """Per detectable feature, whether the installed SGLang's code has it (None: code not found).
    Empty when the installed SGLang is not `sglang_version` (or there is none)."""
    found = _installed_sglang_root()
    if found is None or found[0] != sglang_version:
        return {}
    return _detect_all(found[1])


_warned: set[tuple[str, str]] = set()


def upstream_has(feature: features.Feature, sglang_version: str) -> bool:
    """Whether SGLang `sglang_version` (the installed one: its code decides) already has `feature`."""
    by_table = feature.upstream_has(sglang_version)
    by_code = detected(sglang_version).get(feature.name)
    if by_code is None:
        return by_table
    if by_code != by_table and (feature.name, sglang_version) not in _warned:
        _warned.add((feature.name, sglang_version))
        logger.warning(
            "sglang-fa4: SGLang %s's code %s %s, but its version says it %s (upstream since %s); "
            "going by the code", sglang_version, "has" if by_code else "lacks", feature.name,
            "should" if by_table else "should not", feature.upstream_since)
    return by_code
