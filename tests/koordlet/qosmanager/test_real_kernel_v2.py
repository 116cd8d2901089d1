"""Suppress, burst and memory QoS on a real cgroup v2 kernel (the device machine; `make v2-check`).

Skipped here: this machine has cgroup v1 only. Same shape as test_real_kernel.py, with the v2 files:
cpu.max, cpuset.cpus, cpu.max.burst, memory.min/low/high.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest

from koordlet.api.cpuset import parse_cpu_list
from koordlet.api.nodeslo import parse_node_slo_spec
from koordlet.api.pod import ContainerMeta
from koordlet.api.qos import KubeQoS, QoSClass
from koordlet.qosmanager import QoSManagerConfig
from koordlet.system.cgroup import CgroupVersion
from tests.koordlet.qosmanager.factory import spec
from tests.koordlet.qosmanager.realnode import RealNode, skip_unless_v2_writable

pytestmark = pytest.mark.cgroupv2

PODS = (("ls", QoSClass.LS, KubeQoS.BURSTABLE), ("be", QoSClass.BE, KubeQoS.BESTEFFORT))
CONTAINER_ID = "0123456789ab"
MiB = 1 << 20


@pytest.fixture
def v2_node(request: pytest.FixtureRequest) -> Iterator[RealNode]:
    skip_unless_v2_writable()
    node = RealNode(request.node.name[:20], PODS, v2=True)
    try:
        assert node.fs.version is CgroupVersion.V2
        yield node
    finally:
        node.close()


def _wait_for(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def _with_container(node: RealNode, pod_name: str, container: ContainerMeta) -> str:
    """Give a pod one container dir (a leaf) and return it."""
    pod = node.pod(pod_name)
    pod_dir = node.pod_dir(pod)
    container_dir = f"{pod_dir}/{container.container_id}"
    node.groups.make(container_dir.removeprefix(node.groups.prefix).strip("/"))
    node.states.set_pods([replace(p, containers=(container,)) if p.name == pod_name else p
                          for p in node.states.pods()])
    node.pods = list(node.states.pods())
    return container_dir


def test_v2_suppress_cfs_quota_writes_cpu_max_and_cuts_the_be_share(v2_node: RealNode) -> None:
    v2_node.spawn("be")
    be_before = v2_node.cpu_cores(v2_node.be_dir, 0.5)
    for _ in range(max((os.cpu_count() or 2) // 2, 1)):
        v2_node.spawn("ls")
    v2_node.start(spec(cpuSuppressThresholdPercent=10, cpuSuppressPolicy="cfsQuota"))
    assert _wait_for(lambda: not v2_node.read("cpu", v2_node.be_dir, "cpu.max").startswith("max"), 5.0)
    quota, period = v2_node.read("cpu", v2_node.be_dir, "cpu.max").split()
    assert int(period) == 100000 and int(quota) >= 2000
    be_after = v2_node.cpu_cores(v2_node.be_dir, 0.5)
    assert be_after < be_before * 0.7 or be_after <= int(quota) / 100000 * 1.2


def test_v2_suppress_cpuset_writes_cpuset_cpus(v2_node: RealNode) -> None:
    total = len(parse_cpu_list(v2_node.read("cpuset", "", "cpuset.cpus.effective")))
    if total < 4:
        pytest.skip("needs at least 4 CPUs to see the BE cpuset shrink")
    v2_node.spawn("be")
    v2_node.spawn("ls")
    v2_node.start(spec(cpuSuppressThresholdPercent=10))
    assert _wait_for(lambda: v2_node.read("cpuset", v2_node.be_dir, "cpuset.cpus") != "", 5.0)
    cpus = parse_cpu_list(v2_node.read("cpuset", v2_node.be_dir, "cpuset.cpus"))
    assert 2 <= len(cpus) < total


def test_v2_burst_writes_cpu_max_burst(v2_node: RealNode) -> None:
    container = ContainerMeta("app", container_id=CONTAINER_ID, limits={"cpu": 1000})
    container_dir = _with_container(v2_node, "ls", container)
    v2_node.groups.write("", container_dir.removeprefix(v2_node.groups.prefix).strip("/"), "cpu.max", "100000 100000")
    v2_node.start(parse_node_slo_spec({"cpuBurstStrategy": {"policy": "cpuBurstOnly", "cpuBurstPercent": 50}}),
                  config=QoSManagerConfig(feature_gates={"BECPUSuppress": False, "RdtResctrl": False}))
    assert _wait_for(lambda: v2_node.read("cpu", container_dir, "cpu.max.burst") == "50000", 5.0)


def test_v2_memory_qos_writes_min_low_high(v2_node: RealNode) -> None:
    container = ContainerMeta("app", container_id=CONTAINER_ID, requests={"memory": 256 * MiB},
                              limits={"memory": 512 * MiB})
    container_dir = _with_container(v2_node, "ls", container)
    pod_dir = v2_node.pod_dir(v2_node.pod("ls"))
    slo = parse_node_slo_spec({"resourceQOSStrategy": {"lsClass": {"memoryQOS": {
        "enable": True, "minLimitPercent": 100, "lowLimitPercent": 100, "throttlingPercent": 50}}}})
    v2_node.start(slo, config=QoSManagerConfig(feature_gates={"CgroupReconcile": True, "BECPUSuppress": False,
                                                              "CPUBurst": False, "RdtResctrl": False}))
    assert _wait_for(lambda: v2_node.read("memory", pod_dir, "memory.min") == str(256 * MiB), 5.0)
    assert v2_node.read("memory", pod_dir, "memory.low") == str(256 * MiB)
    assert v2_node.read("memory", container_dir, "memory.high") == str(384 * MiB)  # 256 + (512 − 256) × 50 %
    burstable = v2_node.layout.qos_dir(KubeQoS.BURSTABLE)
    assert int(v2_node.read("memory", burstable, "memory.min")) == 256 * MiB
