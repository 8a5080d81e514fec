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

TYPES = ("bool", "int", "str", "choice")
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

    def parse(self, raw: str) -> Any:
        """Turn the raw string into the declared type, or raise naming the variable."""
        if self.type == "bool":
            low = raw.strip().lower()
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            accepted = "/".join(sorted(_TRUE | _FALSE))
            raise EnvValueError(f"{self.name}={raw!r} is not a boolean; accepted values: {accepted}")
        if self.type == "int":
            try:
                return int(raw.strip())
            except ValueError:
                raise EnvValueError(f"{self.name}={raw!r} is not an integer") from None
        if self.type == "choice":
            if raw not in self.choices:
                shown = ", ".join(repr(c) for c in self.choices)
                raise EnvValueError(f"{self.name}={raw!r} is not one of the accepted values: {shown}")
            return raw
        return raw

    def is_set(self) -> bool:
        return self.name in os.environ

    def raw(self) -> str | None:
        return os.environ.get(self.name)

    def get(self) -> Any:
        raw = os.environ.get(self.name)
        return self.default if raw is None else self.parse(raw)

    def set(self, value: Any) -> None:
        os.environ[self.name] = self.format(value)

    def format(self, value: Any) -> str:
        if self.type == "bool":
            return "1" if value else "0"
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
    var = EnvVar(name, typ, entry["default"], str(entry["meaning"]), str(entry["owner"]), choices)
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
