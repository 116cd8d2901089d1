"""NodeSLO spec: defaults, field-by-field merge, disabled classes, whole-spec rejection, fuzzing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from koordlet.api._fields import dump
from koordlet.api.nodeslo import (
    NONE_MEMORY_QOS,
    NONE_RESOURCE_QOS,
    HostApplication,
    NodeSLOError,
    NodeSLOSpec,
    default_node_slo_spec,
    parse_node_slo_spec,
    recommended_memory_qos,
)
from koordlet.api.qos import QoSClass


def test_defaults_match_koordinator() -> None:
    spec = default_node_slo_spec()
    threshold = spec.resource_used_threshold_with_be
    assert threshold.enable is False
    assert threshold.cpu_suppress_threshold_percent == 65
    assert threshold.cpu_suppress_policy == "cpuset"
    assert threshold.memory_evict_threshold_percent == 70
    assert threshold.effective_memory_evict_lower_percent == 68
    assert threshold.cpu_evict_be_usage_threshold_percent == 90
    assert threshold.cpu_evict_policy == "evictByRealLimit"
    burst = spec.cpu_burst_strategy
    assert (burst.policy, burst.cpu_burst_percent, burst.cfs_quota_burst_percent) == ("none", 1000, 300)
    assert (burst.cfs_quota_burst_period_seconds, burst.share_pool_threshold_percent) == (-1, 50)
    assert spec.system_strategy.min_free_kbytes_factor is None
    assert spec.system_strategy.total_network_bandwidth_bps == 0
    assert spec.host_applications == ()
    # Every class QoS defaults to disabled, hence to the none values.
    strategy = spec.resource_qos_strategy
    for resource_qos in (strategy.lsr_class, strategy.ls_class, strategy.be_class, strategy.system_class):
        assert resource_qos == NONE_RESOURCE_QOS
    assert NONE_MEMORY_QOS.wmark_scale_permill == 50


def test_enabling_a_class_qos_gives_the_recommended_values() -> None:
    spec = parse_node_slo_spec(
        {
            "resourceQOSStrategy": {
                "lsClass": {"cpuQOS": {"enable": True}},
                "beClass": {"cpuQOS": {"enable": True}, "memoryQOS": {"enable": True}, "resctrlQOS": {"enable": True}},
            }
        }
    )
    strategy = spec.resource_qos_strategy
    assert strategy.ls_class.cpu_qos.group_identity == 2
    assert strategy.be_class.cpu_qos.group_identity == -1
    assert strategy.be_class.memory_qos == recommended_memory_qos(QoSClass.BE)
    assert strategy.be_class.memory_qos.wmark_min_adj == 50
    assert strategy.be_class.resctrl_qos.cat_range_end_percent == 30
    # LSR untouched → disabled → none; LSE shares LSR.
    assert strategy.for_class(QoSClass.LSE) == strategy.lsr_class == NONE_RESOURCE_QOS


def test_fields_merge_one_by_one_over_defaults() -> None:
    spec = parse_node_slo_spec(
        {
            "resourceUsedThresholdWithBE": {"enable": True, "cpuSuppressThresholdPercent": 50},
            "resourceQOSStrategy": {"lsClass": {"memoryQOS": {"enable": True, "wmarkRatio": 80}}},
            "cpuBurstStrategy": {"policy": "auto"},
        }
    )
    threshold = spec.resource_used_threshold_with_be
    assert (threshold.enable, threshold.cpu_suppress_threshold_percent) == (True, 50)
    assert threshold.memory_evict_threshold_percent == 70
    memory = spec.resource_qos_strategy.ls_class.memory_qos
    assert (memory.wmark_ratio, memory.wmark_scale_permill, memory.wmark_min_adj) == (80, 20, -25)
    assert spec.cpu_burst_strategy.policy == "auto" and spec.cpu_burst_strategy.cpu_burst_percent == 1000


def test_disabled_class_gets_none_values_even_with_explicit_fields() -> None:
    spec = parse_node_slo_spec({"resourceQOSStrategy": {"lsClass": {"cpuQOS": {"enable": False, "groupIdentity": 2}}}})
    assert spec.resource_qos_strategy.ls_class.cpu_qos.group_identity == 0


def test_null_and_unknown_keys_are_ignored() -> None:
    spec = parse_node_slo_spec(
        {"resourceUsedThresholdWithBE": None, "blkioQOS": {"x": 1}, "cpuBurstStrategy": {"policy": None, "new": 1}}
    )
    assert spec == default_node_slo_spec()


def test_invalid_fields_reject_the_whole_spec_and_are_all_named() -> None:
    with pytest.raises(NodeSLOError) as info:
        parse_node_slo_spec(
            {
                "resourceUsedThresholdWithBE": {"enable": True, "cpuSuppressThresholdPercent": 150},
                "resourceQOSStrategy": {"beClass": {"memoryQOS": {"wmarkMinAdj": 80}}},
                "cpuBurstStrategy": {"policy": "always"},
            }
        )
    errors = info.value.errors
    assert any(e.startswith("resourceUsedThresholdWithBE.cpuSuppressThresholdPercent:") for e in errors)
    assert any(e.startswith("resourceQOSStrategy.beClass.memoryQOS.wmarkMinAdj:") for e in errors)
    assert any(e.startswith("cpuBurstStrategy.policy:") for e in errors)
    assert len(errors) == 3


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"resourceUsedThresholdWithBE": {"enable": "yes"}}, "resourceUsedThresholdWithBE.enable"),
        ({"resourceUsedThresholdWithBE": {"cpuSuppressThresholdPercent": 65.5}}, "cpuSuppressThresholdPercent"),
        ({"resourceUsedThresholdWithBE": {"cpuSuppressThresholdPercent": True}}, "cpuSuppressThresholdPercent"),
        ({"resourceUsedThresholdWithBE": {"allocatableEvictPriorityThreshold": 8000}}, "allocatableEvict"),
        ({"resourceQOSStrategy": {"policies": {"cpuPolicy": "bvt"}}}, "policies.cpuPolicy"),
        (
            {
                "resourceQOSStrategy": {
                    "beClass": {"resctrlQOS": {"catRangeStartPercent": 60, "catRangeEndPercent": 30}}
                }
            },
            "beClass.resctrlQOS",
        ),
        ({"resourceQOSStrategy": {"lsClass": {"networkQOS": {"ingressLimit": "fast"}}}}, "ingressLimit"),
        ({"systemStrategy": {"schedFeatures": {"X": 1}}}, "systemStrategy.schedFeatures"),
        ({"systemStrategy": {"totalNetworkBandwidth": "-1G"}}, "totalNetworkBandwidth"),
        ({"hostApplications": [{"name": "x", "cgroupPath": {"relativePath": "../../etc"}}]}, "relativePath"),
        ({"hostApplications": [{"qos": "LS"}]}, "name: required"),
        ({"resourceQOSStrategy": []}, "resourceQOSStrategy"),
        ([], "<root>"),
    ],
)
def test_invalid_field_error_names_the_field(spec: object, field: str) -> None:
    with pytest.raises(NodeSLOError) as info:
        parse_node_slo_spec(spec)
    assert field in str(info.value)


def test_host_applications_and_system_strategy_parse() -> None:
    spec = parse_node_slo_spec(
        {
            "hostApplications": [
                {
                    "name": "nginx",
                    "qos": "LS",
                    "priority": "koord-prod",
                    "cgroupPath": {"base": "CgroupRoot", "relativePath": "host-latency-sensitive/nginx/"},
                }
            ],
            "systemStrategy": {
                "minFreeKbytesFactor": 100,
                "totalNetworkBandwidth": "10G",
                "schedFeatures": {"A": True},
            },
        }
    )
    app = spec.host_applications[0]
    assert isinstance(app, HostApplication) and app.qos is QoSClass.LS
    assert app.cgroup_path is not None and app.cgroup_path.relative_path == "host-latency-sensitive/nginx/"
    assert spec.system_strategy.total_network_bandwidth_bps == 10_000_000_000
    assert spec.system_strategy.sched_features == {"A": True}


_leaf = st.none() | st.booleans() | st.integers(-100, 20000) | st.floats(allow_nan=True) | st.text(max_size=6)
_slo_keys = st.sampled_from(
    [
        "resourceUsedThresholdWithBE",
        "resourceQOSStrategy",
        "cpuBurstStrategy",
        "systemStrategy",
        "hostApplications",
        "extensions",
        "enable",
        "cpuSuppressThresholdPercent",
        "cpuSuppressPolicy",
        "lsClass",
        "beClass",
        "policies",
        "cpuQOS",
        "memoryQOS",
        "resctrlQOS",
        "networkQOS",
        "groupIdentity",
        "wmarkRatio",
        "catRangeStartPercent",
        "ingressLimit",
        "policy",
        "schedFeatures",
        "totalNetworkBandwidth",
        "name",
        "cgroupPath",
        "relativePath",
        "qos",
    ]
)
_specs = st.recursive(
    _leaf,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(_slo_keys | st.text(max_size=4), children, max_size=5)
    ),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(_specs)
def test_random_specs_never_crash_the_parser(spec: object) -> None:
    try:
        result = parse_node_slo_spec(spec)
    except NodeSLOError as exc:
        assert exc.errors and all(isinstance(e, str) and ": " in e for e in exc.errors)
    else:
        assert isinstance(result, NodeSLOSpec)


@settings(max_examples=200, deadline=None)
@given(_specs)
def test_the_json_form_of_a_parsed_spec_parses_back_to_the_same_spec(spec: object) -> None:
    """/debug/nodeslo shows the spec in effect as JSON (``dump``); read back, it is that spec."""
    try:
        result = parse_node_slo_spec(spec)
    except NodeSLOError:
        return
    assert parse_node_slo_spec(dump(result)) == result


def test_the_json_form_of_a_full_spec_parses_back_to_the_same_spec() -> None:
    spec = parse_node_slo_spec({
        "resourceUsedThresholdWithBE": {"enable": True, "cpuSuppressThresholdPercent": 45},
        "resourceQOSStrategy": {"beClass": {"cpuQOS": {"enable": True}, "memoryQOS": {"enable": True},
                                            "resctrlQOS": {"enable": True}, "networkQOS": {"enable": True}}},
        "hostApplications": [{"name": "nginx", "qos": "LS", "cgroupPath": {"relativePath": "host/nginx/"}}],
        "systemStrategy": {"totalNetworkBandwidth": "10G", "schedFeatures": {"A": True}},
        "extensions": {"vendor": {"x": 1}},
    })
    shown = dump(spec)
    assert shown["resourceUsedThresholdWithBE"]["cpuSuppressThresholdPercent"] == 45
    assert shown["hostApplications"][0]["qos"] == "LS"
    assert parse_node_slo_spec(shown) == spec
    assert parse_node_slo_spec(dump(default_node_slo_spec())) == default_node_slo_spec()
