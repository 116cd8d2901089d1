"""NodeResourceTopology reporting against the project's API server (the chart's CRD, files/crds, validates
every write), on fixture machines and on this host. Each object is decoded the way Koordinator's scheduler decodes
it: only the JSON field names of its structs (apis/extension/numa_aware.go) are accepted."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest

from koordlet.api.cpupools import compute_cpu_pools
from koordlet.api.keys import (
    ANNOTATION_NODE_RESERVATION,
    ANNOTATION_NODE_SYSTEM_QOS_RESOURCE,
    ANNOTATION_NRT_BE_CPU_SHARED_POOLS,
    ANNOTATION_NRT_CPU_SHARED_POOLS,
    ANNOTATION_NRT_CPU_TOPOLOGY,
    ANNOTATION_NRT_KUBELET_CPU_MANAGER_POLICY,
    ANNOTATION_NRT_POD_CPU_ALLOCS,
    ANNOTATION_RESOURCE_STATUS,
    LABEL_QOS_CLASS,
)
from koordlet.api.pod import PodMeta
from koordlet.kubeapi import CustomObjects
from koordlet.kubeclient.checkpoint import ApiCheckpoint
from koordlet.reporters.nrt import (
    NRTReporter,
    NRTReportLoop,
    build_nrt,
    change_reason,
    format_bytes,
    logical_core_ids,
)
from koordlet.statesinformer.cpumanager import CPUAssignment, CPUManagerState
from koordlet.system.sysfs import NodeTopology, read_node_topology
from tests.koordlet.system.topology_tree import MACHINES, build_tree, four_numa_with_holes, two_sockets_smt
from tests.support.apiserver import ApiServer, kube_api_client

NODE = "node-1"
NODE_UID = "8f0c3a52-1c1e-4a9e-9a53-2f1b1f3e0a01"
PLURAL = "noderesourcetopologies"

# Koordinator's structs and their JSON names (apis/extension/numa_aware.go, node_reservation.go, system_qos.go)
CPU_INFO = {"id", "core", "socket", "node"}
CPU_SHARED_POOL = {"socket", "node", "cpuset"}
KUBELET_POLICY = {"policy", "options", "reservedCPUs"}
POD_CPU_ALLOC = {"namespace", "name", "uid", "cpuset", "managedByKubelet"}
NODE_RESERVATION = {"resources", "reservedCPUs", "applyPolicy"}
SYSTEM_QOS = {"cpuset", "cpusetExclusive"}


def decode_as_koordinator(annotations: dict[str, str]) -> dict[str, Any]:
    """Decode every annotation into its Koordinator struct shape; fail on any field those structs lack."""
    def fields(obj: object, allowed: set[str], where: str) -> dict:
        assert isinstance(obj, dict), where
        assert set(obj) <= allowed, f"{where}: {set(obj) - allowed} are not fields of Koordinator's struct"
        return obj

    topology = fields(json.loads(annotations[ANNOTATION_NRT_CPU_TOPOLOGY]), {"detail"}, "CPUTopology")
    detail = [fields(c, CPU_INFO, "CPUInfo") for c in topology.get("detail", [])]
    assert all(set(c) == CPU_INFO and all(isinstance(v, int) for v in c.values()) for c in detail)
    pools = {key: [fields(p, CPU_SHARED_POOL, "CPUSharedPool") for p in json.loads(annotations[key]) or []]
             for key in (ANNOTATION_NRT_CPU_SHARED_POOLS, ANNOTATION_NRT_BE_CPU_SHARED_POOLS)}
    policy = fields(json.loads(annotations[ANNOTATION_NRT_KUBELET_CPU_MANAGER_POLICY]), KUBELET_POLICY,
                    "KubeletCPUManagerPolicy")
    allocs = [fields(a, POD_CPU_ALLOC, "PodCPUAlloc") for a in json.loads(annotations[ANNOTATION_NRT_POD_CPU_ALLOCS])
              or []]
    reservation = fields(json.loads(annotations[ANNOTATION_NODE_RESERVATION]), NODE_RESERVATION, "NodeReservation")
    system = fields(json.loads(annotations[ANNOTATION_NODE_SYSTEM_QOS_RESOURCE]), SYSTEM_QOS, "SystemQOSResource")
    return {"detail": detail, "shared": pools[ANNOTATION_NRT_CPU_SHARED_POOLS],
            "be_shared": pools[ANNOTATION_NRT_BE_CPU_SHARED_POOLS], "policy": policy, "allocs": allocs,
            "reservation": reservation, "system": system}


def _pod(name: str, qos: str = "", cpuset: str = "") -> PodMeta:
    annotations = {ANNOTATION_RESOURCE_STATUS: json.dumps({"cpuset": cpuset})} if cpuset else {}
    return PodMeta(name=name, namespace="default", uid=f"uid-{name}",
                   labels={LABEL_QOS_CLASS: qos} if qos else {}, annotations=annotations, phase="Running")


STATIC = CPUManagerState(policy="static", options={"full-pcpus-only": "true"}, reserved_cpus=frozenset({0, 8}),
                         assignments=(CPUAssignment(cpus=frozenset({7, 15}), pod_uid="uid-guaranteed",
                                                    container_name="app"),))


@pytest.fixture
def server() -> Iterator[ApiServer]:
    with ApiServer() as started:
        yield started


@pytest.fixture
def custom(server: ApiServer) -> Iterator[CustomObjects]:
    with kube_api_client(server) as api:
        yield CustomObjects(api)


def _topology(tmp_path: Path, machine=two_sockets_smt) -> NodeTopology:
    return read_node_topology(build_tree(tmp_path, machine()))


def test_two_socket_nrt_decodes_with_koordinators_field_names(tmp_path: Path, server: ApiServer, custom) -> None:
    topology = _topology(tmp_path)
    pods = [_pod("lse", "LSE", "1,9"), _pod("lsr", "LSR", "2,10"), _pod("guaranteed")]
    node_annotations = {ANNOTATION_NODE_RESERVATION: '{"resources":{"cpu":"2"},"applyPolicy":"ReservedCPUsOnly"}',
                        ANNOTATION_NODE_SYSTEM_QOS_RESOURCE: '{"cpuset":"6"}'}
    pools = compute_cpu_pools(topology.cpus, pods, STATIC, node_annotations)
    nrt = build_nrt(NODE, topology, pools, STATIC, node_annotations, NODE_UID)
    reporter = NRTReporter(NODE, custom)
    assert reporter.write(nrt)[0] == "created"
    stored = server.get_object(PLURAL, NODE)
    assert stored is not None and stored["zones"] == nrt["zones"]  # the CRD schema kept every field
    decoded = decode_as_koordinator(stored["metadata"]["annotations"])
    # siblings cpuK/cpuK+8 share a node-wide core id; socket 1's core ids do not repeat socket 0's
    assert [(c["id"], c["core"], c["socket"], c["node"]) for c in decoded["detail"]][::4] == [
        (0, 0, 0, 0), (4, 4, 1, 1), (8, 0, 0, 0), (12, 4, 1, 1)]
    assert len({c["core"] for c in decoded["detail"]}) == 8
    # a reservation of 2 CPUs takes a whole core (0 and 8); SYSTEM QoS 6 is exclusive; kubelet has 7,15
    assert decoded["shared"] == [{"socket": 0, "node": 0, "cpuset": "3,11"},
                                 {"socket": 1, "node": 1, "cpuset": "4-5,12-14"}]
    assert decoded["be_shared"] == [{"socket": 0, "node": 0, "cpuset": "2-3,10-11"},
                                    {"socket": 1, "node": 1, "cpuset": "4-5,12-14"}]
    assert decoded["policy"] == {"policy": "static", "options": {"full-pcpus-only": "true"}, "reservedCPUs": "0,8"}
    assert decoded["allocs"] == [
        {"namespace": "default", "name": "guaranteed", "uid": "uid-guaranteed", "cpuset": "7,15",
         "managedByKubelet": True},
        {"namespace": "default", "name": "lse", "uid": "uid-lse", "cpuset": "1,9"},
        {"namespace": "default", "name": "lsr", "uid": "uid-lsr", "cpuset": "2,10"}]
    assert decoded["reservation"] == {"resources": {"cpu": "2"}, "applyPolicy": "ReservedCPUsOnly",
                                      "reservedCPUs": "0,8"}
    assert decoded["system"] == {"cpuset": "6"}
    assert stored["topologyPolicies"] == ["None"]
    assert stored["metadata"]["ownerReferences"][0]["uid"] == NODE_UID
    zone = stored["zones"][1]
    assert (zone["name"], zone["type"], zone["costs"]) == ("node-1", "Node", [{"name": "node-0", "value": 21},
                                                                                {"name": "node-1", "value": 10}])
    assert {r["name"]: r["capacity"] for r in zone["resources"]} == {
        "cpu": "8", "hugepages-1Gi": "0", "hugepages-2Mi": "0", "memory": "64Gi"}
    assert all(r["capacity"] == r["allocatable"] == r["available"] for r in zone["resources"])


@pytest.mark.parametrize("machine", MACHINES, ids=lambda m: m.__name__)
def test_every_fixture_machine_is_accepted_by_the_crd_and_decodes(tmp_path: Path, server: ApiServer, custom,
                                                                  machine) -> None:
    topology = _topology(tmp_path, machine)
    nrt = build_nrt(NODE, topology, compute_cpu_pools(topology.cpus, []), None, {})
    assert NRTReporter(NODE, custom).write(nrt)[0] == "created"
    stored = server.get_object(PLURAL, NODE)
    decoded = decode_as_koordinator(stored["metadata"]["annotations"])
    assert [c["id"] for c in decoded["detail"]] == list(topology.online_cpus)
    assert decoded["policy"] == {} and decoded["allocs"] == [] and decoded["reservation"] == {}
    assert [z["name"] for z in stored["zones"]] == [f"node-{n.node_id}" for n in topology.numa_nodes]
    assert sum(int(r["capacity"]) for z in stored["zones"] for r in z["resources"] if r["name"] == "cpu") == len(
        topology.cpus)


def test_four_numa_holes_pools_and_core_ids(tmp_path: Path) -> None:
    topology = _topology(tmp_path, four_numa_with_holes)
    nrt = build_nrt(NODE, topology, compute_cpu_pools(topology.cpus, []), None, {})
    decoded = decode_as_koordinator(nrt["metadata"]["annotations"])
    assert [p["cpuset"] for p in decoded["shared"]] == ["0-1,8-9", "2,10", "4-5,12-13", "6-7,15"]
    cores = logical_core_ids(topology.cpus)
    assert cores[2] == cores[10] and cores[7] == cores[15] and cores[6] != cores[15]  # cpu14 (6's sibling) is offline
    assert [z["resources"][0]["capacity"] for z in nrt["zones"]] == ["4", "2", "4", "3"]


def test_this_host_nrt_is_accepted_and_decodes(server: ApiServer, custom) -> None:
    topology = read_node_topology()
    nrt = build_nrt(NODE, topology, compute_cpu_pools(topology.cpus, []), None, {})
    assert NRTReporter(NODE, custom).write(nrt)[0] == "created"
    decoded = decode_as_koordinator(server.get_object(PLURAL, NODE)["metadata"]["annotations"])
    assert [c["id"] for c in decoded["detail"]] == list(topology.online_cpus)
    assert {cpu for p in decoded["shared"] for cpu in _cpu_list(p["cpuset"])} == set(topology.online_cpus)


def _cpu_list(text: str) -> list[int]:
    from koordlet.api.cpuset import parse_cpu_list
    return list(parse_cpu_list(text))


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_loop_writes_only_changes_and_not_more_often_than_the_bound(tmp_path: Path, server: ApiServer,
                                                                    custom) -> None:
    topology = _topology(tmp_path)
    pods: list[PodMeta] = []
    clock = _Clock()
    outcomes: list[str] = []
    loop = NRTReportLoop(NRTReporter(NODE, custom), lambda: topology, lambda: pods, lambda: None,
                         node_uid=lambda: NODE_UID, min_update_interval_s=10.0, observe=outcomes.append,
                         monotonic=clock)
    assert loop.report_once() == "created"
    server.clear_requests()
    clock.now += 3
    assert loop.report_once() == "unchanged"
    assert server.requests() == []  # an unchanged node costs no API call
    # someone else annotates the object; a pod gets bound: the change waits for the bound, then is written
    stored = custom.get_cluster_custom_object("topology.node.k8s.io", "v1alpha1", PLURAL, NODE)
    stored["metadata"]["annotations"]["example.com/note"] = "kept"
    custom.replace_cluster_custom_object("topology.node.k8s.io", "v1alpha1", PLURAL, NODE, stored)
    server.clear_requests()
    pods.append(_pod("lse", "LSE", "0,8"))
    clock.now += 3
    assert loop.report_once() == "deferred"
    clock.now += 3
    assert loop.report_once() == "deferred"
    assert server.requests("PUT") == []
    clock.now += 5
    assert loop.report_once() == "updated"
    annotations = server.get_object(PLURAL, NODE)["metadata"]["annotations"]
    assert annotations["example.com/note"] == "kept"
    assert json.loads(annotations[ANNOTATION_NRT_BE_CPU_SHARED_POOLS])[0]["cpuset"] == "1-3,9-11"
    # written with the version of its own last write, never read before: someone else wrote meanwhile, so the
    # write conflicted, the newest was read (from etcd) and written again
    assert [(r.verb, r.status, r.query.get("resourceVersion")) for r in server.requests(path_regex=NODE)] == [
        ("PUT", 409, None), ("GET", 200, None), ("PUT", 200, None)]
    assert loop.writes == 2
    clock.now += 3
    assert loop.report_once() == "unchanged"
    assert outcomes == ["created", "unchanged", "deferred", "deferred", "updated", "unchanged"]


def test_loop_retries_failures_and_conflicts_and_rereads_after_resync(tmp_path: Path, server: ApiServer,
                                                                      custom) -> None:
    topology = _topology(tmp_path)
    clock = _Clock()
    state: list[CPUManagerState | None] = [None]
    loop = NRTReportLoop(NRTReporter(NODE, custom), lambda: topology, list, lambda: state[0],
                         min_update_interval_s=0.0, resync_s=60.0, monotonic=clock)
    server.fail_next("POST", rf"/{PLURAL}$", status=500)
    assert loop.report_once() == "failed"
    assert loop.report_once() == "backoff"  # no request before the backoff (at most 30 s) is over
    clock.now += 31
    assert loop.report_once() == "created"
    state[0] = STATIC
    server.fail_next("PUT", rf"/{PLURAL}/{NODE}$", status=409)
    clock.now += 3
    assert loop.report_once() == "updated"  # the conflict was read again and retried
    policy = server.get_object(PLURAL, NODE)["metadata"]["annotations"][ANNOTATION_NRT_KUBELET_CPU_MANAGER_POLICY]
    assert json.loads(policy)["policy"] == "static"
    # someone deletes the object: noticed at the next resync, recreated
    kubernetes.client.CustomObjectsApi(custom.api_client).delete_cluster_custom_object(
        "topology.node.k8s.io", "v1alpha1", PLURAL, NODE)
    clock.now += 3
    assert loop.report_once() == "unchanged"
    clock.now += 70  # the resync, 60 s ±10 %: read again (from the watch cache) and found missing
    assert loop.report_once() == "created"


def test_loop_runs_on_its_thread_and_stops(tmp_path: Path, server: ApiServer, custom) -> None:
    topology = _topology(tmp_path)
    loop = NRTReportLoop(NRTReporter(NODE, custom), lambda: topology, list, lambda: None, interval_s=0.05)
    loop.start()
    try:
        from tests.support.waiting import wait_for
        assert wait_for(lambda: server.get_object(PLURAL, NODE) is not None)
    finally:
        assert loop.stop(2.0)


def test_change_reason_ignores_key_order_and_sees_zone_changes(tmp_path: Path) -> None:
    topology = _topology(tmp_path)
    nrt = build_nrt(NODE, topology, compute_cpu_pools(topology.cpus, []), None, {})
    assert change_reason(None, nrt) == "missing" and change_reason(nrt, nrt) is None
    reordered = json.loads(json.dumps(nrt))
    policy_key = ANNOTATION_NRT_CPU_TOPOLOGY
    reordered["metadata"]["annotations"][policy_key] = json.dumps(
        json.loads(nrt["metadata"]["annotations"][policy_key]), indent=1)
    assert change_reason(reordered, nrt) is None
    reordered["zones"][0]["resources"][3]["capacity"] = "1Gi"
    assert change_reason(reordered, nrt) == "zones"
    assert [format_bytes(v) for v in (0, 1536, 2048, 7208128512, 64 << 30)] == [
        "0", "1536", "2Ki", "7039188Ki", "64Gi"]


def test_a_restarted_loop_takes_its_checkpoint_for_the_first_read_and_writes_only_what_changed(
        tmp_path: Path, server: ApiServer, custom) -> None:
    topology = _topology(tmp_path)
    pods: list[PodMeta] = []
    clock = _Clock()
    path = str(tmp_path / "api-checkpoint.json")

    def loop() -> NRTReportLoop:
        return NRTReportLoop(NRTReporter(NODE, custom), lambda: topology, lambda: pods, lambda: None,
                             node_uid=lambda: NODE_UID, min_update_interval_s=0.0, resync_s=600.0, monotonic=clock,
                             checkpoint=ApiCheckpoint(path))

    assert loop().report_once() == "created"
    server.clear_requests()
    # a new process, nothing changed: no API call at all, the first resync at a random point of its interval
    restarted = loop()
    assert restarted.report_once() == "unchanged"
    assert server.requests() == []
    # a pod bound while koordlet was down: written at once with the kept version, never read before
    pods.append(_pod("lse", "LSE", "0,8"))
    again = loop()
    assert again.report_once() == "updated"
    assert [(r.verb, r.status) for r in server.requests(path_regex=NODE)] == [("PUT", 200)]
    # someone else changed the object while koordlet was down: the kept version conflicts, the newest is read
    stored = custom.get_cluster_custom_object("topology.node.k8s.io", "v1alpha1", PLURAL, NODE)
    stored["metadata"]["annotations"]["example.com/note"] = "kept"
    custom.replace_cluster_custom_object("topology.node.k8s.io", "v1alpha1", PLURAL, NODE, stored)
    pods.pop()
    server.clear_requests()
    assert loop().report_once() == "updated"
    assert [(r.verb, r.status) for r in server.requests(path_regex=NODE)] == [("PUT", 409), ("GET", 200), ("PUT", 200)]
    assert server.get_object(PLURAL, NODE)["metadata"]["annotations"]["example.com/note"] == "kept"
    # the resync still comes: within its interval the restarted loop reads the object once
    last = loop()
    assert last.report_once() == "unchanged"
    server.clear_requests()
    clock.now += 601
    assert last.report_once() == "unchanged"
    assert [r.verb for r in server.requests(path_regex=NODE)] == ["GET"]
