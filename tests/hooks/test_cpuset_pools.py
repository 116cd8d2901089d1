"""The cpuset hook with the node's CPU pools and kubelet's CPU manager policy.

Koordinator's order, docs/koordinator.md §3.3."""

from __future__ import annotations

import json

from hooks import cpuset
from hooks.protocol import Changes, ContainerContext, NodeContext
from koordlet.api.cpupools import compute_cpu_pools
from koordlet.api.pod import PodMeta
from koordlet.api.qos import KubeQoS
from koordlet.statesinformer.cpumanager import CPUAssignment, CPUManagerState
from koordlet.system.sysfs import CPUInfo

CPUS = tuple(CPUInfo(cpu_id=i, core_id=i, socket_id=0, node_id=0) for i in range(8))


def _pod(name: str, qos: str | None, kube_qos: KubeQoS, cpuset_cpus: str = "") -> PodMeta:
    annotations = {"scheduling.koordinator.sh/resource-status": json.dumps({"cpuset": cpuset_cpus})} \
        if cpuset_cpus else {}
    return PodMeta(name=name, namespace="ns", uid=f"uid-{name}", labels={"koordinator.sh/qosClass": qos} if qos else {},
                   annotations=annotations, kube_qos=kube_qos, phase="Running",
                   cgroup_parent=f"/kubepods/{kube_qos.value.lower()}/poduid-{name}")


LSE = _pod("lse", "LSE", KubeQoS.GUARANTEED, "6-7")
LSR = _pod("lsr", "LSR", KubeQoS.GUARANTEED, "4-5")
LS = _pod("ls", "LS", KubeQoS.BURSTABLE)
BE = _pod("be", "BE", KubeQoS.BESTEFFORT)
PLAIN = _pod("plain", None, KubeQoS.GUARANTEED)


def _node(policy: str, exclusive: frozenset[int] = frozenset()) -> NodeContext:
    state = CPUManagerState(policy=policy, assignments=(CPUAssignment(exclusive, pod_uid="uid-plain",
                                                                       container_name="c"),) if exclusive else ())
    pools = compute_cpu_pools(CPUS, (LSE, LSR, LS, BE, PLAIN), state, {})
    return NodeContext(cpu_pools=pools, kubelet_cpu_policy=policy)


def _cpuset(node: NodeContext, pod: PodMeta) -> Changes:
    return cpuset.container(ContainerContext(pod, "c"), cpuset.rule(node))


def test_lse_and_lsr_get_the_schedulers_cpus_and_ls_the_shared_pool_without_them() -> None:
    node = _node("none")
    assert _cpuset(node, LSE) == Changes(cpuset_cpus="6-7", cfs_quota_us=-1)
    assert _cpuset(node, LSR) == Changes(cpuset_cpus="4-5", cfs_quota_us=-1)
    assert _cpuset(node, LS) == Changes(cpuset_cpus="0-3")  # LSE and LSR CPUs are out of the shared pool
    assert _cpuset(node, BE) == Changes(cpuset_cpus="")  # follows the besteffort parent (suppress's cpuset)
    assert _cpuset(node, PLAIN) == Changes(cpuset_cpus="0-3")  # policy none: the shared pool


def test_static_policy_leaves_kubelets_pods_alone_and_keeps_its_exclusive_cpus_out_of_the_pool() -> None:
    node = _node("static", frozenset({2, 3}))
    assert not _cpuset(node, PLAIN)  # kubelet owns its cpuset
    assert _cpuset(node, LS) == Changes(cpuset_cpus="0-1")  # kubelet's exclusive 2-3 and LSE/LSR are out
    assert node.cpu_pools is not None and not {2, 3, 6, 7} & node.cpu_pools.be_shared_cpus


def test_unknown_pools_or_policy_change_nothing_for_unbound_pods() -> None:
    assert not _cpuset(NodeContext(), LS) and not _cpuset(NodeContext(), PLAIN)
    unknown_policy = NodeContext(cpu_pools=_node("none").cpu_pools, kubelet_cpu_policy="")
    assert not _cpuset(unknown_policy, PLAIN)
    assert _cpuset(unknown_policy, LS) == Changes(cpuset_cpus="0-3")


# -------------------------------------------------------------------------------- NUMA allocations

CPUS_2NUMA = tuple(CPUInfo(cpu_id=i, core_id=i, socket_id=0, node_id=i // 4) for i in range(8))


def _numa_pod(name: str, qos: str, kube_qos: KubeQoS, node: int, resource: str) -> PodMeta:
    status = {"numaNodeResources": [{"node": node, "resources": {resource: "2" if resource == "cpu" else "2000"}}]}
    return PodMeta(name=name, namespace="ns", uid=f"uid-{name}", labels={"koordinator.sh/qosClass": qos},
                   annotations={"scheduling.koordinator.sh/resource-status": json.dumps(status)}, kube_qos=kube_qos,
                   phase="Running")


def test_numa_allocations_get_their_nodes_pools_be_only_with_the_be_cpu_manager() -> None:
    be = _numa_pod("be-numa", "BE", KubeQoS.BESTEFFORT, 1, "kubernetes.io/batch-cpu")
    ls = _numa_pod("ls-numa", "LS", KubeQoS.BURSTABLE, 0, "cpu")
    pools = compute_cpu_pools(CPUS_2NUMA, (LSE, be, ls), CPUManagerState(policy="none"), {})
    # LSE holds 6-7 on node 1: out of both pools
    with_manager = NodeContext(cpu_pools=pools, kubelet_cpu_policy="none", be_cpu_manager=True)
    assert _cpuset(with_manager, be) == Changes(cpuset_cpus="4-5")  # node 1's BE shared pool
    assert _cpuset(with_manager, ls) == Changes(cpuset_cpus="0-3")  # node 0's LS shared pool
    without = NodeContext(cpu_pools=pools, kubelet_cpu_policy="none")
    assert _cpuset(without, be) == Changes(cpuset_cpus="")  # follows the besteffort parent, as before
    assert _cpuset(without, ls) == Changes(cpuset_cpus="0-3")
