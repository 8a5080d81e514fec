"""sglang-fa4 patch {status,check,apply,revert} and build-wheel on the real sglang 0.5.20 wheel."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from _sglang_wheel import ROOT, sglang_wheel, unpack
from sglang_fa4.cli import main
from sglang_fa4.patching import apply as ops
from sglang_fa4.patching import series as series_mod
from sglang_fa4.patching.series import PatchError, load_series, supported_versions
from sglang_fa4.patching.wheel import build_fork_wheel, record_hash

VERSION = "0.5.20"
CUTE = "sglang/kernels/ops/attention/flash_attn/cute/"
PREFIXES = ("sglang/__init__.py", "sglang/_version.py", CUTE, f"sglang-{VERSION}.dist-info/")


@pytest.fixture(scope="module")
def wheel() -> Path:
    return sglang_wheel(VERSION)


@pytest.fixture
def tree(wheel, tmp_path) -> Path:
    """A freshly unpacked 0.5.20 wheel (the parts the series and version detection need)."""
    return unpack(wheel, tmp_path / "site", PREFIXES)


def snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_series_layout_and_headers():
    assert VERSION in supported_versions()
    s = load_series(VERSION)
    assert s.revision >= 1 and s.local_version == f"fa4.{s.revision}"
    assert [p.name for p in s.patches] == sorted(p.name for p in s.patches)  # numbered, in order
    assert set(s.files) == {CUTE + f for f in ("softmax.py", "flash_fwd_sm100.py", "interface.py")}
    for p in s.patches:
        header = p.header
        for word in ("What:", "Why:", "Verified"):
            assert word in header, f"{p.name} header lacks {word!r}"


def test_base_hashes_are_the_wheels_record(wheel):
    """base.sha256 says what upstream shipped: check it against the wheel's own RECORD."""
    with zipfile.ZipFile(wheel) as zf:
        record = zf.read(f"sglang-{VERSION}.dist-info/RECORD").decode()
    rows = {r[0]: r[1] for r in csv.reader(io.StringIO(record)) if r}
    for rel, hexdigest in load_series(VERSION).base_hashes.items():
        b64 = base64.urlsafe_b64encode(bytes.fromhex(hexdigest)).rstrip(b"=").decode()
        assert rows[rel] == f"sha256={b64}", rel


def test_check_apply_revert_round_trip(tree):
    before = snapshot(tree)
    target = ops.resolve_target(tree)
    assert target.version == VERSION and target.package == tree / "sglang"

    assert len(ops.check(target)) == 2 and snapshot(tree) == before  # dry run changes nothing
    status = ops.status(target)
    assert not status["applied"] and set(status["files"].values()) == {"upstream"}

    state = ops.apply(target)
    after = snapshot(tree)
    changed = {k for k in before if before[k] != after.get(k)}
    assert changed == set(load_series(VERSION).files)
    assert set(after) - set(before) == {"sglang/" + ops.STATE_NAME}
    recorded = json.loads((tree / "sglang" / ops.STATE_NAME).read_text())
    assert recorded == state and recorded["revision"] == load_series(VERSION).revision
    for rel, h in recorded["files"].items():
        assert h["before"] == hashlib.sha256(before[rel]).hexdigest()
        assert h["after"] == hashlib.sha256(after[rel]).hexdigest()
    softmax = after[CUTE + "softmax.py"].decode()
    assert "tile_max: Float32 | None = None" in softmax
    fwd = after[CUTE + "flash_fwd_sm100.py"].decode()
    assert "tcgen05.copy.LdRed32x32bOp" in fwd and "TmemLoadRedOp.MAX" in fwd
    assert "SGLANG_FA4_TMEM_LOAD_RED_MAX" in after[CUTE + "interface.py"].decode()
    assert set(ops.status(target)["files"].values()) == {"patched"}

    # re-application is refused and changes nothing
    with pytest.raises(PatchError, match="already carries sglang-fa4 patches"):
        ops.apply(target)
    assert snapshot(tree) == after
    assert ops.check(target)[0].startswith("applied")

    ops.revert(target)
    assert snapshot(tree) == before  # byte-identical, state file gone
    with pytest.raises(PatchError, match="nothing to revert"):
        ops.revert(target)


def test_locally_modified_file_is_refused(tree):
    victim = tree / CUTE / "interface.py"
    victim.write_bytes(victim.read_bytes() + b"# local edit\n")
    before = snapshot(tree)
    target = ops.resolve_target(tree)
    for op in (ops.apply, ops.check):
        with pytest.raises(PatchError, match=r"interface\.py: locally modified"):
            op(target)
    assert snapshot(tree) == before


def test_file_edited_after_apply_blocks_revert(tree):
    target = ops.resolve_target(tree)
    ops.apply(target)
    victim = tree / CUTE / "softmax.py"
    victim.write_bytes(victim.read_bytes().replace(b"sglang-fa4", b"edited!!!!", 1))
    before = snapshot(tree)
    with pytest.raises(PatchError, match=r"softmax\.py changed since the patches were applied"):
        ops.revert(target)
    assert snapshot(tree) == before
    assert ops.status(target)["files"][CUTE + "softmax.py"] == "modified"


def test_unknown_version_is_refused(tree):
    (tree / "sglang" / "_version.py").write_text("__version__ = version = '0.5.19'\n")
    before = snapshot(tree)
    target = ops.resolve_target(tree)
    assert target.version == "0.5.19"
    with pytest.raises(PatchError, match=r"no patch series for sglang 0\.5\.19; supported versions: .*0\.5\.20"):
        ops.apply(target)
    assert snapshot(tree) == before


def test_bad_targets_are_named(tmp_path):
    with pytest.raises(PatchError, match="not a directory"):
        ops.resolve_target(tmp_path / "nope")
    with pytest.raises(PatchError, match="no sglang package found"):
        ops.resolve_target(tmp_path)


def test_source_checkout_layout(wheel, tmp_path):
    """A checkout keeps the package in python/sglang/; its version comes from --sglang-version."""
    co = tmp_path / "checkout"
    unpack(wheel, co / "python", (CUTE, "sglang/__init__.py"))
    with pytest.raises(PatchError, match="cannot tell the sglang version"):
        ops.resolve_target(co)
    target = ops.resolve_target(co, VERSION)
    assert target.package == co / "python" / "sglang"
    before = snapshot(co)
    ops.apply(target)
    ops.revert(target)
    assert snapshot(co) == before


def test_failing_hunk_in_a_later_patch_changes_nothing(tree, tmp_path, monkeypatch):
    """All or nothing: patch 0001 applies, 0002 does not -> no file is touched."""
    fake_root = tmp_path / "patches"
    src = series_mod.patches_root() / "sglang" / VERSION
    dst = fake_root / "sglang" / VERSION
    dst.mkdir(parents=True)
    for f in src.iterdir():
        dst.joinpath(f.name).write_bytes(f.read_bytes())
    broken = dst / "0002-sm103-tcgen05-ld-red-row-max.patch"
    text = broken.read_text()
    # corrupt one context line of the last hunk so that it cannot apply
    i = text.rindex("\n         batch_invariant,\n")
    broken.write_text(text[:i] + "\n         batch_invariant_renamed,\n" + text[i + len("\n         batch_invariant,\n"):])
    monkeypatch.setattr(series_mod, "patches_root", lambda: fake_root)

    before = snapshot(tree)
    target = ops.resolve_target(tree)
    with pytest.raises(PatchError, match=r"0002-sm103-tcgen05-ld-red-row-max\.patch does not apply cleanly"):
        ops.check(target)
    with pytest.raises(PatchError, match="does not apply cleanly"):
        ops.apply(target)
    assert snapshot(tree) == before


def test_write_failure_midway_is_rolled_back(tree, monkeypatch):
    before = snapshot(tree)
    target = ops.resolve_target(tree)
    real = ops._write_file
    calls = []

    def flaky(path, data, mode):
        calls.append(path)
        if len(calls) == 2:
            raise OSError("disk full (simulated)")
        return real(path, data, mode)

    monkeypatch.setattr(ops, "_write_file", flaky)
    with pytest.raises(PatchError, match=r"disk full \(simulated\)\); the files written were put back -- nothing was changed"):
        ops.apply(target)
    monkeypatch.setattr(ops, "_write_file", real)
    assert snapshot(tree) == before


def test_cli(tree, capsys):
    t = ["--target", str(tree)]
    assert main(["patch", "status", *t]) == 0
    assert "not applied" in capsys.readouterr().out
    assert main(["patch", "check", *t]) == 0
    assert main(["patch", "apply", *t]) == 0
    assert main(["patch", "apply", *t]) == 1
    assert "already carries sglang-fa4 patches" in capsys.readouterr().err
    assert main(["patch", "status", "--json", *t]) == 0
    assert json.loads(capsys.readouterr().out)["applied"] is True
    assert main(["patch", "revert", *t]) == 0
    assert main(["patch", "revert", *t]) == 1
    assert "nothing to revert" in capsys.readouterr().err


# ---- every failure a message, nothing half done --------------------------------------------------


@pytest.fixture
def unwritable():
    """Make directories take no new file, for this user too: read-only permission bits, or, for
    root (who writes through them), the immutable attribute; undone afterwards."""
    made: list[Path] = []

    def make(directory: Path) -> Path:
        if os.geteuid() != 0:
            directory.chmod(0o555)
        elif subprocess.run(["chattr", "+i", str(directory)], capture_output=True).returncode != 0:
            pytest.skip("root here cannot make a directory unwritable (chattr +i failed)")
        made.append(directory)
        return directory

    yield make
    for directory in made:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(directory)], check=True)
        else:
            directory.chmod(0o755)


def test_patch_on_an_unwritable_target_is_a_message(tree, unwritable, capsys):
    cute = unwritable(tree / CUTE)
    before = snapshot(tree)
    assert main(["patch", "apply", "--target", str(tree)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"sglang-fa4 patch apply: refusing to patch {tree / 'sglang'}: cannot write in {cute} (")
    assert err.endswith("-- nothing was changed\n")
    assert snapshot(tree) == before


def test_revert_on_an_unwritable_target_is_a_message(tree, unwritable, capsys):
    ops.apply(ops.resolve_target(tree))
    package = unwritable(tree / "sglang")  # the state file's directory
    before = snapshot(tree)
    assert main(["patch", "revert", "--target", str(tree)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"sglang-fa4 patch revert: refusing to revert {package}: cannot write in {package} (")
    assert snapshot(tree) == before


def test_build_wheel_into_an_unwritable_directory_is_a_message(wheel, tmp_path, unwritable, capsys, monkeypatch):
    from sglang_fa4.patching import wheel as wheel_mod

    out = tmp_path / "dist"
    out.mkdir()
    unwritable(out)
    monkeypatch.setattr(wheel_mod, "_check_source", lambda *a, **k: pytest.fail("work before the output was checked"))
    assert main(["build-wheel", "--sglang", VERSION, "-o", str(out), "--from", str(wheel)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"sglang-fa4 build-wheel: refusing to write a wheel to {out}: cannot write in {out} (")
    assert list(out.iterdir()) == []


@pytest.mark.parametrize("where", ["file", "below_a_file"])
def test_build_wheel_output_that_is_a_file_is_refused_before_any_work(wheel, tmp_path, monkeypatch, where):
    """Checked first: no download, no unpacking, no patching for a wheel that cannot be written."""
    from sglang_fa4.patching import wheel as wheel_mod

    blocker = tmp_path / "dist"
    blocker.write_text("not a directory")
    out = blocker if where == "file" else blocker / "sub"
    for step in ("download_wheel", "apply", "_check_source"):
        monkeypatch.setattr(wheel_mod, step, lambda *a, **k: pytest.fail("work before the output was checked"))
    message = f"-o {out} is a file" if where == "file" else f"{blocker} is not a directory"
    with pytest.raises(PatchError, match=re.escape(message)):
        build_fork_wheel(VERSION, out, None)
    with pytest.raises(PatchError, match=re.escape(message)):
        build_fork_wheel(VERSION, out, wheel)
    assert blocker.read_text() == "not a directory"


def test_build_wheel_output_file_cli(wheel, tmp_path, capsys):
    (tmp_path / "dist").write_text("")
    assert main(["build-wheel", "--sglang", VERSION, "-o", str(tmp_path / "dist"), "--from", str(wheel)]) == 1
    assert capsys.readouterr().err == f"sglang-fa4 build-wheel: -o {tmp_path / 'dist'} is a file, not a directory -- nothing was built\n"


def test_a_wheel_that_is_no_zip_is_a_message(tmp_path, capsys):
    bogus = tmp_path / f"sglang-{VERSION}-cp311-cp311-manylinux_2_34_x86_64.whl"
    bogus.write_bytes(b"this is not a zip file")
    assert main(["build-wheel", "--sglang", VERSION, "-o", str(tmp_path / "out"), "--from", str(bogus)]) == 1
    assert capsys.readouterr().err == (f"sglang-fa4 build-wheel: --from {bogus}: not a readable wheel (File is not a "
                                       "zip file) -- nothing was built\n")
    assert not (tmp_path / "out").exists()


def test_a_wheel_with_a_corrupt_member_is_a_message(tmp_path, capsys):
    """The zip directory reads, a member's bytes do not match their CRC: found while unpacking
    (into a scratch directory), before anything is written to the output."""
    bad = tmp_path / f"sglang-{VERSION}-cp311-cp311-manylinux_2_34_x86_64.whl"
    with zipfile.ZipFile(bad, "w", compression=zipfile.ZIP_STORED) as zf:
        zf.writestr(f"sglang-{VERSION}.dist-info/METADATA", "Name: sglang\nVersion: 0.5.20\n" + "x" * 64)
    data = bytearray(bad.read_bytes())
    data[data.index(b"xxxx")] = ord("y")  # one byte of the stored member
    bad.write_bytes(bytes(data))
    assert main(["build-wheel", "--sglang", VERSION, "-o", str(tmp_path / "out"), "--from", str(bad)]) == 1
    assert capsys.readouterr().err.startswith(f"sglang-fa4 build-wheel: {bad}: corrupt wheel (Bad CRC-32 for file ")
    assert not (tmp_path / "out").exists()


def test_a_lost_state_file_is_told_by_content_and_revertable(tree, capsys):
    before = snapshot(tree)
    target = ops.resolve_target(tree)
    ops.apply(target)
    patched = snapshot(tree)
    target.state_path.unlink()
    status = ops.status(target)
    assert status["applied"] and status["applied_by_content"] and status["applied_revision"] is None
    assert set(status["files"].values()) == {"patched"}
    for op in (ops.apply, ops.check):  # refused, naming the way out
        with pytest.raises(PatchError, match="hold this series already .by content., but .* is missing; "
                                             "'sglang-fa4 patch revert' undoes them"):
            op(target)
    assert main(["patch", "status", "--target", str(tree)]) == 0
    assert "applied (told by content: its .sglang_fa4_patches.json is missing" in capsys.readouterr().out
    assert main(["patch", "revert", "--target", str(tree)]) == 0
    assert "its state file was missing: told by content" in capsys.readouterr().out
    assert snapshot(tree) == before
    assert not ops.status(target)["applied"]
    ops.apply(target)  # and it applies again (the new state file has its own time)
    state = "sglang/" + ops.STATE_NAME
    assert {k: v for k, v in snapshot(tree).items() if k != state} == {k: v for k, v in patched.items() if k != state}


def test_a_lost_state_file_with_an_edited_file_is_not_reverted(tree):
    target = ops.resolve_target(tree)
    ops.apply(target)
    target.state_path.unlink()
    victim = tree / CUTE / "softmax.py"
    victim.write_bytes(victim.read_bytes() + b"# edited\n")
    before = snapshot(tree)
    status = ops.status(target)
    assert not status["applied"] and status["files"][CUTE + "softmax.py"] == "modified"
    with pytest.raises(PatchError, match="are not what the series for sglang 0.5.20 makes"):
        ops.revert(target)
    assert snapshot(tree) == before


def test_installed_sglang_fa4_wheel_finds_its_patches(tmp_path):
    """pyproject force-includes patches/ as sglang_fa4/patches: build our wheel, install it
    elsewhere, and load the series from there (not from this checkout)."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--disable-pip-version-check",
                    "-w", str(tmp_path / "w"), str(ROOT)], check=True)
    (whl,) = (tmp_path / "w").glob("sglang_fa4-*.whl")
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--disable-pip-version-check",
                    "--target", str(site), str(whl)], check=True)
    code = ("from sglang_fa4.patching.series import patches_root, load_series; "
            "print(patches_root()); print(load_series('0.5.20').revision)")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
                         check=True, capture_output=True, text=True).stdout.split()
    assert out == [str(site / "sglang_fa4" / "patches"), str(load_series(VERSION).revision)]


def _verify_record(whl: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(whl) as zf:
        names = [n for n in zf.namelist() if not n.endswith("/")]
        record_name = next(n for n in names if n.endswith(".dist-info/RECORD"))
        rows = list(csv.reader(io.StringIO(zf.read(record_name).decode())))
        listed = {r[0]: r for r in rows if r}
        assert set(listed) == set(names)
        for name in names:
            if name == record_name:
                assert listed[name][1:] == ["", ""]
                continue
            data = zf.read(name)
            assert listed[name][1] == record_hash(data), name
            assert int(listed[name][2]) == len(data), name
        return {n: zf.read(n) for n in names if n.startswith(CUTE) or n.endswith("METADATA")}


def test_build_wheel_and_install(wheel, tmp_path):
    s = load_series(VERSION)
    out = tmp_path / "dist"
    assert main(["build-wheel", "--sglang", VERSION, "-o", str(out), "--from", str(wheel)]) == 0
    (whl,) = out.glob("*.whl")
    fork_version = f"{VERSION}+{s.local_version}"
    assert whl.name.startswith(f"sglang-{fork_version}-cp311-")
    files = _verify_record(whl)
    meta = files[f"sglang-{fork_version}.dist-info/METADATA"].decode()
    assert f"\nVersion: {fork_version}\n" in meta
    # SGLang's requirements unchanged: every install line that fits the release fits its fork
    # (tests/test_install_pins.py checks them against the release)
    from test_install_pins import metadata_requires
    assert metadata_requires(whl) == metadata_requires(wheel) != []

    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "--quiet",
                    "--disable-pip-version-check", "--target", str(site), str(whl)], check=True)
    assert (site / f"sglang-{fork_version}.dist-info").is_dir()
    target = ops.resolve_target(site)
    status = ops.status(target)
    assert status["applied"] and set(status["files"].values()) == {"patched"}
    assert "LdRed32x32bOp" in (site / CUTE / "flash_fwd_sm100.py").read_text()
    # and the installed fork can be reverted to the exact upstream bytes
    ops.revert(target)
    assert set(ops.status(target)["files"].values()) == {"upstream"}


def test_build_wheel_refuses_mismatched_or_unknown(wheel, tmp_path):
    with pytest.raises(PatchError, match="no patch series for sglang 9.9.9"):
        build_fork_wheel("9.9.9", tmp_path, wheel)
    renamed = tmp_path / "sglang-0.5.21-cp311-cp311-manylinux_2_34_x86_64.whl"
    renamed.write_bytes(b"")
    with pytest.raises(PatchError, match="is sglang 0.5.21, but --sglang 0.5.20"):
        build_fork_wheel(VERSION, tmp_path / "o", renamed)
    assert not (tmp_path / "o").exists()


def test_patched_interface_reads_the_switch(tree, monkeypatch):
    """The vendored interface can't import sglang_fa4, so it parses SGLANG_FA4_TMEM_LOAD_RED_MAX
    itself: run that function (lifted out of the patched file; the module needs a GPU stack)."""
    import ast

    ops.apply(ops.resolve_target(tree))
    module = ast.parse((tree / CUTE / "interface.py").read_text())
    wanted = [n for n in module.body
              if (isinstance(n, ast.FunctionDef) and n.name == "_tmem_load_red_max_enabled")
              or (isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "_TMEM_LOAD_RED_MAX_ENV")]
    assert len(wanted) == 2
    ns: dict = {}
    exec(compile(ast.Module([ast.parse("import os").body[0], *wanted], []), "interface.py", "exec"), ns)
    enabled = ns["_tmem_load_red_max_enabled"]

    monkeypatch.delenv("SGLANG_FA4_TMEM_LOAD_RED_MAX", raising=False)
    assert enabled(103) is True  # default on, like environ.yaml's declaration
    for raw, want in (("0", False), ("off", False), ("No", False), ("1", True), (" TRUE ", True)):
        monkeypatch.setenv("SGLANG_FA4_TMEM_LOAD_RED_MAX", raw)
        assert enabled(103) is want, raw
        assert enabled(100) is False and enabled(110) is False  # ignored off sm_103
    monkeypatch.setenv("SGLANG_FA4_TMEM_LOAD_RED_MAX", "maybe")
    with pytest.raises(ValueError, match="SGLANG_FA4_TMEM_LOAD_RED_MAX='maybe' is not a boolean"):
        enabled(103)
    from sglang_fa4.environ import envs

    assert envs.SGLANG_FA4_TMEM_LOAD_RED_MAX.default is True
