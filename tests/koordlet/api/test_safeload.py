"""The bounded loader every outside document goes through: plain data or one SafeLoadError, quickly."""

from __future__ import annotations

import time

import pytest

from koordlet.api.annotations import AnnotationError, parse_resource_status
from koordlet.api.safeload import SafeLoadError, depth_of, load_json, load_yaml


def test_plain_documents_load() -> None:
    assert load_yaml("a: [1, {b: c}]\n", "t") == {"a": [1, {"b": "c"}]}
    assert load_yaml(b"", "t") is None
    assert load_json('{"a": [1, 2]}', "t") == {"a": [1, 2]}


@pytest.mark.parametrize("text,reason", [
    ("a: &x [1]\nb: *x\n", "alias"),
    ("a: &x 1\n", "alias"),
    ("[" * 20000 + "]" * 20000, "too_deep"),
    ("x: " + "9" * 5000, "syntax"),
    ("a: !!python/object/apply:os.system ['true']\n", "syntax"),
    (b"a: \xff", "encoding"),
    ("#" * (2 << 20), "too_large"),
    ("a: \x00\n", "syntax"),  # control characters fail while the loader is built, before parsing
    (b"a: b\x07\n", "syntax"),
    ("a: !!int abc\n", "syntax"),
    ("a: !!float abc\n", "syntax"),
    ("a: 2026-13-45\n", "syntax"),
    ("a: 2026-01-01 25:00:00\n", "syntax"),
])
def test_hostile_yaml_is_refused_with_a_reason(text: str | bytes, reason: str) -> None:
    started = time.perf_counter()
    with pytest.raises(SafeLoadError) as caught:
        load_yaml(text, "the-file")
    assert caught.value.reason == reason
    assert str(caught.value).startswith("the-file: ") and "\n" not in str(caught.value)
    assert time.perf_counter() - started < 2.0


@pytest.mark.parametrize("text,reason", [
    ("[" * 20000 + "]" * 20000, "too_deep"),
    ("[" * 100 + "]" * 100, "too_deep"),
    ("1" * 5000, "syntax"),
    ("{", "syntax"),
    (" " * (2 << 20), "too_large"),
])
def test_hostile_json_is_refused_with_a_reason(text: str, reason: str) -> None:
    with pytest.raises(SafeLoadError) as caught:
        load_json(text, "x")
    assert caught.value.reason == reason


def test_depth_is_counted_without_recursion() -> None:
    value: list = []
    for _ in range(5000):
        value = [value]
    assert depth_of(value, 64) == 65
    assert depth_of({"a": [{"b": 1}]}, 64) == 3


def test_annotation_json_is_bounded() -> None:
    with pytest.raises(AnnotationError):
        parse_resource_status('{"cpuset": "0", "x": ' + "[" * 50 + "]" * 50 + "}")
    with pytest.raises(AnnotationError):
        parse_resource_status('{"cpuset": "' + "0," * (200 << 10) + '0"}')
