"""Suppress, burst, memory QoS and memory eviction on a real cgroup v2 kernel (the VM stage of `make test`;
`make v2-check` alone). The host (cgroup v1) skips them. Same shape as test_real_kernel.py, with the v2
files: cpu.max, cpuset.cpus, cpu.max.burst, memory.min/low/high, memory.current.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest

from koordlet.api.cpuset import parse_cpu_list
from koordlet.api.keys import ANNOTATION_RESOURCE_STATUS
from koordlet.api.nodeslo import parse_node_slo_spec
from koordlet.api.pod import ContainerMeta
from koordlet.api.qos import KubeQoS, QoSClass
from koordlet.eviction import Evictor
from koordlet.qosmanager import QoSManagerConfig
from koordlet.statesinformer.cpumanager import CPUAssignment, CPUManagerState
from koordlet.system.cgroup import CgroupVersion
from tests.koordlet.qosmanager.factory import spec
from tests.koordlet.qosmanager.realnode import RealNode
from tests.support.apiserver import ApiServer, kube_api_client
from tests.support.v2guest import skip_unless_v2_writable
from tests.support.waiting import wait_for

# alone: suppression follows what the guest counts as the node's CPU use, which a busy host (whose stalls of the
# guest's vCPUs it counts as use) moves; in the guest these run once the host stage is done (tests/support/v2guest.py).
pytestmark = [pytest.mark.cgroupv2, pytest.mark.alone]

PODS = (("ls", QoSClass.LS, KubeQoS.BURSTABLE), ("be", QoSClass.BE, KubeQoS.BESTEFFORT))
CONTAINER_ID = "0123456789ab"
MiB = 1 << 20


def _v2_real_node(name: str, pods, min_cpus: int = 0) -> Iterator[RealNode]:
    """A RealNode on the guest's cgroup v2 (skips outside the VM stage), closed after the test."""
    skip_unless_v2_writable()
    node = RealNode(name[:20], pods, v2=True)
    try:
        assert node.fs.version is CgroupVersion.V2
        if min_cpus and len(parse_cpu_list(node.read("cpuset", "", "cpuset.cpus.effective"))) < min_cpus:
            pytest.skip(f"needs at least {min_cpus} CPUs (the VM stage gives 4)")
        yield node
    finally:
        node.close()


@pytest.fixture
def v2_node(request: pytest.FixtureRequest) -> Iterator[RealNode]:
    yield from _v2_real_node(request.node.name, PODS)


def _be_quota(node: RealNode) -> int:
    quota = node.be_quota()
    assert quota.period_us == 100000
    return quota.quota_us


def test_v2_suppress_cfs_quota_shrinks_cpu_max_under_ls_load_and_gives_it_back_after(v2_node: RealNode) -> None:
    cores = os.cpu_count() or 2
    v2_node.spawn("be")
    be_before = v2_node.cpu_cores(v2_node.be_dir, 0.5)
    ls_burners = [v2_node.spawn("ls") for _ in range(max(cores // 2, 1))]
    # Threshold 60 %: with half the CPUs burning for LS the budget is ~10 % of the node (minus system use).
    v2_node.start(spec(cpuSuppressThresholdPercent=60, cpuSuppressPolicy="cfsQuota"))
    assert wait_for(lambda: 0 < _be_quota(v2_node) < cores * 100000 * 0.35, 10.0), _be_quota(v2_node)
    shrunk = _be_quota(v2_node)
    assert shrunk >= 2000
    be_after = v2_node.cpu_cores(v2_node.be_dir, 1.0)
    assert be_after < be_before * 0.7 or be_after <= shrunk / 100000 * 1.2, (be_before, be_after, shrunk)
    # LS load gone: the budget grows back towards 60 % of the node (less system use), by at least the better
    # part of the cores the LS burners used.
    for p in ls_burners:
        p.kill()
        p.wait(10)
    assert wait_for(lambda: _be_quota(v2_node) >= shrunk + 0.4 * 100000 * max(cores // 2, 1), 15.0), (
        shrunk, _be_quota(v2_node))


def test_v2_suppress_cpuset_shrinks_cpuset_cpus_under_ls_load_and_gives_it_back_after(v2_node: RealNode) -> None:
    total = len(parse_cpu_list(v2_node.read("cpuset", "", "cpuset.cpus.effective")))
    if total < 4:
        pytest.skip("needs at least 4 CPUs to see the BE cpuset shrink (the VM stage gives 4)")
    be_process = v2_node.spawn("be")
    ls_burners = [v2_node.spawn("ls") for _ in range(total // 2)]
    # Threshold 75 %: LS burns half the node, so the BE budget is ~1 CPU, the floor of the cpuset policy 2.
    v2_node.start(spec(cpuSuppressThresholdPercent=75))
    be_cpus = lambda: parse_cpu_list(v2_node.read("cpuset", v2_node.be_dir, "cpuset.cpus"))  # noqa: E731
    assert wait_for(lambda: 2 <= len(be_cpus()) < total, 10.0), be_cpus()
    shrunk = be_cpus()
    assert set(os.sched_getaffinity(be_process.pid)) <= set(shrunk)  # the kernel moved the BE process too
    for p in ls_burners:
        p.kill()
        p.wait(10)
    assert wait_for(lambda: len(be_cpus()) > len(shrunk), 15.0), (shrunk, be_cpus())


def test_v2_memory_over_threshold_under_real_pressure_evicts_the_be_pod(v2_node: RealNode) -> None:
    """As on v1 (test_real_kernel.py): the threshold is what the BE pod's own v2 cgroup holds, never the guest's
    use."""
    allocate = v2_node.node.capacity["memory"] * 5 // 100
    with ApiServer() as server, kube_api_client(server) as api_client:
        v2_node.put_pod_in_api("be", api_client)
        config = QoSManagerConfig(node_name="node-1", feature_gates={"BEMemoryEvict": True, "BECPUSuppress": False,
                                                                     "CPUBurst": False, "RdtResctrl": False})
        v2_node.start(spec(memoryEvictThresholdPercent=99), evictor=Evictor("node-1", api_client=api_client),
                      config=config)
        v2_node.spawn("be", f"data = bytearray({allocate})\nfor i in range(0, len(data), 4096):\n    data[i] = 1\n"
                      "import time\ntime.sleep(60)\n")
        # The memory really is charged to the BE pod's v2 cgroup.
        assert wait_for(lambda: v2_node.anon_bytes("be") >= allocate * 0.9, 30.0), (v2_node.anon_bytes("be"), allocate)
        time.sleep(2.0)
        assert not server.requests("POST", r"/eviction$"), "evicted below the threshold"
        v2_node.states.set_node_slo(spec(memoryEvictThresholdPercent=v2_node.evict_threshold_held_by("be")))
        assert wait_for(lambda: bool(server.requests("POST", r"/pods/be/eviction$")), 20.0)
        assert not server.requests("POST", r"/pods/ls/eviction$")


def test_v2_burst_writes_cpu_max_burst(v2_node: RealNode) -> None:
    container = ContainerMeta("app", container_id=CONTAINER_ID, limits={"cpu": 1000})
    container_dir = v2_node.add_container("ls", container)
    v2_node.groups.write("", container_dir.removeprefix(v2_node.groups.prefix).strip("/"), "cpu.max", "100000 100000")
    v2_node.start(parse_node_slo_spec({"cpuBurstStrategy": {"policy": "cpuBurstOnly", "cpuBurstPercent": 50}}),
                  config=QoSManagerConfig(feature_gates={"BECPUSuppress": False, "RdtResctrl": False}))
    assert wait_for(lambda: v2_node.read("cpu", container_dir, "cpu.max.burst") == "50000", 5.0)


def test_v2_memory_qos_writes_min_low_high(v2_node: RealNode) -> None:
    container = ContainerMeta("app", container_id=CONTAINER_ID, requests={"memory": 256 * MiB},
                              limits={"memory": 512 * MiB})
    container_dir = v2_node.add_container("ls", container)
    pod_dir = v2_node.pod_dir(v2_node.pod("ls"))
    slo = parse_node_slo_spec({"resourceQOSStrategy": {"lsClass": {"memoryQOS": {
        "enable": True, "minLimitPercent": 100, "lowLimitPercent": 100, "throttlingPercent": 50}}}})
    v2_node.start(slo, config=QoSManagerConfig(feature_gates={"CgroupReconcile": True, "BECPUSuppress": False,
                                                              "CPUBurst": False, "RdtResctrl": False}))
    burstable = v2_node.layout.qos_dir(KubeQoS.BURSTABLE)
    want = {(pod_dir, "memory.min"): str(256 * MiB), (pod_dir, "memory.low"): str(256 * MiB),
            (container_dir, "memory.high"): str(384 * MiB),  # 256 + (512 − 256) × 50 %
            (burstable, "memory.min"): str(256 * MiB), (burstable, "memory.low"): str(256 * MiB)}
    got = lambda: {k: v2_node.read("memory", *k) for k in want}  # noqa: E731
    # All of them, not one then the rest: on v2 a tick writes children before parents (leveled update), so
    # the kubepods QoS dir is the last write of the tick, and reading it once right after the pod's value
    # appeared races the manager's thread (the "burstable memory.min 0" first seen in the VM).
    assert wait_for(lambda: got() == want, 10.0), {k: (v, want[k]) for k, v in got().items() if v != want[k]}


def test_v2_memory_qos_leaves_local_mode_pods_alone_and_writes_them_with_specs(v2_node: RealNode) -> None:
    """Pods from the CRI pod source (local mode, ``requests_known`` False) keep their memory.min/low/high and
    so do their QoS dirs; the same pods with their specs get the right values."""
    container = ContainerMeta("app", container_id=CONTAINER_ID, requests={"memory": 256 * MiB},
                              limits={"memory": 512 * MiB})
    container_dir = v2_node.add_container("ls", container)
    pod_dir = v2_node.pod_dir(v2_node.pod("ls"))
    burstable = v2_node.layout.qos_dir(KubeQoS.BURSTABLE)
    before = {(pod_dir, "memory.min"): str(8 * MiB), (pod_dir, "memory.low"): str(8 * MiB),
              (container_dir, "memory.high"): str(64 * MiB),
              (burstable, "memory.min"): str(8 * MiB), (burstable, "memory.low"): str(8 * MiB)}
    for (cgroup_dir, name), value in before.items():  # someone's values, not ours
        with open(os.path.join(v2_node.fs.cgroup_dir("memory", cgroup_dir), name), "w") as f:
            f.write(value)
    with_specs = list(v2_node.states.pods())
    v2_node.states.set_pods([replace(p, requests_known=False) for p in with_specs])
    slo = parse_node_slo_spec({"resourceQOSStrategy": {"lsClass": {"memoryQOS": {
        "enable": True, "minLimitPercent": 100, "lowLimitPercent": 100, "throttlingPercent": 50}}}})
    manager = v2_node.start(slo, config=QoSManagerConfig(feature_gates={
        "CgroupReconcile": True, "BECPUSuppress": False, "CPUBurst": False, "RdtResctrl": False}))
    got = lambda: {k: v2_node.read("memory", *k) for k in before}  # noqa: E731
    assert wait_for(lambda: manager.last_record("memoryqos") is not None, 10.0)
    time.sleep(2.5)  # two more ticks
    assert got() == before
    v2_node.states.set_pods(with_specs)
    want = {(pod_dir, "memory.min"): str(256 * MiB), (pod_dir, "memory.low"): str(256 * MiB),
            (container_dir, "memory.high"): str(384 * MiB),
            (burstable, "memory.min"): str(256 * MiB), (burstable, "memory.low"): str(256 * MiB)}
    assert wait_for(lambda: got() == want, 10.0), {k: (v, want[k]) for k, v in got().items() if v != want[k]}


LSE_PODS = (("lse", QoSClass.LSE, KubeQoS.GUARANTEED), ("ls", QoSClass.LS, KubeQoS.BURSTABLE),
            ("be", QoSClass.BE, KubeQoS.BESTEFFORT))


@pytest.fixture
def v2_lse_node(request: pytest.FixtureRequest) -> Iterator[RealNode]:
    yield from _v2_real_node(request.node.name, LSE_PODS, min_cpus=4)


def test_v2_an_lse_pods_cpus_stay_out_of_the_be_cpuset_while_ls_load_rises(v2_lse_node: RealNode) -> None:
    node = v2_lse_node
    online = parse_cpu_list(node.read("cpuset", "", "cpuset.cpus.effective"))
    lse_cpu = online[-1]
    bound = {ANNOTATION_RESOURCE_STATUS: json.dumps({"cpuset": str(lse_cpu)})}
    node.states.set_pods([replace(p, annotations=bound) if p.name == "lse" else p for p in node.states.pods()])
    node.pods = list(node.states.pods())
    be_process = node.spawn("be")
    burners = [node.spawn("ls") for _ in range(len(online) // 2)]
    node.start(spec(cpuSuppressThresholdPercent=75))
    be_cpus = lambda: set(parse_cpu_list(node.read("cpuset", node.be_dir, "cpuset.cpus")))  # noqa: E731
    assert wait_for(lambda: lse_cpu not in be_cpus() and 2 <= len(be_cpus()) < len(online) - 1, 15.0), be_cpus()
    for _ in range(4):  # LS load keeps rising and falling; LSE's CPU never comes back to BE
        time.sleep(0.5)
        assert lse_cpu not in be_cpus() and lse_cpu not in os.sched_getaffinity(be_process.pid)
    for burner in burners:
        burner.kill()
        burner.wait(10)
    assert wait_for(lambda: be_cpus() == set(online) - {lse_cpu}, 15.0), be_cpus()  # given back, but not LSE's


def test_v2_static_policy_keeps_kubelets_cpus_out_and_suppresses_at_container_level(v2_lse_node: RealNode) -> None:
    node = v2_lse_node
    online = parse_cpu_list(node.read("cpuset", "", "cpuset.cpus.effective"))
    exclusive = online[-1]
    state = CPUManagerState(policy="static", default_cpuset=frozenset(online[:-1]),
                            assignments=(CPUAssignment(frozenset({exclusive}), pod_uid="guaranteed-uid",
                                                       container_name="main"),))
    container_dir = node.add_container("be", ContainerMeta("job", CONTAINER_ID))  # no process: not a leaf
    burners = [node.spawn("ls") for _ in range(len(online) // 2)]
    node.start(spec(cpuSuppressThresholdPercent=75), cpu_manager=lambda: state)
    read = lambda d: set(parse_cpu_list(node.read("cpuset", d, "cpuset.cpus")))  # noqa: E731
    full = set(online) - {exclusive}
    # the container holds the suppressed cpuset; the QoS and pod dirs keep every CPU kubelet does not own
    assert wait_for(lambda: 2 <= len(read(container_dir)) < len(full), 15.0), read(container_dir)
    assert exclusive not in read(container_dir)
    assert read(node.be_dir) == full and read(node.pod_dir(node.pod("be"))) == full
    for burner in burners:
        burner.kill()
        burner.wait(10)
