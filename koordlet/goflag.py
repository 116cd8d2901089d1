"""Go's ``flag`` package, as Koordinator's koordlet binary parses its command line (``flag.Parse``).

koordlet-py runs unchanged under Koordinator's DaemonSet, so its command line is read by Go's rules, not by
argparse's:

- ``-name`` and ``--name`` are the same flag; ``-name=value`` or ``-name value``;
- a boolean flag takes ``-name`` or ``-name=value`` only (``-name false`` sets it true and ``false`` ends the
  flags, as in Go);
- the first argument that is not a flag, or ``--``, ends the flags: what follows is left unparsed;
- a flag may be given again: the last value wins (a :data:`Kind` with ``accumulate`` collects every value);
- values are parsed as the Go types of Go's flag package parse them, and refused with its messages
  (``invalid value "x" for flag -name: parse error``, ``...: value out of range``): ``flag.Int`` and
  ``flag.Int64`` by ``strconv.ParseInt(s, 0, 64)``, ``flag.Uint``/``flag.Uint64`` by ``strconv.ParseUint(s, 0,
  64)`` (amd64 and arm64: ``strconv.IntSize`` is 64), ``flag.Float64`` by ``strconv.ParseFloat(s, 64)``,
  ``flag.Bool`` by ``strconv.ParseBool``, ``flag.Duration`` by ``time.ParseDuration`` (any error of it is
  ``parse error``, as in Go);
- ``-h``/``-help``, when no such flag is defined, prints Go's ``PrintDefaults`` form to stderr; an error prints
  the message and then the same usage (the caller prints; :meth:`FlagSet.usage` gives the text).

The parsers are ports of Go's sources (``strconv/atoi.go``, ``strconv/atof.go``, ``time/format.go``), byte for
byte in what they accept: underscores only with base 0 and only between digits (or after a base prefix), hex
floats only with a ``p`` exponent, ASCII digits only, Go's int64 nanosecond range for durations (the minimum,
``-2562047h47m16.854775808s``, included). tests/koordlet/test_goflag.py holds them to Go's own test tables.

A :class:`FlagSet` holds :class:`Flag` definitions; :meth:`FlagSet.parse` returns a :class:`Parsed`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal

ERR_SYNTAX = "invalid syntax"  # strconv.ErrSyntax
ERR_RANGE = "value out of range"  # strconv.ErrRange
PARSE_ERROR = "parse error"  # flag's errParse
RANGE_ERROR = "value out of range"  # flag's errRange
INT_SIZE = 64  # strconv.IntSize on the 64-bit platforms Koordinator ships for

_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v",
            '"': '\\"', "\\": "\\\\"}


class GoFlagError(ValueError):
    """A command line Go's flag package refuses; the message is Go's."""


class HelpRequested(Exception):  # noqa: N818 (Go's flag.ErrHelp)
    """``-h`` or ``-help`` when no such flag is defined."""


class NumError(ValueError):
    """strconv's ``*NumError``: ``strconv.<func>: parsing "<num>": <err>`` (``err``: ERR_SYNTAX or ERR_RANGE)."""

    def __init__(self, func: str, num: str, err: str) -> None:
        super().__init__(f"strconv.{func}: parsing {go_quote(num)}: {err}")
        self.func, self.num, self.err = func, num, err


class DurationError(ValueError):
    """time.ParseDuration's error, with its text (``time: invalid duration "x"``)."""


class _BadDuration(Exception):  # noqa: N818 (a signal inside parse_duration_ns, never raised out of it)
    """time.ParseDuration's ``invalid duration``."""


class _SetError(ValueError):
    """A Value's Set error: Go prints it after ``invalid value ... for flag -name: ``."""


def go_quote(text: str) -> str:
    """strconv.Quote (``%q``): printable runes as they are, the rest escaped; a byte that is not UTF-8 (carried
    by Python's surrogateescape, as sys.argv holds it) as ``\\xNN``."""
    out = ['"']
    for char in text:
        code = ord(char)
        if char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif 0xDC80 <= code <= 0xDCFF:  # an undecodable byte of the command line
            out.append(f"\\x{code - 0xDC00:02x}")
        elif char.isprintable():  # Go's IsPrint: letters, marks, numbers, punctuation, symbols, ASCII space
            out.append(char)
        elif code < 0x80:
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    return "".join(out) + '"'


def parse_bool(text: str) -> bool:
    """strconv.ParseBool."""
    if text in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if text in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    raise NumError("ParseBool", text, ERR_SYNTAX)


def _underscore_ok(text: str) -> bool:
    """strconv's underscoreOK: each underscore between two digits, or between a base prefix and a digit."""
    saw, i = "^", 0  # ^ start, 0 digit or base prefix, _ underscore, ! anything else
    if text[:1] in ("+", "-"):
        text = text[1:]
    hexadecimal = False
    if len(text) >= 2 and text[0] == "0" and text[1].lower() in "box":
        i, saw, hexadecimal = 2, "0", text[1].lower() == "x"
    for char in text[i:]:
        if "0" <= char <= "9" or hexadecimal and "a" <= char.lower() <= "f":
            saw = "0"
        elif char == "_":
            if saw != "0":
                return False
            saw = "_"
        elif saw == "_":
            return False
        else:
            saw = "!"
    return saw != "_"


def parse_uint(text: str, base: int = 0, bit_size: int = 64, func: str = "ParseUint") -> int:
    """strconv.ParseUint (base 0: ``0x``/``0o``/``0b`` prefixes, a leading ``0`` for octal, underscores)."""
    if not text:
        raise NumError(func, text, ERR_SYNTAX)
    base0, digits = base == 0, text
    if base0:
        base = 10
        if text[0] == "0":
            marker = text[1].lower() if len(text) >= 3 else ""
            base, digits = {"b": (2, text[2:]), "o": (8, text[2:]), "x": (16, text[2:])}.get(marker, (8, text[1:]))
    max_value = (1 << bit_size) - 1
    value, underscores = 0, False
    for char in digits:
        if char == "_" and base0:
            underscores = True
            continue
        if "0" <= char <= "9":
            digit = ord(char) - 48
        elif char.isascii() and char.isalpha():
            digit = ord(char.lower()) - 87
        else:
            raise NumError(func, text, ERR_SYNTAX)
        if digit >= base:
            raise NumError(func, text, ERR_SYNTAX)
        value = value * base + digit
        if value > max_value:  # Go stops at the first digit that overflows, before any later syntax error
            raise NumError(func, text, ERR_RANGE)
    if underscores and not _underscore_ok(text):
        raise NumError(func, text, ERR_SYNTAX)
    return value


def parse_int(text: str, base: int = 0, bit_size: int = 64) -> int:
    """strconv.ParseInt: an optional sign, then ParseUint's forms."""
    if not text:
        raise NumError("ParseInt", text, ERR_SYNTAX)
    negative = text[0] == "-"
    body = text[1:] if text[0] in "+-" else text
    try:
        magnitude = parse_uint(body, base, bit_size, func="ParseInt")
    except NumError as err:
        raise NumError("ParseInt", text, err.err) from None
    cutoff = 1 << (bit_size - 1)
    if magnitude > cutoff or magnitude == cutoff and not negative:
        raise NumError("ParseInt", text, ERR_RANGE)
    return -magnitude if negative else magnitude


def _special_float(text: str) -> float | None:
    """ParseFloat's inf, infinity (signed) and nan (unsigned), any case; None for anything else."""
    lowered = text.lower()
    if lowered in ("inf", "+inf", "infinity", "+infinity"):
        return math.inf
    if lowered in ("-inf", "-infinity"):
        return -math.inf
    return math.nan if lowered == "nan" else None


def _float_body_end(text: str, i: int, hexadecimal: bool) -> int:
    """readFloat's mantissa and exponent from ``text[i]`` on: the index after them, or -1 when they are not a
    number (no digits, an empty exponent, a hex mantissa without its ``p`` exponent)."""
    digits_seen = dot_seen = False
    while i < len(text):
        char = text[i]
        if char == "_":
            pass
        elif char == ".":
            if dot_seen:
                break
            dot_seen = True
        elif "0" <= char <= "9" or hexadecimal and "a" <= char.lower() <= "f":
            digits_seen = True
        else:
            break
        i += 1
    if not digits_seen:
        return -1
    if i < len(text) and text[i].lower() == ("p" if hexadecimal else "e"):
        i += 1
        if i < len(text) and text[i] in "+-":
            i += 1
        if i >= len(text) or not "0" <= text[i] <= "9":
            return -1
        while i < len(text) and ("0" <= text[i] <= "9" or text[i] == "_"):
            i += 1
    elif hexadecimal:
        return -1
    return i


def parse_float(text: str) -> float:
    """strconv.ParseFloat(s, 64): decimal and hexadecimal (``0x1.8p1``, its ``p`` exponent required) forms with
    Go's underscores, inf/infinity/nan; beyond the float64 range a range error."""
    special = _special_float(text)
    if special is not None:
        return special
    start = 1 if text[:1] in ("+", "-") else 0
    hexadecimal = len(text) > start + 2 and text[start] == "0" and text[start + 1].lower() == "x"
    end = _float_body_end(text, start + 2 if hexadecimal else start, hexadecimal)
    if end != len(text) or "_" in text and not _underscore_ok(text):
        raise NumError("ParseFloat", text, ERR_SYNTAX)
    plain = text.replace("_", "")
    try:  # the grammar is Go's and checked above: Python's correctly rounded conversion gives Go's value
        value = float.fromhex(plain) if hexadecimal else float(plain)
    except OverflowError:
        value = math.inf
    if math.isinf(value):
        raise NumError("ParseFloat", text, ERR_RANGE)
    return value


_UNIT_NS = {"ns": 1, "us": 1_000, "µs": 1_000, "μs": 1_000, "ms": 1_000_000, "s": 1_000_000_000,
            "m": 60_000_000_000, "h": 3_600_000_000_000}
_LIMIT = 1 << 63


def _time_quote(text: str) -> str:
    """time's own quote: non-ASCII and control characters as the ``\\xNN`` of their UTF-8 bytes."""
    out = []
    for char in text:
        if ord(char) >= 0x80 or char < " ":
            out.extend(f"\\x{byte:02x}" for byte in char.encode("utf-8", "surrogateescape"))
        else:
            out.append("\\" + char if char in '"\\' else char)
    return '"' + "".join(out) + '"'


def _leading_int(body: str, i: int) -> tuple[int, int]:
    """time's leadingInt: the digits from ``body[i]`` and the index after them (past 2^63: _BadDuration)."""
    value = 0
    while i < len(body) and "0" <= body[i] <= "9":
        if value > _LIMIT // 10:
            raise _BadDuration
        value = value * 10 + ord(body[i]) - 48
        if value > _LIMIT:
            raise _BadDuration
        i += 1
    return value, i


def _leading_fraction(body: str, i: int) -> tuple[int, float, int]:
    """time's leadingFraction: the digits from ``body[i]`` as (value, scale), the index after them; past 2^63 the
    digits are read but add no precision."""
    value, scale, overflow = 0, 1.0, False
    while i < len(body) and "0" <= body[i] <= "9":
        if not overflow:
            grown = value * 10 + ord(body[i]) - 48
            if value > (_LIMIT - 1) // 10 or grown > _LIMIT:
                overflow = True
            else:
                value, scale = grown, scale * 10
        i += 1
    return value, scale, i


def _duration_part(text: str, body: str, i: int) -> tuple[int, int]:
    r"""One ``[0-9]*(\.[0-9]*)?unit`` of ``body`` from ``i``: its nanoseconds and the index after it."""
    if not (body[i] == "." or "0" <= body[i] <= "9"):
        raise _BadDuration
    whole, after_int = _leading_int(body, i)
    fraction, scale, end = 0, 1.0, after_int
    if end < len(body) and body[end] == ".":
        fraction, scale, end = _leading_fraction(body, end + 1)
        if end == after_int + 1 and after_int == i:  # no digits at all (".s", "-.")
            raise _BadDuration
    elif after_int == i:
        raise _BadDuration
    unit_end = end
    while unit_end < len(body) and not (body[unit_end] == "." or "0" <= body[unit_end] <= "9"):
        unit_end += 1
    if unit_end == end:
        raise DurationError(f"time: missing unit in duration {_time_quote(text)}")
    unit = _UNIT_NS.get(body[end:unit_end])
    if unit is None:
        raise DurationError(f"time: unknown unit {_time_quote(body[end:unit_end])} in duration {_time_quote(text)}")
    if whole > _LIMIT // unit:
        raise _BadDuration
    whole *= unit
    if fraction > 0:  # float64, as Go computes it (nanosecond exact for fractions of an hour)
        whole += int(float(fraction) * (float(unit) / scale))
    return whole, unit_end


def parse_duration_ns(text: str) -> int:
    r"""time.ParseDuration in nanoseconds: ``[-+]?([0-9]*(\.[0-9]*)?[a-z]+)+`` or ``0``; units ns, us (µs, μs),
    ms, s, m, h; the int64 range, ``-2562047h47m16.854775808s`` (its minimum) included."""
    body, negative = text, False
    if body[:1] in ("+", "-"):
        body, negative = body[1:], body[0] == "-"
    if body == "0":
        return 0
    total, i = 0, 0
    try:
        if not body:
            raise _BadDuration
        while i < len(body):
            part, i = _duration_part(text, body, i)
            total += part
            if part > _LIMIT or total > _LIMIT:
                raise _BadDuration
        if not negative and total == _LIMIT:  # -2^63 is a duration, 2^63 is not
            raise _BadDuration
    except _BadDuration:  # Go's one message for bad syntax and for values past the int64 range
        raise DurationError(f"time: invalid duration {_time_quote(text)}") from None
    return -total if negative else total


def _fraction(value: int, precision: int) -> tuple[str, int]:
    """time's fmtFrac: the fraction of ``value / 10**precision`` without trailing zeros, and the whole part."""
    whole, rest = divmod(value, 10**precision)
    digits = f"{rest:0{precision}d}".rstrip("0") if precision else ""
    return ("." + digits if digits else ""), whole


def duration_string(nanoseconds: int) -> str:
    """time.Duration.String: ``1h2m3.5s``, ``1.5ms``, ``1µs``, ``0s``."""
    sign, magnitude = ("-" if nanoseconds < 0 else ""), abs(nanoseconds)
    if magnitude == 0:
        return "0s"
    if magnitude < 1_000_000_000:
        precision, unit = (0, "ns") if magnitude < 1_000 else (3, "µs") if magnitude < 1_000_000 else (6, "ms")
        fraction, whole = _fraction(magnitude, precision)
        return f"{sign}{whole}{fraction}{unit}"
    fraction, seconds = _fraction(magnitude, 9)
    minutes, seconds = divmod(seconds, 60)
    text = f"{seconds}{fraction}s"
    if minutes:
        hours, minutes = divmod(minutes, 60)
        text = f"{hours}h{minutes}m{text}" if hours else f"{minutes}m{text}"
    return sign + text


def format_float(value: float) -> str:
    """strconv.FormatFloat(f, 'g', -1, 64): the shortest digits that read back; the %e form for a decimal
    exponent below -4 or from 6 on (Go's rule for the shortest precision)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    sign = "-" if math.copysign(1.0, value) < 0 else ""
    if value == 0:
        return sign + "0"
    _, digit_tuple, exponent = Decimal(repr(abs(value))).normalize().as_tuple()
    digits = "".join(map(str, digit_tuple))
    point = len(digits) + int(exponent)  # digits are 0.DIGITS x 10^point
    exp = point - 1
    if exp < -4 or exp >= 6:
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{sign}{mantissa}e{'-' if exp < 0 else '+'}{abs(exp):02d}"
    if point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return sign + digits + "0" * (point - len(digits))
    return f"{sign}{digits[:point]}.{digits[point:]}"


def _value_text(value: object) -> str:
    """A default's Value.String() for the kinds of our own: bools as Go writes them, lists joined by commas,
    maps as sorted ``key=value`` pairs (component-base's MapStringBool)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return format_float(value)
    if isinstance(value, (tuple, list)):
        return ",".join(_value_text(item) for item in value)
    if isinstance(value, dict):
        return ",".join(f"{key}={_value_text(item)}" for key, item in sorted(value.items()))
    return "" if value is None else str(value)


# UnquoteUsage's guess of a value's name from its Go type; any other Value is a "value".
_PLACEHOLDERS = {"bool": "", "duration": "duration", "float64": "float", "int": "int", "int64": "int",
                 "string": "string", "uint": "uint", "uint64": "uint"}


@dataclass(frozen=True, slots=True)
class Kind:
    """A flag's Go type: how a value is parsed, whether it is a boolean flag, whether repeats accumulate, how a
    default is written (Value.String()) and the zero value's text (PrintDefaults omits a default equal to it)."""

    name: str  # the Go type (Koordinator's declaration: int, uint, float64, duration, mapStringBool ...)
    parse: Callable[[str], object]
    is_bool: bool = False
    accumulate: bool = False  # every value is kept, in order (cliflag.StringSlice, cliflag.MapStringBool)
    show: Callable[[object], str] = _value_text
    zero: str = ""

    @property
    def placeholder(self) -> str:
        return _PLACEHOLDERS.get(self.name, "value")


def _flag_value(parse: Callable[[str], object]) -> Callable[[str], object]:
    """A strconv parser as flag's Value.Set: its NumError becomes ``parse error`` or ``value out of range``."""

    def set_value(text: str) -> object:
        try:
            return parse(text)
        except NumError as err:
            raise _SetError(RANGE_ERROR if err.err == ERR_RANGE else PARSE_ERROR) from err

    return set_value


def _duration_seconds(text: str) -> float:
    try:
        return parse_duration_ns(text) / 1e9
    except DurationError as err:  # flag's durationValue.Set: every error is errParse
        raise _SetError(PARSE_ERROR) from err


STRING = Kind("string", str)
BOOL = Kind("bool", _flag_value(parse_bool), is_bool=True, zero="false")
INT = Kind("int", _flag_value(lambda text: parse_int(text, 0, INT_SIZE)), zero="0")
INT64 = Kind("int64", _flag_value(parse_int), zero="0")
UINT = Kind("uint", _flag_value(lambda text: parse_uint(text, 0, INT_SIZE)), zero="0")
UINT64 = Kind("uint64", _flag_value(parse_uint), zero="0")
FLOAT64 = Kind("float64", _flag_value(parse_float), zero="0")
DURATION = Kind("duration", _duration_seconds, show=lambda seconds: duration_string(round(seconds * 1e9)),  # type: ignore[arg-type]
                zero="0s")
STRING_LIST = Kind("stringSlice", str, accumulate=True)


def value_kind(name: str, check: Callable[[str], object], is_bool: bool = False, accumulate: bool = False,
               zero: str = "") -> Kind:
    """A flag.Value of its own (klog's Level, vmodule ...): ``check`` parses a value or raises ValueError whose
    text is the Set error Go would print; ``zero``: the text of its zero value."""

    def parse(text: str) -> object:
        try:
            return check(text)
        except _SetError:
            raise
        except ValueError as err:
            raise _SetError(str(err)) from err

    return Kind(name, parse, is_bool=is_bool, accumulate=accumulate, zero=zero)


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


def _unquote_usage(item: Flag) -> tuple[str, str]:
    """flag.UnquoteUsage: a back-quoted word of the usage names the value; else the type's guess."""
    first = item.usage.find("`")
    if first >= 0:
        second = item.usage.find("`", first + 1)
        if second >= 0:
            name = item.usage[first + 1:second]
            return name, item.usage[:first] + name + item.usage[second + 1:]
    return item.kind.placeholder, item.usage


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
        """Go's default usage: ``Usage of <program>:`` and PrintDefaults, as it goes to stderr."""
        lines = [f"Usage of {self.program}:\n"]
        for item in self.flags():
            line = f"  -{item.name}"
            name, usage = _unquote_usage(item)
            if name:
                line += " " + name
            line += "\t" if len(line) <= 4 else "\n    \t"  # a one-letter bool keeps its usage on its line
            line += usage.replace("\n", "\n    \t")
            default = item.kind.zero if item.default is None else item.kind.show(item.default)  # None: not recorded
            if default != item.kind.zero:
                line += f" (default {go_quote(default) if item.kind.name == 'string' else default})"
            lines.append(line + "\n")
        return "".join(lines)

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
            except _SetError as err:
                if not has_value:
                    raise GoFlagError(f"invalid boolean flag {name}: {err}") from err
                raise GoFlagError(f"invalid boolean value {go_quote(text)} for -{name}: {err}") from err
        if not has_value:
            if not args:
                raise GoFlagError(f"flag needs an argument: -{name}")
            value = args.pop(0)
        try:
            return item, item.kind.parse(value)
        except _SetError as err:
            raise GoFlagError(f"invalid value {go_quote(value)} for flag -{name}: {err}") from err
