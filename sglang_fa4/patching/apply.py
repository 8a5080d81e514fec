"""Applying / reverting a patch series on an SGLang tree, all or nothing.

The work is done by GNU ``patch`` on copies of the touched files in a scratch directory; the target
is only written once every patch of the series has gone through cleanly there, and a failure while
writing puts back what was already written. What was applied is recorded in a JSON state file inside
the package (``sglang/.sglang_fa4_patches.json``) with the sha256 of every file before and after, so
``revert`` can prove it restored the upstream bytes and refuse files edited since. A tree whose state
file was lost is still told by content: the series reverse-applied to it gives upstream's bytes.
Every directory to be written is probed before the first write.
"""

from __future__ import annotations

import datetime as _dt
import importlib.util
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sglang_fa4.patching.series import PACKAGE, PatchError, Series, load_series, sha256_file

STATE_NAME = ".sglang_fa4_patches.json"
STATE_FORMAT = 1


@dataclass(frozen=True)
class Target:
    root: Path  # the directory that holds the sglang package
    package: Path  # root / "sglang"
    version: str  # public version, e.g. "0.5.20"

    @property
    def state_path(self) -> Path:
        return self.package / STATE_NAME

    def path(self, rel: str) -> Path:
        return self.root / rel


def _find_installed_package() -> Path:
    """The installed sglang package directory, located without importing sglang."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise PatchError("sglang is not installed in this environment; pass --target DIR")
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def _package_dir(target: Path) -> Path:
    target = target.resolve()
    if not target.is_dir():
        raise PatchError(f"--target {target} is not a directory")
    candidates = [target] if target.name == PACKAGE else []
    candidates += [target / PACKAGE, target / "python" / PACKAGE]
    for c in candidates:
        if (c / "__init__.py").is_file():
            return c
    raise PatchError(
        f"--target {target}: no sglang package found (expected an sglang package directory, a "
        "directory holding sglang/, or a source checkout with python/sglang/)"
    )


_VERSION_RE = re.compile(r"""^__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", re.M)


def detect_version(package: Path) -> str:
    """sglang's version from its generated _version.py, else from the dist-info next to it."""
    vfile = package / "_version.py"
    if vfile.is_file():
        m = _VERSION_RE.search(vfile.read_text())
        if m:
            return m.group(1).split("+", 1)[0]
    for dist in sorted(package.parent.glob(f"{PACKAGE}-*.dist-info")):
        meta = dist / "METADATA"
        if meta.is_file():
            m = re.search(r"^Version:\s*(\S+)", meta.read_text(errors="replace"), re.M)
            if m:
                return m.group(1).split("+", 1)[0]
    raise PatchError(
        f"cannot tell the sglang version of {package} (no _version.py, no sglang-*.dist-info "
        "beside it); pass --sglang-version"
    )


def resolve_target(target: Path | str | None = None, version: str | None = None) -> Target:
    package = _find_installed_package() if target is None else _package_dir(Path(target))
    return Target(package.parent, package, version or detect_version(package))


def read_state(target: Target) -> dict | None:
    if not target.state_path.is_file():
        return None
    try:
        state = json.loads(target.state_path.read_text())
    except (OSError, ValueError) as exc:
        raise PatchError(f"{target.state_path} is unreadable ({exc}); fix or remove it by hand") from None
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT or "files" not in state:
        raise PatchError(f"{target.state_path} is not a sglang-fa4 patch state file (format {STATE_FORMAT})")
    return state


def _patch_exe() -> str:
    exe = shutil.which("patch")
    if exe is None:
        raise PatchError("GNU patch is not installed (needed to apply patch series); e.g. apt-get install patch")
    return exe


def _run_series(series: Series, originals: dict[str, bytes | None], reverse: bool) -> dict[str, bytes | None]:
    """Run the series (or its reverse) on copies of `originals`; return the resulting contents.

    Raises PatchError naming the failing patch, with patch's own report, if any hunk does not apply
    exactly (no fuzz)."""
    exe = _patch_exe()
    with tempfile.TemporaryDirectory(prefix="sglang-fa4-patch-") as tmp:
        stage = Path(tmp)
        for rel, data in originals.items():
            if data is not None:
                dest = stage / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(data)
        patches = reversed(series.patches) if reverse else series.patches
        for patch in patches:
            cmd = [exe, "-p1", "--batch", "--fuzz=0", "--no-backup-if-mismatch", "--reject-file=-",
                   "--silent", "-d", str(stage), "-i", str(patch.path)]
            cmd.insert(1, "--reverse" if reverse else "--forward")
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                how = "reverse-apply" if reverse else "apply"
                report = (proc.stdout + proc.stderr).strip()
                raise PatchError(f"{patch.name} does not {how} cleanly to sglang {series.version}:\n{report}")
        created = {f for p in series.patches for f in p.creates}
        out: dict[str, bytes | None] = {}
        for rel in originals:
            p = stage / rel
            data = p.read_bytes() if p.is_file() else None
            # reversing a patch that created a file leaves it empty (or removes it): it goes away
            out[rel] = None if (reverse and rel in created and not data) else data
        return out


def _hash_bytes(data: bytes | None) -> str | None:
    import hashlib

    return None if data is None else hashlib.sha256(data).hexdigest()


def _read_current(target: Target, files: list[str]) -> dict[str, bytes | None]:
    return {rel: (target.path(rel).read_bytes() if target.path(rel).is_file() else None) for rel in files}


def check_writable(paths: list[Path], what: str) -> None:
    """Refuse, before any work, when a file of ``paths`` cannot be written: its directory takes no
    new file (files are replaced through a temporary file beside them), or a directory sits where
    the file goes."""
    problems = []
    for directory in dict.fromkeys(p.parent for p in paths):
        probe_dir = directory
        while not probe_dir.exists() and probe_dir != probe_dir.parent:
            probe_dir = probe_dir.parent  # a directory still to be made: its nearest existing parent
        if not probe_dir.is_dir():
            problems.append(f"{probe_dir} is not a directory")
            continue
        try:
            fd, probe = tempfile.mkstemp(prefix=".sglang-fa4-probe-", dir=probe_dir)
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            problems.append(f"cannot write in {probe_dir} ({exc.strerror or exc})")
    problems += [f"{p} is a directory" for p in paths if p.is_dir()]
    if problems:
        raise PatchError(f"refusing to {what}: " + "; ".join(dict.fromkeys(problems)) + " -- nothing was changed")


def _write_file(path: Path, data: bytes | None, mode: int | None) -> None:
    if data is None:
        if path.exists():
            path.unlink()
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, mode if mode is not None else 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _commit(target: Target, new: dict[str, bytes | None], state: dict | None) -> None:
    """Write every file of `new` and then the state file (or remove it when `state` is None);
    on any failure restore what was already written, so the tree is never left half-patched."""
    before = {}
    for rel in new:
        p = target.path(rel)
        before[rel] = (p.read_bytes(), p.stat().st_mode & 0o7777) if p.is_file() else (None, None)
    old_state = target.state_path.read_bytes() if target.state_path.is_file() else None
    written: list[str] = []
    try:
        for rel, data in new.items():
            _write_file(target.path(rel), data, before[rel][1])
            written.append(rel)
        if state is None:
            _write_file(target.state_path, None, None)
        else:
            _write_file(target.state_path, (json.dumps(state, indent=2, sort_keys=True) + "\n").encode(), 0o644)
    except BaseException as exc:
        for rel in reversed(written):
            _write_file(target.path(rel), *before[rel])
        _write_file(target.state_path, old_state, 0o644)
        if isinstance(exc, OSError):
            raise PatchError(f"writing {target.package} failed ({exc}); the files written were put back "
                             "-- nothing was changed") from exc
        raise


def _check_base(target: Target, series: Series, current: dict[str, bytes | None]) -> None:
    created = {f for p in series.patches for f in p.creates}
    problems = []
    for rel, data in current.items():
        if rel in created:
            if data is not None:
                problems.append(f"{rel}: exists, but the series creates it")
            continue
        if data is None:
            problems.append(f"{rel}: missing")
        elif _hash_bytes(data) != series.base_hashes[rel]:
            problems.append(f"{rel}: locally modified (sha256 differs from sglang {series.version} upstream)")
    if problems and _reverted_by_content(series, current) is not None:
        raise PatchError(
            f"refusing to patch {target.package}: its files hold this series already (by content), but "
            f"{STATE_NAME} is missing; 'sglang-fa4 patch revert' undoes them -- nothing was changed"
        )
    if problems:
        raise PatchError(
            f"refusing to patch {target.package}: " + "; ".join(problems) + " -- nothing was changed"
        )


def _reverted_by_content(series: Series, current: dict[str, bytes | None]) -> dict[str, bytes | None] | None:
    """When ``current`` is exactly what the series makes of upstream (told by content: the series
    reverse-applied gives upstream's sha256 for every file), the upstream contents; else None."""
    if any(current[rel] is None for rel in current):
        return None
    try:
        result = _run_series(series, current, reverse=True)
    except PatchError:
        return None
    created = {f for p in series.patches for f in p.creates}
    for rel, data in result.items():
        if (data is not None or rel not in created) and _hash_bytes(data) != series.base_hashes.get(rel):
            return None
    return result


def check(target: Target) -> list[str]:
    """Dry-run: every hunk of the series (or, if applied, of its reverse) against copies of the
    target files. Returns report lines; raises PatchError if the operation would be refused."""
    series = load_series(target.version)
    state = read_state(target)
    files = series.files
    current = _read_current(target, files)
    if state is not None:
        _check_applied(target, state, current)
        result = _run_series(series, current, reverse=True)
        _check_reverted(state, result)
        return [f"applied (revision {state['revision']}); revert would restore {len(files)} file(s) exactly"]
    _check_base(target, series, current)
    _run_series(series, current, reverse=False)
    return [f"{p.name}: applies cleanly ({len(p.files)} file(s))" for p in series.patches]


def apply(target: Target) -> dict:
    series = load_series(target.version)
    state = read_state(target)
    if state is not None:
        raise PatchError(
            f"{target.package} already carries sglang-fa4 patches (revision {state.get('revision')}, "
            f"applied {state.get('applied_at')}); run 'sglang-fa4 patch revert' first -- nothing was changed"
        )
    files = series.files
    current = _read_current(target, files)
    _check_base(target, series, current)
    check_writable([target.path(rel) for rel in files] + [target.state_path], f"patch {target.package}")
    result = _run_series(series, current, reverse=False)
    state = {
        "format": STATE_FORMAT,
        "tool": "sglang-fa4",
        "sglang_version": series.version,
        "revision": series.revision,
        "patches": [p.name for p in series.patches],
        "applied_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "files": {rel: {"before": _hash_bytes(current[rel]), "after": _hash_bytes(result[rel])} for rel in files},
    }
    _commit(target, result, state)
    return state


def _check_applied(target: Target, state: dict, current: dict[str, bytes | None]) -> None:
    changed = [rel for rel, h in state["files"].items() if _hash_bytes(current.get(rel)) != h["after"]]
    extra = sorted(set(current) ^ set(state["files"]))
    if extra:
        raise PatchError(
            f"{target.state_path} records files {sorted(state['files'])}, but the series for sglang "
            f"{target.version} touches {sorted(current)}; the patches changed since they were applied"
        )
    if changed:
        raise PatchError(
            f"refusing to revert {target.package}: " + ", ".join(changed)
            + " changed since the patches were applied -- nothing was changed"
        )


def _check_reverted(state: dict, result: dict[str, bytes | None]) -> None:
    bad = [rel for rel, h in state["files"].items() if _hash_bytes(result[rel]) != h["before"]]
    if bad:
        raise PatchError(
            "reverting would not restore the original bytes of " + ", ".join(bad) + " -- nothing was changed"
        )


def revert(target: Target) -> dict:
    """Undo the series; without a state file, when the files hold the series by content (the
    returned state then says ``"state_file": "missing"``)."""
    state = read_state(target)
    series = load_series(target.version)
    check_writable([target.path(rel) for rel in series.files] + [target.state_path], f"revert {target.package}")
    current = _read_current(target, series.files)
    if state is None:
        result = _reverted_by_content(series, current)
        if result is None:
            raise PatchError(f"{target.package} carries no sglang-fa4 patches (no {STATE_NAME}, and its files "
                             f"are not what the series for sglang {series.version} makes); nothing to revert")
        state = {"format": STATE_FORMAT, "sglang_version": series.version, "revision": series.revision,
                 "patches": [p.name for p in series.patches], "state_file": "missing",
                 "files": {rel: {"before": _hash_bytes(result[rel]), "after": _hash_bytes(current[rel])}
                           for rel in series.files}}
    else:
        _check_applied(target, state, current)
        result = _run_series(series, current, reverse=True)
        _check_reverted(state, result)
    _commit(target, result, None)
    return state


def status(target: Target) -> dict:
    """What the target holds: per file 'upstream', 'patched', 'modified' or 'missing'. Without a
    state file, 'patched' is told by content (the series reverse-applied gives upstream's bytes);
    ``applied_by_content`` says so."""
    series = load_series(target.version)
    state = read_state(target)
    by_content = state is None and _reverted_by_content(series, _read_current(target, series.files)) is not None
    files = {}
    for rel in series.files:
        p = target.path(rel)
        h = sha256_file(p) if p.is_file() else None
        if h is None:
            files[rel] = "missing"
        elif by_content or (state is not None and h == state["files"].get(rel, {}).get("after")):
            files[rel] = "patched"
        elif h == series.base_hashes.get(rel):
            files[rel] = "upstream"
        else:
            files[rel] = "modified"
    return {
        "package": str(target.package),
        "sglang_version": target.version,
        "series_revision": series.revision,
        "patches": [p.name for p in series.patches],
        "applied": state is not None or by_content,
        "applied_revision": state.get("revision") if state else None,
        "applied_by_content": by_content,  # applied, but the state file is missing
        "files": files,
    }
