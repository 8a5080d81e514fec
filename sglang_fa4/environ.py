"""The environment registry, built from environ.yaml at import.

Every variable sglang-fa4 reads or adds is declared in environ.yaml; this module is the only place in
the package that touches ``os.environ``. Use it like SGLang's own registry::

    from sglang_fa4.environ import envs
    envs.SGLANG_FA4_TMEM_LOAD_RED_MAX.get()   # -> bool, raises EnvValueError on a bad value
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator, Mapping

import yaml

TYPES = ("bool", "int", "int_list", "str", "choice")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class EnvValueError(ValueError):
    """An environment variable holds a value its declared type does not accept."""


class EnvSpecError(ValueError):
    """environ.yaml itself is malformed."""


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
    maximum: int | None = None  # int / int_list: largest accepted value
    multiple_of: int | None = None  # int / int_list: every value a multiple of this

    def accepted(self) -> str:
        """What the variable accepts, in words (error messages and the README table)."""
        if self.type == "bool":
            return "/".join(sorted(_TRUE | _FALSE))
        if self.type == "choice":
            return ", ".join(repr(c) for c in self.choices)
        bounds = []
        if self.minimum is not None:
            bounds.append(f">= {self.minimum}")
        if self.maximum is not None:
            bounds.append(f"<= {self.maximum}")
        if self.multiple_of is not None:
            bounds.append(f"a multiple of {self.multiple_of}")
        bounded = " and ".join(bounds)
        if self.type == "int":
            return f"an integer {bounded}" if bounds else "an integer"
        if self.type == "int_list":
            return f"a comma list of integers, each {bounded}" if bounds else "a comma list of integers"
        return "any string"

    def _check_int(self, raw: str, value: int) -> int:
        if (self.minimum is not None and value < self.minimum) or (
            self.maximum is not None and value > self.maximum) or (
            self.multiple_of is not None and value % self.multiple_of
        ):
            raise EnvValueError(f"{self.name}={raw!r}: {value} is out of range; accepted: {self.accepted()}")
        return value

    def parse(self, raw: str) -> Any:
        """Turn the raw string into the declared type, or raise naming the variable."""
        if self.type == "bool":
            low = raw.strip().lower()
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            raise EnvValueError(f"{self.name}={raw!r} is not a boolean; accepted values: {self.accepted()}")
        if self.type == "int":
            try:
                value = int(raw.strip())
            except ValueError:
                raise EnvValueError(f"{self.name}={raw!r} is not an integer; accepted: {self.accepted()}") from None
            return self._check_int(raw, value)
        if self.type == "int_list":
            values = set()
            for part in raw.split(","):
                if not part.strip():
                    continue
                try:
                    value = int(part.strip())
                except ValueError:
                    raise EnvValueError(
                        f"{self.name}={raw!r}: {part.strip()!r} is not an integer; accepted: {self.accepted()}"
                    ) from None
                values.add(self._check_int(raw, value))
            if not values:
                raise EnvValueError(f"{self.name}={raw!r} is empty; accepted: {self.accepted()}")
            return tuple(sorted(values))
        if self.type == "choice":
            if raw not in self.choices:
                shown = ", ".join(repr(c) for c in self.choices)
                raise EnvValueError(f"{self.name}={raw!r} is not one of the accepted values: {shown}")
            return raw
        return raw

    def is_set(self) -> bool:
        return self.name in os.environ

    def get(self) -> Any:
        raw = os.environ.get(self.name)
        return self.default if raw is None else self.parse(raw)

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
    bounds = {key: entry[field] for key, field in (("minimum", "min"), ("maximum", "max"), ("multiple_of", "multiple_of"))
              if field in entry}
    if bounds and typ not in ("int", "int_list"):
        raise EnvSpecError(f"{name}: min / max / multiple_of apply to int and int_list only")
    default = entry["default"]
    if typ == "int_list" and isinstance(default, (list, tuple)):
        default = tuple(sorted(set(default)))
    var = EnvVar(name, typ, default, str(entry["meaning"]), str(entry["owner"]), choices, **bounds)
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
        key of a stored FA4 kernel, :mod:`sglang_fa4.kernels.fa4_shared_libs`)."""
        return {k: v for k, v in sorted(os.environ.items()) if k.startswith(prefixes)}

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Every variable's value (or the error its value raises), for doctor and logs."""
        out = {}
        for var in self:
            entry: dict[str, Any] = {"set": var.is_set(), "owner": var.owner}
            try:
                entry["value"] = var.get()
            except EnvValueError as exc:
                entry["error"] = str(exc)
            out[var.name] = entry
        return out

    def validate(self) -> list[str]:
        """Messages for every variable whose current value does not parse."""
        errors = []
        for var in self:
            try:
                var.get()
            except EnvValueError as exc:
                errors.append(str(exc))
        return errors


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
