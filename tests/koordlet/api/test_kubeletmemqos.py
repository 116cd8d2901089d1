"""kubelet's own memory QoS (KEP-2570) as koordlet reads it from a KubeletConfiguration, and which memory QoS file,
level and kube QoS class is kubelet's (koordlet/api/kubeletmemqos.py; the ownership table of docs/colocation.md)."""

from __future__ import annotations

import pytest

from koordlet.api.kubeletmemqos import (
    LEGACY,
    MEMORY_HIGH,
    MEMORY_LOW,
    MEMORY_MIN,
    NONE,
    TIERED,
    KubeletConfigError,
    KubeletMemoryQoS,
    Level,
    from_kubelet_config,
    kubelet_value,
    kubelet_writes,
)
from koordlet.api.qos import KubeQoS

G, B, BE = KubeQoS.GUARANTEED, KubeQoS.BURSTABLE, KubeQoS.BESTEFFORT
C, P, Q = Level.CONTAINER, Level.POD, Level.QOS
TIERED_HIGH = KubeletMemoryQoS(True, 0.9, TIERED)


def _kubelet_files(kubelet: KubeletMemoryQoS) -> set[tuple[str, str, str]]:
    return {(f, level.value, qos.value) for f in (MEMORY_MIN, MEMORY_LOW, MEMORY_HIGH) for level in Level
            for qos in KubeQoS if kubelet_writes(f, level, qos, kubelet)}


def test_kubelet_1_37_with_tiered_reservation_and_a_factor_owns_these_files_and_no_other() -> None:
    assert _kubelet_files(TIERED_HIGH) == {
        (MEMORY_MIN, "container", "Guaranteed"), (MEMORY_MIN, "pod", "Guaranteed"),
        (MEMORY_MIN, "qos", "Guaranteed"),  # the kubepods dir: Guaranteed and Burstable requests together
        (MEMORY_LOW, "container", "Burstable"), (MEMORY_LOW, "pod", "Burstable"), (MEMORY_LOW, "qos", "Burstable"),
        (MEMORY_HIGH, "container", "Burstable"), (MEMORY_HIGH, "container", "BestEffort")}


def test_kubelet_before_1_36_protects_with_memory_min_on_both_classes() -> None:
    assert _kubelet_files(KubeletMemoryQoS(True, 0.9, LEGACY)) == {
        (MEMORY_MIN, level, qos) for level in ("container", "pod", "qos") for qos in ("Guaranteed", "Burstable")} | {
        (MEMORY_HIGH, "container", "Burstable"), (MEMORY_HIGH, "container", "BestEffort")}


def test_nothing_is_kubelets_with_its_gate_off_or_its_1_37_defaults() -> None:
    assert _kubelet_files(KubeletMemoryQoS(False, 0.9, TIERED)) == set()
    assert _kubelet_files(KubeletMemoryQoS(True, None, NONE)) == set()


def test_kubelets_value_is_the_request_where_it_writes() -> None:
    assert kubelet_value(MEMORY_LOW, P, B, 256, TIERED_HIGH) == 256
    assert kubelet_value(MEMORY_MIN, P, B, 256, TIERED_HIGH) == 0


@pytest.mark.parametrize(("doc", "version", "want"), [
    ({}, "v1.37.1", KubeletMemoryQoS(True, None, NONE)),  # 1.37's defaults: the gate on, nothing written
    ({}, "v1.35.0", KubeletMemoryQoS(False, 0.9, LEGACY)),
    ({}, "", KubeletMemoryQoS(False, None, NONE)),  # version not known: the gate taken as off
    ({"featureGates": {"MemoryQoS": True}}, "v1.30.2", KubeletMemoryQoS(True, 0.9, LEGACY)),
    ({"featureGates": {"MemoryQoS": True}, "memoryReservationPolicy": "TieredReservation"}, "v1.36.0",
     KubeletMemoryQoS(True, 0.9, TIERED)),
    ({"memoryThrottlingFactor": 0.8, "memoryReservationPolicy": "TieredReservation"}, "v1.37.0",
     KubeletMemoryQoS(True, 0.8, TIERED)),
    ({"featureGates": {"MemoryQoS": False}, "memoryThrottlingFactor": 0.8}, "v1.37.0",
     KubeletMemoryQoS(False, 0.8, NONE)),
])
def test_the_kubelet_configuration_and_version_say_what_kubelet_writes(doc: dict, version: str,
                                                                       want: KubeletMemoryQoS) -> None:
    got = from_kubelet_config(doc, version, "test")
    assert (got.enabled, got.throttling_factor, got.reservation) == (want.enabled, want.throttling_factor,
                                                                     want.reservation)


@pytest.mark.parametrize(("doc", "error"), [
    ({"featureGates": ["MemoryQoS"]}, "featureGates: expected a map"),
    ({"featureGates": {"MemoryQoS": "yes"}}, "expected true or false"),
    ({"memoryThrottlingFactor": 1.5}, r"memoryThrottlingFactor: expected a number in \(0, 1\]"),
    ({"memoryThrottlingFactor": True}, "memoryThrottlingFactor"),
    ({"memoryReservationPolicy": "Everything"}, "memoryReservationPolicy: expected None or TieredReservation"),
])
def test_a_config_koordlet_cannot_read_is_refused_with_the_field(doc: dict, error: str) -> None:
    with pytest.raises(KubeletConfigError, match=error):
        from_kubelet_config(doc, "v1.37.0")
