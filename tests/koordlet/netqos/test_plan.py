"""The pure network QoS plan, against rates computed by hand."""

from __future__ import annotations

import pytest

from koordlet.api.nodeslo import parse_node_slo_spec
from koordlet.api.qos import QoSClass
from koordlet.netqos.plan import (
    MIN_RATE_BPS,
    ClassRates,
    IPFilter,
    NetPod,
    NetQoSError,
    NetQoSSpec,
    classid,
    net_pod,
    plan,
    resolve_rate,
    spec_from_node_slo,
)

MBIT = 1_000_000


def _node_slo(total: str = "1G", **classes: dict[str, object]) -> dict[str, object]:
    return {
        "systemStrategy": {"totalNetworkBandwidth": total},
        "resourceQOSStrategy": {name: {"networkQOS": cfg} for name, cfg in classes.items()},
    }


def test_int_is_percent_of_total_and_string_is_absolute_bits_per_second() -> None:
    assert resolve_rate(30, 1000 * MBIT) == 300 * MBIT
    assert resolve_rate("50M", 1000 * MBIT) == 50 * MBIT
    assert resolve_rate("2G", 1000 * MBIT) == 1000 * MBIT  # capped at the node bandwidth
    with pytest.raises(NetQoSError):
        resolve_rate("fast", 1000 * MBIT)


def test_spec_from_node_slo_resolves_each_class_by_hand() -> None:
    spec = spec_from_node_slo(
        parse_node_slo_spec(
            _node_slo(
                "1G",
                lsClass={"enable": True, "egressRequest": 50, "egressLimit": 100},
                beClass={"enable": True, "egressRequest": "10M", "egressLimit": 20},
            )
        )
    )
    assert spec == NetQoSSpec(
        total_bps=1000 * MBIT,
        system=ClassRates(rate_bps=0, ceil_bps=1000 * MBIT),  # disabled: no guarantee, no cap
        ls=ClassRates(rate_bps=500 * MBIT, ceil_bps=1000 * MBIT),
        be=ClassRates(rate_bps=10 * MBIT, ceil_bps=200 * MBIT),
    )


def test_spec_is_none_when_no_class_enables_network_qos_or_policy_is_terway() -> None:
    assert spec_from_node_slo(parse_node_slo_spec(None)) is None
    terway = _node_slo(beClass={"enable": True, "egressLimit": 10})
    terway["resourceQOSStrategy"]["policies"] = {"netQOSPolicy": "terway-qos"}  # type: ignore[index]
    assert spec_from_node_slo(parse_node_slo_spec(terway)) is None


def test_spec_falls_back_to_link_speed_and_refuses_without_any_bandwidth() -> None:
    slo = parse_node_slo_spec(_node_slo("0", beClass={"enable": True, "egressLimit": 10}))
    assert spec_from_node_slo(slo, link_speed_bps=10_000 * MBIT).be == ClassRates(0, 1000 * MBIT)  # type: ignore[union-attr]
    with pytest.raises(NetQoSError, match="totalNetworkBandwidth"):
        spec_from_node_slo(slo)


SPEC = NetQoSSpec(
    total_bps=100 * MBIT,
    system=ClassRates(0, 100 * MBIT),
    ls=ClassRates(60 * MBIT, 100 * MBIT),
    be=ClassRates(0, 10 * MBIT),
)


def test_plan_has_koordinator_class_layout_with_system_as_default() -> None:
    result = plan(SPEC, [])
    layout = {(c.classid, c.parent): (c.rate_bps, c.ceil_bps) for c in result.classes}
    assert result.qdisc_handle == 0x10000
    assert result.default_classid == classid(2)
    assert layout == {
        (0x10001, 0x10000): (100 * MBIT, 100 * MBIT),
        (0x10002, 0x10001): (MIN_RATE_BPS, 100 * MBIT),  # a zero request becomes the HTB floor
        (0x10003, 0x10001): (60 * MBIT, 100 * MBIT),
        (0x10004, 0x10001): (MIN_RATE_BPS, 10 * MBIT),
    }
    # quantum = rate / 8 / r2q(10), clamped to [1600, 200000] bytes
    assert {c.classid: c.quantum_bytes for c in result.classes} == {
        0x10001: 200_000,
        0x10002: 1_600,
        0x10003: 200_000,
        0x10004: 1_600,
    }


def test_pods_are_classified_by_ipv4_source_into_their_qos_class() -> None:
    pods = [
        NetPod("default/web", ("10.0.0.5", "fd00::5"), QoSClass.LSR),
        NetPod("default/batch", ("10.0.0.7",), QoSClass.BE),
        NetPod("default/plain", ("10.0.0.6",), QoSClass.NONE),
        NetPod("default/pending", (), QoSClass.BE),
    ]
    assert plan(SPEC, pods).filters == (
        IPFilter("10.0.0.5", classid(3)),
        IPFilter("10.0.0.6", classid(2)),
        IPFilter("10.0.0.7", classid(4)),
    )


def test_pod_egress_limit_gets_a_leaf_class_capped_by_its_qos_class() -> None:
    pods = [
        net_pod("ns/a", ["10.0.0.2"], QoSClass.BE, {"koordinator.sh/networkQOS": '{"egressLimit": "50M"}'}),
        net_pod("ns/b", ["10.0.0.3"], QoSClass.LS, {"koordinator.sh/networkQOS": '{"egressLimit": "20M"}'}),
        net_pod("ns/c", ["10.0.0.4"], QoSClass.LS, {"koordinator.sh/networkQOS": "not json"}),
    ]
    result = plan(SPEC, pods)
    leaves = [c for c in result.classes if c.classid >= classid(0x100)]
    assert [(c.classid, c.parent, c.ceil_bps) for c in leaves] == [
        (classid(0x100), classid(4), 10 * MBIT),  # 50M asked, BE class ceiling is 10M
        (classid(0x101), classid(3), 20 * MBIT),
    ]
    assert result.filters == (
        IPFilter("10.0.0.2", classid(0x100)),
        IPFilter("10.0.0.3", classid(0x101)),
        IPFilter("10.0.0.4", classid(3)),  # bad annotation: ignored, pod still classified
    )


def test_an_ip_claimed_twice_keeps_the_first_pod_in_key_order() -> None:
    pods = [NetPod("b/late", ("10.0.0.9",), QoSClass.BE), NetPod("a/early", ("10.0.0.9",), QoSClass.LS)]
    assert plan(SPEC, pods).filters == (IPFilter("10.0.0.9", classid(3)),)
