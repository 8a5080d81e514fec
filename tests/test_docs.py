"""The user docs (README.md, docs/) against their sources: generated blocks equal what environ.yaml,
features.py and the committed results give, quoted blocks are in the files they cite, cited results
are in the tree, and the README stays a first screen for people who serve VLMs."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from tools import docs, result_figures
from sglang_fa4.bench import report
from sglang_fa4.environ import envs

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_docs_agree_with_their_sources():
    """Regenerate with `python -m tools.docs`; `--check` prints the same list."""
    assert docs.problems() == []


def test_environment_doc_lists_every_variable():
    text = (ROOT / "docs" / "environment.md").read_text()
    for var in envs:
        assert f"| `{var.name}` |" in text


def test_render_replaces_named_sections_only():
    text = "a\n<!-- env-table:start -->\nstale\n<!-- env-table:end -->\n<!-- support-matrix:start -->\n\n<!-- support-matrix:end -->\n"
    out = docs.render(text, ("env-table", "support-matrix"))
    assert "stale" not in out and "SGLANG_FA4_TMEM_LOAD_RED_MAX" in out and "backend_default_table" in out
    assert docs.render(text, ("support-matrix",)).count("stale") == 1
    with pytest.raises(ValueError, match="env-table"):
        docs.render("no sections", ("env-table",))
    with pytest.raises(ValueError, match="headline"):
        docs.render(text, ("env-table", "headline"))


def test_settings_table_reads_defaults_from_the_registry():
    table = docs.settings_table()
    assert table.count("\n") == len(docs.SETTINGS) + 1
    assert f"| `SGLANG_FA4_VIT_GRAPH_BUDGETS` | `{envs.SGLANG_FA4_VIT_GRAPH_BUDGETS.format(envs.SGLANG_FA4_VIT_GRAPH_BUDGETS.default)}` |" in table
    assert '| `SGLANG_FA4_MM_ATTENTION_BACKEND_DEFAULT` | `""` |' in table


def _tree(tmp_path: Path) -> Path:
    res = tmp_path / "benchmark" / "results" / "h200"
    res.mkdir(parents=True)
    (res / "run.md").write_text("# run\n\n| a | b |\n|---|---|\n| 1 | 2.5x |\n| 2 | 3.0x |\n")
    (tmp_path / "docs").mkdir()
    return tmp_path


def test_quote_matches_whole_lines_of_its_file(tmp_path):
    root = _tree(tmp_path)
    ok = "<!-- quote: benchmark/results/h200/run.md -->\n| a | b |\n|---|---|\n| 2 | 3.0x |\n\n| 9 | 9 |\n"
    assert docs.quote_problems(ok, root) == []  # the block ends at the blank line
    # a figure changed by one digit, or a part of a line, is reported
    assert len(docs.quote_problems("<!-- quote: benchmark/results/h200/run.md -->\n| 2 | 3.1x |\n", root)) == 1
    assert len(docs.quote_problems("<!-- quote: benchmark/results/h200/run.md -->\n| 2 |\n", root)) == 1
    # the report names the line that disagrees
    assert docs.quote_problems("<!-- quote: benchmark/results/h200/run.md -->\n| 1 | 2.5x |\n| 2 | 3.1x |\n", root) == [
        "line 3: not in benchmark/results/h200/run.md: | 2 | 3.1x |"]
    # code fences around a quote are not part of it
    assert docs.quote_problems("<!-- quote: benchmark/results/h200/run.md -->\n```\n| 1 | 2.5x |\n```\n", root) == []
    gone = docs.quote_problems("<!-- quote: benchmark/results/h200/old.md -->\n| 1 | 2.5x |\n", root)
    assert gone == ["line 1: quoted file benchmark/results/h200/old.md is not in the tree"]
    assert docs.quote_problems("x\n<!-- quote: benchmark/results/h200/run.md -->\n\n", root) == [
        "line 2: quote of benchmark/results/h200/run.md is followed by no text"]


FIG = "<!-- fig: benchmark/results/h200/run.md -->\n"


def test_numbers_are_the_prose_figures_only():
    text = ("H200 d128 FA4 bf16 Qwen2.5-VL-7B 720p 4k on SGLang 0.5.23: 1.30x, 2.4e-2..1.5e-2, 0.5-0.94x, "
            "8x4096, 3.14p, `--rounds 21` [a](h/7.md) and 12.5%.")
    assert docs.numbers(text) == ["1.30", "2.4e-2", "1.5e-2", "0.5", "0.94", "8", "12.5"]


def test_figure_paragraph_numbers_come_from_its_file(tmp_path):
    root = _tree(tmp_path)
    assert docs.figure_problems(FIG + "Speed 2.5x and 3.0x, in 2 rounds.\n\nOther 9.9x.\n", root) == []
    # a planted wrong digit fails, with its line
    assert docs.figure_problems(FIG + "Speed 2.5x\nand 3.1x.\n", root) == [
        "line 3: 3.1 is not in benchmark/results/h200/run.md"]
    # a figure is the file's value printed to the prose's digits; an integer must be exact
    (root / "benchmark/results/h200/t.md").write_text("| 7.6 | 0.04372 | 1416.195 |\n")
    t = "<!-- fig: benchmark/results/h200/t.md -->\n"
    assert docs.figure_problems(t + "7.6, 7.60, 0.044, 4.37e-2, 4.4e-2, 1416.2\n", root) == []
    for wrong in ("8", "7.7", "0.043", "4.38e-2", "1416"):
        assert docs.figure_problems(t + wrong + "\n", root) == [f"line 2: {wrong} is not in benchmark/results/h200/t.md"]


def test_figure_paragraph_cannot_pass_empty_or_without_its_file(tmp_path):
    root = _tree(tmp_path)
    assert docs.figure_problems(FIG + "no figures, `2.5x` in code only\n", root) == [
        "line 1: figure paragraph of benchmark/results/h200/run.md holds no number"]
    assert docs.figure_problems(FIG + "\n2.5x\n", root) == [
        "line 1: figure paragraph of benchmark/results/h200/run.md holds no number"]
    assert docs.figure_problems("<!-- fig: benchmark/results/h200/old.md -->\n2.5x\n", root) == [
        "line 1: figure file benchmark/results/h200/old.md is not in the tree"]


def test_figure_paragraph_reads_every_named_file_and_gzipped_json(tmp_path):
    root = _tree(tmp_path)
    res = root / "benchmark" / "results" / "h200"
    (res / "b.json.gz").write_bytes(gzip.compress(json.dumps({"ms": [0.7113, -4.25]}).encode()))
    two = "<!-- fig: benchmark/results/h200/run.md benchmark/results/h200/b.json.gz -->\n"
    assert docs.figure_problems(two + "2.5x at 0.711 ms and 4.25\n", root) == []
    assert docs.figure_problems(two + "2.5x at 0.712 ms\n", root) == [
        "line 2: 0.712 is not in benchmark/results/h200/run.md benchmark/results/h200/b.json.gz"]


def test_problems_name_the_doc_and_line(tmp_path):
    root = _tree(tmp_path)
    (root / "README.md").write_text("# x\n\n" + FIG + "2.5x and 3.1x\n")
    assert docs.problems(root, generated={}) == [
        "README.md: line 4: 3.1 is not in benchmark/results/h200/run.md"]


def test_a_measured_figure_outside_a_checked_block_is_reported():
    hint = "cites no result (mark the paragraph <!-- fig: FILE -->, quote its file, or <!-- not-a-result: WHY -->)"
    assert docs.unsourced_figures("# t\n\nIt runs 1.3x faster\nin 8.6 s.\n") == [
        f"line 3: 1.3x {hint}", f"line 4: 8.6 s {hint}"]
    for unit in ("12 MiB", "3.2 GiB", "45 ms", "16.2 us", "747.0 TFLOP/s", "0.36%", "2×"):
        assert len(docs.unsourced_figures(f"takes {unit} here\n")) == 1, unit
    # each way of sourcing it, on its own
    assert docs.unsourced_figures(FIG + "It runs 1.3x faster.\n") == []
    assert docs.unsourced_figures("<!-- quote: benchmark/results/h200/run.md -->\n| 2 | 3.0x |\n") == []
    assert docs.unsourced_figures("<!-- not-a-result: the clip's size -->\na 60 KB clip\n") == []
    assert docs.unsourced_figures("<!-- headline:start -->\n| 1.3x |\n<!-- headline:end -->\n") == []
    assert docs.unsourced_figures("```bash\nsleep 5 s # 1.3x\n```\n") == []
    # a marker covers its own paragraph only
    assert docs.unsourced_figures(FIG + "1.3x\n\nthen 2.5x\n") == [f"line 4: 2.5x {hint}"]
    # not figures: sizes of a layout, code, bare numbers
    assert docs.unsourced_figures("448x448, 8x4096, `--budget-s 150`, 4 x tokens, 64 segments\n") == []


def test_cited_results_must_be_in_the_tree(tmp_path):
    root = _tree(tmp_path)
    assert docs.missing_results("see `run.md` and `benchmark/results/h200/run.md`", root) == []
    assert docs.missing_results("see `speed6.md`", root) == ["cites speed6.md, which is not in the tree"]
    assert docs.missing_results("`benchmark/results/h200/run.json`", root) == [
        "cites benchmark/results/h200/run.json, which is not in the tree"]


def test_read_json_takes_plain_and_gzipped(tmp_path):
    data = {"command": "python3 x.py", "rows": [1, 2]}
    (tmp_path / "a.json").write_text(json.dumps(data))
    (tmp_path / "b.json.gz").write_bytes(gzip.compress(json.dumps(data).encode()))
    assert report.read_json(tmp_path / "a.json") == report.read_json(tmp_path / "b.json.gz") == data


def test_per_round_ratios_need_paired_rounds():
    assert result_figures._ratios([2.0, 3.0], [1.0, 2.0]) == [2.0, 1.5]
    with pytest.raises(ValueError, match="rounds differ"):
        result_figures._ratios([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="empty"):
        result_figures._ratios([], [])


def test_headline_figures_agree_with_the_runs_own_reports():
    """The generator recomputes from the raw rounds what each run's own markdown printed (the same
    statistic: exact to the printed digits; the FP8-KV report prints a ratio of medians: within 0.01)."""
    kv = (ROOT / "benchmark/results/h200/fp8_attention_kvsplit.md").read_text()
    (row,) = [line for line in kv.splitlines() if line.startswith("| nkv |")]
    printed = [re.search(r"\((\d\.\d\d)x\)", cell).group(1) for cell in row.split("|")[4:6]]
    assert [r[1] for r in result_figures.fp8_attention_rows()] == [f"{x}x faster" for x in printed]

    sections = (ROOT / "benchmark/results/h200/vit_graphs-ladder896-0.5.23.md").read_text().split("\n## ")
    for row in result_figures.tower_rows():
        model = "qwen3_vl" if row[0].startswith("Qwen3") else "qwen2_5_vl"
        (sec,) = [s for s in sections if s.startswith(model)]
        for fig in row[1].removesuffix(" faster").split(", "):
            picture, ratio = fig.split()
            line = next(x for x in sec.splitlines() if x.startswith(f"| {picture} |"))
            assert ratio == f"{float(line.split('|')[6].split('x')[0]):.2f}x"

    kvb = (ROOT / "benchmark/results/h200/fp8_kv_backend-all-0.5.23.md").read_text()
    rows = {r[0]: float(r[1].split("x")[0]) for r in result_figures.fp8_kv_rows()}
    line = next(x for x in kvb.splitlines() if x.startswith("| prefill 8k | qwen2.5-7b d128 |"))
    vs_bf16, vs_fa3 = (float(c.strip().rstrip("x")) for c in line.rstrip(" |").split("|")[-2:])
    assert abs(rows["LLM layer on an FP8 KV cache, prefill 8k d=128: ours vs fa4 on a bf16 pool (H200)"] - vs_bf16) < 0.01
    assert abs(rows["LLM layer on an FP8 KV cache, prefill 8k d=128: ours vs FA3-FP8 (H200)"] - vs_fa3) < 0.01
    assert not any("decode" in r for r in rows)  # decode rows come from the split-KV kernel's matrix

    # decode: the per-case ratios the matrix's own markdown printed, their range per model at page 16
    printed = {}
    for path in result_figures.DECODE:
        md = (ROOT / path.replace(".json.gz", ".md")).read_text().splitlines()
        head = next(x for x in md if x.startswith("| case |")).split("|")
        col = head.index(" ours vs fa3_fp8 ")
        for x in md:
            cells = x.split("|")
            if x.startswith("| ") and " P16 " in cells[1] and cells[col].strip()[:1].isdigit():
                printed.setdefault(cells[1].split()[0], []).append(cells[col].split("x")[0].strip())
    fa3_rows = [r for r in result_figures.decode_rows() if r[0].endswith("ours vs FA3-FP8 (H100)")]
    assert len(fa3_rows) == len(result_figures.DECODE_MODELS) == len(printed)
    for model, label in result_figures.DECODE_MODELS.items():
        (row,) = [r for r in fa3_rows if label in r[0]]
        got = sorted(printed[model], key=float)
        assert row[1].startswith(f"{got[0]}x to {got[-1]}x; >= 1.0x on ") and row[1].endswith(f" of {len(got)}")
        # a printed 1.00x may be just under 1: the count lies between the strict and the rounded one
        count = int(row[1].split(" on ")[1].split()[0])
        assert sum(float(g) > 1 for g in got) <= count <= sum(float(g) >= 1 for g in got), (model, got, count)


def test_readme_is_a_first_screen():
    assert len(README.splitlines()) <= 200
    for path in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        assert not re.search(r"[Ii]ssue #\d+|\(#\d+\)", path.read_text()), path
    quick = README.split("## Quick start", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    assert [line.split("#")[0].strip() for line in quick] == ["pip install . && sglang-fa4 doctor", "bash tests/run.sh"]
    for version in ("0.5.20", "0.5.23"):
        assert f'pip install "sglang=={version}" "./sglang-fa4[gpu]"' in README


def test_ci_runs_the_readmes_test_command():
    assert "bash tests/run.sh" in (ROOT / ".ci" / "run").read_text()
    assert "pytest" in (ROOT / "tests" / "run.sh").read_text()
    for doc in re.findall(r"`(docs/[\w.-]+\.md)`", README):
        assert (ROOT / doc).is_file(), doc


# Result files cited in the package's comments and docstrings and in environ.yaml's meanings.
# A superseded result leaves the tree (git keeps it), so a citation names a committed file or its git
# location, written `git show <commit>:benchmark/results/<dir>/<file>`.
_RESULT_FILE = re.compile(r"(?<![\w./<>*{}$-])((?:[\w.-]+/)*\w[\w.-]*?\.(?:json\.gz|log\.gz|md|json|log))\b")
_RESULT_PREFIX = re.compile(r"(?:fp8_|vit_|kernels|server|start[-.]|warmup|internvl_|short_windows|pad_head_dim|fa4_drift|fa4_call)")
_AT_COMMIT = re.compile(r"git show ([0-9a-f]{7,40}):(benchmark/results/[\w./-]+)")


def _comment_and_docstring_texts(path: Path) -> list[tuple[int, str]]:
    """(first line, text) of each docstring and each run of consecutive comment lines."""
    import ast
    import io
    import tokenize

    src = path.read_text()
    out, block, last = [], [], -2
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            if tok.start[0] != last + 1 and block:
                out.append(_block_text(block))
                block = []
            block.append((tok.start[0], tok.string.lstrip("#:").strip()))
            last = tok.start[0]
    if block:
        out.append(_block_text(block))
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                out.append((node.body[0].lineno, doc))
    return out


def _block_text(block: list[tuple[int, str]]) -> tuple[int, str]:
    return block[0][0], "\n".join(text for _, text in block)


def _result_citations(text: str) -> tuple[list[str], list[tuple[str, str]]]:
    """(result files named in the tree's terms, (commit, path) of the `git show` ones)."""
    text = re.sub(r"/[ \t]*\n\s*", "/", text)  # a path wrapped after a slash
    at_commit = _AT_COMMIT.findall(text)
    names = []
    for name in _RESULT_FILE.findall(_AT_COMMIT.sub("", text)):
        name = re.sub(r"^(?:benchmark/)?(?:results/)?(h200|cpu)/", r"benchmark/results/\1/", name)
        if name.startswith("benchmark/results/") or ("/" not in name and _RESULT_PREFIX.match(name)):
            names.append(name)
    return names, at_commit


def _stale_citations(sources: list[tuple[str, str]], root: Path = ROOT) -> tuple[list[str], set, set]:
    """Problems (where, name), the result names found in the tree, and the `git show` ones."""
    problems, present, at_commit = [], set(), set()
    for where, text in sources:
        names, old = _result_citations(text)
        at_commit |= set(old)
        for name in names:
            # a bare *.json / *.log also stands for its gzipped twin: the writers' docstrings name what
            # they write, the tree holds it gzipped
            twin = "/" not in name and name.endswith((".json", ".log")) and not docs.missing_results(f"`{name}.gz`", root)
            if docs.missing_results(f"`{name}`", root) and not twin:
                problems.append(f"{where}: {name} is not in the tree (cite the file that backs it now, or "
                                "`git show <commit>:benchmark/results/...`)")
            else:
                present.add(name)
    return problems, present, at_commit


def _package_sources() -> list[tuple[str, str]]:
    out = []
    for path in sorted((ROOT / "sglang_fa4").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        out += [(f"{rel}:{line}", text) for line, text in _comment_and_docstring_texts(path)]
    return out + [(f"environ.yaml {var.name}", var.meaning) for var in envs]


def test_package_comments_cite_results_that_exist():
    problems, present, at_commit = _stale_citations(_package_sources())
    assert problems == []
    # not vacuous: the scan reads comments, docstrings (a path wrapped after a slash too) and meanings
    assert {"benchmark/results/h200/vit_graphs-ladder896-0.5.23.json.gz", "start-lazy-run2.md",
            "benchmark/results/h200/start.md", "vit_fp8-0.5.23.md"} <= present
    assert ("244b9bd", "benchmark/results/h200/fp8_attention_speed4.md") in at_commit
    assert any(name.endswith("vit_graphs-dense-0.5.23.md") for _, name in at_commit)  # environ.yaml
    cmd = ["git", "-C", str(ROOT), "ls-tree", "-r", "--name-only", "244b9bd", "--", "benchmark/results"]
    import subprocess

    listed = subprocess.run(cmd, capture_output=True, text=True)
    if listed.returncode == 0:  # a shallow clone may not hold the commit
        old = set(listed.stdout.split())
        assert [name for commit, name in at_commit if commit == "244b9bd" and name not in old] == []


def test_stale_result_citation_is_reported(tmp_path):
    root = _tree(tmp_path)
    (root / "benchmark/results/h200/vit_here.md").write_text("x\n")
    src = tmp_path / "m.py"
    src.write_text('"""Measured (benchmark/results/\n    h200/gone.md)."""\n\n# wide tile: fp8_attention_speed9.md,\n'
                   "# vit_here.md, results/h200/run.md, docs/startup.md, $OUT/vit_x.json\nX = 'vit_gone.md'  # git show abc1234:benchmark/results/h200/y.md\n")
    sources = [(f"m.py:{line}", text) for line, text in _comment_and_docstring_texts(src)]
    problems, present, at_commit = _stale_citations(sources, root)
    assert sorted(p.split(" is not")[0] for p in problems) == ["m.py:1: benchmark/results/h200/gone.md",
                                                               "m.py:4: fp8_attention_speed9.md"]
    assert present == {"vit_here.md", "benchmark/results/h200/run.md"}
    assert at_commit == {("abc1234", "benchmark/results/h200/y.md")}
    # code strings are not comments; a bare name counts with its gzipped twin, a path must be exact
    assert _stale_citations([("t", "kernels.json")], ROOT)[0] == []
    assert _stale_citations([("t", "benchmark/results/h200/kernels.json")], ROOT)[0] != []
