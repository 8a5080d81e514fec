"""The environment registry, built from environ.yaml at import.

Every variable sglang-fa4 reads or adds is declared in environ.yaml; this module is the only place in
the package that touches ``os.environ``. Use it like SGLang's own registry::

    from sglang_fa4.environ import envs
    envs.SGLANG_FA4_TMEM_LOAD_RED_MAX.get()   # -> bool, raises EnvValueError on a bad value

A variable another library owns (environ.yaml's ``owner``: sglang, triton, flash-attn-4, ...) is read
exactly as that library reads it and never refused here: a value its owner accepts must not stop the
plugin. Only our own variables (owners in ``OUR_OWNERS``) are checked; the plugin reports a malformed
one and runs it at its default (:meth:`EnvRegistry.fall_back_to_defaults`).
"""

from __future__ import annotations

import os
import re
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator, Mapping

import yaml

TYPES = ("bool", "int", "int_list", "str", "path", "choice")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
_INT = re.compile(r"^[+-]?[0-9]+$")  # ASCII digits only: int() would take "1_000" and other scripts' digits


def _shown(raw: str) -> str:
    """A value as error messages quote it: repr, cut to 60 characters (a log line stays one line)."""
    return repr(raw) if len(raw) <= 60 else repr(raw[:60]) + f"... ({len(raw)} characters)"


#: owners whose variables this registry checks (the rest are read as their owner reads them)
OUR_OWNERS = ("sglang-fa4", "tests")


def _sglang_bool(raw: str, default: bool) -> bool:
    # sglang/srt/environ.py EnvBool.parse, the same in 0.5.20 and 0.5.23: lower-cased, not stripped;
    # anything else is SGLang's default (SGLang warns about it itself)
    low = raw.lower()
    if low in ("true", "1", "yes", "y"):
        return True
    if low in ("false", "0", "no", "n"):
        return False
    return default


def _triton_bool(raw: str, default: bool) -> bool:
    # triton.knobs env_bool -> libtriton getenv_bool (Triton 3.8.0; a test compares with the
    # installed Triton value by value): lower-cased, not stripped; set, it is false unless one of these
    return raw.lower() in ("1", "y", "on", "yes", "true")


def _fa4_flag(raw: str, default: bool) -> bool:
    # flash_attn/cute/cache_utils.py: os.getenv(NAME, "0") == "1"
    return raw == "1"


#: how a bool variable of another library is read: exactly as that library reads it
OWNER_BOOL_READERS = {"sglang": _sglang_bool, "triton": _triton_bool, "flash-attn-4": _fa4_flag}


class EnvValueError(ValueError):
    """An environment variable holds a value its declared type does not accept."""


class EnvSpecError(ValueError):
    """environ.yaml itself is malformed."""


#: variable -> the malformed raw value that reads as the variable's default (fall_back_to_defaults)
_FALLBACKS: dict[str, str] = {}


@dataclass(frozen=True)
class EnvProblem:
    """One of our variables holds a value its declared type does not accept."""

    name: str
    raw: str
    message: str  # names the variable, the value and what is accepted


def spec_path() -> Path:
    """environ.yaml: inside the installed package (wheel), else at the repository root (checkout)."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "environ.yaml", here.parent / "environ.yaml"):
        if candidate.is_file():
            return candidate
    raise EnvSpecError(f"environ.yaml not found next to {here} or in its parent")


@dataclass(frozen=True)
class EnvVar:
    name: str
    type: str
    default: Any
    meaning: str
    owner: str
    choices: tuple[str, ...] = ()
    minimum: int | None = None  # int / int_list: smallest accepted value
    multiple_of: int | None = None  # int / int_list: every value a multiple of this
    maximum: int | None = None  # int / int_list: largest accepted value
    #: who else reads the variable straight from the environment (code that cannot import this
    #: registry, e.g. a kernel patch inside SGLang); a malformed value falls back there too
    read_outside: str = ""

    @property
    def checked(self) -> bool:
        """Whether this registry checks the value (ours), or reads it as its owner does."""
        return self.owner in OUR_OWNERS

    def accepted(self) -> str:
        """What the variable accepts, in words (error messages and the README table)."""
        if self.type == "bool":
            return "/".join(sorted(_TRUE | _FALSE))
        if self.type == "choice":
            return ", ".join(repr(c) for c in self.choices)
        if self.type == "path":
            return "a path (empty: the default)"
        bounds = []
        if self.minimum is not None:
            bounds.append(f">= {self.minimum}")
        if self.multiple_of is not None:
            bounds.append(f"a multiple of {self.multiple_of}")
        if self.maximum is not None:
            bounds.append(f"<= {self.maximum}")
        bounded = " and ".join(bounds)
        if self.type == "int":
            return f"an integer {bounded}" if bounds else "an integer"
        if self.type == "int_list":
            return f"a comma list of integers, each {bounded}" if bounds else "a comma list of integers"
        return "any string"

    def _int(self, raw: str, part: str) -> int:
        text = part.strip()
        if not _INT.match(text):
            where = "" if text == raw.strip() else f": {text!r}"
            raise EnvValueError(f"{self.name}={_shown(raw)}{where} is not an integer; accepted: {self.accepted()}")
        try:
            value = int(text)
        except ValueError:  # past Python's digit limit: out of any range
            raise EnvValueError(f"{self.name}={_shown(raw)}: {len(text)} digits are out of range; accepted: {self.accepted()}") from None
        if (
            (self.minimum is not None and value < self.minimum)
            or (self.maximum is not None and value > self.maximum)
            or (self.multiple_of is not None and value % self.multiple_of)
        ):
            raise EnvValueError(f"{self.name}={_shown(raw)}: {value} is out of range; accepted: {self.accepted()}")
        return value

    def parse(self, raw: str) -> Any:
        """Turn the raw string into the declared type, or raise naming the variable."""
        if self.type == "bool":
            low = raw.strip().lower()
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            raise EnvValueError(f"{self.name}={_shown(raw)} is not a boolean; accepted values: {self.accepted()}")
        if self.type == "int":
            return self._int(raw, raw)
        if self.type == "int_list":
            values = set()
            for part in raw.split(","):
                if part.strip():
                    values.add(self._int(raw, part))
            if not values:
                raise EnvValueError(f"{self.name}={_shown(raw)} is empty; accepted: {self.accepted()}")
            return tuple(sorted(values))
        if self.type == "choice":
            if raw not in self.choices:
                shown = ", ".join(repr(c) for c in self.choices)
                raise EnvValueError(f"{self.name}={_shown(raw)} is not one of the accepted values: {shown}")
            return raw
        return raw

    def is_set(self) -> bool:
        return self.name in os.environ

    def raw(self) -> str | None:
        """The value as set (None: unset), unparsed: for messages that quote it."""
        return os.environ.get(self.name)

    def get(self) -> Any:
        raw = os.environ.get(self.name)
        if raw is None or _FALLBACKS.get(self.name) == raw:
            return self.default
        if self.type == "bool" and not self.checked:
            return OWNER_BOOL_READERS[self.owner](raw, self.default)
        if self.type == "path" and not raw.strip():
            return self.default  # empty is unset: never the working directory
        return self.parse(raw)

    def set(self, value: Any) -> None:
        os.environ[self.name] = self.format(value)

    def format(self, value: Any) -> str:
        if self.type == "bool":
            return "1" if value else "0"
        if self.type == "int_list":
            return ",".join(str(v) for v in (value.split(",") if isinstance(value, str) else value))
        return str(value)

    @contextmanager
    def override(self, value: Any) -> Iterator[None]:
        """Set the variable for the duration of a block (None unsets it), then restore it."""
        old = os.environ.get(self.name)
        if value is None:
            os.environ.pop(self.name, None)
        else:
            self.parse(self.format(value))  # validate before touching the environment
            self.set(value)
        try:
            yield
        finally:
            if old is None:
                os.environ.pop(self.name, None)
            else:
                os.environ[self.name] = old


def _build_var(name: str, entry: Mapping[str, Any]) -> EnvVar:
    if not isinstance(entry, Mapping):
        raise EnvSpecError(f"{name}: expected a mapping, got {type(entry).__name__}")
    missing = {"type", "default", "meaning", "owner"} - set(entry)
    if missing:
        raise EnvSpecError(f"{name}: missing field(s) {sorted(missing)}")
    typ = entry["type"]
    if typ not in TYPES:
        raise EnvSpecError(f"{name}: type {typ!r} is not one of {TYPES}")
    choices = tuple(str(c) for c in entry.get("choices", ()))
    if typ == "choice" and not choices:
        raise EnvSpecError(f"{name}: type choice needs choices")
    fields = (("minimum", "min"), ("multiple_of", "multiple_of"), ("maximum", "max"))
    bounds = {key: entry[field] for key, field in fields if field in entry}
    if bounds and typ not in ("int", "int_list"):
        raise EnvSpecError(f"{name}: min / max / multiple_of apply to int and int_list only")
    owner = str(entry["owner"])
    if typ == "bool" and owner not in OUR_OWNERS and owner not in OWNER_BOOL_READERS:
        raise EnvSpecError(f"{name}: no reader for a bool owned by {owner!r} (environ.OWNER_BOOL_READERS)")
    default = entry["default"]
    if typ == "int_list" and isinstance(default, (list, tuple)):
        default = tuple(sorted(set(default)))
    var = EnvVar(name, typ, default, str(entry["meaning"]), owner, choices, **bounds,
                 read_outside=str(entry.get("read_outside", "")))
    # the default must itself be a valid value of the declared type
    parsed = var.parse(var.format(var.default))
    if parsed != var.default:
        raise EnvSpecError(f"{name}: default {var.default!r} does not round-trip as {typ}")
    return var


class EnvRegistry:
    """Attribute access to the declared variables: ``envs.NAME.get()``."""

    def __init__(self, variables: Mapping[str, EnvVar], backend_defaults: Mapping[str, str]):
        self._vars = dict(variables)
        self.mm_attention_backend_defaults = dict(backend_defaults)

    def __getattr__(self, name: str) -> EnvVar:
        try:
            return self._vars[name]
        except KeyError:
            raise AttributeError(f"{name} is not declared in environ.yaml") from None

    def __iter__(self) -> Iterator[EnvVar]:
        return iter(self._vars.values())

    def __contains__(self, name: str) -> bool:
        return name in self._vars

    def names(self) -> list[str]:
        return list(self._vars)

    def raw_with_prefixes(self, prefixes: tuple[str, ...]) -> dict[str, str]:
        """The raw value of every variable in the environment whose name starts with one of
        ``prefixes``, declared here or not: another library's settings as one fingerprint (the
        key of a stored FA4 kernel, :mod:`sglang_fa4.kernels.fa4.shared_libs`)."""
        return {k: v for k, v in sorted(os.environ.items()) if k.startswith(prefixes)}

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Every variable's value (or the error its value raises), for doctor and logs; a
        malformed value that falls back to its default has both."""
        problems = {p.name: p.message for p in self.problems()}
        out = {}
        for var in self:
            entry: dict[str, Any] = {"set": var.is_set(), "owner": var.owner}
            try:
                entry["value"] = var.get()
            except EnvValueError as exc:
                entry["error"] = str(exc)
            if var.name in problems:
                entry["error"] = problems[var.name]
            out[var.name] = entry
        return out

    def problems(self, owners: tuple[str, ...] = OUR_OWNERS) -> list[EnvProblem]:
        """Every variable of ``owners`` whose current value does not parse (a value already
        falling back to its default included); another owner's variable is never one."""
        out = []
        for var in self:
            raw = os.environ.get(var.name)
            if not var.checked or var.owner not in owners or raw is None:
                continue
            try:
                var.parse(raw)
            except EnvValueError as exc:
                out.append(EnvProblem(var.name, raw, str(exc)))
        return out

    def validate(self) -> list[str]:
        """Messages for every variable whose current value does not parse."""
        return [p.message for p in self.problems()]

    def fall_back_to_defaults(self, problems: list[EnvProblem]) -> None:
        """From now on, in this process, each of these variables reads as its default while it
        holds the malformed value reported (a later, valid value is read as usual)."""
        for problem in problems:
            _FALLBACKS[problem.name] = problem.raw

    def default_for_outside_readers(self, names) -> list[str]:
        """Of the variables ``names`` (falling back to their defaults), those read outside this
        registry (``read_outside``) get the default written to the environment: that reader cannot
        see the fallback. Returns their names. The plugin does this, not doctor."""
        written = []
        for name in names:
            var = self._vars[name]
            if var.read_outside:
                var.set(var.default)
                written.append(name)
        return written

    def clear_fallbacks(self) -> None:
        _FALLBACKS.clear()


def load_registry(path: Path | None = None) -> EnvRegistry:
    data = yaml.safe_load((path or spec_path()).read_text())
    if not isinstance(data, Mapping) or "variables" not in data:
        raise EnvSpecError("environ.yaml needs a top-level 'variables' mapping")
    variables = {name: _build_var(name, entry) for name, entry in data["variables"].items()}
    defaults = {str(k): str(v) for k, v in (data.get("mm_attention_backend_defaults") or {}).items()}
    if "default" not in defaults:
        raise EnvSpecError("mm_attention_backend_defaults needs a 'default' entry")
    return EnvRegistry(variables, defaults)


@lru_cache(maxsize=1)
def _registry() -> EnvRegistry:
    return load_registry()


envs = _registry()
