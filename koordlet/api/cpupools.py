"""The node's CPU pools: which CPUs LS pods share, which BE pods share, and which are bound to pods.

Pure: the inputs are the CPU topology, the pods, kubelet's CPU manager state and the node's annotations;
nothing is read here. The NodeResourceTopology reporter (``koordlet/reporters/nrt.py``) publishes the result
in Koordinator's annotations; the cpuset hook and CPU suppress call :func:`compute_cpu_pools` with the same
inputs so that what the node does and what the scheduler is told agree.

The rules are Koordinator's koordlet (``pkg/koordlet/statesinformer/impl/states_noderesourcetopology.go``,
``calcNodeTopo``/``calCPUSharePools``/``calGuaranteedCpu``; docs/koordinator.md §4.2, §8.1):

1. Start from every online CPU.
2. kubelet ``static`` policy: the CPUs kubelet assigned exclusively to a container leave both pools, unless
   the pod is Koordinator's (qosClass LS or BE, or a scheduler cpuset in ``resource-status``) — kubelet's
   checkpoint may still list those, but the koordlet owns their cpusets. kubelet's *reserved* CPUs stay in
   the pools: kubelet itself runs its shared pool (Burstable pods) on them, and Koordinator keeps them so a
   pod requesting 0 CPUs still has CPUs to run on. They are published in the kubelet policy annotation, and
   the scheduler keeps them out of what it binds.
3. A pod with a cpuset in ``scheduling.koordinator.sh/resource-status`` (LSE, LSR, or a bound pod without a
   label) leaves the LS shared pool. Only LSE pods also leave the BE pool: BE may run on LSR CPUs.
4. CPUs of the node reservation (``node.koordinator.sh/reservation``: ``reservedCPUs``, or a CPU amount taken
   by topology) and exclusive SYSTEM-QoS CPUs (``node.koordinator.sh/system-qos-resource``, exclusive unless
   ``cpusetExclusive`` is false) leave both pools.

Pools are per (socket, NUMA node), sorted by socket then node; a pool whose CPUs all went in step 4 stays,
with an empty cpuset, as in Koordinator. Pods that have ended (phase Succeeded/Failed) hold no CPUs.

Use (the NRT reporter; the cpuset hook and CPU suppress)::

    pools = compute_cpu_pools(cpus, pods, kubelet_state, node.annotations)
    pools.shared            # per (socket, node): the cpu-shared-pools annotation
    pools.shared_cpus       # all LS shared CPUs: an LS / Burstable container's cpuset
    pools.be_shared_cpus    # what BE may run on at most (suppress shrinks the BE cpuset within it)
    pools.kubelet_exclusive_cpus, pools.pod_allocs, pools.problems  # the last: log and count them

``cpus`` is ``koordlet.system.sysfs.read_node_topology(sys_dir).cpus``; ``kubelet_state`` a
``koordlet.statesinformer.cpumanager.CPUManagerState`` or None (both are matched structurally, so this
leaf module imports neither).

Deviation, on purpose: bad annotations are not fatal; each is skipped and named in :attr:`CPUPools.problems`
so the caller logs and counts it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from koordlet.api.annotations import (
    AnnotationError,
    NodeReservation,
    parse_node_reservation,
    parse_resource_status,
    parse_system_qos_resource,
)
from koordlet.api.cpuset import format_cpu_list
from koordlet.api.keys import (
    ANNOTATION_NODE_RESERVATION,
    ANNOTATION_NODE_SYSTEM_QOS_RESOURCE,
    ANNOTATION_RESOURCE_STATUS,
    RESOURCE_CPU,
)
from koordlet.api.pod import PodMeta
from koordlet.api.qos import QoSClass

KUBELET_POLICY_STATIC = "static"
_ENDED_PHASES = ("Succeeded", "Failed")


class TopologyCPU(Protocol):
    """A logical CPU (``koordlet.system.sysfs.CPUInfo`` is one); ``core_id`` is unique within its socket."""

    @property
    def cpu_id(self) -> int: ...
    @property
    def core_id(self) -> int: ...
    @property
    def socket_id(self) -> int: ...
    @property
    def node_id(self) -> int: ...


class KubeletCPUAssignment(Protocol):
    @property
    def cpus(self) -> frozenset[int]: ...
    @property
    def pod_uid(self) -> str: ...


class KubeletCPUManager(Protocol):
    """kubelet's CPU manager state (``koordlet.statesinformer.cpumanager.CPUManagerState`` is one)."""

    @property
    def policy(self) -> str: ...
    @property
    def reserved_cpus(self) -> frozenset[int]: ...
    @property
    def assignments(self) -> Sequence[KubeletCPUAssignment]: ...


@dataclass(frozen=True, slots=True)
class CPUSharedPool:
    """Koordinator's ``CPUSharedPool`` ({socket, node, cpuset}) of one (socket, NUMA node)."""

    socket: int
    node: int
    cpus: tuple[int, ...]

    @property
    def cpuset(self) -> str:
        return format_cpu_list(self.cpus)

    def to_json(self) -> dict[str, object]:
        """Koordinator's JSON (``cpuset`` is omitempty)."""
        out: dict[str, object] = {"socket": self.socket, "node": self.node}
        if self.cpus:
            out["cpuset"] = self.cpuset
        return out


@dataclass(frozen=True, slots=True)
class PodCPUAlloc:
    """Koordinator's ``PodCPUAlloc``: CPUs bound to a pod, by the scheduler or by kubelet's static policy."""

    uid: str
    cpus: tuple[int, ...]
    namespace: str = ""
    name: str = ""
    managed_by_kubelet: bool = False

    def to_json(self) -> dict[str, object]:
        """Koordinator's JSON; every field is omitempty."""
        out: dict[str, object] = {}
        for key, value in (("namespace", self.namespace), ("name", self.name), ("uid", self.uid),
                           ("cpuset", format_cpu_list(self.cpus)), ("managedByKubelet", self.managed_by_kubelet)):
            if value:
                out[key] = value
        return out


@dataclass(frozen=True, slots=True)
class CPUPools:
    """The result of :func:`compute_cpu_pools`.

    ``shared``: the LS shared pools (``node.koordinator.sh/cpu-shared-pools``), where LS and Burstable pods
    run. ``be_shared``: the BE shared pools (``node.koordinator.sh/be-cpu-shared-pools``). ``pod_allocs``:
    kubelet's exclusive assignments (``managed_by_kubelet``) and the scheduler's cpusets, sorted by pod UID.
    ``node_reserved_cpus``: the node reservation's CPUs, resolved. ``node_reservation``: the reservation
    annotation as parsed (None when absent or malformed), for callers that need its resources too (CPU
    suppress's budget), so it is parsed once. ``system_qos_cpus``: SYSTEM-QoS CPUs that are exclusive (empty
    when they are shared). ``problems``: annotations that were skipped, and why.
    """

    shared: tuple[CPUSharedPool, ...] = ()
    be_shared: tuple[CPUSharedPool, ...] = ()
    pod_allocs: tuple[PodCPUAlloc, ...] = ()
    node_reserved_cpus: tuple[int, ...] = ()
    system_qos_cpus: tuple[int, ...] = ()
    problems: tuple[str, ...] = ()
    node_reservation: NodeReservation | None = None

    @property
    def shared_cpus(self) -> frozenset[int]:
        """Every CPU of the LS shared pools (the cpuset an LS pod gets)."""
        return frozenset(cpu for pool in self.shared for cpu in pool.cpus)

    @property
    def be_shared_cpus(self) -> frozenset[int]:
        """Every CPU of the BE shared pools (the most a BE pod may run on)."""
        return frozenset(cpu for pool in self.be_shared for cpu in pool.cpus)

    @property
    def kubelet_exclusive_cpus(self) -> frozenset[int]:
        return frozenset(cpu for alloc in self.pod_allocs if alloc.managed_by_kubelet for cpu in alloc.cpus)


def take_by_topology(cpus: Iterable[TopologyCPU], count: int) -> tuple[int, ...]:
    """``count`` CPUs packed by topology, as kubelet reserves CPUs: whole sockets first, then whole physical
    cores, then single threads, lowest ids first. Used for a node reservation given as a CPU amount."""
    ordered = sorted(cpus, key=lambda c: c.cpu_id)
    if count <= 0:
        return ()
    if count >= len(ordered):
        return tuple(c.cpu_id for c in ordered)
    taken: list[int] = []
    sockets: dict[int, list[int]] = {}
    cores: dict[tuple[int, int], list[int]] = {}
    for cpu in ordered:
        sockets.setdefault(cpu.socket_id, []).append(cpu.cpu_id)
        cores.setdefault((cpu.socket_id, cpu.core_id), []).append(cpu.cpu_id)
    for members in sockets.values():
        if count - len(taken) >= len(members):
            taken += members
    for members in cores.values():
        free = [cpu for cpu in members if cpu not in taken]
        if len(free) == len(members) and count - len(taken) >= len(members):
            taken += free
    for cpu in ordered:
        if len(taken) >= count:
            break
        if cpu.cpu_id not in taken:
            taken.append(cpu.cpu_id)
    return tuple(sorted(taken))


def _pools(cpus: Mapping[int, TopologyCPU]) -> list[tuple[int, int, list[int]]]:
    by_node: dict[int, list[int]] = {}
    for cpu_id in sorted(cpus):
        by_node.setdefault(cpus[cpu_id].node_id, []).append(cpu_id)
    # the pool's socket is that of its first CPU (a NUMA node lies within one socket on real machines)
    pools = [(cpus[members[0]].socket_id, node, members) for node, members in by_node.items()]
    return sorted(pools, key=lambda p: (p[0], p[1]))


def _drop(pool: dict[int, TopologyCPU], cpus: Iterable[int]) -> None:
    for cpu in cpus:
        pool.pop(cpu, None)


def _scheduler_cpusets(live: Sequence[PodMeta], problems: list[str]) -> dict[str, tuple[PodMeta, tuple[int, ...]]]:
    """uid -> (pod, cpuset) of the pods with a cpuset in ``resource-status`` (the scheduler bound them)."""
    bound: dict[str, tuple[PodMeta, tuple[int, ...]]] = {}
    for pod in live:
        raw = pod.annotations.get(ANNOTATION_RESOURCE_STATUS)
        if not raw:
            continue
        try:
            cpuset = parse_resource_status(raw).cpuset
        except AnnotationError as exc:
            problems.append(f"pod {pod.key}: {exc}")
            continue
        if cpuset:
            bound[pod.uid] = (pod, cpuset)
    return bound


def _kubelet_exclusive_cpus(kubelet: KubeletCPUManager, pods_by_uid: Mapping[str, PodMeta],
                            bound: Mapping[str, object]) -> dict[str, set[int]]:
    """uid -> the CPUs kubelet's static policy gave the pod's containers exclusively, Koordinator's pods left
    out (rule 2); "" collects a v1 checkpoint's assignments, which name no pod."""
    koordinator_owned = {uid for uid, pod in pods_by_uid.items()
                         if pod.qos_label in (QoSClass.LS, QoSClass.BE)} | set(bound)
    owned: dict[str, set[int]] = {}
    for assignment in kubelet.assignments:
        if assignment.pod_uid not in koordinator_owned:
            owned.setdefault(assignment.pod_uid, set()).update(assignment.cpus)
    return owned


def compute_cpu_pools(
    cpus: Iterable[TopologyCPU],
    pods: Iterable[PodMeta],
    kubelet: KubeletCPUManager | None = None,
    node_annotations: Mapping[str, str] | None = None,
    *,
    exclude_kubelet_reserved: bool = False,
) -> CPUPools:
    """The node's CPU pools by Koordinator's rules (module docstring). ``cpus``: every online CPU;
    ``pods``: the pods on the node; ``kubelet``: its CPU manager state, None when unknown (then nothing is
    kubelet's); ``node_annotations``: the Node's (reservation, SYSTEM QoS). ``exclude_kubelet_reserved``:
    also keep kubelet's reserved CPUs (static policy) out of both pools, for a caller that wants them
    left to system daemons; the NRT reporter keeps Koordinator's rule (they stay)."""
    annotations = node_annotations or {}
    problems: list[str] = []
    topology = {cpu.cpu_id: cpu for cpu in cpus}
    live = [pod for pod in pods if pod.phase not in _ENDED_PHASES]
    bound = _scheduler_cpusets(live, problems)
    allocs = [PodCPUAlloc(uid=uid, cpus=cpuset, namespace=pod.namespace, name=pod.name)
              for uid, (pod, cpuset) in bound.items()]
    static = kubelet is not None and kubelet.policy == KUBELET_POLICY_STATIC
    shared = dict(topology)
    if static:
        pods_by_uid = {pod.uid: pod for pod in live}
        for uid, owned in _kubelet_exclusive_cpus(kubelet, pods_by_uid, bound).items():
            _drop(shared, owned)
            if uid and owned:
                pod = pods_by_uid.get(uid)
                allocs.append(PodCPUAlloc(uid=uid, cpus=tuple(sorted(owned)), managed_by_kubelet=True,
                                          namespace=pod.namespace if pod else "", name=pod.name if pod else ""))

    ls_pool = dict(shared)
    be_pool = dict(shared)
    for pod, cpuset in bound.values():
        _drop(ls_pool, cpuset)
        if pod.qos_label is QoSClass.LSE:
            _drop(be_pool, cpuset)
    if exclude_kubelet_reserved and static:
        _drop(ls_pool, kubelet.reserved_cpus)
        _drop(be_pool, kubelet.reserved_cpus)

    reservation = _node_reservation(annotations, problems)
    reserved = _node_reserved_cpus(reservation, topology.values())
    system_qos = _system_qos_exclusive_cpus(annotations, problems)
    removed = set(reserved) | set(system_qos)

    def pools(members: Mapping[int, TopologyCPU]) -> tuple[CPUSharedPool, ...]:
        return tuple(CPUSharedPool(socket=socket, node=node, cpus=tuple(c for c in node_cpus if c not in removed))
                     for socket, node, node_cpus in _pools(members))

    return CPUPools(
        shared=pools(ls_pool),
        be_shared=pools(be_pool),
        pod_allocs=tuple(sorted(allocs, key=lambda a: a.uid)),
        node_reserved_cpus=reserved,
        system_qos_cpus=system_qos,
        problems=tuple(problems),
        node_reservation=reservation,
    )


def _node_reservation(annotations: Mapping[str, str], problems: list[str]) -> NodeReservation | None:
    raw = annotations.get(ANNOTATION_NODE_RESERVATION)
    if not raw:
        return None
    try:
        return parse_node_reservation(raw)
    except AnnotationError as exc:
        problems.append(f"node: {exc}")
        return None


def _node_reserved_cpus(reservation: NodeReservation | None, cpus: Iterable[TopologyCPU]) -> tuple[int, ...]:
    if reservation is None:
        return ()
    if reservation.reserved_cpus:
        return reservation.reserved_cpus
    milli = reservation.resources.get(RESOURCE_CPU, 0)
    return take_by_topology(cpus, -(-milli // 1000)) if milli > 0 else ()


def _system_qos_exclusive_cpus(annotations: Mapping[str, str], problems: list[str]) -> tuple[int, ...]:
    raw = annotations.get(ANNOTATION_NODE_SYSTEM_QOS_RESOURCE)
    if not raw:
        return ()
    try:
        system = parse_system_qos_resource(raw)
    except AnnotationError as exc:
        problems.append(f"node: {exc}")
        return ()
    return system.cpuset if system.cpuset_exclusive else ()
