"""The CFS quota's owners on the real kernel (cgroup v1 here, v2 in the VM stage; docs/colocation.md "One owner for
the CFS quota").

CPU burst and CPU normalization both on: across a burst and back neither undoes the other (Koordinator #2306).

An LS pod with one container, limit 0.2 cores (kubelet's quota 20000 µs on the pod and the container), on a node whose
CPU normalization ratio is 1.25: the normalized base is 16000 µs. (A small limit, so that two burners are throttled
at every step even on a busy shared machine.) The burst strategy (run tick by tick) and the
runtime hooks' reconciler (normalization, a pass after every tick) both act on the same cgroups. The container
really burns, so its throttling is the kernel's, read by the real collector. The node's CPU use is the one input
set by the test: the share pool's load on a shared machine is not what this test is about, and an overloaded share
pool makes burst scale down instead of up.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from hooks import registry
from hooks.protocol import NodeContext
from koordlet import audit
from koordlet.api.keys import ANNOTATION_EXTENDED_RESOURCE_SPEC, ANNOTATION_NODE_CPU_NORMALIZATION_RATIO
from koordlet.api.nodeslo import parse_node_slo_spec
from koordlet.api.pod import ContainerMeta
from koordlet.api.qos import KubeQoS, QoSClass
from koordlet.metriccache import MetricKind, SeriesKey
from koordlet.qosmanager import QoSManager, QoSManagerConfig, new_qos_manager
from koordlet.runtimehooks.reconciler import Reconciler
from koordlet.system.cgroup import CgroupVersion
from koordlet.system.cgroup_stats import cpu_stat_counters, read_cfs_quota
from tests.koordlet.qosmanager.realnode import BURN, RealNode
from tests.support.v2guest import skip_unless_v2_writable
from tests.support.waiting import wait_for

CONTAINER = ContainerMeta("app", container_id="0123456789ab", requests={"cpu": 100}, limits={"cpu": 200})
GATES = {"CPUBurst": True, "CPUNormalization": True, "BECPUSuppress": False, "RdtResctrl": False}
KUBELET_QUOTA, BASE, CEIL = 20_000, 16_000, 48_000  # limit 0.2 cores; ÷ 1.25; base × cfsQuotaBurstPercent 300 %


def _slo(policy: str):
    return parse_node_slo_spec({"cpuBurstStrategy": {"policy": policy, "cfsQuotaBurstPercent": 300,
                                                     "cfsQuotaBurstPeriodSeconds": -1}})


@pytest.fixture(params=[pytest.param("v1", marks=pytest.mark.cgroupv1),
                        pytest.param("v2", marks=pytest.mark.cgroupv2)])
def node(request: pytest.FixtureRequest) -> Iterator[RealNode]:
    v2 = request.param == "v2"
    skip_unless_v2_writable() if v2 else RealNode.skip_unless_possible()
    # The strategy is run by hand, tick by tick, with no QoS manager loop to say which pods it reads: the collector
    # reads every pod at each of the test's collections.
    real = RealNode("quota-owner", (("ls", QoSClass.LS, KubeQoS.BURSTABLE), ("be", QoSClass.BE, KubeQoS.BESTEFFORT)),
                    v2=v2, fanout_s=1.0)
    try:
        yield real
    finally:
        real.close()


def _set_quota(node: RealNode, cgroup_dir: str, quota_us: int) -> None:
    if node.fs.version is CgroupVersion.V2:
        name, value = "cpu.max", f"{quota_us} 100000"
    else:
        name, value = "cpu.cfs_quota_us", str(quota_us)
    node.groups.write("cpu", node._rel(cgroup_dir), name, value)


def _quota(node: RealNode, cgroup_dir: str) -> int:
    return read_cfs_quota(node.fs.cgroup_dir("cpu", cgroup_dir), node.fs.version).quota_us


class Actors:
    """The burst strategy and the reconciler on one node, driven by the test."""

    def __init__(self, node: RealNode) -> None:
        self.node = node
        self.container_dir = node.add_container("ls", CONTAINER)
        self.pod_dir = node.pod_dir(node.pod("ls"))
        for cgroup_dir in (self.pod_dir, self.container_dir):  # kubelet's values
            self._set_quota(cgroup_dir, KUBELET_QUOTA)
        node.states.set_node(replace(node.node, annotations={ANNOTATION_NODE_CPU_NORMALIZATION_RATIO: "1.25"}))
        self.manager: QoSManager = new_qos_manager(node.states, node.cache, node.executor, node.layout,
                                                   config=QoSManagerConfig(feature_gates=GATES))
        plugins = registry.enabled(GATES)
        self.reconciler = Reconciler(
            node.states.pods, lambda: NodeContext(node_slo=node.states.node_slo(),
                                                  node_annotations=node.states.node().annotations, cpu_burst=True),
            lambda: plugins, node.executor, node.layout)

    def _set_quota(self, cgroup_dir: str, quota_us: int) -> None:
        _set_quota(self.node, cgroup_dir, quota_us)

    def quota(self, cgroup_dir: str) -> int:
        return _quota(self.node, cgroup_dir)

    def throttling(self) -> tuple[int, int]:
        """The container's (nr_periods, nr_throttled), as the kernel counts them."""
        stat = self.node.read("cpu", self.container_dir, "cpu.stat").encode()
        return cpu_stat_counters(stat, self.node.fs.version)[1:]

    def burst_tick(self, burning: bool = False) -> int:
        """Collect (the container's real throttling since the last collection), one burst tick, then a reconciler
        pass; returns the container's quota after the tick, checking the pass left it there. ``burning``: the
        collection spans CFS periods the container ran and was throttled in (on a busy shared machine the burners
        may get no CPU for 0.3 s, and a period the container did not run in is not counted by the kernel)."""
        self.node.runner.run_collector("pod_resource")
        periods, throttled = self.throttling()
        time.sleep(0.3)
        if burning:
            ran_throttled = lambda: (c := self.throttling())[0] >= periods + 3 and c[1] > throttled  # noqa: E731
            assert wait_for(ran_throttled, 10.0), (periods, throttled, self.throttling())
        self.node.runner.run_collector("pod_resource")
        self.node.cache.append(SeriesKey.of(MetricKind.NODE_CPU_USAGE), time.time(), 0.2)  # an idle share pool
        assert self.manager.run_strategy("cpuburst")
        after_burst = self.quota(self.container_dir)
        self.reconciler.reconcile_once()
        assert self.quota(self.container_dir) == after_burst, "the reconciler undid burst's quota"
        assert self.quota(self.pod_dir) >= after_burst  # v1: a child's quota never above its pod's
        return after_burst


def test_burst_and_normalization_both_on_neither_undoes_the_other_across_a_burst_and_back(node: RealNode) -> None:
    actors = Actors(node)
    # At rest (policy none): burst resets the container to the normalized base, and the reconciler keeps it there.
    node.states.set_node_slo(_slo("none"))
    assert actors.burst_tick() == BASE
    # A burst: the container burns 2 CPUs against 0.16 and is throttled; burst scales it up tick by tick, past
    # kubelet's 20000, and the reconciler's normalization (which would write 16000) leaves every step alone.
    node.states.set_node_slo(_slo("cfsQuotaBurstOnly"))
    burners = [node.groups.spawn(node._rel(actors.container_dir), BURN) for _ in range(max(2, os.cpu_count() or 2))]
    seen = [actors.burst_tick(burning=True) for _ in range(3)]
    assert seen == [19_200, 23_040, 27_648], seen  # × 1.2 per tick from the normalized base
    for burner in burners:
        burner.kill()
        burner.wait()
    # And back: the burst is over (policy none again): burst resets to the normalized base, not to kubelet's quota,
    # and the reconciler agrees.
    node.states.set_node_slo(_slo("none"))
    assert actors.burst_tick() == BASE
    assert actors.burst_tick() == BASE
    assert max(seen) <= CEIL


BE_CONTAINER = ContainerMeta("main", container_id="be0123456789")
BATCH_SPEC = {"containers": {"main": {"requests": {"kubernetes.io/batch-cpu": "500"},
                                      "limits": {"kubernetes.io/batch-cpu": "1000"}}}}  # quota 100000 µs
BE_GATES = {"BatchResource": True, "BECPUSuppress": True, "CPUBurst": False, "RdtResctrl": False}


def _suppress(node: RealNode, policy: str) -> object:
    return parse_node_slo_spec({"resourceUsedThresholdWithBE": {"enable": True, "cpuSuppressThresholdPercent": 10,
                                                                "cpuSuppressPolicy": policy}})


def _be_pod_with_batch_quota(node: RealNode, be_cpu_suppress: bool) -> tuple[Reconciler, str, str]:
    """The BE pod with a container and a batch-cpu limit of 1 core, and the reconciler (batch resources on)."""
    node.states.set_pods([replace(p, annotations={ANNOTATION_EXTENDED_RESOURCE_SPEC: json.dumps(BATCH_SPEC)})
                          if p.name == "be" else p for p in node.states.pods()])
    container_dir = node.add_container("be", BE_CONTAINER)
    plugins = registry.enabled(BE_GATES)
    reconciler = Reconciler(node.states.pods, lambda: NodeContext(node_slo=node.states.node_slo(),
                                                                  be_cpu_suppress=be_cpu_suppress),
                            lambda: plugins, node.executor, node.layout)
    return reconciler, node.pod_dir(node.pod("be")), container_dir


def test_a_be_pods_batch_quota_gives_way_to_cfs_quota_suppression_recorded_and_comes_back_in_one_pass(
        node: RealNode, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Batch resources and CPU suppress (cfsQuota) on one BE pod, in the order the agent runs them: a NodeSLO change
    triggers a reconciler pass at once, CPU suppress ticks every second. Under cfsQuota the pod's and container's own
    quotas are unset (Koordinator's rule: v1 refuses a besteffort quota below a child's), and those writes are
    recorded (audited), though the leveled update's first pass makes them; suppress then lowers the besteffort dir.
    Back to the cpuset policy, the next reconciler pass, before suppress's tick, gives the pod and container their
    100000 µs back with the besteffort dir unlimited first, and reports no value as refused."""
    reconciler, pod_dir, container_dir = _be_pod_with_batch_quota(node, be_cpu_suppress=True)
    be_dir = node.be_dir
    manager = new_qos_manager(node.states, node.cache, node.executor, node.layout,
                              config=QoSManagerConfig(feature_gates=BE_GATES))
    quotas = lambda: (_quota(node, be_dir), _quota(node, pod_dir), _quota(node, container_dir))  # noqa: E731
    node.states.set_node_slo(_suppress(node, "cpuset"))
    reconciler.reconcile_once()
    assert quotas() == (-1, 100_000, 100_000)

    auditor = audit.Auditor(audit.AuditConfig(log_dir=str(tmp_path / "audit")))
    audit.install(auditor)
    try:
        node.states.set_node_slo(_suppress(node, "cfsQuota"))
        reconciler.reconcile_once()
        assert quotas() == (-1, -1, -1)
        for _ in range(2):  # a CPU sample, then suppress's tick: the besteffort quota comes down, the kernel takes it
            node.runner.run_collector("node_resource")
            time.sleep(1.1)
        assert manager.run_strategy("cpusuppress")
        record = manager.last_record("cpusuppress")
        assert record is not None and record.failed == 0
        suppressed = _quota(node, be_dir)
        assert 0 < suppressed < 100_000

        caplog.set_level(logging.WARNING, logger="koordlet.runtimehooks")
        node.states.set_node_slo(_suppress(node, "cpuset"))
        reconciler.reconcile_once()
        assert quotas() == (-1, 100_000, 100_000)
        assert not [r for r in caplog.records if "dropped" in r.getMessage()]
    finally:
        audit.install(None)
        auditor.close()
    events = [e for e in reversed(audit.read_events(str(tmp_path / "audit"))) if "cpu.cfs_quota_us" in e.message]
    written = [e.message.split(" by ")[0] for e in events]
    # the BE pod's −1 says why (what `koordlet explain` shows beside the file): the besteffort quota is its limit
    unset = [e.message for e in events if e.message.startswith(tuple(f"cpu.cfs_quota_us of {d} to -1 "
                                                                      for d in (pod_dir, container_dir)))]
    assert len(unset) == 2 and all("by reconciler: BatchResource: no quota of its own under CPU suppress's cfsQuota "
                                   "policy" in m for m in unset), unset
    # (the order within a pass is the leveled update's, which differs between v1 and v2; the kernel holds v1's)
    assert sorted(written) == sorted([
        f"cpu.cfs_quota_us of {pod_dir} to -1", f"cpu.cfs_quota_us of {container_dir} to -1",
        f"cpu.cfs_quota_us of {be_dir} to {suppressed}", f"cpu.cfs_quota_us of {be_dir} to -1",
        f"cpu.cfs_quota_us of {container_dir} to 100000", f"cpu.cfs_quota_us of {pod_dir} to 100000"])


def test_without_cpu_suppress_a_besteffort_quota_koordlet_never_wrote_is_left_alone(node: RealNode) -> None:
    """With the BECPUSuppress gate off the besteffort dir's quota is nobody's in koordlet: a limit set there by hand
    stays, and a BE pod's batch quota above it is not written (the kernel would refuse it on v1)."""
    reconciler, pod_dir, container_dir = _be_pod_with_batch_quota(node, be_cpu_suppress=False)
    _set_quota(node, node.be_dir, 50_000)
    node.states.set_node_slo(_suppress(node, "cpuset"))
    reconciler.reconcile_once()
    assert (_quota(node, node.be_dir), _quota(node, pod_dir), _quota(node, container_dir)) == (50_000, -1, -1)
