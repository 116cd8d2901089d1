"""The CFS quota's owner, in the order docs/colocation.md writes down (koordlet/api/cfsquota.py)."""

from __future__ import annotations

import json

import pytest

from koordlet.api.annotations import AnnotationError
from koordlet.api.cfsquota import (
    QuotaGates,
    QuotaOwner,
    burst_base_quota_us,
    node_normalization_ratio,
    normalized_quota_us,
    quota_owner,
)
from koordlet.api.pod import PodMeta

BOUND = {"scheduling.koordinator.sh/resource-status": json.dumps({"cpuset": "2-3"})}
NUMA_ONLY = {"scheduling.koordinator.sh/resource-status": json.dumps(
    {"numaNodeResources": [{"node": 0, "resources": {"cpu": "2"}}]})}
ALL_ON = QuotaGates(cpuset=True, cpu_burst=True, normalization=True)


def _pod(qos: str | None, annotations: dict[str, str] | None = None, phase: str = "Running") -> PodMeta:
    return PodMeta(name="p", namespace="n", uid="u", labels={"koordinator.sh/qosClass": qos} if qos else {},
                   annotations=annotations or {}, phase=phase)


@pytest.mark.parametrize("pod,running,owner", [
    (_pod("LS", BOUND), True, QuotaOwner.CPUSET),  # bound: unlimited, whatever else is on
    (_pod("LSR", BOUND), False, QuotaOwner.CPUSET),
    (_pod("BE", BOUND), True, QuotaOwner.CPUSET),
    (_pod("BE"), True, QuotaOwner.BATCH),  # burst and normalization never take BE pods
    (_pod("LS"), True, QuotaOwner.BURST),  # running: burst's, within its range above the normalized base
    (_pod(None), True, QuotaOwner.BURST),
    (_pod("LS"), False, QuotaOwner.NORMALIZATION),  # created / updated by kubelet: normalized (= burst's base)
    (_pod("LSR"), True, QuotaOwner.KUBELET),  # LSR without a cpuset: neither burst nor normalization
    (_pod("LS", NUMA_ONLY), True, QuotaOwner.BURST),
    (_pod("LS", NUMA_ONLY), False, QuotaOwner.KUBELET),  # normalization leaves pods with a resource status
    (_pod("LS", phase="Succeeded"), True, QuotaOwner.NORMALIZATION),
    (_pod("SYSTEM"), True, QuotaOwner.BURST),
    (_pod("SYSTEM"), False, QuotaOwner.KUBELET),
])
def test_the_owner_is_the_first_that_takes_the_pod_in_the_written_order(pod: PodMeta, running: bool,
                                                                           owner: QuotaOwner) -> None:
    assert quota_owner(pod, ALL_ON, running=running, ratio=1.25) is owner


def test_gates_off_and_no_ratio_hand_the_quota_down_the_order() -> None:
    ls = _pod("LS")
    assert quota_owner(ls, QuotaGates(normalization=True), running=True, ratio=1.25) is QuotaOwner.NORMALIZATION
    assert quota_owner(ls, ALL_ON, running=False, ratio=None) is QuotaOwner.KUBELET
    assert quota_owner(_pod("LS", BOUND), QuotaGates(cpuset=False, cpu_burst=True), running=True) is QuotaOwner.BURST


def test_burst_base_is_kubelets_limit_normalized_where_normalization_would_own_it() -> None:
    assert burst_base_quota_us(_pod("LS"), 100_000, ALL_ON, 1.25) == 80_000
    assert burst_base_quota_us(_pod("LS"), 100_000, QuotaGates(cpu_burst=True), 1.25) == 100_000  # gate off
    assert burst_base_quota_us(_pod("SYSTEM"), 100_000, ALL_ON, 1.25) == 100_000  # normalization: LS, unlabelled
    assert burst_base_quota_us(_pod("LS"), 100_000, ALL_ON, None) == 100_000


def test_normalized_quota_and_the_nodes_ratio() -> None:
    assert normalized_quota_us(150_000, 2.0) == 75_000
    assert normalized_quota_us(100_001, 1.5) == 66_668  # ceil
    assert normalized_quota_us(1_500, 2.0) == 1_000  # the kernel's floor
    assert normalized_quota_us(-1, 2.0) == -1 and normalized_quota_us(50_000, None) == 50_000
    key = "node.koordinator.sh/cpu-normalization-ratio"
    assert node_normalization_ratio({key: "1.25"}) == 1.25
    assert node_normalization_ratio({key: "1"}) is None and node_normalization_ratio({key: "-1"}) is None
    assert node_normalization_ratio({}) is None
    with pytest.raises(AnnotationError):
        node_normalization_ratio({key: "fast"})
