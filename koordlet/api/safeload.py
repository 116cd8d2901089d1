"""Bounded YAML and JSON parsing for every document koordlet reads from outside (NodeSLO files, annotations,
kubelet and CRI answers, config files).

A document from outside may be written by a buggy webhook, a hand edit or a hostile user. Parsing it must
cost a bounded amount of memory and time and end either in plain data or in one :class:`SafeLoadError`,
never in an exception of another type:

- a size limit, checked before parsing;
- YAML anchors and aliases are refused (a 400-byte file of 8 levels of 9 aliases names 43 million strings;
  whoever walks it, e.g. to print it in an error message, takes minutes and hundreds of MiB);
- a nesting depth limit, checked while the YAML is composed (20,000 nested lists stop at the limit instead
  of recursing until Python's stack runs out) and after a JSON document is decoded;
- only plain data: the safe YAML tags, text that is UTF-8, integers of a sane length.

``SafeLoadError.reason`` is a short machine label (``too_large``, ``alias``, ``too_deep``, ``syntax``,
``encoding``) for a metric; ``str()`` is one line for a log.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

MAX_DOCUMENT_BYTES = 1 << 20
MAX_DEPTH = 64

class SafeLoadError(ValueError):
    """A document that cannot be used; ``reason`` labels why (for a metric)."""

    def __init__(self, what: str, reason: str, detail: str) -> None:
        super().__init__(f"{what}: {detail}")
        self.what = what
        self.reason = reason


def _one_line(text: str, limit: int = 160) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader without aliases and with a depth limit while composing."""

    max_depth = MAX_DEPTH

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise _Refused("alias", f"YAML aliases are not accepted (alias *{event.anchor} at line "
                                    f"{event.start_mark.line + 1})")
        event = self.peek_event()
        if getattr(event, "anchor", None) is not None:
            raise _Refused("alias", f"YAML anchors are not accepted (anchor &{event.anchor} at line "
                                    f"{event.start_mark.line + 1})")
        self._depth += 1
        try:
            if self._depth > self.max_depth:
                raise _Refused("too_deep", f"nested deeper than {self.max_depth} levels "
                                           f"(line {event.start_mark.line + 1})")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


class _Refused(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def _text(data: bytes | str, what: str, max_bytes: int) -> str:
    size = len(data.encode("utf-8", "surrogatepass")) if isinstance(data, str) else len(data)
    if size > max_bytes:
        raise SafeLoadError(what, "too_large", f"{size} bytes, larger than the limit of {max_bytes}")
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SafeLoadError(what, "encoding", f"not UTF-8 text: {_one_line(str(exc))}") from None


def load_yaml(data: bytes | str, what: str, *, max_bytes: int = MAX_DOCUMENT_BYTES,
              max_depth: int = MAX_DEPTH) -> Any:
    """The one YAML document in ``data`` as plain data; raises :class:`SafeLoadError` (``what`` names it)."""
    text = _text(data, what, max_bytes)
    loader: _BoundedLoader | None = None
    try:
        loader = _BoundedLoader(text)  # reads the text already: a NUL or control character fails here
        loader.max_depth = max_depth
        return loader.get_single_data()
    except _Refused as exc:
        raise SafeLoadError(what, exc.reason, str(exc)) from None
    except yaml.YAMLError as exc:
        raise SafeLoadError(what, "syntax", f"not YAML: {_one_line(str(exc))}") from None
    except RecursionError:
        raise SafeLoadError(what, "too_deep", "nested too deep to parse") from None
    except (ValueError, TypeError, OverflowError) as exc:  # e.g. an integer of 5000 digits
        raise SafeLoadError(what, "syntax", f"unusable value: {_one_line(str(exc))}") from None
    finally:
        if loader is not None:
            loader.dispose()


def depth_of(value: Any, limit: int) -> int:
    """Nesting depth of lists and dicts in ``value``, walked without recursion; stops counting past ``limit``."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if not isinstance(item, dict | list):
            continue
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return deepest


def load_json(data: bytes | str, what: str, *, max_bytes: int = MAX_DOCUMENT_BYTES,
              max_depth: int = MAX_DEPTH) -> Any:
    """The JSON document in ``data`` as plain data; raises :class:`SafeLoadError` (``what`` names it)."""
    text = _text(data, what, max_bytes)
    try:
        value = json.loads(text)
    except RecursionError:
        raise SafeLoadError(what, "too_deep", "nested too deep to parse") from None
    except ValueError as exc:  # JSONDecodeError, and integers too long to convert
        raise SafeLoadError(what, "syntax", f"not JSON: {_one_line(str(exc))}") from None
    if depth_of(value, max_depth) > max_depth:
        raise SafeLoadError(what, "too_deep", f"nested deeper than {max_depth} levels")
    return value
