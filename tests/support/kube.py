"""Kubernetes API semantics the in-repo test API server needs, as pure functions.

Structural-schema pruning, defaulting and validation of custom objects (the subset of OpenAPI v3
that apiextensions.k8s.io/v1 structural schemas allow), JSON patch (RFC 6902), JSON merge patch
(RFC 7386), strategic merge patch for the list fields the node side touches, label and field
selectors, and a structural check of CRD documents. Error texts follow the real API server's
`field.Error` wording so tests can assert on field paths and reasons.
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

JSON = Any
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

_DATE_TIME_RE = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")


class PatchError(ValueError):
    """A patch document that cannot be applied (bad operation, missing path, failed test)."""


class SelectorError(ValueError):
    """A label or field selector that cannot be parsed."""


@dataclass(frozen=True, slots=True)
class FieldError:
    """One invalid field, shaped like k8s.io/apimachinery field.Error."""

    field: str
    reason: str  # FieldValueInvalid, FieldValueRequired, FieldValueNotSupported, FieldValueTypeInvalid
    detail: str

    def __str__(self) -> str:
        return f"{self.field}: {self.detail}"


# ---------------------------------------------------------------- structural schemas

def _json_type_name(value: JSON) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _has_type(value: JSON, type_name: str) -> bool:
    actual = _json_type_name(value)
    if type_name == "number":
        return actual in ("integer", "number")
    return actual == type_name


def _render(value: JSON) -> str:
    return f'"{value}"' if isinstance(value, str) else str(value).lower() if isinstance(value, bool) else str(value)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def prune_unknown_fields(value: JSON, schema: dict, path: str = "") -> list[str]:
    """Drop fields the schema does not know (and nulls of non-nullable fields), in place.

    Like the real server, `x-kubernetes-preserve-unknown-fields` keeps unknown keys and the root
    `metadata` is left alone. Returns the dotted paths that were removed.
    """
    pruned: list[str] = []
    if isinstance(value, dict):
        props: dict = schema.get("properties") or {}
        additional = schema.get("additionalProperties")
        keep_unknown = schema.get("x-kubernetes-preserve-unknown-fields") or additional is True
        for key in list(value):
            child_path = _join(path, key)
            if path == "" and key in ("metadata", "apiVersion", "kind"):
                continue
            child_schema = props.get(key) if key in props else (
                additional if isinstance(additional, dict) else None)
            if child_schema is None:
                if not keep_unknown:
                    del value[key]
                    pruned.append(child_path)
                continue
            if value[key] is None and not child_schema.get("nullable"):
                del value[key]
                continue
            pruned.extend(prune_unknown_fields(value[key], child_schema, child_path))
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            pruned.extend(prune_unknown_fields(item, schema["items"], f"{path}[{index}]"))
    return pruned


def apply_defaults(value: JSON, schema: dict) -> None:
    """Fill absent properties that carry a `default`, in place (recursively)."""
    if isinstance(value, dict):
        props: dict = schema.get("properties") or {}
        for key, child_schema in props.items():
            if key not in value and "default" in child_schema:
                value[key] = copy.deepcopy(child_schema["default"])
            if key in value:
                apply_defaults(value[key], child_schema)
        additional = schema.get("additionalProperties")
        if isinstance(additional, dict):
            for key in value:
                if key not in props:
                    apply_defaults(value[key], additional)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            apply_defaults(item, schema["items"])


def validate_schema(value: JSON, schema: dict, path: str = "") -> list[FieldError]:
    """Validate `value` against a structural OpenAPI v3 schema; [] when valid."""
    if value is None:
        if schema.get("nullable"):
            return []
        return [FieldError(path, "FieldValueRequired", "Required value")]
    if schema.get("x-kubernetes-int-or-string"):
        if not (_has_type(value, "integer") or _has_type(value, "string")):
            return [FieldError(path, "FieldValueTypeInvalid", f'Invalid value: "{_json_type_name(value)}": '
                               f"{path} in body must be of type integer,string: "
                               f'"{_json_type_name(value)}"')]
    elif "type" in schema and not _has_type(value, schema["type"]):
        return [FieldError(path, "FieldValueTypeInvalid",
                           f'Invalid value: "{_json_type_name(value)}": {path} in body must be of type '
                           f'{schema["type"]}: "{_json_type_name(value)}"')]
    elif "anyOf" in schema and not any(not validate_schema(value, branch, path) for branch in schema["anyOf"]):
        return [FieldError(path, "FieldValueInvalid",
                           f"Invalid value: {_render(value)}: {path} in body must match a schema in anyOf")]
    errors = _validate_value_constraints(value, schema, path)
    if isinstance(value, dict):
        errors.extend(_validate_object(value, schema, path))
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            errors.extend(validate_schema(item, schema["items"], f"{path}[{index}]"))
    return errors


def _validate_value_constraints(value: JSON, schema: dict, path: str) -> list[FieldError]:
    errors: list[FieldError] = []
    shown = _render(value)
    if "enum" in schema and value not in schema["enum"]:
        supported = ", ".join(_render(item) for item in schema["enum"])
        errors.append(FieldError(path, "FieldValueNotSupported",
                                 f"Unsupported value: {shown}: supported values: {supported}"))
    checks: list[tuple[bool, str]] = []  # (violated, what the value should be)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        low, high = schema.get("minimum"), schema.get("maximum")
        checks += [(low is not None and (value < low or (bool(schema.get("exclusiveMinimum")) and value == low)),
                    f"should be greater than or equal to {low}"),
                   (high is not None and (value > high or (bool(schema.get("exclusiveMaximum")) and value == high)),
                    f"should be less than or equal to {high}")]
    if isinstance(value, str):
        checks += [("pattern" in schema and not re.search(schema["pattern"], value),
                    f"should match '{schema.get('pattern')}'"),
                   (len(value) > schema.get("maxLength", math.inf),
                    f"should be at most {schema.get('maxLength')} chars long"),
                   (len(value) < schema.get("minLength", 0),
                    f"should be at least {schema.get('minLength')} chars long"),
                   (schema.get("format") == "date-time" and not _DATE_TIME_RE.match(value),
                    "must be of type date-time")]
    if isinstance(value, list):
        checks += [(len(value) > schema.get("maxItems", math.inf),
                    f"should have at most {schema.get('maxItems')} items"),
                   (len(value) < schema.get("minItems", 0),
                    f"should have at least {schema.get('minItems')} items")]
    errors.extend(FieldError(path, "FieldValueInvalid", f"Invalid value: {shown}: {path} in body {expectation}")
                  for violated, expectation in checks if violated)
    return errors


def _validate_object(value: dict, schema: dict, path: str) -> list[FieldError]:
    errors = [FieldError(_join(path, key), "FieldValueRequired", "Required value")
              for key in schema.get("required", ()) if key not in value]
    props: dict = schema.get("properties") or {}
    additional = schema.get("additionalProperties")
    for key, child in value.items():
        if path == "" and key == "metadata":
            continue
        if key in props:
            errors.extend(validate_schema(child, props[key], _join(path, key)))
        elif isinstance(additional, dict):
            errors.extend(validate_schema(child, additional, _join(path, key)))
    return errors


# ---------------------------------------------------------------- CRD documents

def load_crds(directory: Path) -> list[dict]:
    """Every CustomResourceDefinition document in the *.yaml files of `directory`, sorted by file."""
    documents: list[dict] = []
    for path in sorted(directory.glob("*.yaml")):
        with path.open(encoding="utf-8") as stream:
            documents.extend(doc for doc in yaml.load_all(stream, Loader=_YAML_LOADER) if doc)
    return [doc for doc in documents if doc.get("kind") == "CustomResourceDefinition"]


def crd_problems(crd: dict) -> list[str]:
    """What makes `crd` not a valid, structural apiextensions.k8s.io/v1 CRD; [] when it is fine."""
    problems: list[str] = []
    if crd.get("apiVersion") != "apiextensions.k8s.io/v1":
        problems.append("apiVersion must be apiextensions.k8s.io/v1")
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    for key in ("plural", "singular", "kind", "listKind"):
        if not names.get(key):
            problems.append(f"spec.names.{key} is missing")
    if not spec.get("group"):
        problems.append("spec.group is missing")
    expected_name = f"{names.get('plural')}.{spec.get('group')}"
    if (crd.get("metadata") or {}).get("name") != expected_name:
        problems.append(f"metadata.name must be {expected_name}")
    if spec.get("scope") not in ("Cluster", "Namespaced"):
        problems.append("spec.scope must be Cluster or Namespaced")
    versions = spec.get("versions") or []
    if not versions:
        problems.append("spec.versions is empty")
    if sum(1 for version in versions if version.get("storage")) != 1:
        problems.append("exactly one version must have storage: true")
    for index, version in enumerate(versions):
        schema = ((version.get("schema") or {}).get("openAPIV3Schema"))
        if not version.get("name") or not isinstance(schema, dict):
            problems.append(f"spec.versions[{index}] needs a name and schema.openAPIV3Schema")
            continue
        if schema.get("type") != "object":
            problems.append(f"spec.versions[{index}].schema.openAPIV3Schema.type must be object")
        problems.extend(_structural_problems(schema, f"versions[{index}].schema"))
    return problems


def _structural_problems(schema: dict, path: str) -> list[str]:
    problems: list[str] = []
    untyped_ok = schema.get("x-kubernetes-int-or-string") or schema.get("x-kubernetes-preserve-unknown-fields")
    if "type" not in schema and not untyped_ok:
        problems.append(f"{path}: type is missing")
    if schema.get("x-kubernetes-int-or-string") and "type" in schema:
        problems.append(f"{path}: x-kubernetes-int-or-string must not set type")
    if schema.get("type") == "array" and not isinstance(schema.get("items"), dict):
        problems.append(f"{path}: array without items")
    if "properties" in schema and isinstance(schema.get("additionalProperties"), dict):
        problems.append(f"{path}: properties and additionalProperties are mutually exclusive")
    for branch in schema.get("anyOf", ()):
        if set(branch) - {"type"}:
            problems.append(f"{path}: anyOf branches may only restrict the type here")
    if "default" in schema:
        problems.extend(f"{path}: default is invalid: {error}"
                        for error in validate_schema(schema["default"], schema, "default"))
    for key, child in (schema.get("properties") or {}).items():
        problems.extend(_structural_problems(child, f"{path}.{key}"))
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            problems.extend(_structural_problems(schema[key], f"{path}.{key}"))
    return problems


# ---------------------------------------------------------------- patches

def json_merge_patch(target: JSON, patch: JSON) -> JSON:
    """RFC 7386: objects merge recursively, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = json_merge_patch(result.get(key), value)
    return result


# patchMergeKey of the list fields of core/v1 objects the node side patches (name -> merge key);
# lists not named here are replaced, as for atomic lists.
STRATEGIC_MERGE_KEYS: dict[str, str] = {
    "containers": "name", "initContainers": "name", "ephemeralContainers": "name", "env": "name",
    "volumes": "name", "volumeMounts": "mountPath", "ports": "containerPort", "imagePullSecrets": "name",
    "conditions": "type", "addresses": "type", "taints": "key", "ownerReferences": "uid",
    "containerStatuses": "name", "initContainerStatuses": "name",
}
# Primitive lists with patchStrategy=merge (union on patch).
STRATEGIC_MERGE_SETS = frozenset({"finalizers"})


def strategic_merge_patch(target: JSON, patch: JSON) -> JSON:
    """Strategic merge patch for built-in objects: merge patch plus keyed list merges and `$patch`."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    directive = patch.get("$patch")
    body = {key: value for key, value in patch.items() if not key.startswith("$")}
    if directive == "replace":
        return copy.deepcopy(body)
    if directive == "delete":
        return None
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in body.items():
        current = result.get(key)
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and isinstance(current, list) and key in STRATEGIC_MERGE_KEYS:
            result[key] = _merge_keyed_list(current, value, STRATEGIC_MERGE_KEYS[key])
        elif isinstance(value, list) and isinstance(current, list) and key in STRATEGIC_MERGE_SETS:
            result[key] = current + [item for item in value if item not in current]
        elif isinstance(value, dict):
            merged = strategic_merge_patch(current, value)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        else:
            result[key] = copy.deepcopy(value)
    return result


def _merge_keyed_list(current: list, patch: list, merge_key: str) -> list:
    result = [copy.deepcopy(item) for item in current]
    for item in patch:
        if not isinstance(item, dict) or merge_key not in item:
            raise PatchError(f"list item {item!r} lacks merge key {merge_key!r}")
        index = next((i for i, old in enumerate(result)
                      if isinstance(old, dict) and old.get(merge_key) == item[merge_key]), None)
        if item.get("$patch") == "delete":
            if index is not None:
                del result[index]
        elif index is None:
            result.append({key: value for key, value in item.items() if not key.startswith("$")})
        else:
            result[index] = strategic_merge_patch(result[index], item)
    return result


def _pointer_tokens(pointer: str) -> list[str]:
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise PatchError(f"invalid JSON pointer {pointer!r}")
    return [token.replace("~1", "/").replace("~0", "~") for token in pointer[1:].split("/")]


def _resolve_parent(document: JSON, tokens: list[str]) -> JSON:
    node = document
    for token in tokens[:-1]:
        try:
            node = node[int(token)] if isinstance(node, list) else node[token]
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            raise PatchError(f"path /{'/'.join(tokens)} does not exist") from exc
    return node


def _list_index(container: list, token: str, allow_end: bool) -> int:
    if token == "-" and allow_end:
        return len(container)
    if not token.isdigit() or int(token) > len(container) - (0 if allow_end else 1):
        raise PatchError(f"list index {token!r} out of range")
    return int(token)


def json_patch(document: JSON, operations: list) -> JSON:
    """RFC 6902 JSON patch (add, remove, replace, move, copy, test) on a copy of `document`."""
    if not isinstance(operations, list):
        raise PatchError("a JSON patch must be a list of operations")
    result = copy.deepcopy(document)
    for operation in operations:
        if not isinstance(operation, dict) or "op" not in operation or "path" not in operation:
            raise PatchError(f"invalid JSON patch operation {operation!r}")
        result = _apply_operation(result, operation)
    return result


def _get_pointer(document: JSON, pointer: str) -> JSON:
    tokens = _pointer_tokens(pointer)
    if not tokens:
        return document
    parent = _resolve_parent(document, tokens)
    try:
        return parent[_list_index(parent, tokens[-1], False)] if isinstance(parent, list) else parent[tokens[-1]]
    except (KeyError, TypeError) as exc:
        raise PatchError(f"path {pointer} does not exist") from exc


def _apply_operation(document: JSON, operation: dict) -> JSON:
    op, pointer = operation["op"], operation["path"]
    if op == "test":
        if _get_pointer(document, pointer) != operation.get("value"):
            raise PatchError(f"test operation failed at {pointer}")
        return document
    if op in ("move", "copy"):
        value = copy.deepcopy(_get_pointer(document, operation.get("from", "")))
        if op == "move":
            document = _apply_operation(document, {"op": "remove", "path": operation["from"]})
        return _apply_operation(document, {"op": "add", "path": pointer, "value": value})
    tokens = _pointer_tokens(pointer)
    if not tokens:
        if op == "remove":
            raise PatchError("cannot remove the whole document")
        return copy.deepcopy(operation.get("value"))
    parent = _resolve_parent(document, tokens)
    if op == "add":
        _add(parent, tokens[-1], copy.deepcopy(operation.get("value")), pointer)
    elif op in ("remove", "replace"):
        index = _existing_index(parent, tokens[-1], pointer)
        if op == "remove":
            del parent[index]
        else:
            parent[index] = copy.deepcopy(operation.get("value"))
    else:
        raise PatchError(f"unknown JSON patch operation {op!r}")
    return document


def _add(parent: JSON, last: str, value: JSON, pointer: str) -> None:
    if isinstance(parent, list):
        parent.insert(_list_index(parent, last, True), value)
    elif isinstance(parent, dict):
        parent[last] = value
    else:
        raise PatchError(f"cannot add below a scalar at {pointer}")


def _existing_index(parent: JSON, last: str, pointer: str) -> int | str:
    if isinstance(parent, list):
        return _list_index(parent, last, False)
    if isinstance(parent, dict) and last in parent:
        return last
    raise PatchError(f"path {pointer} does not exist")


# ---------------------------------------------------------------- selectors

_REQUIREMENT_RE = re.compile(
    r"^\s*(?:(?P<absent>!)\s*(?P<absent_key>[\w./-]+)"
    r"|(?P<set_key>[\w./-]+)\s+(?P<set_op>in|notin)\s*\((?P<values>[^)]*)\)"
    r"|(?P<key>[\w./-]+)\s*(?P<op>==|!=|=)\s*(?P<value>[\w./-]*)"
    r"|(?P<exists>[\w./-]+))\s*$")


def _split_top_level(text: str) -> list[str]:
    parts, depth, current = [], 0, []
    for char in text:
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return [part for part in parts if part.strip()]


def label_selector_matches(selector: str, labels: dict[str, str]) -> bool:
    """Match a label selector string (`a=b,c!=d,e in (x,y),!f,g`) against `labels`."""
    for part in _split_top_level(selector or ""):
        match = _REQUIREMENT_RE.match(part)
        if not match:
            raise SelectorError(f"unable to parse requirement {part!r}")
        if match["absent"]:
            ok = match["absent_key"] not in labels
        elif match["set_key"]:
            values = {value.strip() for value in match["values"].split(",") if value.strip()}
            present = match["set_key"] in labels and labels[match["set_key"]] in values
            ok = present if match["set_op"] == "in" else not present
        elif match["key"]:
            equal = labels.get(match["key"]) == match["value"]
            ok = (match["key"] in labels and equal) if match["op"] != "!=" else not equal
        else:
            ok = match["exists"] in labels
        if not ok:
            return False
    return True


def label_selector_object_matches(selector: dict | None, labels: dict[str, str]) -> bool:
    """Match a metav1.LabelSelector (matchLabels + matchExpressions); an empty selector matches all."""
    selector = selector or {}
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], expression.get("values") or []
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and key in labels and labels[key] in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
    return True


def field_selector_matches(selector: str, obj: dict) -> bool:
    """Match a field selector (`spec.nodeName=n,metadata.name!=x`) against an object's dotted paths."""
    for part in _split_top_level(selector or ""):
        match = re.match(r"^\s*([\w.]+)\s*(==|!=|=)\s*(.*?)\s*$", part)
        if not match:
            raise SelectorError(f"invalid field selector {part!r}")
        field_path, operator, expected = match.groups()
        node: JSON = obj
        for token in field_path.split("."):
            node = node.get(token) if isinstance(node, dict) else None
        actual = "" if node is None else str(node).lower() if isinstance(node, bool) else str(node)
        if (actual == expected) != (operator != "!="):
            return False
    return True
