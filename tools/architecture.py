"""The package's structure read from its imports: the module graph, its cycles, the sub-package faces,
and the generated layout of docs/architecture.md.

``python -m tools.architecture`` rewrites the ``<!-- layout:start -->`` block of docs/architecture.md
(the tree of ``sglang_fa4/``: one line per module, the first line of its docstring; per kernels
sub-package, the sub-packages it imports); ``--check`` only reports. tests/test_architecture.py
keeps the block equal to what this writes and runs the graph checks (:func:`cycles`,
:func:`face_violations`) on the package and on planted violations.

The graph is static (``ast``), lazy imports included (an import inside a function runs when that
function does: a cycle through one is a cycle). A node is a module or a package's ``__init__`` (its
face, named by the package). ``from P import x`` is an edge to the module ``P.x`` when there is
one, else to ``P`` (a name of ``P``'s face: an edge to the face even from inside ``P``, where it is
still running); an import also runs the ``__init__`` of every package above its target that is not
above the importer itself, so those are edges too (a package's own modules importing each other
pass through a face that is already running, which is no edge).
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "sglang_fa4"
DOC = ROOT / "docs" / "architecture.md"
BLOCK = "layout"


@dataclass
class Module:
    name: str  # dotted; a package by its own name
    path: Path
    is_package: bool
    tree: ast.Module


@dataclass
class Graph:
    modules: dict[str, Module]
    #: module -> {imported module: [(line, what the import statement named)]}
    edges: dict[str, dict[str, list]] = field(default_factory=dict)

    def packages(self) -> list[str]:
        return sorted(n for n, m in self.modules.items() if m.is_package)


def load(root: Path = PACKAGE) -> Graph:
    """The import graph of the package at ``root`` (a directory with an ``__init__.py``)."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        rel = path.relative_to(root.parent).with_suffix("")
        parts = list(rel.parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        name = ".".join(parts)
        modules[name] = Module(name, path, is_package, ast.parse(path.read_text(), str(path)))
    graph = Graph(modules)
    for name, module in modules.items():
        graph.edges[name] = _edges(name, module, modules)
    return graph


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _edges(name: str, module: Module, modules: dict) -> dict[str, list]:
    out: dict[str, list] = {}
    here = set(_ancestors(name)) | ({name} if module.is_package else set())

    def add(target: str, line: int, named: str) -> None:
        while target and target not in modules:  # a name inside a module: the module
            target = target.rpartition(".")[0]
        if not target or target == name:
            return
        for anc in _ancestors(target):  # the faces the import runs first
            if anc in modules and anc not in here:
                out.setdefault(anc, []).append((line, named))
        # the target itself, even a package above the importer: a name taken from a face that is
        # still running (its own modules importing it back) is the cycle that fails at import
        out.setdefault(target, []).append((line, named))

    base_parts = name.split(".") if module.is_package else name.split(".")[:-1]
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno, alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parent = ".".join(base_parts[: len(base_parts) - node.level + 1])
                source = f"{parent}.{node.module}" if node.module else parent
            else:
                source = node.module or ""
            for alias in node.names:
                full = f"{source}.{alias.name}"
                add(full if full in modules else source, node.lineno, full)
    return out


def cycles(graph: Graph) -> list[list[str]]:
    """Every set of modules that import each other in a loop (strongly connected, size > 1), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(max(10000, sys.getrecursionlimit()))

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph.modules):
        if v not in index:
            visit(v)
    return sorted(found)


def sub_packages(graph: Graph, under: str) -> list[str]:
    """The packages directly below package ``under`` (e.g. the kernels' sub-packages)."""
    return [p for p in graph.packages() if p.rpartition(".")[0] == under]


def face_names(graph: Graph, package: str) -> list[str]:
    """The names a face's ``__all__`` lists (empty without one)."""
    for node in graph.modules[package].tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return [e.value for e in ast.walk(node.value) if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return []


def face_violations(graph: Graph, packages: list[str]) -> list[str]:
    """Imports into one of ``packages`` from a module outside it that are not its face's names:
    a submodule (``from P.m import x``, ``from P import m``), or a name the face does not list."""
    out = []
    for name, module in sorted(graph.modules.items()):
        for package in packages:
            if name == package or name.startswith(package + "."):
                continue
            public = set(face_names(graph, package))
            for target, uses in sorted(graph.edges[name].items()):
                if target == package:
                    for line, named in uses:  # a name taken from the face itself (not one of its modules)
                        leaf = named[len(package) + 1:]
                        if named.startswith(package + ".") and "." not in leaf and named not in graph.modules \
                                and leaf not in public:
                            out.append(f"{_rel(module)}:{line}: {named} (not in {package}'s __all__)")
                elif target.startswith(package + "."):
                    for line, named in uses:
                        out.append(f"{_rel(module)}:{line}: {named} (inside {package}: use its face)")
    return sorted(set(out))


def _rel(module: Module) -> str:
    try:
        return module.path.relative_to(ROOT).as_posix()
    except ValueError:
        return module.path.as_posix()


#: the longest summary a layout line carries (the docstring has the rest)
SUMMARY_CHARS = 100


def summary(module: Module) -> str:
    """The first sentence of a module's docstring, cut at a word to SUMMARY_CHARS."""
    doc = ast.get_docstring(module.tree) or ""
    first = " ".join(doc.strip().split("\n\n")[0].split()).split(". ")[0].rstrip(".")
    first = re.sub(r"\s*\([Ii]ssue #\d+[^)]*\)", "", first)  # the user docs name no issues
    if len(first) > SUMMARY_CHARS:
        first = first[: SUMMARY_CHARS - 3].rsplit(" ", 1)[0].rstrip(",;:") + "..."
    return first


def layout(graph: Graph) -> str:
    """The generated layout: the package's tree, one line per module and package, then which
    kernels sub-packages (and top-level kernels modules) each sub-package imports."""
    lines = ["```"]
    for name in sorted(graph.modules, key=lambda n: (n.split("."), )):
        module = graph.modules[name]
        depth = name.count(".")
        label = name.rpartition(".")[2] + ("/" if module.is_package else ".py")
        lines.append(f"{'  ' * depth}{label:<{max(1, 34 - 2 * depth)}} {summary(module)}")
    lines.append("```")
    lines += ["", "| kernels sub-package | imports (kernels) |", "|---|---|"]
    kernels = "sglang_fa4.kernels"
    for package in sub_packages(graph, kernels):
        used = set()
        for name in graph.modules:
            if name == package or name.startswith(package + "."):
                for target in graph.edges[name]:
                    if target.startswith(kernels + ".") and not (target == package or target.startswith(package + ".")):
                        used.add(target[len(kernels) + 1:].split(".")[0])
        lines.append(f"| `{package[len(kernels) + 1:]}/` | {', '.join(f'`{u}`' for u in sorted(used)) or '-'} |")
    return "\n".join(lines)


def render(text: str, graph: Graph) -> str:
    start, end = f"<!-- {BLOCK}:start -->", f"<!-- {BLOCK}:end -->"
    if start not in text or end not in text:
        raise ValueError(f"no {start} ... {end} block")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{layout(graph)}\n{end}{tail}"


def main(argv: list[str]) -> int:
    graph = load()
    text = DOC.read_text()
    fresh = render(text, graph)
    if "--check" in argv:
        if fresh != text:
            print(f"{DOC.relative_to(ROOT)}: the layout block is stale (python -m tools.architecture)")
            return 1
        return 0
    DOC.write_text(fresh)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
