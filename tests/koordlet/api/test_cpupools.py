"""CPU pools by Koordinator's statesinformer rules: LSE out of both pools, LSR out of the LS pool only, kubelet's
static exclusive CPUs out of both, node reservation and exclusive SYSTEM-QoS CPUs out of both."""

from __future__ import annotations

import json
from pathlib import Path

from koordlet.api.cpupools import CPUPools, CPUSharedPool, PodCPUAlloc, compute_cpu_pools, take_by_topology
from koordlet.api.keys import (
    ANNOTATION_NODE_RESERVATION,
    ANNOTATION_NODE_SYSTEM_QOS_RESOURCE,
    ANNOTATION_RESOURCE_STATUS,
    LABEL_QOS_CLASS,
)
from koordlet.api.pod import PodMeta
from koordlet.statesinformer.cpumanager import CPUAssignment, CPUManagerState
from koordlet.system.sysfs import CPUInfo, read_node_topology
from tests.koordlet.system.topology_tree import build_tree, four_numa_with_holes, two_sockets_smt


def _cpus(tmp_path: Path, machine=two_sockets_smt) -> tuple[CPUInfo, ...]:
    described = machine()
    root = tmp_path / described.name
    sys_dir = str(root / "sys") if root.exists() else build_tree(root, described)
    return read_node_topology(sys_dir).cpus


def _pod(name: str, qos: str = "", cpuset: str = "", phase: str = "Running") -> PodMeta:
    annotations = {ANNOTATION_RESOURCE_STATUS: json.dumps({"cpuset": cpuset})} if cpuset else {}
    labels = {LABEL_QOS_CLASS: qos} if qos else {}
    return PodMeta(name=name, namespace="default", uid=f"uid-{name}", labels=labels, annotations=annotations,
                   phase=phase)


def _sets(pools: tuple[CPUSharedPool, ...]) -> list[tuple[int, int, str]]:
    return [(p.socket, p.node, p.cpuset) for p in pools]


def test_no_pods_no_kubelet_every_cpu_is_in_both_pools_per_socket_and_node(tmp_path: Path) -> None:
    pools = compute_cpu_pools(_cpus(tmp_path), [])
    assert _sets(pools.shared) == [(0, 0, "0-3,8-11"), (1, 1, "4-7,12-15")]
    assert pools.be_shared == pools.shared and pools.pod_allocs == () and pools.problems == ()


def test_lse_leaves_both_pools_lsr_only_the_ls_pool(tmp_path: Path) -> None:
    pods = [_pod("lse", "LSE", "0,8"), _pod("lsr", "LSR", "1,9"), _pod("ls", "LS"), _pod("be", "BE"),
            _pod("done", "LSE", "2", phase="Succeeded")]
    pools = compute_cpu_pools(_cpus(tmp_path), pods)
    assert _sets(pools.shared) == [(0, 0, "2-3,10-11"), (1, 1, "4-7,12-15")]
    assert _sets(pools.be_shared) == [(0, 0, "1-3,9-11"), (1, 1, "4-7,12-15")]  # BE may use LSR CPUs
    assert [(a.name, a.cpus, a.managed_by_kubelet) for a in pools.pod_allocs] == [
        ("lse", (0, 8), False), ("lsr", (1, 9), False)]


def test_kubelet_static_exclusive_cpus_leave_both_pools_but_reserved_stay(tmp_path: Path) -> None:
    kubelet = CPUManagerState(
        policy="static", options={"full-pcpus-only": "true"}, reserved_cpus=frozenset({0, 8}),
        assignments=(
            CPUAssignment(cpus=frozenset({4, 12}), pod_uid="uid-guaranteed", container_name="app"),
            CPUAssignment(cpus=frozenset({5, 13}), pod_uid="uid-guaranteed", container_name="sidecar"),
            CPUAssignment(cpus=frozenset({6}), pod_uid="uid-gone", container_name="app"),
            # Koordinator's pods: the checkpoint may list them, the koordlet owns their cpusets
            CPUAssignment(cpus=frozenset({7}), pod_uid="uid-ls", container_name="app"),
            CPUAssignment(cpus=frozenset({1}), pod_uid="uid-lsr", container_name="app"),
        ))
    pods = [_pod("guaranteed"), _pod("ls", "LS"), _pod("lsr", "LSR", "1")]
    pools = compute_cpu_pools(_cpus(tmp_path), pods, kubelet)
    assert _sets(pools.shared) == [(0, 0, "0,2-3,8-11"), (1, 1, "7,14-15")]  # reserved 0,8 stay (Koordinator)
    assert _sets(pools.be_shared) == [(0, 0, "0-3,8-11"), (1, 1, "7,14-15")]
    assert [a.to_json() for a in pools.pod_allocs] == [  # sorted by UID, as Koordinator
        {"uid": "uid-gone", "cpuset": "6", "managedByKubelet": True},
        {"namespace": "default", "name": "guaranteed", "uid": "uid-guaranteed", "cpuset": "4-5,12-13",
         "managedByKubelet": True},
        {"namespace": "default", "name": "lsr", "uid": "uid-lsr", "cpuset": "1"},
    ]
    assert pools.kubelet_exclusive_cpus == {4, 5, 6, 12, 13}
    strict = compute_cpu_pools(_cpus(tmp_path), pods, kubelet, exclude_kubelet_reserved=True)
    assert _sets(strict.shared) == [(0, 0, "2-3,9-11"), (1, 1, "7,14-15")]
    # the none policy: kubelet binds nothing, whatever its checkpoint says
    none = compute_cpu_pools(_cpus(tmp_path), pods, CPUManagerState(policy="none", assignments=kubelet.assignments))
    assert none.kubelet_exclusive_cpus == frozenset() and none.be_shared_cpus == frozenset(range(16))


def test_node_reservation_and_exclusive_system_qos_leave_both_pools(tmp_path: Path) -> None:
    annotations = {ANNOTATION_NODE_RESERVATION: '{"reservedCPUs":"0-3,8-11"}',
                   ANNOTATION_NODE_SYSTEM_QOS_RESOURCE: '{"cpuset":"4"}'}
    pools = compute_cpu_pools(_cpus(tmp_path), [], node_annotations=annotations)
    # the node 0 pool stays, empty, as in Koordinator (its JSON then has no cpuset)
    assert _sets(pools.shared) == [(0, 0, ""), (1, 1, "5-7,12-15")] and pools.be_shared == pools.shared
    assert pools.shared[0].to_json() == {"socket": 0, "node": 0}
    assert pools.node_reserved_cpus == (0, 1, 2, 3, 8, 9, 10, 11) and pools.system_qos_cpus == (4,)
    shared_system = {ANNOTATION_NODE_SYSTEM_QOS_RESOURCE: '{"cpuset":"4","cpusetExclusive":false}'}
    assert compute_cpu_pools(_cpus(tmp_path), [], node_annotations=shared_system).shared_cpus == set(range(16))


def test_reservation_by_amount_takes_whole_cores_first(tmp_path: Path) -> None:
    cpus = _cpus(tmp_path)
    assert take_by_topology(cpus, 2) == (0, 8)  # one physical core: cpu0 and its sibling
    assert take_by_topology(cpus, 3) == (0, 1, 8)
    assert take_by_topology(cpus, 8) == (0, 1, 2, 3, 8, 9, 10, 11)  # the whole socket 0
    pools = compute_cpu_pools(cpus, [], node_annotations={ANNOTATION_NODE_RESERVATION: '{"resources":{"cpu":"1500m"}}'})
    assert pools.node_reserved_cpus == (0, 8) and 0 not in pools.shared_cpus


def test_bad_annotations_are_skipped_and_named(tmp_path: Path) -> None:
    bad_pod = PodMeta(name="bad", namespace="default", uid="uid-bad",
                      annotations={ANNOTATION_RESOURCE_STATUS: '{"cpuset":"3-1"}'})
    pools = compute_cpu_pools(_cpus(tmp_path), [bad_pod], node_annotations={
        ANNOTATION_NODE_RESERVATION: "{", ANNOTATION_NODE_SYSTEM_QOS_RESOURCE: '{"cpuset":7}'})
    assert pools.shared_cpus == set(range(16))
    assert len(pools.problems) == 3 and pools.problems[0].startswith("pod default/bad: ")


def test_pools_on_four_numa_nodes_with_holes_follow_nodes_not_numbering(tmp_path: Path) -> None:
    pools = compute_cpu_pools(_cpus(tmp_path, four_numa_with_holes), [_pod("lse", "LSE", "6-7")])
    assert _sets(pools.shared) == [(0, 0, "0-1,8-9"), (0, 1, "2,10"), (1, 2, "4-5,12-13"), (1, 3, "15")]
    assert pools.be_shared == pools.shared
    assert isinstance(pools, CPUPools) and PodCPUAlloc(uid="u", cpus=()).to_json() == {"uid": "u"}
