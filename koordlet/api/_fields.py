"""Declarative JSON (camelCase) ↔ frozen-dataclass mapping with validation, shared by NodeSLO and annotations.

A field declares its JSON key and a check in its metadata (:func:`meta`, :func:`nested`). :func:`collect`
reads a JSON object into validated overrides (attribute → value, nested :class:`Overrides` for nested
dataclasses), recording every problem in ``errors`` instead of stopping at the first; :func:`apply` lays
overrides over a base instance. JSON ``null`` is "not set" (a nil pointer in the Go API) and keys we do
not know are ignored, so objects written by newer Koordinator versions still parse.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping
from typing import TypeVar

T = TypeVar("T")

Check = Callable[[object], object]


class Overrides(dict[str, object]):
    """Overrides for one dataclass: attribute name → value, or → Overrides for a nested dataclass."""


class FieldError(Exception):
    """Raised by a check; the message is the reason, the caller adds the field path."""


def show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def meta(key: str, check: Check) -> dict[str, object]:
    """Field metadata: read from JSON key ``key``, validated by ``check``.

    Use as ``x: int = field(default=65, metadata=meta("cpuSuppressThresholdPercent", PERCENT))``.
    """
    return {"json": key, "check": check}


def nested(key: str) -> dict[str, object]:
    """Field metadata for a nested json-mapped dataclass, merged field by field."""
    return {"json": key, "nested": True}


def collect(cls: type, raw: object, path: str, errors: list[str]) -> Overrides:
    """Validated overrides for dataclass ``cls`` from a JSON value; problems are appended to ``errors``."""
    overrides = Overrides()
    if raw is None:
        return overrides
    if not isinstance(raw, Mapping):
        errors.append(f"{path or '<root>'}: expected an object, got {show(raw)}")
        return overrides
    for field in dataclasses.fields(cls):
        key = field.metadata.get("json")
        if key is None or key not in raw or raw[key] is None:
            continue
        where = f"{path}.{key}" if path else key
        if field.metadata.get("nested"):
            nested_cls = type(field.default)  # nested fields always have a plain default
            overrides[field.name] = collect(nested_cls, raw[key], where, errors)
            continue
        try:
            overrides[field.name] = field.metadata["check"](raw[key])
        except FieldError as exc:
            errors.append(f"{where}: {exc}")
    return overrides


def apply(base: T, overrides: Mapping[str, object]) -> T:
    """``base`` with ``overrides`` laid over it (nested dicts merge into nested dataclasses)."""
    if not overrides:
        return base
    changes: dict[str, object] = {}
    for name, value in overrides.items():
        if isinstance(value, Overrides):
            changes[name] = apply(getattr(base, name), value)
        else:
            changes[name] = value
    return dataclasses.replace(base, **changes)  # type: ignore[type-var]


def dump(value: object) -> object:
    """The JSON (camelCase) form of a json-mapped dataclass: every field that has a JSON key, unset (None) ones
    left out; reading it back with :func:`collect` and :func:`apply` gives the same value."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, object] = {}
        for field in dataclasses.fields(value):
            key = field.metadata.get("json")
            item = getattr(value, field.name)
            if key is not None and item is not None:
                out[str(key)] = dump(item)
        return out
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(key): dump(item) for key, item in value.items()}
    if isinstance(value, tuple | list | frozenset | set):
        return [dump(item) for item in value]
    return value


# ---------------------------------------------------------------------------------------------- checks


def check_bool(value: object) -> bool:
    if not isinstance(value, bool):
        raise FieldError(f"expected true or false, got {show(value)}")
    return value


def check_int(low: int | None = None, high: int | None = None) -> Check:
    """An integer (not a bool, not a float) within [low, high]."""

    def check(value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise FieldError(f"expected an integer, got {show(value)}")
        if low is not None and value < low:
            raise FieldError(f"{value} is below the minimum {low}")
        if high is not None and value > high:
            raise FieldError(f"{value} is above the maximum {high}")
        return value

    return check


def check_enum(*allowed: str) -> Check:
    def check(value: object) -> str:
        if not isinstance(value, str) or value not in allowed:
            raise FieldError(f"expected one of {', '.join(allowed)}, got {show(value)}")
        return value

    return check


def check_str(value: object) -> str:
    if not isinstance(value, str):
        raise FieldError(f"expected a string, got {show(value)}")
    return value


PERCENT = check_int(0, 100)
INT32 = check_int(-(2**31), 2**31 - 1)
