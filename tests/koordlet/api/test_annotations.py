"""The JSON annotation parsers: valid values, clear errors, and no other exception for any input."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from koordlet.api import keys
from koordlet.api.annotations import (
    AnnotationError,
    parse_blkio_qos,
    parse_cpu_burst,
    parse_cpu_normalization_ratio,
    parse_cpu_qos,
    parse_device_allocated,
    parse_extended_resource_spec,
    parse_memory_qos,
    parse_network_qos,
    parse_node_reservation,
    parse_resctrl,
    parse_resource_status,
    parse_system_qos_resource,
)
from koordlet.api.keys import (
    ANNOTATION_CPU_QOS,
    ANNOTATION_EXTENDED_RESOURCE_SPEC,
    ANNOTATION_RESCTRL,
    ANNOTATION_RESOURCE_STATUS,
    RESOURCE_BATCH_CPU,
    RESOURCE_BATCH_MEMORY,
)
from koordlet.api.nodeslo import CPUBurstStrategy, MemoryQOS, recommended_memory_qos
from koordlet.api.qos import QoSClass

PARSERS = (
    parse_extended_resource_spec,
    parse_resource_status,
    parse_device_allocated,
    parse_cpu_qos,
    parse_memory_qos,
    parse_cpu_burst,
    parse_resctrl,
    parse_network_qos,
    parse_node_reservation,
    parse_system_qos_resource,
    parse_blkio_qos,
)


def test_extended_resource_spec_gives_integer_batch_amounts() -> None:
    spec = parse_extended_resource_spec(
        json.dumps(
            {
                "containers": {
                    "main": {
                        "requests": {RESOURCE_BATCH_CPU: "1000", RESOURCE_BATCH_MEMORY: "2Gi"},
                        "limits": {"koordinator.sh/batch-cpu": "2000"},
                    }
                }
            }
        )
    )
    main = spec.containers["main"]
    assert main.requests == {RESOURCE_BATCH_CPU: 1000, RESOURCE_BATCH_MEMORY: 2 * 1024**3}
    assert main.limits == {RESOURCE_BATCH_CPU: 2000}  # deprecated alias read as the current name


def test_extended_resource_spec_bad_quantity_names_annotation_and_field() -> None:
    with pytest.raises(AnnotationError) as info:
        parse_extended_resource_spec('{"containers":{"main":{"limits":{"kubernetes.io/batch-cpu":"lots"}}}}')
    message = str(info.value)
    assert message.startswith(ANNOTATION_EXTENDED_RESOURCE_SPEC)
    assert "containers.main.limits.kubernetes.io/batch-cpu" in message


def test_resource_status_parses_cpuset_and_numa() -> None:
    status = parse_resource_status(
        '{"cpuset":"0-3","numaNodeResources":[{"node":1,"resources":{"cpu":"4","memory":"8Gi"}}]}'
    )
    assert status.cpuset == (0, 1, 2, 3)
    assert status.numa_node_resources[0].node == 1
    assert status.numa_node_resources[0].resources == {"cpu": 4000, "memory": 8 * 1024**3}


def test_resource_status_rejects_a_cpuset_that_is_not_a_cpu_list() -> None:
    with pytest.raises(AnnotationError) as info:
        parse_resource_status('{"cpuset":"0-3,../../etc"}')
    assert info.value.annotation == ANNOTATION_RESOURCE_STATUS
    assert "cpuset" in info.value.reason


def test_device_allocated_gpu_minors() -> None:
    allocated = parse_device_allocated(
        '{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"100"}},{"minor":3}],"rdma":[{"minor":0}]}'
    )
    assert [gpu.minor for gpu in allocated.gpus] == [0, 3]


def test_device_allocated_errors_are_annotation_errors() -> None:
    with pytest.raises(AnnotationError, match="minor"):
        parse_device_allocated('{"gpu":[{"minor":true}]}')


def test_cpu_qos_missing_enable_is_disabled_and_identity_validated() -> None:
    assert parse_cpu_qos('{"groupIdentity":2}').enable is False
    assert parse_cpu_qos('{"enable":true,"groupIdentity":-1}').group_identity == -1
    with pytest.raises(AnnotationError) as info:
        parse_cpu_qos('{"enable":true,"groupIdentity":3}')
    assert str(info.value).startswith(ANNOTATION_CPU_QOS)
    assert "groupIdentity" in str(info.value)


def test_memory_qos_policies_resolve_over_class_config() -> None:
    class_config = MemoryQOS(enable=True, min_limit_percent=10, wmark_ratio=90)
    recommended = recommended_memory_qos(QoSClass.LS)
    assert parse_memory_qos('{"policy":"none","minLimitPercent":80}').resolve(class_config, recommended) == MemoryQOS()
    auto = parse_memory_qos('{"policy":"auto","lowLimitPercent":40}').resolve(class_config, recommended)
    assert auto.enable and auto.wmark_ratio == 95 and auto.low_limit_percent == 40
    default = parse_memory_qos('{"minLimitPercent":50}').resolve(class_config, recommended)
    assert default.min_limit_percent == 50 and default.wmark_ratio == 90


def test_memory_qos_rejects_unknown_policy_and_bad_field() -> None:
    with pytest.raises(AnnotationError, match="policy"):
        parse_memory_qos('{"policy":"max"}')
    with pytest.raises(AnnotationError, match="wmarkMinAdj"):
        parse_memory_qos('{"wmarkMinAdj":-26}')


def test_cpu_burst_overrides_node_strategy_but_not_share_pool_threshold() -> None:
    pod = parse_cpu_burst('{"policy":"auto","cpuBurstPercent":200,"sharePoolThresholdPercent":90}')
    resolved = pod.resolve(CPUBurstStrategy())
    assert resolved.policy == "auto" and resolved.cpu_burst_percent == 200
    assert resolved.share_pool_threshold_percent == 50


def test_resctrl_ranges_and_per_cache_values() -> None:
    resctrl = parse_resctrl(
        '{"llc":{"schemata":{"range":[0,30]},"schemataPerCache":[{"cacheID":1,"range":[20,50]}]},'
        '"mb":{"schemata":{"percent":50},"schemataPerCache":[{"cacheID":1,"percent":80}]}}'
    )
    assert resctrl.llc is not None and (resctrl.llc.start_percent, resctrl.llc.end_percent) == (0, 30)
    assert resctrl.llc_per_cache[0].cache_id == 1
    assert resctrl.mb is not None and resctrl.mb.percent == 50
    assert resctrl.mb_per_cache[0].percent == 80


def test_resctrl_rejects_empty_range() -> None:
    with pytest.raises(AnnotationError) as info:
        parse_resctrl('{"llc":{"schemata":{"range":[50,50]}}}')
    assert info.value.annotation == ANNOTATION_RESCTRL


def test_network_qos_limits_in_bits_per_second() -> None:
    qos = parse_network_qos('{"ingressLimit":"10M","egressLimit":"20M"}')
    assert (qos.ingress_limit_bps, qos.egress_limit_bps) == (10_000_000, 20_000_000)
    assert parse_network_qos("{}").ingress_limit_bps is None


def test_node_annotations() -> None:
    reservation = parse_node_reservation(
        '{"resources":{"cpu":"1"},"reservedCPUs":"0-1","applyPolicy":"ReservedCPUsOnly"}'
    )
    assert reservation.resources == {"cpu": 1000}
    assert reservation.reserved_cpus == (0, 1)
    system = parse_system_qos_resource('{"cpuset":"2-3","cpusetExclusive":true}')
    assert system.cpuset == (2, 3) and system.cpuset_exclusive
    # Koordinator: exclusive unless cpusetExclusive is false (absent and null mean exclusive)
    assert parse_system_qos_resource('{"cpuset":"2-3"}').cpuset_exclusive
    assert parse_system_qos_resource('{"cpuset":"2-3","cpusetExclusive":null}').cpuset_exclusive
    assert not parse_system_qos_resource('{"cpuset":"2-3","cpusetExclusive":false}').cpuset_exclusive
    assert parse_cpu_normalization_ratio("1.234") == 1.23
    assert parse_cpu_normalization_ratio("-1") is None
    with pytest.raises(AnnotationError):
        parse_cpu_normalization_ratio("0.5")


@pytest.mark.parametrize("parser", PARSERS)
@pytest.mark.parametrize("value", ["", "not json", "[]", "null", "1", '"x"', "[" * 5000 + "]" * 5000])
def test_every_parser_rejects_non_objects_with_annotation_error(parser: Callable[[str], object], value: str) -> None:
    with pytest.raises(AnnotationError):
        parser(value)


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=12,
)
_keys = st.sampled_from(
    [
        "containers",
        "requests",
        "limits",
        "cpuset",
        "numaNodeResources",
        "node",
        "resources",
        "gpu",
        "minor",
        "enable",
        "groupIdentity",
        "policy",
        "minLimitPercent",
        "wmarkRatio",
        "cpuBurstPercent",
        "llc",
        "mb",
        "schemata",
        "schemataPerCache",
        "range",
        "percent",
        "cacheID",
        "ingressLimit",
        "reservedCPUs",
        "applyPolicy",
        "cpusetExclusive",
        "main",
        RESOURCE_BATCH_CPU,
    ]
)
# Objects shaped like the real annotations (known keys at every level) reach the deep validation paths.
_shaped = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 200) | st.sampled_from(["0-3", "1Gi", "auto", "", "x"]),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(_keys, children, max_size=4),
    max_leaves=16,
)


_ANNOTATION_KEYS = {value for name, value in vars(keys).items() if name.startswith("ANNOTATION_")}


@settings(max_examples=150, deadline=None)
@given(value=st.one_of(st.text(max_size=40), _json_values.map(json.dumps), _shaped.map(json.dumps)))
def test_annotation_parsers_return_a_value_or_annotation_error(value: str) -> None:
    for parser in (*PARSERS, parse_cpu_normalization_ratio):
        try:
            parser(value)
        except AnnotationError as exc:
            assert exc.annotation in _ANNOTATION_KEYS
            assert str(exc).startswith(f"{exc.annotation}: ") and exc.reason
