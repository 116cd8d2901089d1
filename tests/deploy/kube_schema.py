"""Strict validation of manifests against the ``kubernetes`` Python client's models.

The client's own deserializer drops unknown fields silently, so a misspelt key (``hostPid``) would pass.
This walks the document alongside the model's ``openapi_types``/``attribute_map``: every key must be a
field of the model, every value of the declared type; then the real deserializer builds the object so
the models' own required-field checks run too.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import kubernetes.client
from kubernetes.client import ApiClient

_LIST = re.compile(r"^List\[(.+)\]$")
_DICT = re.compile(r"^Dict\[str, (.+)\]$")
_PRIMITIVES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "object": (object,),
    "datetime": (str,),
    "date": (str,),
}


class SchemaError(ValueError):
    pass


def model_name(doc: Mapping[str, Any]) -> str:
    """``apps/v1`` DaemonSet -> ``V1DaemonSet``; ``rbac.authorization.k8s.io/v1`` ClusterRole -> ``V1ClusterRole``."""
    version = str(doc["apiVersion"]).rsplit("/", 1)[-1]
    name = version[0].upper() + version[1:] + doc["kind"]
    if not hasattr(kubernetes.client, name):
        raise SchemaError(f"no model {name} for {doc['apiVersion']} {doc['kind']}")
    return name


def _check(value: Any, type_name: str, path: str) -> None:
    if value is None:
        return
    if match := _LIST.match(type_name):
        if not isinstance(value, list):
            raise SchemaError(f"{path}: expected a list, got {type(value).__name__}")
        for i, item in enumerate(value):
            _check(item, match.group(1), f"{path}[{i}]")
    elif match := _DICT.match(type_name):
        if not isinstance(value, Mapping):
            raise SchemaError(f"{path}: expected a mapping, got {type(value).__name__}")
        for key, item in value.items():
            _check(item, match.group(1), f"{path}.{key}")
    elif type_name in _PRIMITIVES:
        _check_primitive(value, type_name, path)
    else:
        _check_model(value, type_name, path)


def _check_primitive(value: Any, type_name: str, path: str) -> None:
    if type_name in ("int", "float") and isinstance(value, bool):
        raise SchemaError(f"{path}: expected {type_name}, got a bool")
    if not isinstance(value, _PRIMITIVES[type_name]):
        raise SchemaError(f"{path}: expected {type_name}, got {type(value).__name__} {value!r}")


def _check_model(value: Any, type_name: str, path: str) -> None:
    model = getattr(kubernetes.client, type_name)
    if not isinstance(value, Mapping):
        raise SchemaError(f"{path}: expected an object ({type_name}), got {type(value).__name__}")
    by_json = {json_key: attr for attr, json_key in model.attribute_map.items()}
    for key, item in value.items():
        if key not in by_json:
            raise SchemaError(f"{path}.{key}: unknown field of {type_name}")
        _check(item, model.openapi_types[by_json[key]], f"{path}.{key}")


def validate(doc: Mapping[str, Any]) -> Any:
    """Raise :class:`SchemaError` on any unknown field or wrong type; returns the deserialized model."""
    name = model_name(doc)
    _check(doc, name, doc["kind"])
    try:
        return ApiClient()._ApiClient__deserialize(dict(doc), name)  # the client's own deserializer
    except ValueError as exc:  # the models raise ValueError for a missing required field
        raise SchemaError(f"{doc['kind']}: {exc}") from exc
