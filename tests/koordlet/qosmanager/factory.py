"""Hand-made pods, nodes and snapshots for the strategies' decide() tests."""

from __future__ import annotations

from collections.abc import Mapping

from koordlet.api.keys import LABEL_QOS_CLASS
from koordlet.api.nodeslo import NodeSLOSpec, parse_node_slo_spec
from koordlet.api.pod import ContainerMeta, PodMeta
from koordlet.api.qos import KubeQoS
from koordlet.qosmanager.snapshot import Snapshot
from koordlet.statesinformer.api import NodeInfo
from koordlet.system.kubepods import KubeCgroupLayout
from koordlet.system.sysfs import CPUInfo
from tests.support.apiserver import ApiServer

GiB = 1 << 30
LAYOUT = KubeCgroupLayout()


def pod(
    name: str,
    qos: str = "",
    kube_qos: KubeQoS | None = KubeQoS.BURSTABLE,
    *,
    priority: int | None = None,
    containers: tuple[ContainerMeta, ...] = (),
    annotations: Mapping[str, str] | None = None,
    phase: str = "Running",
) -> PodMeta:
    labels = {LABEL_QOS_CLASS: qos} if qos else {}
    return PodMeta(
        name=name,
        namespace="default",
        uid=f"uid-{name}",
        labels=labels,
        annotations=dict(annotations or {}),
        kube_qos=kube_qos,
        priority=priority,
        containers=containers,
        phase=phase,
    )


def be_pod(name: str, *, priority: int | None = None, batch_cpu_milli: int = 0, batch_memory: int = 0,
           containers: tuple[ContainerMeta, ...] | None = None) -> PodMeta:
    if containers is None:
        requests = {}
        if batch_cpu_milli:
            requests["kubernetes.io/batch-cpu"] = batch_cpu_milli
        if batch_memory:
            requests["kubernetes.io/batch-memory"] = batch_memory
        containers = (ContainerMeta("main", container_id=(name.encode().hex() * 12)[:12], requests=requests),)
    return pod(name, "BE", KubeQoS.BESTEFFORT, priority=priority, containers=containers)


def node(cpu_milli: int = 8000, memory: int = 16 * GiB, *, allocatable_cpu_milli: int | None = None,
         allocatable_memory: int | None = None, annotations: Mapping[str, str] | None = None,
         batch_cpu_milli: int | None = None) -> NodeInfo:
    allocatable = {"cpu": cpu_milli if allocatable_cpu_milli is None else allocatable_cpu_milli,
                   "memory": memory if allocatable_memory is None else allocatable_memory}
    if batch_cpu_milli is not None:
        allocatable["kubernetes.io/batch-cpu"] = batch_cpu_milli
    return NodeInfo(name="node-1", annotations=dict(annotations or {}),
                    capacity={"cpu": cpu_milli, "memory": memory}, allocatable=allocatable)


def cpus(sockets: int = 1, cores_per_socket: int = 4, threads: int = 2) -> tuple[CPUInfo, ...]:
    """Linux-style numbering: thread t of core c on socket s is cpu t × (all cores) + s × cores + c."""
    total_cores = sockets * cores_per_socket
    infos = []
    for thread in range(threads):
        for socket in range(sockets):
            for core in range(cores_per_socket):
                cpu_id = thread * total_cores + socket * cores_per_socket + core
                infos.append(CPUInfo(cpu_id=cpu_id, core_id=core, socket_id=socket, node_id=socket))
    return tuple(sorted(infos, key=lambda c: c.cpu_id))


def spec(**threshold: object) -> NodeSLOSpec:
    return parse_node_slo_spec({"resourceUsedThresholdWithBE": {"enable": True, **threshold}})


def snapshot(**fields: object) -> Snapshot:
    values: dict[str, object] = {"timestamp": 1000.0, "node": node(), "node_slo": spec()}
    values.update(fields)
    return Snapshot(**values)  # type: ignore[arg-type]


def seed_pod(server: ApiServer, name: str, qos: str, kube_qos: str, app: str = "batch") -> PodMeta:
    """A Running pod on node-1 in the project's API server, and its PodMeta as the states would have it."""
    obj = server.seed({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": app, LABEL_QOS_CLASS: qos}},
        "spec": {"nodeName": "node-1", "containers": [{"name": "main", "image": "localhost/busybox"}]},
        "status": {"phase": "Running", "qosClass": kube_qos, "conditions": [{"type": "Ready", "status": "True"}]},
    })
    return PodMeta(name=name, namespace="default", uid=obj["metadata"]["uid"], labels={LABEL_QOS_CLASS: qos},
                   kube_qos=KubeQoS(kube_qos), phase="Running")
