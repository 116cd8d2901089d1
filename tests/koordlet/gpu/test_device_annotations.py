import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from koordlet.api.device import (
    DeviceAnnotationError,
    format_device_bound,
    label_value,
    node_gpu_labels,
    nvidia_visible_devices,
    parse_device_allocated,
    parse_device_bound,
)

KOORD_EXAMPLE = (
    '{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"100","koordinator.sh/gpu-memory-ratio":"100",'
    '"koordinator.sh/gpu-memory":"16Gi"}}],"rdma":[{"minor":0,"id":"0000:09:00.0","resources":'
    '{"koordinator.sh/rdma":"100"},"extension":{"vfs":[{"minor":0,"busID":"0000:09:00.2"}]}}]}'
)


def test_koordinator_annotation_parses_gpu_entries_and_ignores_rdma() -> None:
    allocated = parse_device_allocated(KOORD_EXAMPLE)
    assert [g.minor for g in allocated.gpus] == [0]
    assert allocated.gpus[0].resources["koordinator.sh/gpu-memory"] == "16Gi"


def test_visible_devices_are_minors_in_scheduler_order() -> None:
    allocated = parse_device_allocated('{"gpu":[{"minor":3},{"minor":1}]}')
    assert nvidia_visible_devices(allocated.gpus) == "3,1"


@pytest.mark.parametrize(
    "value, message",
    [
        ("not json", "not JSON"),
        ("[]", "JSON object"),
        ('{"gpu": {}}', "must be a list"),
        ('{"gpu": [{"minor": -1}]}', ">= 0"),
        ('{"gpu": [{"minor": true}]}', "integer"),
        ('{"gpu": [{"minor": "0"}]}', "integer"),
        ('{"gpu": [{"minor": 0}, {"minor": 0}]}', "twice"),
        ('{"gpu": [{"minor": 0, "resources": []}]}', "resources"),
    ],
)
def test_bad_annotation_is_rejected_with_the_annotation_named(value: str, message: str) -> None:
    with pytest.raises(DeviceAnnotationError, match=message) as info:
        parse_device_allocated(value)
    assert "scheduling.koordinator.sh/device-allocated" in str(info.value)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=10,
)


@given(st.one_of(_json, st.fixed_dictionaries({"gpu": _json})))
def test_any_json_either_parses_or_raises_the_annotation_error(data) -> None:
    try:
        allocated = parse_device_allocated(json.dumps(data))
    except DeviceAnnotationError:
        return
    assert all(isinstance(g.minor, int) and g.minor >= 0 for g in allocated.gpus)


def test_device_bound_round_trips() -> None:
    value = format_device_bound({"b": [1], "a": [0, 2]})
    assert parse_device_bound(value) == {"a": (0, 2), "b": (1,)}
    with pytest.raises(DeviceAnnotationError):
        parse_device_bound('{"a": 1}')


def test_node_labels_follow_seed_004_names_and_label_value_rules() -> None:
    assert node_gpu_labels("Tesla T4", "460.91.03") == {
        "kubernetes.io/gpu-model": "Tesla-T4",
        "kubernetes.io/gpu-driver": "460.91.03",
    }
    assert len(label_value("x" * 100)) == 63
