"""Go's ``flag`` package, as Koordinator's koordlet binary parses its command line (``flag.Parse``).

koordlet-py runs unchanged under Koordinator's DaemonSet, so its command line is read by Go's rules, not by
argparse's:

- ``-name`` and ``--name`` are the same flag; ``-name=value`` or ``-name value``;
- a boolean flag takes ``-name`` or ``-name=value`` only (``-name false`` sets it true and ``false`` ends the
  flags, as in Go);
- the first argument that is not a flag, or ``--``, ends the flags: what follows is left unparsed;
- a flag may be given again: the last value wins (a :data:`Kind` with ``accumulate`` collects every value);
- values are parsed as Go's types parse them (``strconv.ParseInt(s, 0, 64)`` for ints, so ``0x10`` and ``010``
  (octal) are ints; ``strconv.ParseBool``; ``time.ParseDuration``, so ``10`` without a unit is an error) and
  refused with Go's messages (``invalid value "x" for flag -name: parse error``).

A :class:`FlagSet` holds :class:`Flag` definitions; :meth:`FlagSet.parse` returns a :class:`Parsed`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

_INT64 = (-(1 << 63), (1 << 63) - 1)
_UINT64 = (0, (1 << 64) - 1)
_INT32 = (-(1 << 31), (1 << 31) - 1)


class GoFlagError(ValueError):
    """A command line Go's flag package refuses; the message is Go's."""


class HelpRequested(Exception):  # noqa: N818 (Go's flag.ErrHelp)
    """``-h`` or ``-help`` when no such flag is defined."""


class _ParseError(ValueError):
    """Go's errParse / errRange, or a Value's own Set error: ``invalid value ... : <this>``."""


PARSE_ERROR = "parse error"
RANGE_ERROR = "value out of range"


def go_quote(text: str) -> str:
    """Go's ``%q`` of a string (strconv.Quote) for printable text."""
    return json.dumps(text, ensure_ascii=False)


def parse_go_bool(text: str) -> bool:
    """strconv.ParseBool."""
    if text in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if text in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    raise _ParseError(PARSE_ERROR)


_DIGITS = {2: "01", 8: "01234567", 10: "0123456789", 16: "0123456789abcdefABCDEF"}


def _go_uint_base0(text: str) -> int:
    """The magnitude part of strconv.ParseUint(s, 0, 64): base prefixes 0x/0o/0b, a leading 0 for octal,
    underscores only between digits of a number written with a base prefix (or a leading 0)."""
    if not text:
        raise _ParseError(PARSE_ERROR)
    base, digits, prefixed = 10, text, False
    if len(text) >= 2 and text[0] == "0":
        marker = text[1].lower()
        if marker in "xob":
            base, digits, prefixed = {"x": 16, "o": 8, "b": 2}[marker], text[2:], True
        else:
            base, digits, prefixed = 8, text[1:], True
    if "_" in digits:  # Go: underscores only in a number with a base prefix, each between two digits
        if not prefixed or digits.endswith("_") or "__" in digits:
            raise _ParseError(PARSE_ERROR)
        digits = digits.replace("_", "")
    if not digits or any(ch not in _DIGITS[base] for ch in digits):
        raise _ParseError(PARSE_ERROR)
    return int(digits, base)


def parse_go_int(text: str, bits: tuple[int, int] = _INT64) -> int:
    """strconv.ParseInt(s, 0, 64) (``bits``: the type's range)."""
    negative = text.startswith("-")
    magnitude = _go_uint_base0(text[1:] if text[:1] in "+-" else text)
    value = -magnitude if negative else magnitude
    if not bits[0] <= value <= bits[1]:
        raise _ParseError(RANGE_ERROR)
    return value


def parse_go_uint(text: str) -> int:
    """strconv.ParseUint(s, 0, 64): no sign at all."""
    value = _go_uint_base0(text)
    if value > _UINT64[1]:
        raise _ParseError(RANGE_ERROR)
    return value


_FLOAT = re.compile(r"[+-]?(?:\d+(?:_\d+)*(?:\.(?:\d+(?:_\d+)*)?)?|\.\d+(?:_\d+)*)(?:[eE][+-]?\d+)?")
_SPECIAL_FLOATS = {"inf": math.inf, "+inf": math.inf, "-inf": -math.inf, "infinity": math.inf,
                   "+infinity": math.inf, "-infinity": -math.inf, "nan": math.nan}


def parse_go_float(text: str) -> float:
    """strconv.ParseFloat(s, 64), decimal and hexadecimal forms, inf and nan."""
    special = _SPECIAL_FLOATS.get(text.lower())
    if special is not None:
        return special
    body = text.lstrip("+-")
    if body[:2].lower() == "0x":
        try:
            value = float.fromhex(text.replace("_", ""))
        except (ValueError, OverflowError) as err:
            raise _ParseError(PARSE_ERROR) from err
    elif _FLOAT.fullmatch(text) and "_" not in text:
        value = float(text)
    else:
        raise _ParseError(PARSE_ERROR)
    if math.isinf(value):
        raise _ParseError(RANGE_ERROR)
    return value


_DURATION_UNITS_NS = {"ns": 1, "us": 1_000, "µs": 1_000, "μs": 1_000, "ms": 1_000_000, "s": 1_000_000_000,
                      "m": 60_000_000_000, "h": 3_600_000_000_000}
_DURATION_PART = re.compile(r"(\d*)(?:\.(\d*))?([^\d.]+)")


def parse_go_duration(text: str) -> float:
    """time.ParseDuration, in seconds: ``1m30s``, ``500ms``, ``-1.5h``; ``0`` alone needs no unit."""
    body = text[1:] if text[:1] in "+-" else text
    if body == "0":
        return 0.0
    if not body:
        raise _ParseError(PARSE_ERROR)
    total_ns, position = 0, 0
    while position < len(body):
        match = _DURATION_PART.match(body, position)
        if match is None or not (match.group(1) or match.group(2)) or match.group(3) not in _DURATION_UNITS_NS:
            raise _ParseError(PARSE_ERROR)
        whole, fraction, unit = match.group(1) or "0", match.group(2) or "", _DURATION_UNITS_NS[match.group(3)]
        total_ns += int(whole) * unit + (int(fraction) * unit // 10 ** len(fraction) if fraction else 0)
        position = match.end()
    if total_ns > _INT64[1]:
        raise _ParseError(PARSE_ERROR)
    return (-total_ns if text.startswith("-") else total_ns) / 1e9


@dataclass(frozen=True, slots=True)
class Kind:
    """A flag's Go type: how a value is parsed, whether it is a boolean flag, whether repeats accumulate."""

    name: str
    parse: Callable[[str], object]
    is_bool: bool = False
    accumulate: bool = False  # every value is kept, in order (cliflag.StringSlice, cliflag.MapStringBool)


STRING = Kind("string", str)
BOOL = Kind("bool", parse_go_bool, is_bool=True)
INT = Kind("int", parse_go_int)
INT32 = Kind("int32", lambda text: parse_go_int(text, _INT32))
INT64 = Kind("int64", parse_go_int)
UINT = Kind("uint", parse_go_uint)
UINT64 = Kind("uint64", parse_go_uint)
FLOAT64 = Kind("float64", parse_go_float)
DURATION = Kind("duration", parse_go_duration)
STRING_LIST = Kind("strings", str, accumulate=True)


def value_kind(name: str, check: Callable[[str], object], is_bool: bool = False, accumulate: bool = False) -> Kind:
    """A flag.Value of its own (klog's Level, vmodule ...): ``check`` parses a value or raises ValueError whose
    text is the Set error Go would print."""

    def parse(text: str) -> object:
        try:
            return check(text)
        except _ParseError:
            raise
        except ValueError as err:
            raise _ParseError(str(err)) from err

    return Kind(name, parse, is_bool=is_bool, accumulate=accumulate)


@dataclass(frozen=True, slots=True)
class Flag:
    name: str
    kind: Kind
    default: object
    usage: str
    dest: str  # the attribute name the parsed value goes to


@dataclass(slots=True)
class Parsed:
    values: dict[str, object]  # dest -> value (default where not given)
    given: list[str] = field(default_factory=list)  # the flag names given, in order, each once
    rest: list[str] = field(default_factory=list)  # the arguments after the flags (Go's flag.Args())


class FlagSet:
    def __init__(self, program: str) -> None:
        self.program = program
        self._flags: dict[str, Flag] = {}

    def add(self, name: str, kind: Kind, default: object, usage: str, dest: str | None = None) -> None:
        if name in self._flags:
            raise ValueError(f"flag redefined: {name}")  # Go panics: a programming error
        self._flags[name] = Flag(name, kind, default, usage, dest or name.replace("-", "_"))

    def __contains__(self, name: str) -> bool:
        return name in self._flags

    def flags(self) -> list[Flag]:
        return sorted(self._flags.values(), key=lambda f: f.name)

    def usage(self) -> str:
        lines = [f"Usage of {self.program}:"]
        for item in self.flags():
            kind = "" if item.kind.is_bool else f" {item.kind.name}"
            default = "" if item.default in ("", None, False, ()) else f" (default {item.default!r})"
            lines.append(f"  -{item.name}{kind}\n    \t{item.usage}{default}")
        return "\n".join(lines) + "\n"

    def parse(self, argv: Sequence[str]) -> Parsed:
        """Go's FlagSet.Parse; raises GoFlagError (Go's message) or HelpRequested."""
        parsed = Parsed({f.dest: ([] if f.kind.accumulate else f.default) for f in self._flags.values()})
        args = list(argv)
        while args and len(args[0]) >= 2 and args[0][0] == "-":
            arg = args.pop(0)
            if arg == "--":
                break
            item, result = self._one(arg, args)
            if item.kind.accumulate:
                parsed.values[item.dest].append(result)  # type: ignore[union-attr]
            else:
                parsed.values[item.dest] = result
            if item.name not in parsed.given:
                parsed.given.append(item.name)
        parsed.rest = args
        return parsed

    def _one(self, arg: str, args: list[str]) -> tuple[Flag, object]:
        """One flag of the command line (its value taken from ``args`` when it needs one)."""
        name = arg[2:] if arg[1] == "-" else arg[1:]
        if not name or name[0] in "-=":
            raise GoFlagError(f"bad flag syntax: {arg}")
        name, has_value, value = name.partition("=")
        item = self._flags.get(name)
        if item is None:
            if name in ("help", "h"):
                raise HelpRequested
            raise GoFlagError(f"flag provided but not defined: -{name}")
        if item.kind.is_bool:
            text = value if has_value else "true"
            try:
                return item, item.kind.parse(text)
            except _ParseError as err:
                raise GoFlagError(f"invalid boolean value {go_quote(text)} for -{name}: {err}") from err
        if not has_value:
            if not args:
                raise GoFlagError(f"flag needs an argument: -{name}")
            value = args.pop(0)
        try:
            return item, item.kind.parse(value)
        except _ParseError as err:
            raise GoFlagError(f"invalid value {go_quote(value)} for flag -{name}: {err}") from err
