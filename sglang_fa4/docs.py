"""README tables generated from their sources (environ.yaml, features.py).

``python -m sglang_fa4.docs README.md`` rewrites the marked sections; a test fails when the README
and the sources disagree.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from sglang_fa4 import features
from sglang_fa4.environ import envs


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


SECTIONS = {"env-table": env_table, "support-matrix": support_matrix}


def render(text: str) -> str:
    for name, make in SECTIONS.items():
        pattern = re.compile(rf"(<!-- {name}:start -->\n).*?(<!-- {name}:end -->)", re.S)
        if not pattern.search(text):
            raise ValueError(f"README has no <!-- {name}:start --> ... <!-- {name}:end --> section")
        text = pattern.sub(lambda m: m.group(1) + make() + "\n" + m.group(2), text)
    return text


def main(argv: list[str]) -> int:
    path = Path(argv[0] if argv else "README.md")
    path.write_text(render(path.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
