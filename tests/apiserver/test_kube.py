"""The pure API semantics behind the server: patches, selectors, schema pruning and validation."""

from __future__ import annotations

import pytest

from tests.support.kube import (
    PatchError,
    SelectorError,
    apply_defaults,
    field_selector_matches,
    json_merge_patch,
    json_patch,
    label_selector_matches,
    label_selector_object_matches,
    prune_unknown_fields,
    strategic_merge_patch,
    validate_schema,
)


def test_json_patch_supports_every_rfc6902_operation() -> None:
    document = {"a": {"b": 1}, "list": [1, 2]}
    patched = json_patch(document, [
        {"op": "add", "path": "/list/-", "value": 3}, {"op": "replace", "path": "/a/b", "value": 2},
        {"op": "copy", "from": "/a", "path": "/c"}, {"op": "move", "from": "/list/0", "path": "/first"},
        {"op": "test", "path": "/c/b", "value": 2}, {"op": "remove", "path": "/a"}])
    assert patched == {"list": [2, 3], "c": {"b": 2}, "first": 1}
    assert document == {"a": {"b": 1}, "list": [1, 2]}  # the input is never modified


@pytest.mark.parametrize("operations", [
    [{"op": "test", "path": "/a", "value": 2}], [{"op": "remove", "path": "/missing"}],
    [{"op": "replace", "path": "/list/5", "value": 0}], [{"op": "jump", "path": "/a"}], {"op": "add"}])
def test_json_patch_rejects_failing_or_malformed_operations(operations: object) -> None:
    with pytest.raises(PatchError):
        json_patch({"a": 1, "list": []}, operations)  # type: ignore[arg-type]


def test_merge_patch_deletes_with_null_and_replaces_lists() -> None:
    assert json_merge_patch({"a": {"x": 1, "y": 2}, "l": [1, 2]}, {"a": {"x": None, "z": 3}, "l": [9]}) == {
        "a": {"y": 2, "z": 3}, "l": [9]}


def test_strategic_merge_merges_keyed_lists_and_honours_patch_directives() -> None:
    pod = {"spec": {"containers": [{"name": "a", "image": "1"}, {"name": "b", "image": "1"}]},
           "metadata": {"finalizers": ["x"], "labels": {"k": "v"}}}
    patched = strategic_merge_patch(pod, {
        "spec": {"containers": [{"name": "b", "image": "2"}, {"name": "a", "$patch": "delete"},
                                {"name": "c", "image": "3"}]},
        "metadata": {"finalizers": ["y"], "labels": {"$patch": "replace", "new": "1"}}})
    assert patched["spec"]["containers"] == [{"name": "b", "image": "2"}, {"name": "c", "image": "3"}]
    assert patched["metadata"] == {"finalizers": ["x", "y"], "labels": {"new": "1"}}


def test_label_selectors_support_equality_set_and_existence_requirements() -> None:
    labels = {"app": "web", "tier": "be", "gpu": ""}
    assert label_selector_matches("app=web,tier in (be, ls),!missing,gpu", labels)
    assert label_selector_matches("app==web,tier notin (ls),zone!=a", labels)
    assert not label_selector_matches("app=db", labels)
    assert not label_selector_matches("tier notin (be)", labels)
    with pytest.raises(SelectorError):
        label_selector_matches("app=(web", labels)


def test_label_selector_objects_and_field_selectors() -> None:
    assert label_selector_object_matches({"matchLabels": {"app": "web"}, "matchExpressions": [
        {"key": "tier", "operator": "In", "values": ["be"]}, {"key": "x", "operator": "DoesNotExist"}]},
        {"app": "web", "tier": "be"})
    assert label_selector_object_matches({}, {"anything": "1"})
    pod = {"metadata": {"name": "p"}, "spec": {"nodeName": "n1", "hostNetwork": True}}
    assert field_selector_matches("spec.nodeName=n1,metadata.name!=q,spec.hostNetwork=true", pod)
    assert not field_selector_matches("spec.nodeName==n2", pod)


def test_prune_defaults_and_validate_follow_the_schema() -> None:
    schema = {"type": "object", "properties": {
        "spec": {"type": "object", "required": ["size"], "properties": {
            "size": {"type": "integer", "minimum": 1}, "mode": {"type": "string", "default": "auto"},
            "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}}}
    obj = {"metadata": {"name": "x", "odd": 1}, "spec": {"size": 0, "unknown": 1, "free": {"k": 1}}, "top": 1}
    assert sorted(prune_unknown_fields(obj, schema)) == ["spec.unknown", "top"]
    apply_defaults(obj, schema)
    assert obj == {"metadata": {"name": "x", "odd": 1}, "spec": {"size": 0, "mode": "auto", "free": {"k": 1}}}
    errors = validate_schema(obj, schema)
    assert [(e.field, e.reason) for e in errors] == [("spec.size", "FieldValueInvalid")]
    assert str(errors[0]) == "spec.size: Invalid value: 0: spec.size in body should be greater than or equal to 1"
    missing = validate_schema({"spec": {}}, schema)
    assert [(e.field, e.reason, e.detail) for e in missing] == [("spec.size", "FieldValueRequired",
                                                                "Required value")]
