"""Build a fork wheel ``sglang-<version>+fa4.<revision>`` from the upstream wheel with the series
applied: the dist-info directory is renamed, METADATA's Version updated and RECORD rewritten (sha256,
urlsafe base64 without padding, and sizes) for every file."""

from __future__ import annotations

import base64
import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
import zlib
from pathlib import Path

from sglang_fa4.patching.apply import apply, check_writable, resolve_target
from sglang_fa4.patching.series import PatchError, load_series

_WHEEL_RE = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)(?:-(?P<build>\d[^-]*))?-(?P<tags>[^-]+-[^-]+-[^-]+)\.whl$")


def parse_wheel_name(path: Path) -> tuple[str, str, str]:
    m = _WHEEL_RE.match(path.name)
    if not m:
        raise PatchError(f"{path.name} is not a wheel file name (name-version-pytag-abitag-platform.whl)")
    return m.group("name"), m.group("version"), m.group("tags")


def download_wheel(version: str, dest: Path) -> Path:
    """``pip download --no-deps sglang==<version>`` for this interpreter's platform."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           f"sglang=={version}", "-d", str(dest)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise PatchError(f"pip download of sglang=={version} failed:\n{(proc.stdout + proc.stderr).strip()[-2000:]}")
    found = sorted(p for p in dest.glob("sglang-*.whl") if parse_wheel_name(p)[1] == version)
    if not found:
        raise PatchError(f"pip download of sglang=={version} produced no sglang wheel in {dest}")
    return found[0]


def record_hash(data: bytes) -> str:
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _check_source(source: Path, version: str) -> tuple[str, str]:
    """The upstream wheel's name and tags; refuses a missing, misnamed or unreadable one."""
    if not source.is_file():
        raise PatchError(f"--from {source}: no such file")
    name, src_version, tags = parse_wheel_name(source)
    if name.lower().replace("-", "_") != "sglang":
        raise PatchError(f"--from {source.name}: not an sglang wheel")
    if src_version != version:
        raise PatchError(f"--from {source.name} is sglang {src_version}, but --sglang {version} was asked for")
    try:
        zipfile.ZipFile(source).close()  # its directory; members are checked as they are unpacked
    except (zipfile.BadZipFile, OSError) as exc:
        raise PatchError(f"--from {source}: not a readable wheel ({exc}) -- nothing was built") from None
    return name, tags


def build_fork_wheel(version: str, out_dir: Path, source: Path | None = None) -> Path:
    series = load_series(version)  # refuse unknown versions before downloading anything
    out_dir = Path(out_dir)
    # the output first: no download, unpacking or patching for a wheel that could not be written
    if out_dir.exists() and not out_dir.is_dir():
        raise PatchError(f"-o {out_dir} is a file, not a directory -- nothing was built")
    check_writable([out_dir / "sglang.whl"], f"write a wheel to {out_dir}")
    if source is not None:
        source = Path(source)
        name, tags = _check_source(source, version)
    with tempfile.TemporaryDirectory(prefix="sglang-fa4-wheel-") as tmp:
        tmp_path = Path(tmp)
        if source is None:
            source = download_wheel(version, tmp_path / "download")
            name, tags = _check_source(source, version)
        new_version = f"{version}+{series.local_version}"
        old_info = f"{name}-{version}.dist-info"
        new_info = f"{name}-{new_version}.dist-info"

        tree = tmp_path / "tree"
        modes: dict[str, int] = {}
        try:
            with zipfile.ZipFile(source) as zf:
                for info in zf.infolist():
                    member = Path(info.filename)
                    if member.is_absolute() or ".." in member.parts:
                        raise PatchError(f"{source.name}: unsafe member {info.filename!r}")
                    modes[info.filename.rstrip("/")] = info.external_attr
                zf.extractall(tree)
        except (zipfile.BadZipFile, EOFError, zlib.error) as exc:  # a member cut short or not matching its CRC
            raise PatchError(f"{source}: corrupt wheel ({exc}) -- nothing was built") from None
        if not (tree / old_info).is_dir():
            raise PatchError(f"{source.name} has no {old_info}/")

        apply(resolve_target(tree, version))  # all-or-nothing, records the state file in the package

        (tree / old_info).rename(tree / new_info)
        for sig in ("RECORD.jws", "RECORD.p7s"):
            (tree / new_info / sig).unlink(missing_ok=True)
        meta = tree / new_info / "METADATA"
        text, n = re.subn(r"^Version: .*$", f"Version: {new_version}", meta.read_text(), count=1, flags=re.M)
        if n != 1:
            raise PatchError(f"{source.name}: METADATA has no Version line")
        meta.write_text(text)

        files = sorted(p for p in tree.rglob("*") if p.is_file())
        record_name = f"{new_info}/RECORD"
        rows = []
        for p in files:
            rel = p.relative_to(tree).as_posix()
            if rel == record_name:
                continue
            data = p.read_bytes()
            rows.append(f"{_csv(rel)},{record_hash(data)},{len(data)}")
        rows.append(f"{record_name},,")
        (tree / record_name).write_text("\n".join(rows) + "\n")

        # dist-info last, RECORD very last (the wheel spec recommends it)
        ordered = [p for p in files if not p.relative_to(tree).as_posix().startswith(new_info + "/")]
        ordered += [p for p in files if p.relative_to(tree).as_posix().startswith(new_info + "/")
                    and p.relative_to(tree).as_posix() != record_name]
        ordered.append(tree / record_name)
        wheel_name = f"{name}-{new_version}-{tags}.whl"
        if (out_dir / wheel_name).is_dir():
            raise PatchError(f"{out_dir / wheel_name} is a directory -- nothing was built")
        out_dir.mkdir(parents=True, exist_ok=True)
        partial = out_dir / f".{wheel_name}.part"
        with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            for p in ordered:
                rel = p.relative_to(tree).as_posix()
                old_rel = rel.replace(new_info + "/", old_info + "/", 1) if rel.startswith(new_info + "/") else rel
                info = zipfile.ZipInfo(rel, date_time=(2020, 1, 1, 0, 0, 0))
                info.compress_type = zipfile.ZIP_DEFLATED
                info.external_attr = modes.get(old_rel) or (0o644 << 16)
                zf.writestr(info, p.read_bytes())
        final = out_dir / wheel_name
        shutil.move(partial, final)
        return final


def _csv(field: str) -> str:
    if any(c in field for c in ',"\n'):
        return '"' + field.replace('"', '""') + '"'
    return field
