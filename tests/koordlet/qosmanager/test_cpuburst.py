"""CPU burst decide() against hand-computed docs/koordinator.md §4.3 figures."""

from __future__ import annotations

from dataclasses import replace

import pytest

from koordlet.api.cfsquota import QuotaGates
from koordlet.api.nodeslo import CPUBurstStrategy, parse_node_slo_spec
from koordlet.api.pod import ContainerMeta
from koordlet.qosmanager import QoSManagerConfig
from koordlet.qosmanager.cpuburst import (
    BurstConfig,
    BurstCurrent,
    BurstOperation,
    SharePoolState,
    TokenBucket,
    bucket_capacity,
    container_operation,
    decide,
    decide_burst,
    eligible_containers,
    scaled_quota,
    share_pool_state,
    static_burst_us,
)
from tests.koordlet.qosmanager.factory import LAYOUT, be_pod, node, pod, snapshot

CID = "bbbbbbbbbbbb"
LS_POD = pod("ls", "LS", containers=(ContainerMeta("app", container_id=CID, limits={"cpu": 1000}),))


def _share_pool_snapshot(node_avg: float | None):
    lsr = pod("lsr", "LSR", containers=(ContainerMeta("app", container_id="c1", requests={"cpu": 2000}),))
    return snapshot(
        node=node(8000), pods=(lsr, be_pod("be"), LS_POD), node_cpu_avg_cores=node_avg,
        pod_cpu_avg_cores={"uid-lsr": 1.0, "uid-be": 0.5, "uid-ls": 1.5},
    )


@pytest.mark.parametrize(
    "node_avg,expected",
    [
        (4.0, SharePoolState.IDLE),  # (4 − 1 − 0.5) / (8 − 2) = 0.417 < 0.45
        (4.2, SharePoolState.COOLING),  # 2.7 / 6 = 0.45 ≥ 0.9 × 0.5
        (4.5, SharePoolState.OVERLOAD),  # 3.0 / 6 = 0.5 ≥ 0.5
        (None, SharePoolState.UNKNOWN),
    ],
)
def test_share_pool_state(node_avg: float | None, expected: SharePoolState) -> None:
    assert share_pool_state(_share_pool_snapshot(node_avg), 50) is expected


@pytest.mark.parametrize(
    "quota_burst,allows,throttled,state,expected",
    [
        (False, True, 0.5, SharePoolState.IDLE, BurstOperation.RESET),
        (True, False, 0.5, SharePoolState.IDLE, BurstOperation.DOWN),
        (True, True, 0.5, SharePoolState.IDLE, BurstOperation.UP),
        (True, True, 0.0, SharePoolState.IDLE, BurstOperation.REMAIN),
        (True, True, 0.5, SharePoolState.OVERLOAD, BurstOperation.DOWN),
        (True, True, 0.0, SharePoolState.OVERLOAD, BurstOperation.DOWN),
        (True, True, 0.5, SharePoolState.COOLING, BurstOperation.REMAIN),
        (True, True, 0.5, SharePoolState.UNKNOWN, BurstOperation.REMAIN),
    ],
)
def test_container_operation(quota_burst, allows, throttled, state, expected) -> None:
    assert container_operation(quota_burst, allows, throttled, state) is expected


@pytest.mark.parametrize(
    "operation,current,expected",
    [
        (BurstOperation.UP, 100000, 120000),
        (BurstOperation.UP, 280000, 300000),  # clamped at ceil = 300 %
        (BurstOperation.DOWN, 150000, 120000),
        (BurstOperation.DOWN, 110000, 100000),  # clamped at base
        (BurstOperation.REMAIN, 130000, 130000),
        (BurstOperation.RESET, 250000, 100000),
    ],
)
def test_scaled_quota(operation: BurstOperation, current: int, expected: int) -> None:
    assert scaled_quota(operation, current, 100000, 300000) == expected


def test_static_burst() -> None:
    auto = CPUBurstStrategy(policy="auto")
    assert static_burst_us(1000, auto) == 1_000_000  # 1 core × 1000 % × 100000
    assert static_burst_us(500, CPUBurstStrategy(policy="cpuBurstOnly", cpu_burst_percent=200)) == 100_000
    assert static_burst_us(1000, CPUBurstStrategy(policy="none")) == 0
    assert static_burst_us(0, auto) == 0


def test_token_bucket_consumes_above_100_and_refills_below_60() -> None:
    assert bucket_capacity(CPUBurstStrategy(cfs_quota_burst_period_seconds=10)) == 2000  # 10 × (300 − 100)
    bucket = TokenBucket(2000.0, 100.0, 0.0)
    bucket = bucket.advance(150.0, 1.0)
    assert bucket.tokens == pytest.approx(50.0)
    bucket = bucket.advance(30.0, 3.0)
    assert bucket.tokens == pytest.approx(190.0)  # + (100 − 30) × 2
    assert bucket.advance(80.0, 4.0).tokens == pytest.approx(190.0)
    assert not TokenBucket(2000.0, 10.0, 0.0).advance(200.0, 1.0).allows


def _burst_snapshot(policy: str = "auto", period_s: int = -1, **fields):
    slo = parse_node_slo_spec({"cpuBurstStrategy": {"policy": policy, "cfsQuotaBurstPeriodSeconds": period_s}})
    values = {"node": node(8000), "node_slo": slo, "pods": (LS_POD,), "node_cpu_avg_cores": 1.0,
                  "container_throttled_ratio": {CID: 0.5}, "container_cpu_cores": {CID: 1.0}}
    values.update(fields)
    return snapshot(**values)


def test_scale_up_writes_pod_then_container_and_caps_burst_at_quota() -> None:
    snap = _burst_snapshot()
    containers = eligible_containers(snap, LAYOUT)
    current = BurstCurrent({CID: 100000}, {"uid-ls": 100000})
    decision = decide_burst(snap, containers, current, {})
    assert decision.operations[CID] is BurstOperation.UP
    quota_step, burst_step = decision.steps
    assert [(w.cgroup_dir, w.value) for w in quota_step.writes] == [
        ("kubepods/burstable/poduid-ls", 120000),
        (f"kubepods/burstable/poduid-ls/{CID}", 120000),
    ]
    # 1 core × 1000 % = 1_000_000 µs, capped at the cgroup's quota (mainline kernel rule)
    assert [(w.resource, w.value) for w in burst_step.writes] == [("cpu.cfs_burst_us", 100000)] * 2


def test_overload_scales_down_container_then_pod() -> None:
    snap = _burst_snapshot(node_cpu_avg_cores=7.0)
    decision = decide_burst(snap, eligible_containers(snap, LAYOUT), BurstCurrent({CID: 150000}, {"uid-ls": 150000}),
                            {})
    assert decision.node_state is SharePoolState.OVERLOAD
    assert [w.cgroup_dir for w in decision.steps[0].writes] == [
        f"kubepods/burstable/poduid-ls/{CID}",
        "kubepods/burstable/poduid-ls",
    ]
    assert decision.container_quota_us[CID] == 120000


def test_unlimited_pod_quota_stays_and_empty_bucket_scales_down() -> None:
    snap = _burst_snapshot(period_s=10, container_cpu_cores={CID: 2.0})
    bucket = TokenBucket(2000.0, 50.0, snap.timestamp - 1.0)  # 200 % for 1 s consumes 100 tokens
    decision = decide_burst(snap, eligible_containers(snap, LAYOUT), BurstCurrent({CID: 200000}, {"uid-ls": -1}),
                      {CID: bucket})
    assert decision.operations[CID] is BurstOperation.DOWN
    assert [w.cgroup_dir for w in decision.steps[0].writes] == [f"kubepods/burstable/poduid-ls/{CID}"]
    assert decision.buckets[CID].tokens == 0.0


def test_policy_without_quota_burst_resets_to_the_limit() -> None:
    snap = _burst_snapshot(policy="cpuBurstOnly")
    decision = decide_burst(snap, eligible_containers(snap, LAYOUT), BurstCurrent({CID: 180000}, {"uid-ls": 180000}),
                            {})
    assert decision.operations[CID] is BurstOperation.RESET
    assert decision.container_quota_us[CID] == 100000


def test_with_cpu_normalization_burst_scales_from_and_resets_to_the_normalized_base() -> None:
    """Koordinator #2306: burst's base is the normalized quota, so neither undoes the other (api/cfsquota.py)."""
    flags = QoSManagerConfig(feature_gates={"CPUBurst": True, "CPUNormalization": True})
    ratio = {"node.koordinator.sh/cpu-normalization-ratio": "1.25"}
    at_rest = _burst_snapshot(policy="none", node=node(8000, annotations=ratio),
                              cgroup_values={("cpu.cfs_quota_us", f"kubepods/burstable/poduid-ls/{CID}"): "100000",
                                             ("cpu.cfs_quota_us", "kubepods/burstable/poduid-ls"): "100000"})
    config = BurstConfig.from_node_slo(at_rest.node_slo, flags)
    assert config.quota_gates == QuotaGates(cpuset=False, cpu_burst=True, normalization=True)
    assert decide(at_rest, config).report.container_quota_us[CID] == 80_000  # kubelet's 100000 / 1.25
    throttled = replace(at_rest, node_slo=parse_node_slo_spec({"cpuBurstStrategy": {"policy": "cfsQuotaBurstOnly"}}),
                        cgroup_values={("cpu.cfs_quota_us", f"kubepods/burstable/poduid-ls/{CID}"): "80000",
                                       ("cpu.cfs_quota_us", "kubepods/burstable/poduid-ls"): "80000"})
    assert decide(throttled, config).report.container_quota_us[CID] == 96_000
    # the gate off: kubelet's limit is the base; a bad ratio annotation: the same (the hook reports it)
    assert decide(at_rest, BurstConfig.from_node_slo(at_rest.node_slo, QoSManagerConfig(
        feature_gates={"CPUBurst": True}))).report.container_quota_us == {}
    bad = replace(at_rest, node=node(8000, annotations={"node.koordinator.sh/cpu-normalization-ratio": "x"}))
    assert decide(bad, config).report.container_quota_us == {}


def test_a_pod_bound_to_a_cpuset_keeps_its_quota_for_the_cpuset_hook() -> None:
    bound = replace(LS_POD, annotations={"scheduling.koordinator.sh/resource-status": '{"cpuset": "2"}'})
    snap = _burst_snapshot(pods=(bound,))
    containers = eligible_containers(snap, LAYOUT, QuotaGates(cpuset=True, cpu_burst=True))
    assert [c.owns_quota for c in containers] == [False]
    assert not decide_burst(snap, containers, BurstCurrent({CID: 100000}, {"uid-ls": 100000}), {}).operations


def test_only_running_non_lsr_lse_be_pods_are_eligible() -> None:
    pods = (
        LS_POD,
        pod("lsr", "LSR", containers=(ContainerMeta("a", container_id="cccccccccccc"),)),
        be_pod("be"),
        pod("done", "LS", containers=(ContainerMeta("a", container_id="dddddddddddd"),), phase="Succeeded"),
        pod("plain", "", containers=(ContainerMeta("a", container_id="eeeeeeeeeeee"),)),
    )
    names = [entry.pod.name for entry in eligible_containers(_burst_snapshot(pods=pods), LAYOUT)]
    assert names == ["ls", "plain"]


def test_the_per_pod_state_is_a_frozen_value_that_orders_the_pods_writes() -> None:
    """decide_burst's per-pod state (PodBurstState): growing, the pod's quota goes first; shrinking, last (a
    v1 child's quota may not exceed its parent's); an unlimited pod quota stays; the pod's burst is the
    containers' sum capped at its quota."""
    import dataclasses

    from koordlet.qosmanager.cpuburst import PodBurstState, SharePoolState

    state = PodBurstState("pod", 200_000).with_burst(150_000).with_burst(100_000)
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.burst_sum_us = 0  # type: ignore[misc]
    assert state.quota_step(SharePoolState.IDLE) is None and state.burst_write().value == 200_000
    idle = SharePoolState.IDLE
    up = state.with_quota("pod/a", 100_000, 120_000, "a up")
    assert [(w.cgroup_dir, w.value) for w in up.quota_step(idle).writes] == [("pod", 220_000), ("pod/a", 120_000)]
    down = state.with_quota("pod/a", 100_000, 80_000, "a down")
    assert [(w.cgroup_dir, w.value) for w in down.quota_step(idle).writes] == [("pod/a", 80_000), ("pod", 180_000)]
    unlimited = PodBurstState("pod", -1).with_burst(300_000).with_quota("pod/a", 100_000, 120_000, "a up")
    assert [w.cgroup_dir for w in unlimited.quota_step(idle).writes] == ["pod/a"]
    assert unlimited.burst_write().value == 300_000


def test_a_container_without_a_cpu_limit_bursts_from_its_pod_level_limit() -> None:
    """kubelet gives a container that sets no cpu limit the pod-level one (getCPULimit): burst's base is that quota."""
    pod_level = replace(pod("pl", "LS", containers=(ContainerMeta("app", container_id=CID),)),
                        pod_limits={"cpu": 1500}, pod_requests={"cpu": 1000})
    containers = eligible_containers(_burst_snapshot(pods=(pod_level,)), LAYOUT)
    assert [(c.limit_milli, c.base_quota_us) for c in containers] == [(1500, 150000)]


def test_the_share_pool_leaves_out_an_lsr_pod_level_request() -> None:
    lsr = replace(pod("lsr", "LSR", containers=(ContainerMeta("app", container_id="c1", requests={"cpu": 500}),)),
                  pod_requests={"cpu": 2000})
    snap = snapshot(node=node(8000), pods=(lsr, be_pod("be"), LS_POD), node_cpu_avg_cores=4.2,
                    pod_cpu_avg_cores={"uid-lsr": 1.0, "uid-be": 0.5, "uid-ls": 1.5})
    assert share_pool_state(snap, 50) is SharePoolState.COOLING  # as with 2000m in the container: 2.7 / 6
