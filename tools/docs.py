"""The user docs' generated blocks and checked quotes.

Generated blocks (``<!-- NAME:start --> ... <!-- NAME:end -->``) come from their sources:
environ.yaml, features.py and the committed results (``result_figures``).
``python -m tools.docs`` rewrites them in every file of ``GENERATED_IN``; ``--check`` only
reports. A quoted block (``<!-- quote: FILE -->`` and the lines right after it, up to a blank line)
must appear line by line in FILE. A figure paragraph (``<!-- fig: FILE [FILE ...] -->`` and the
prose right after it, up to a blank line) must hold at least one number, and every number in it
(outside code spans) must be one that some named FILE gives, to the digits the prose prints. Every
result file the docs cite must be in the tree, and a measured-looking figure (``1.3x``, ``8.6 s``)
outside those blocks needs ``<!-- not-a-result: WHY -->`` over its paragraph. ``problems()`` reports
each disagreement with its file and line; a test fails on any.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from sglang_fa4 import features
from tools import result_figures
from sglang_fa4.bench import report
from sglang_fa4.environ import envs

ROOT = Path(__file__).resolve().parents[1]


def _default_text(var) -> str:
    text = var.format(var.default)
    return f"`{text}`" if text else '`""`'


def env_table() -> str:
    rows = ["| variable | type | default | owner | meaning |", "|---|---|---|---|---|"]
    for var in envs:
        if var.type == "choice":
            kind = "choice: " + ", ".join(c or '""' for c in var.choices)
        elif var.type in ("int", "int_list") and (var.minimum, var.multiple_of, var.maximum) != (None, None, None):
            kind = f"{var.type}: {var.accepted()}"
        elif var.type == "bool" and not var.checked:
            kind = f"bool, read as {var.owner} reads it"
        else:
            kind = var.type
        rows.append(f"| `{var.name}` | {kind} | {_default_text(var)} | {var.owner} | {var.meaning} |")
    return "\n".join(rows)


def support_matrix() -> str:
    versions = features.SUPPORTED_SGLANG_VERSIONS
    rows = [
        "| feature | what | " + " | ".join(f"SGLang {v}" for v in versions) + " |",
        "|---|---|" + "---|" * len(versions),
    ]
    for f in features.FEATURES:
        cells = ["upstream" if f.upstream_has(v) else "**sglang-fa4**" for v in versions]
        rows.append(f"| `{f.name}` | {f.summary} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


#: The README's few settings: the variable (its default read from the registry) and what people
#: change it for, in a line.
SETTINGS = {
    "SGLANG_VIT_ENABLE_CUDA_GRAPH": "SGLang's own switch for ViT CUDA graphs; with fa4 the plugin captures them at "
                                    "startup (token budgets, InternVL tile counts) and makes their outputs own "
                                    "their memory",
    "SGLANG_FA4_VIT_GRAPH_BUDGETS_ENABLE": "with SGLang's ViT graphs on and fa4: graphs over token budgets, "
                                           "captured at startup, serving never captures (`docs/vit-graphs.md`); "
                                           "0 opts out to SGLang's per-layout runner",
    "SGLANG_FA4_VIT_GRAPH_BUDGETS": "the budgets (tokens); larger batches run eagerly",
    "SGLANG_FA4_VIT_GRAPH_MEMORY_MB": "memory the ViT budget graphs may take (MiB per runner and rank); the "
                                      "ladder is trimmed from the top to fit",
    "SGLANG_FA4_MM_ATTENTION_BACKEND_DEFAULT": "replace the per-GPU default ViT backend "
                                               "(`--mm-attention-backend` still wins)",
    "SGLANG_FA4_KERNEL_CACHE_DIR": "where compiled FA4 kernels are kept across restarts",
    "SGLANG_FA4_JIT_MONITOR": "`off` / `warn` / `raise` on a compile or graph capture after startup",
    "SGLANG_FA4_VIT_ATTN_DTYPE": "`fp8`: FP8 ViT attention on Hopper where it was measured faster "
                                 "(`docs/fp8-kernel.md`)",
    "SGLANG_FA4_FP8_KV_UPGRADE": "with `--kv-cache-dtype fp8_e4m3` on Hopper, SGLang's fa3 LLM attention "
                                 "becomes fa4 (`docs/fp8-kv-cache.md`); Gemma-4's triton too where our route runs "
                                 "every layer (`docs/gemma4.md`)",
}


def settings_table() -> str:
    rows = ["| variable | default | what for |", "|---|---|---|"]
    for name, why in SETTINGS.items():
        rows.append(f"| `{name}` | {_default_text(getattr(envs, name))} | {why} |")
    return "\n".join(rows)


def _command_of(path: Path) -> str:
    """The command line a result records (JSON ``command`` / ``meta.command``, markdown ``Command:``)."""
    if path.name.endswith((".json", ".json.gz")):
        data = report.read_json(path)
        cmd = data.get("command") or data.get("meta", {}).get("command") or ""
    elif path.suffix == ".md":
        m = re.search(r"[Cc]ommand:?\s*`([^`]+)`", path.read_text(errors="replace"))
        cmd = m.group(1) if m else ""
    else:
        cmd = ""
    cmd = " ".join(str(cmd).split())
    return f"`{cmd[:110]}{' ...' if len(cmd) > 110 else ''}`" if cmd else "-"


def results_index(root: Path = ROOT) -> str:
    """Every committed result, the user docs that cite it, and the command that produced it."""
    docs = {p.relative_to(root).as_posix(): p.read_text() for p in user_docs(root)}
    rows = ["| result | cited by | command |", "|---|---|---|"]
    for path in sorted((root / "benchmark" / "results").rglob("*")):
        if not path.is_file() or path.name == "INDEX.md":
            continue
        rel = path.relative_to(root).as_posix()
        stem = re.sub(r"\.(json|log)(\.gz)?$|\.md$", "", path.name)
        # a doc cites the file itself, or its markdown / JSON twin (the same run)
        names = {path.name, f"{stem}.md", f"{stem}.json", f"{stem}.json.gz"}
        cited = [d for d, text in docs.items()
                 if re.search(rf"<!-- (?:quote|fig): (?:\S+ )*{re.escape(rel)}[ ]", text) or any(f"`{n}`" in text or f"/{n}`" in text for n in names)]
        rows.append(f"| `{rel.removeprefix('benchmark/results/')}` | {', '.join(cited) or '(not named in the docs)'} "
                    f"| {_command_of(path)} |")
    return "\n".join(rows)


SECTIONS = {
    "env-table": env_table,
    "support-matrix": support_matrix,
    "settings": settings_table,
    "headline": result_figures.headline_table,
    "results-index": results_index,
}

#: Which generated blocks each file holds (a file missing one of its blocks is an error).
GENERATED_IN = {
    "README.md": ("settings", "headline"),
    "docs/environment.md": ("env-table", "support-matrix"),
    "benchmark/results/INDEX.md": ("results-index",),
}


def render(text: str, sections=("env-table", "support-matrix")) -> str:
    """``text`` with each named generated block rewritten from its source."""
    for name in sections:
        make = SECTIONS[name]
        pattern = re.compile(rf"(<!-- {name}:start -->\n).*?(<!-- {name}:end -->)", re.S)
        if not pattern.search(text):
            raise ValueError(f"no <!-- {name}:start --> ... <!-- {name}:end --> section")
        text = pattern.sub(lambda m: m.group(1) + make() + "\n" + m.group(2), text)
    return text


QUOTE = re.compile(r"^<!-- quote: (\S+) -->$")


def _marked_blocks(text: str, marker: re.Pattern):
    """Each ``marker`` line of ``text`` with its match and the lines right after it, up to a blank
    line, as (line index, text) pairs."""
    lines = text.split("\n")
    for i, line in enumerate(lines):
        m = marker.match(line.strip())
        if not m:
            continue
        block = []
        for j in range(i + 1, len(lines)):
            if not lines[j].strip():
                break
            block.append((j, lines[j]))
        yield i, m, block


def quote_problems(text: str, root: Path = ROOT) -> list[str]:
    """Each quoted block's lines that its cited file does not hold, whole (code fences aside)."""
    out = []
    for i, m, block in _marked_blocks(text, QUOTE):
        src = root / m.group(1)
        if not src.is_file():
            out.append(f"line {i + 1}: quoted file {m.group(1)} is not in the tree")
            continue
        have = {x.rstrip() for x in src.read_text(errors="replace").split("\n")}
        if not block:
            out.append(f"line {i + 1}: quote of {m.group(1)} is followed by no text")
        for j, q in block:
            if not q.startswith("```") and q.rstrip() not in have:
                out.append(f"line {j + 1}: not in {m.group(1)}: {q[:80]}")
    return out


FIG = re.compile(r"^<!-- fig: (\S+(?: \S+)*) -->$")

#: A figure as prose prints it: not part of a word, a name or a version (``H200``, ``d128``,
#: ``7B``, ``720p``, ``0.5.23``), optionally in e-notation (``2.4e-2``) or a ratio (``1.30x``).
NUMBER = re.compile(r"(?<!\w)(?<!\w\.)(?<![eE][-+])(\d+(?:\.\d+)*(?:e[-+]?\d+)?)(?![A-Za-wyz_\d]|\.\d)")


def numbers(text: str) -> list[str]:
    """The figures of a prose text: every number outside code spans and link targets, versions
    (two dots or more) aside."""
    text = re.sub(r"`[^`]*`|\]\([^)]*\)", " ", text)
    return [n for n in NUMBER.findall(text) if n.split("e")[0].count(".") < 2]


def _file_numbers(path: Path) -> set[float]:
    if path.name.endswith((".json", ".json.gz")):
        import json
        text = json.dumps(report.read_json(path))
    elif path.name.endswith(".gz"):
        import gzip
        text = gzip.decompress(path.read_bytes()).decode(errors="replace")
    else:
        text = path.read_text(errors="replace")
    out = set()
    # versions (0.5.23, 4.0.0b36) are not figures
    for n in re.findall(r"(?<!\w)(?<!\w\.)(?<![eE][-+])-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?!\.\d)", text):
        try:
            out.add(abs(float(n)))
        except ValueError:
            pass
    return out


def _printed_as(value: float, figure: str) -> bool:
    """Whether ``value`` printed to ``figure``'s digits reads ``figure`` (an integer must be exact)."""
    mant, _, exp = figure.partition("e")
    digits = len(mant.partition(".")[2])
    if exp:
        return f"{value:.{digits}e}" == f"{float(figure):.{digits}e}"
    if not digits:
        return value == int(figure)
    return f"{value:.{digits}f}" == figure


def figure_problems(text: str, root: Path = ROOT) -> list[str]:
    """Each figure paragraph's numbers that none of its cited files gives."""
    out = []
    for i, m, block in _marked_blocks(text, FIG):
        files = m.group(1).split()
        missing = [f for f in files if not (root / f).is_file()]
        if missing:
            out.append(f"line {i + 1}: figure file {', '.join(missing)} is not in the tree")
            continue
        values = set().union(*(_file_numbers(root / f) for f in files))
        figures = [(j, fig) for j, line in block for fig in numbers(line)]
        if not figures:
            out.append(f"line {i + 1}: figure paragraph of {' '.join(files)} holds no number")
        out += [f"line {j + 1}: {fig} is not in {' '.join(files)}"
                for j, fig in figures if not any(_printed_as(v, fig) for v in values)]
    return out


#: A measured-looking figure: a number with a unit of time, memory, throughput, or a ratio.
UNIT_FIGURE = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:e[-+]?\d+)?(?:x|×|%|\s?(?:ms|us|µs|s|KB|MB|GB|MiB|GiB|TFLOP/s|PFLOP/s))(?![\w/])")
NOT_A_RESULT = re.compile(r"^<!-- not-a-result: .+ -->$")
GENERATED = re.compile(r"^<!-- [\w-]+:(start|end) -->$")


def unsourced_figures(text: str) -> list[str]:
    """Paragraphs with a measured-looking figure (``1.3x``, ``8.6 s``, ``12 MiB``; code aside) that
    are neither a figure paragraph, a quote, a generated block, nor marked
    ``<!-- not-a-result: WHY -->`` (a size or estimate that no run measured)."""
    out = []
    lines = text.split("\n")
    fence = generated = False
    para: list[tuple[int, str]] = []

    def close():
        if para and not any(FIG.match(x.strip()) or QUOTE.match(x.strip()) or NOT_A_RESULT.match(x.strip())
                            for _, x in para[:1]):
            for j, x in para:
                hits = UNIT_FIGURE.findall(re.sub(r"`[^`]*`", " ", x))
                if hits:
                    out.append(f"line {j + 1}: {', '.join(hits)} cites no result (mark the paragraph "
                               f"<!-- fig: FILE -->, quote its file, or <!-- not-a-result: WHY -->)")
        para.clear()

    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith("```"):
            fence = not fence
            close()
            continue
        if GENERATED.match(stripped):
            generated = stripped.endswith(":start -->")
            close()
            continue
        if fence or generated:
            continue
        if not stripped:
            close()
        else:
            para.append((i, line))
    close()
    return out


#: A result file as the docs cite it: a path under benchmark/results/, or a bare result-like name.
CITED = re.compile(r"`((?:benchmark/results/)?[\w.\-/]+?\.(?:md|json|json\.gz|log|log\.gz|png))`")


def missing_results(text: str, root: Path = ROOT) -> list[str]:
    """Result files the text cites that are not in the tree (a bare name counts when some
    benchmark/results/<dir>/ holds it; names that are not results resolve from the repository)."""
    results = root / "benchmark" / "results"
    out = []
    for name in sorted(set(CITED.findall(text))):
        if "/" in name:
            ok = (root / name).is_file()
        else:
            ok = any((d / name).is_file() for d in results.iterdir() if d.is_dir()) or any(
                p.name == name for p in (root / "docs").glob("*.md")) or (root / name).is_file()
        if not ok:
            out.append(f"cites {name}, which is not in the tree")
    return out


def user_docs(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def problems(root: Path = ROOT, generated: dict | None = None) -> list[str]:
    """Every disagreement between the user docs and their sources, one line each."""
    out = []
    for rel, sections in (GENERATED_IN if generated is None else generated).items():
        text = (root / rel).read_text()
        if render(text, sections) != text:
            out.append(f"{rel}: generated blocks are stale (python -m tools.docs)")
    for path in user_docs(root):
        text = path.read_text()
        found = quote_problems(text, root) + figure_problems(text, root) + unsourced_figures(text) + missing_results(text, root)
        out += [f"{path.relative_to(root).as_posix()}: {p}" for p in found]
    return out


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--check":
        found = problems()
        print("\n".join(found) or "docs agree with their sources")
        return 1 if found else 0
    for rel, sections in GENERATED_IN.items():
        path = ROOT / rel
        path.write_text(render(path.read_text(), sections))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
