"""Suppress and memory eviction on the real kernel (cgroup v1): real processes, real collectors, real executor.

Each test burns or allocates for a few seconds under a private prefix and removes everything after.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest

from koordlet.api.cpuset import parse_cpu_list
from koordlet.api.keys import ANNOTATION_NODE_RESERVATION, ANNOTATION_RESOURCE_STATUS
from koordlet.api.qos import KubeQoS, QoSClass
from koordlet.eviction import Evictor
from koordlet.qosmanager import QoSManagerConfig
from koordlet.qosmanager.metrics import BE_SUPPRESS_CPU_CORES, BE_SUPPRESS_LS_USED_CPU_CORES, value_of
from koordlet.statesinformer.api import NodeInfo
from koordlet.statesinformer.cpumanager import CPUAssignment, CPUManagerState
from tests.koordlet.qosmanager.factory import spec
from tests.koordlet.qosmanager.realnode import RealNode
from tests.support.apiserver import ApiServer, kube_api_client
from tests.support.waiting import wait_for

# alone: suppression has something to show only when the LS burner moves the node's use, and the BE burner's share
# before and after is compared; other tests' load beside them would move both.
pytestmark = [pytest.mark.cgroupv1, pytest.mark.alone]

PODS = (("ls", QoSClass.LS, KubeQoS.BURSTABLE), ("be", QoSClass.BE, KubeQoS.BESTEFFORT))


@pytest.fixture
def real_node(request: pytest.FixtureRequest) -> Iterator[RealNode]:
    RealNode.skip_unless_possible()
    node = RealNode(request.node.name[:20].replace("[", "-").replace("]", ""), PODS)
    try:
        yield node
    finally:
        node.close()


def test_suppress_cfs_quota_shrinks_the_be_quota_and_its_cpu_share(real_node: RealNode) -> None:
    real_node.spawn("be")
    be_before = real_node.cpu_cores(real_node.be_dir, 0.5)
    real_node.spawn("ls")
    # Threshold 30 %: budget = capacity × 0.3 − LS (~1 core) − system ≤ 0 on this node → the 2000 µs floor.
    real_node.start(spec(cpuSuppressThresholdPercent=30, cpuSuppressPolicy="cfsQuota"))
    assert wait_for(lambda: real_node.read("cpu", real_node.be_dir, "cpu.cfs_quota_us") != "-1", 5.0)
    quota = int(real_node.read("cpu", real_node.be_dir, "cpu.cfs_quota_us"))
    assert 2000 <= quota < 100000
    assert 0 < value_of(BE_SUPPRESS_CPU_CORES, node="node-1", type="cfsQuota") < 1.0
    # The LS burner's use was counted: what koordlet saw against what the LS pod's own cgroup shows right after (a
    # busy machine gives the burner less than a core, both figures alike; a fixed floor would measure the machine).
    ls_seen = value_of(BE_SUPPRESS_LS_USED_CPU_CORES, node="node-1")
    ls_measured = real_node.cpu_cores(real_node.pod_dir(real_node.pod("ls")), 0.5)
    assert ls_measured > 0.05 and ls_seen > 0.3 * ls_measured, (ls_seen, ls_measured)
    be_after = real_node.cpu_cores(real_node.be_dir, 0.5)
    assert be_before > 0.15
    assert be_after < be_before * 0.5, (be_before, be_after)


def test_suppress_cpuset_shrinks_the_be_cpuset_on_disk_and_the_process_affinity(real_node: RealNode) -> None:
    if (os.cpu_count() or 0) < 2:
        pytest.skip("needs at least 2 CPUs")
    online = parse_cpu_list(real_node.read("cpuset", "", "cpuset.cpus"))
    # Reserving every CPU but the last leaves one candidate CPU for BE pods.
    reserved = ",".join(str(c) for c in online[:-1])
    real_node.states.set_node(NodeInfo(real_node.node.name, annotations={
        ANNOTATION_NODE_RESERVATION: f'{{"reservedCPUs": "{reserved}"}}'},
        capacity=real_node.node.capacity, allocatable=real_node.node.allocatable))
    be_process = real_node.spawn("be")
    real_node.spawn("ls")
    real_node.start(spec(cpuSuppressThresholdPercent=30))
    last = str(online[-1])
    assert wait_for(lambda: real_node.read("cpuset", real_node.be_dir, "cpuset.cpus") == last, 5.0)
    pod_dir = real_node.pod_dir(real_node.pod("be"))
    assert real_node.read("cpuset", pod_dir, "cpuset.cpus") == last
    assert os.sched_getaffinity(be_process.pid) == {online[-1]}
    assert real_node.cpu_cores(real_node.be_dir, 0.5) <= 1.1


def test_memory_over_threshold_produces_an_eviction_request(real_node: RealNode) -> None:
    """The threshold comes from the BE pod's own cgroup, never from the machine's use (other programs move it):
    at 99 % nothing is evicted; once the threshold is what the BE pod alone holds, the node is over it whatever
    else runs, and the BE pod (not the LS one) is evicted."""
    allocate = real_node.node.capacity["memory"] * 3 // 100
    with ApiServer() as server, kube_api_client(server) as api_client:
        real_node.put_pod_in_api("be", api_client)
        config = QoSManagerConfig(node_name="node-1", feature_gates={"BEMemoryEvict": True, "BECPUSuppress": False,
                                                                     "CPUBurst": False, "RdtResctrl": False})
        real_node.start(spec(memoryEvictThresholdPercent=99), evictor=Evictor("node-1", api_client=api_client),
                        config=config)
        real_node.spawn("be", f"data = b'x' * {allocate}\nimport time\ntime.sleep(60)\n")
        assert wait_for(lambda: real_node.anon_bytes("be") >= allocate, 30.0)
        time.sleep(1.5)
        assert not server.requests("POST", r"/eviction$"), "evicted below the threshold"
        threshold = real_node.evict_threshold_held_by("be")
        real_node.states.set_node_slo(spec(memoryEvictThresholdPercent=threshold))
        assert wait_for(lambda: bool(server.requests("POST", r"/pods/be/eviction$")), 10.0)
        assert not server.requests("POST", r"/pods/ls/eviction$")
        # The Event follows the accepted eviction (its own POST, just after the eviction's).
        assert wait_for(lambda: bool(server.list_objects("events", "default")), 5.0)
        (event,) = server.list_objects("events", "default")
        assert event["reason"] == "BEMemoryEvict" and f"threshold {threshold}%" in event["message"]


LSE_PODS = (("lse", QoSClass.LSE, KubeQoS.GUARANTEED), ("ls", QoSClass.LS, KubeQoS.BURSTABLE),
            ("be", QoSClass.BE, KubeQoS.BESTEFFORT))


@pytest.fixture
def lse_node(request: pytest.FixtureRequest) -> Iterator[RealNode]:
    RealNode.skip_unless_possible()
    if (os.cpu_count() or 0) < 2:
        pytest.skip("needs at least 2 CPUs")
    node = RealNode(request.node.name[:20].replace("[", "-").replace("]", ""), LSE_PODS)
    try:
        yield node
    finally:
        node.close()


def _bind(node: RealNode, pod_name: str, cpus: str) -> None:
    """Give ``pod_name`` the scheduler's cpuset (resource-status), as an LSE/LSR pod has."""
    node.states.set_pods([replace(p, annotations={ANNOTATION_RESOURCE_STATUS: json.dumps({"cpuset": cpus})})
                          if p.name == pod_name else p for p in node.states.pods()])
    node.pods = list(node.states.pods())


def test_an_lse_pods_cpus_stay_out_of_the_be_cpuset_while_ls_load_rises(lse_node: RealNode) -> None:
    online = parse_cpu_list(lse_node.read("cpuset", "", "cpuset.cpus"))
    lse_cpu = online[-1]
    _bind(lse_node, "lse", str(lse_cpu))
    be_process = lse_node.spawn("be")
    lse_node.spawn("ls")
    lse_node.start(spec(cpuSuppressThresholdPercent=30))
    be_cpus = lambda: set(parse_cpu_list(lse_node.read("cpuset", lse_node.be_dir, "cpuset.cpus")))  # noqa: E731
    assert wait_for(lambda: lse_cpu not in be_cpus(), 5.0), be_cpus()
    for _ in range(5):  # and it stays out, tick after tick, while LS burns
        time.sleep(0.5)
        assert lse_cpu not in be_cpus()
        assert lse_cpu not in os.sched_getaffinity(be_process.pid)


def test_kubelets_exclusive_cpus_stay_out_of_the_be_cpuset_with_the_static_policy(lse_node: RealNode) -> None:
    online = parse_cpu_list(lse_node.read("cpuset", "", "cpuset.cpus"))
    exclusive = online[-1]
    # kubelet's static policy pinned a Guaranteed pod that is not Koordinator's to the last CPU
    state = CPUManagerState(policy="static", default_cpuset=frozenset(online[:-1]),
                            assignments=(CPUAssignment(frozenset({exclusive}), pod_uid="guaranteed-uid",
                                                       container_name="main"),))
    be_process = lse_node.spawn("be")
    lse_node.spawn("ls")
    lse_node.start(spec(cpuSuppressThresholdPercent=30), cpu_manager=lambda: state)
    be_cpus = lambda: set(parse_cpu_list(lse_node.read("cpuset", lse_node.be_dir, "cpuset.cpus")))  # noqa: E731
    assert wait_for(lambda: exclusive not in be_cpus(), 5.0), be_cpus()
    for _ in range(4):
        time.sleep(0.5)
        assert exclusive not in be_cpus() and exclusive not in os.sched_getaffinity(be_process.pid)
    # the static variant: the pod dir keeps the full BE cpuset (every CPU kubelet does not own)
    pod_dir = lse_node.pod_dir(lse_node.pod("be"))
    assert set(parse_cpu_list(lse_node.read("cpuset", pod_dir, "cpuset.cpus"))) == set(online[:-1])
