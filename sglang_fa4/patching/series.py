"""Finding and reading the patch series for an SGLang version.

Layout of ``patches/sglang/<version>/``:

* ``series``: one patch file name a line, applied in order; ``#`` starts a comment. The directive
  ``# revision: N`` (required) numbers the series; fork wheels are versioned ``<version>+fa4.N``.
* ``base.sha256``: ``<sha256>  <path>`` for every file the series touches, as shipped upstream
  (paths relative to the directory that holds the ``sglang`` package). A target file whose hash
  differs is treated as locally modified and the series is refused.
* ``NNNN-name.patch``: a unified diff (``-p1``, paths ``a/sglang/...`` / ``b/sglang/...``) preceded
  by a free-text header saying what the patch does, why, and how it was verified.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "sglang"


class PatchError(RuntimeError):
    """A patch operation was refused or failed; nothing was changed."""


def patches_root() -> Path:
    """``patches/`` inside the installed wheel (``sglang_fa4/patches``) or at the checkout root."""
    here = Path(__file__).resolve().parent.parent  # sglang_fa4/
    for candidate in (here / "patches", here.parent / "patches"):
        if (candidate / PACKAGE).is_dir():
            return candidate
    raise PatchError(f"patch directory not found: neither {here / 'patches'} nor {here.parent / 'patches'}")


def supported_versions(root: Path | None = None) -> list[str]:
    base = (root or patches_root()) / PACKAGE
    return sorted(p.name for p in base.iterdir() if (p / "series").is_file())


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass(frozen=True)
class Patch:
    name: str
    path: Path
    files: tuple[str, ...]  # paths relative to the package's parent directory, e.g. "sglang/x.py"
    creates: tuple[str, ...]  # the subset of files that the patch creates (source /dev/null)

    @property
    def header(self) -> str:
        """The free text before the first diff line."""
        lines = []
        for line in self.path.read_text().splitlines():
            if line.startswith(("--- ", "diff ", "Index: ")):
                break
            lines.append(line)
        return "\n".join(lines).strip()


@dataclass(frozen=True)
class Series:
    version: str
    directory: Path
    revision: int
    patches: tuple[Patch, ...]
    base_hashes: dict[str, str]  # file -> sha256 upstream ("" for a file a patch creates)

    @property
    def local_version(self) -> str:
        return f"fa4.{self.revision}"

    @property
    def files(self) -> list[str]:
        seen: dict[str, None] = {}
        for patch in self.patches:
            for f in patch.files:
                seen.setdefault(f, None)
        return list(seen)


_PLUS = re.compile(r"^\+\+\+ (\S+)")
_MINUS = re.compile(r"^--- (\S+)")


def _strip1(path: str, patch: Path) -> str:
    parts = path.split("/", 1)
    if len(parts) != 2 or not parts[1]:
        raise PatchError(f"{patch.name}: path {path!r} has no leading component to strip (-p1)")
    rel = parts[1]
    if rel.startswith("/") or ".." in rel.split("/"):
        raise PatchError(f"{patch.name}: unsafe path {path!r}")
    if rel.split("/", 1)[0] != PACKAGE:
        raise PatchError(f"{patch.name}: path {path!r} is outside the {PACKAGE}/ package")
    return rel


def parse_patch(path: Path) -> Patch:
    files: list[str] = []
    creates: list[str] = []
    source = None
    for line in path.read_text().splitlines():
        m = _MINUS.match(line)
        if m:
            source = m.group(1)
            continue
        m = _PLUS.match(line)
        if m and source is not None:
            target = m.group(1)
            if target == "/dev/null":
                raise PatchError(f"{path.name}: deleting files is not supported")
            rel = _strip1(target, path)
            if rel not in files:
                files.append(rel)
            if source == "/dev/null":
                creates.append(rel)
            source = None
    if not files:
        raise PatchError(f"{path.name}: no unified-diff file headers (---/+++) found")
    return Patch(path.name, path, tuple(files), tuple(creates))


def load_series(version: str, root: Path | None = None) -> Series:
    root = root or patches_root()
    directory = root / PACKAGE / version
    if not (directory / "series").is_file():
        known = ", ".join(supported_versions(root)) or "none"
        from sglang_fa4.features import SUPPORTED_SGLANG_VERSIONS

        if version in SUPPORTED_SGLANG_VERSIONS:  # a release the plugin supports, nothing to patch there
            raise PatchError(f"no patch series for sglang {version}: its vendored FA4 already has the sm_103 "
                             f"row max (tcgen05.ld.red), so there is nothing to patch; series exist for: {known}")
        raise PatchError(f"no patch series for sglang {version}; supported versions: {known}")
    revision = None
    names = []
    for raw in (directory / "series").read_text().splitlines():
        line = raw.strip()
        m = re.match(r"#\s*revision:\s*(\S+)\s*$", line)
        if m:
            if not m.group(1).isdigit():
                raise PatchError(f"{directory / 'series'}: revision {m.group(1)!r} is not a number")
            revision = int(m.group(1))
            continue
        line = line.split("#", 1)[0].strip()
        if line:
            names.append(line)
    if revision is None:
        raise PatchError(f"{directory / 'series'}: missing '# revision: N' line")
    if not names:
        raise PatchError(f"{directory / 'series'}: lists no patches")
    patches = []
    for name in names:
        p = directory / name
        if not p.is_file():
            raise PatchError(f"{directory / 'series'}: lists {name}, which does not exist")
        patches.append(parse_patch(p))
    base = _load_base_hashes(directory)
    series = Series(version, directory, revision, tuple(patches), base)
    created = {f for p in series.patches for f in p.creates}
    missing = [f for f in series.files if f not in base and f not in created]
    if missing:
        raise PatchError(f"{directory / 'base.sha256'}: no upstream hash for {', '.join(missing)}")
    return series


def _load_base_hashes(directory: Path) -> dict[str, str]:
    path = directory / "base.sha256"
    if not path.is_file():
        raise PatchError(f"{path} is missing")
    out = {}
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        if not raw.strip() or raw.startswith("#"):
            continue
        parts = raw.split()
        if len(parts) != 2 or not re.fullmatch(r"[0-9a-f]{64}", parts[0]):
            raise PatchError(f"{path}:{n}: expected '<sha256>  <path>', got {raw!r}")
        out[parts[1]] = parts[0]
    return out
