"""Every install line resolves next to each SGLang release of the supported window: our base
dependencies, every extra, and what our pinned flash-attn-4 asks for, each checked against the
release's own requirements (its wheel's METADATA), specifier against specifier for every shared
name -- so a pin of ours that clashes with SGLang's (``nvidia-cutlass-dsl==4.8.1`` against 0.5.23's
``==4.8.0``) fails here instead of in a user's ``pip install``. The fork wheel ``build-wheel`` makes
keeps SGLang's requirements unchanged (tests/test_patch_tooling.py, which builds one), so the same
lines fit it. No network: the wheels are tests/setup_env.sh's.
"""

from __future__ import annotations

import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from _sglang_wheel import sglang_wheel
from sglang_harness import REGISTRATION_VERSIONS

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
FA4_LAYER = ROOT / ".cache" / "fa4-b36"  # tests/setup_env.sh: flash-attn-4 as the gpu extra pins it
# the platform SGLang's cp311 manylinux wheels are for
TARGET_ENV = {"python_version": "3.11", "python_full_version": "3.11.0", "sys_platform": "linux",
              "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
              "platform_python_implementation": "CPython", "implementation_name": "cpython", "extra": ""}


def _candidates(spec: SpecifierSet) -> set[Version]:
    """Each bound of `spec` and a release just past it (V.0.0.0.1: above V, below V's next micro)."""
    out = {Version("0")}
    for s in spec:
        try:
            v = Version(s.version.removesuffix(".*"))
        except InvalidVersion:
            continue
        out.add(v)
        out.add(Version(".".join(map(str, (*v.release, 0, 0, 0, 1)))))
    return out


def compatible(a: SpecifierSet, b: SpecifierSet) -> bool:
    """Whether some version satisfies both (pre-releases count: flash-attn-4 4.0.0b36 is one).
    A non-empty intersection of the ranges requirements write starts at a bound of one side
    (inclusive: the bound; exclusive: just past it) or is open below (0), so those are tried."""
    if not a or not b:
        return True
    return any(a.contains(v, prereleases=True) and b.contains(v, prereleases=True)
               for v in _candidates(a) | _candidates(b))


def requirements(lines: list[str], extra: str = "") -> dict[str, SpecifierSet]:
    """name -> the combined specifier of the lines that apply on the target platform."""
    out: dict[str, SpecifierSet] = {}
    for line in lines:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({**TARGET_ENV, "extra": extra}):
            continue
        name = canonicalize_name(req.name)
        out[name] = out.get(name, SpecifierSet()) & req.specifier
    return out


def metadata_requires(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        meta = Parser().parsestr(zf.read(name).decode())
    return meta.get_all("Requires-Dist") or []


def clashes(ours: dict[str, SpecifierSet], theirs: dict[str, SpecifierSet]) -> list[str]:
    return [f"{name}: ours {ours[name]} vs SGLang's {theirs[name]}"
            for name in sorted(ours.keys() & theirs.keys()) if not compatible(ours[name], theirs[name])]


def our_install_lines() -> dict[str, list[str]]:
    """Each thing a README line installs: the base package and the base plus each extra."""
    base = PYPROJECT["project"]["dependencies"]
    lines = {"sglang-fa4": base}
    for extra, reqs in PYPROJECT["project"]["optional-dependencies"].items():
        lines[f"sglang-fa4[{extra}]"] = base + reqs
    return lines


def fa4_requires() -> list[str]:
    """What the flash-attn-4 the gpu extra pins asks for (its own METADATA)."""
    pin = next(Requirement(r) for r in PYPROJECT["project"]["optional-dependencies"]["gpu"]
               if canonicalize_name(Requirement(r).name) == "flash-attn-4")
    infos = sorted(FA4_LAYER.glob("flash_attn_4-*.dist-info"))
    assert infos, f"no flash-attn-4 in {FA4_LAYER} (run tests/setup_env.sh)"
    version = infos[-1].name.removeprefix("flash_attn_4-").removesuffix(".dist-info")
    assert pin.specifier.contains(version, prereleases=True), (version, str(pin))
    meta = Parser().parsestr((infos[-1] / "METADATA").read_text())
    return meta.get_all("Requires-Dist") or []


@pytest.mark.parametrize("a, b, ok", [
    ("==4.8.1", "==4.8.0", False),  # the clash this test exists for
    (">=4.6.2", "==4.8.0", True),
    (">=4.6.2", "==4.6.2", True),  # exact fit at the bound
    (">=4.6.3", "==4.6.2", False),  # off by one
    (">4.6.2", "==4.6.2", False),
    ("<4.6.2", ">=4.6.2", False),
    (">=4.6,<4.8", "==4.8.0", False),
    ("~=4.6", "==4.8.0", True),
    ("!=4.8.0", "==4.8.0", False),
    ("==4.0.0b36", ">=4.0.0b18", True),  # pre-releases count
    ("==4.0.0b17", ">=4.0.0b18", False),
    (">1.0", "<1.0.1", True),  # only the version just past a bound satisfies both
    (">=2", "", True),
    ("<2", "<3", True),  # open below
    ("<2", ">=2,<3", False),
    ("==2.*", "==2.14.1", True),
    ("==2.*", "==3.0", False),
])
def test_compatible(a, b, ok):
    assert compatible(SpecifierSet(a), SpecifierSet(b)) is ok
    assert compatible(SpecifierSet(b), SpecifierSet(a)) is ok


def test_requirements_apply_markers_and_merge():
    got = requirements(['tomli; python_version < "3.11"', "torch>=2", "torch<3", 'x==1; extra == "dev"',
                        "Nvidia_Cutlass.DSL[cu13]==4.8.0"])
    assert got == {"torch": SpecifierSet(">=2,<3"), "nvidia-cutlass-dsl": SpecifierSet("==4.8.0")}


def test_the_old_pin_would_have_failed():
    """The checker sees the clash the README's install line hit (gpu extra pinning 4.8.1)."""
    theirs = requirements(metadata_requires(sglang_wheel("0.5.23")))
    assert clashes(requirements(["nvidia-cutlass-dsl[cu13]==4.8.1"]), theirs) == [
        "nvidia-cutlass-dsl: ours ==4.8.1 vs SGLang's ==4.8.0"]


@pytest.mark.parametrize("version", REGISTRATION_VERSIONS)
def test_every_install_line_fits_sglang(version):
    theirs = requirements(metadata_requires(sglang_wheel(version)))
    assert "nvidia-cutlass-dsl" in theirs and "torch" in theirs  # what the check is about
    for line, reqs in our_install_lines().items():
        assert clashes(requirements(reqs), theirs) == [], f"pip install sglang=={version} {line}"
    # one level down: the flash-attn-4 the gpu extra pins
    assert clashes(requirements(fa4_requires()), theirs) == [], f"flash-attn-4 vs sglang=={version}"
    # SGLang itself asks for a flash-attn-4 (>=4.0.0b18): ours must be one of those
    fa4 = requirements(PYPROJECT["project"]["optional-dependencies"]["gpu"])["flash-attn-4"]
    assert compatible(fa4, theirs["flash-attn-4"])


def test_no_torch_in_the_base_install():
    """`pip install sglang-fa4` (doctor, patch, build-wheel) must not pull a CUDA torch; the
    plugin runs inside an SGLang that brings its own (tests/test_doctor.py: doctor imports none)."""
    assert "torch" not in requirements(PYPROJECT["project"]["dependencies"])



def test_setup_env_installs_the_window_with_each_releases_pins():
    """tests/setup_env.sh's SGLANG_VERSIONS is the window, and what it installs beside each release
    (--no-deps) is exactly what that release's METADATA pins."""
    import re

    script = (ROOT / "tests" / "setup_env.sh").read_text()
    versions = tuple(re.search(r"^SGLANG_VERSIONS=\(([^)]*)\)", script, re.M).group(1).split())
    assert versions == REGISTRATION_VERSIONS
    pkgs = dict(re.findall(r'^\s*\[([\d.]+)\]="([^"]*)"', script, re.M))
    assert tuple(pkgs) == versions
    for version in versions:
        theirs = requirements(metadata_requires(sglang_wheel(version)))
        for line in pkgs[version].split():
            req = Requirement(line)
            assert str(theirs[canonicalize_name(req.name)]) == str(req.specifier), (version, line)
