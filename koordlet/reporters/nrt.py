"""The node's NodeResourceTopology (``topology.node.k8s.io/v1alpha1``; gate ``NodeTopologyReport``).

What koord-scheduler reads to bind CPUs (Koordinator ``pkg/koordlet/statesinformer/impl/
states_noderesourcetopology.go``; its scheduler's ``nodenumaresource`` plugin reads it back):

- ``zones``: one per NUMA node, name ``node-N``, type ``Node``, resources ``cpu`` (the node's online CPUs),
  ``memory`` (its MemTotal), ``hugepages-1Gi`` and ``hugepages-2Mi`` (0: gate ``HugePageReport`` is not
  implemented), each with capacity = allocatable = available, sorted by name; ``costs`` are the kernel's
  NUMA distances (Koordinator leaves them out; the NRT API defines them so);
- ``topologyPolicies``: ``["None"]`` (kubelet's topology manager policy is not read);
- annotations, JSON with Koordinator's field names: ``node.koordinator.sh/cpu-topology``
  (``{"detail":[{id,core,socket,node}]}``; ``core`` is a node-wide logical core id like ``lscpu``'s, since
  sysfs ``core_id`` repeats on every socket and the scheduler groups threads by it),
  ``node.koordinator.sh/cpu-shared-pools`` and ``…/be-cpu-shared-pools`` (``[{socket,node,cpuset}]``),
  ``kubelet.koordinator.sh/cpu-manager-policy`` (``{policy,options,reservedCPUs}``; ``{}`` when kubelet's
  state is unknown), ``node.koordinator.sh/pod-cpu-allocs`` (``[{namespace,name,uid,cpuset,
  managedByKubelet}]``: kubelet's exclusive CPUs, which the scheduler keeps out of what it binds, and the
  scheduler's own LSE/LSR cpusets, which it ignores there), ``node.koordinator.sh/reservation`` and
  ``node.koordinator.sh/system-qos-resource`` (the node's, with the reserved CPUs resolved; ``{}`` when none).
  The pools come from :mod:`koordlet.api.cpupools`.

Writes: created at once when missing (with an owner reference to the Node); replaced only when what koordlet
manages changed (the same fields Koordinator compares: topology policies, managed annotations by their
decoded JSON, zone names, types and managed resources), and then not more often than
``min_update_interval_s`` (a change waits for the bound, the latest state wins). Others' annotations, labels,
zones' extra resources are kept. Between writes the object last written or read is the comparison base, so
an unchanged node costs no API call. API traffic (docs/design.md §5): the object is read at the first tick and
then every ``resync_s`` (the first at a random point of it, then ±10 %; from the watch cache,
``resourceVersion=0``; after a restart, the object ``-api-checkpoint-file`` kept stands in for the first read,
koordlet/kubeclient/checkpoint.py), and again from etcd only after a
409; a write carries the version of that read or of koordlet's last write. A failed read or write is tried again
after a backoff (full jitter, up to 30 s, koordlet/kubeclient/backoff.py), not at every tick; a tick the koordlet's
API budget holds back (the API server pushing back) does nothing. The 3 s tick starts at a random point and keeps
±10 % jitter.
"""

from __future__ import annotations

import copy
import json
import logging
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import urllib3
from kubernetes.client.exceptions import ApiException

from koordlet.api.annotations import MAX_ANNOTATION_BYTES
from koordlet.api.cpupools import CPUPools, compute_cpu_pools
from koordlet.api.cpuset import format_cpu_list
from koordlet.api.keys import (
    ANNOTATION_NODE_RESERVATION,
    ANNOTATION_NODE_SYSTEM_QOS_RESOURCE,
    ANNOTATION_NRT_BE_CPU_SHARED_POOLS,
    ANNOTATION_NRT_CPU_SHARED_POOLS,
    ANNOTATION_NRT_CPU_TOPOLOGY,
    ANNOTATION_NRT_KUBELET_CPU_MANAGER_POLICY,
    ANNOTATION_NRT_POD_CPU_ALLOCS,
)
from koordlet.api.pod import PodMeta
from koordlet.api.safeload import load_json
from koordlet.kubeapi import CustomObjects, Throttled, retry_after_s
from koordlet.kubeclient.backoff import Backoff
from koordlet.kubeclient.checkpoint import ApiCheckpoint
from koordlet.kubeclient.timing import phase, spread
from koordlet.statesinformer.cpumanager import POLICY_STATIC, CPUManagerState
from koordlet.system.sysfs import CPUInfo, HugePages, NodeTopology, SysfsError
from koordlet.ticker import PeriodicThread

logger = logging.getLogger(__name__)

NRT_GROUP = "topology.node.k8s.io"
NRT_VERSION = "v1alpha1"
NRT_PLURAL = "noderesourcetopologies"
NRT_KIND = "NodeResourceTopology"
TOPOLOGY_POLICY_NONE = "None"
ZONE_TYPE_NODE = "Node"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY_KOORDINATOR = "Koordinator"

DEFAULT_SYNC_INTERVAL_S = 3.0
DEFAULT_MIN_UPDATE_INTERVAL_S = 10.0
DEFAULT_RESYNC_S = 600.0  # a read from the watch cache: catches an object others changed or deleted
TOPOLOGY_REFRESH_S = 60.0  # CPU hotplug is rare; sysfs is re-read this often

# The annotations koordlet owns on the object (Koordinator managedNRTAnnotationKeys, minus cpu-basic-info).
MANAGED_ANNOTATIONS = (
    ANNOTATION_NRT_KUBELET_CPU_MANAGER_POLICY,
    ANNOTATION_NRT_CPU_SHARED_POOLS,
    ANNOTATION_NRT_BE_CPU_SHARED_POOLS,
    ANNOTATION_NRT_CPU_TOPOLOGY,
    ANNOTATION_NRT_POD_CPU_ALLOCS,
    ANNOTATION_NODE_RESERVATION,
    ANNOTATION_NODE_SYSTEM_QOS_RESOURCE,
)
MANAGED_RESOURCES = ("cpu", "hugepages-1Gi", "hugepages-2Mi", "memory")


class NRTReportError(RuntimeError):
    """The NodeResourceTopology could not be read or written."""


# ------------------------------------------------------------------------------------------- the object


def zone_name(node_id: int) -> str:
    return f"node-{node_id}"


def logical_core_ids(cpus: Iterable[CPUInfo]) -> dict[int, int]:
    """cpu id → a node-wide core id: (socket, core_id) pairs numbered in order of their first CPU, as lscpu's
    CORE column (what Koordinator's koordlet reports)."""
    numbers: dict[tuple[int, int], int] = {}
    out: dict[int, int] = {}
    for cpu in sorted(cpus, key=lambda c: c.cpu_id):
        out[cpu.cpu_id] = numbers.setdefault(cpu.core_key, len(numbers))
    return out


def cpu_topology_json(cpus: Iterable[CPUInfo]) -> dict[str, Any]:
    """Koordinator ``CPUTopology``: ``{"detail": [{"id", "core", "socket", "node"}, ...]}`` by cpu id."""
    ordered = sorted(cpus, key=lambda c: c.cpu_id)
    cores = logical_core_ids(ordered)
    return {"detail": [{"id": c.cpu_id, "core": cores[c.cpu_id], "socket": c.socket_id, "node": c.node_id}
                       for c in ordered]}


def kubelet_policy_json(state: CPUManagerState | None) -> dict[str, Any]:
    """Koordinator ``KubeletCPUManagerPolicy`` (every field omitempty): ``{}`` when kubelet's state is unknown."""
    if state is None:
        return {}
    out: dict[str, Any] = {}
    if state.policy:
        out["policy"] = state.policy
    if state.options:
        out["options"] = dict(state.options)
    if state.policy == POLICY_STATIC and state.reserved_cpus:
        out["reservedCPUs"] = format_cpu_list(state.reserved_cpus)
    return out


def _node_annotation_object(annotations: Mapping[str, str], key: str) -> dict[str, Any]:
    raw = annotations.get(key)
    if not raw:
        return {}
    try:
        value = load_json(raw, key, max_bytes=MAX_ANNOTATION_BYTES)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def reservation_json(annotations: Mapping[str, str], pools: CPUPools) -> dict[str, Any]:
    """Koordinator ``NodeReservation`` as on the Node, ``reservedCPUs`` resolved (an amount taken by topology)."""
    raw = _node_annotation_object(annotations, ANNOTATION_NODE_RESERVATION)
    out = {key: raw[key] for key in ("resources", "applyPolicy") if raw.get(key)}
    if pools.node_reserved_cpus:
        out["reservedCPUs"] = format_cpu_list(pools.node_reserved_cpus)
    return out


def system_qos_json(annotations: Mapping[str, str]) -> dict[str, Any]:
    """Koordinator ``SystemQOSResource`` as on the Node (``cpuset``, ``cpusetExclusive``)."""
    raw = _node_annotation_object(annotations, ANNOTATION_NODE_SYSTEM_QOS_RESOURCE)
    out: dict[str, Any] = {}
    if isinstance(raw.get("cpuset"), str) and raw["cpuset"]:
        out["cpuset"] = raw["cpuset"]
    if isinstance(raw.get("cpusetExclusive"), bool):
        out["cpusetExclusive"] = raw["cpusetExclusive"]
    return out


def _json(value: object) -> str:
    # Go's encoding/json: compact, and an empty slice field of Koordinator's (a nil slice there) is "null"
    if isinstance(value, list) and not value:
        return "null"
    return json.dumps(value, separators=(",", ":"))


def format_bytes(value: int) -> str:
    """A byte count as a Kubernetes quantity: the largest binary suffix that divides it exactly."""
    for power, suffix in ((6, "Ei"), (5, "Pi"), (4, "Ti"), (3, "Gi"), (2, "Mi"), (1, "Ki")):
        if value and value % (1 << (10 * power)) == 0:
            return f"{value >> (10 * power)}{suffix}"
    return str(value)


def _resource(name: str, amount: str) -> dict[str, str]:
    return {"name": name, "capacity": amount, "allocatable": amount, "available": amount}


HUGEPAGE_RESOURCES = ((2048, "hugepages-2Mi"), (1048576, "hugepages-1Gi"))  # page size kB → resource name


def _hugepage_resources(pools: Sequence[HugePages] | None) -> tuple[list[dict[str, str]], int]:
    """The zone's ``hugepages-2Mi`` and ``hugepages-1Gi`` (gate ``HugePageReport``; zero without it) and the
    bytes they hold. Capacity and allocatable are the node's pool (``nr_hugepages`` pages), as Koordinator
    reports; available is what the kernel has free of it (``free_hugepages``), where Koordinator repeats
    allocatable."""
    by_size = {pool.page_size_kb: pool for pool in pools or ()}
    resources, held = [], 0
    for size_kb, name in HUGEPAGE_RESOURCES:
        pool = by_size.get(size_kb)
        if pool is None:
            resources.append(_resource(name, "0"))
            continue
        total = format_bytes(pool.total_bytes)
        resources.append({"name": name, "capacity": total, "allocatable": total,
                          "available": format_bytes(min(pool.free_bytes, pool.total_bytes))})
        held += pool.total_bytes
    return resources, held


def build_zones(topology: NodeTopology,
                hugepages: Mapping[int, Sequence[HugePages]] | None = None) -> list[dict[str, Any]]:
    """One zone per NUMA node; ``hugepages`` (None: gate ``HugePageReport`` off) fills the huge page
    resources and takes their memory out of the zone's ``memory``, as Koordinator does."""
    zones = []
    for node in topology.numa_nodes:
        zone: dict[str, Any] = {"name": zone_name(node.node_id), "type": ZONE_TYPE_NODE}
        if node.distances:
            zone["costs"] = [{"name": zone_name(other), "value": distance} for other, distance in node.distances]
        huge, held = _hugepage_resources(hugepages.get(node.node_id) if hugepages is not None else None)
        zone["resources"] = sorted([
            _resource("cpu", str(len(node.cpus))),
            *huge,
            _resource("memory", format_bytes(max(node.memory_total_bytes - held, 0))),
        ], key=lambda r: r["name"])
        zones.append(zone)
    return sorted(zones, key=lambda z: z["name"])


def build_nrt(node_name: str, topology: NodeTopology, pools: CPUPools, kubelet: CPUManagerState | None,
              node_annotations: Mapping[str, str], node_uid: str = "",
              hugepages: Mapping[int, Sequence[HugePages]] | None = None) -> dict[str, Any]:
    """The whole NodeResourceTopology object koordlet wants for this node (pure)."""
    annotations = {
        ANNOTATION_NRT_CPU_TOPOLOGY: _json(cpu_topology_json(topology.cpus)),
        ANNOTATION_NRT_CPU_SHARED_POOLS: _json([p.to_json() for p in pools.shared]),
        ANNOTATION_NRT_BE_CPU_SHARED_POOLS: _json([p.to_json() for p in pools.be_shared]),
        ANNOTATION_NRT_KUBELET_CPU_MANAGER_POLICY: _json(kubelet_policy_json(kubelet)),
        ANNOTATION_NRT_POD_CPU_ALLOCS: _json([a.to_json() for a in pools.pod_allocs]),
        ANNOTATION_NODE_RESERVATION: _json(reservation_json(node_annotations, pools)),
        ANNOTATION_NODE_SYSTEM_QOS_RESOURCE: _json(system_qos_json(node_annotations)),
    }
    metadata: dict[str, Any] = {"name": node_name, "labels": {LABEL_MANAGED_BY: MANAGED_BY_KOORDINATOR},
                                "annotations": annotations}
    if node_uid:
        metadata["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid,
                                        "controller": True, "blockOwnerDeletion": True}]
    return {"apiVersion": f"{NRT_GROUP}/{NRT_VERSION}", "kind": NRT_KIND, "metadata": metadata,
            "topologyPolicies": [TOPOLOGY_POLICY_NONE], "zones": build_zones(topology, hugepages)}


def _decoded(value: str | None) -> object:
    if value is None:
        return None
    try:
        return load_json(value, "annotation", max_bytes=MAX_ANNOTATION_BYTES)
    except ValueError:
        return ("undecodable", value)


def _zone_view(zones: object) -> list[tuple[object, object, object, dict[str, tuple[str, str, str]]]]:
    view = []
    for zone in zones if isinstance(zones, list) else []:
        if not isinstance(zone, dict):
            continue
        resources = {r.get("name"): (str(r.get("capacity")), str(r.get("allocatable")), str(r.get("available")))
                     for r in zone.get("resources") or [] if isinstance(r, dict) and r.get("name") in MANAGED_RESOURCES}
        view.append((zone.get("name"), zone.get("type"), zone.get("costs"), resources))
    return view


def change_reason(existing: Mapping[str, Any] | None, desired: Mapping[str, Any]) -> str | None:
    """Why ``existing`` must be rewritten to carry ``desired``'s managed parts; None when it need not be."""
    if existing is None:
        return "missing"
    if existing.get("topologyPolicies") != desired["topologyPolicies"]:
        return "topologyPolicies"
    old = (existing.get("metadata") or {}).get("annotations") or {}
    new = desired["metadata"]["annotations"]
    for key in MANAGED_ANNOTATIONS:
        if _decoded(old.get(key)) != _decoded(new.get(key)):
            return f"annotation {key}"
    if _zone_view(existing.get("zones")) != _zone_view(desired["zones"]):
        return "zones"
    return None


def merge_into(existing: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any]:
    """``existing`` carrying ``desired``'s managed parts; others' annotations, labels and extra zone
    resources kept (Koordinator ``updateNRT``)."""
    merged = copy.deepcopy(dict(existing))
    meta = merged.setdefault("metadata", {})
    meta["annotations"] = {**(meta.get("annotations") or {}), **desired["metadata"]["annotations"]}
    if not meta.get("ownerReferences") and desired["metadata"].get("ownerReferences"):
        meta["ownerReferences"] = copy.deepcopy(desired["metadata"]["ownerReferences"])
    merged["topologyPolicies"] = list(desired["topologyPolicies"])
    old_zones = {z.get("name"): z for z in existing.get("zones") or [] if isinstance(z, dict)}
    zones = []
    for zone in desired["zones"]:
        new_zone = copy.deepcopy(zone)
        old = old_zones.get(zone["name"]) or {}
        ours = {r["name"] for r in zone["resources"]}
        extra = [r for r in old.get("resources") or [] if isinstance(r, dict) and r.get("name") not in ours]
        new_zone["resources"] = sorted(new_zone["resources"] + extra, key=lambda r: str(r.get("name")))
        if old.get("attributes") and "attributes" not in new_zone:
            new_zone["attributes"] = old["attributes"]
        zones.append(new_zone)
    merged["zones"] = zones
    return merged


# --------------------------------------------------------------------------------------------- API writes


class _Unread:
    """No object was read yet."""


class NRTReporter:
    """Reads, creates and replaces the node's NodeResourceTopology through
    :class:`koordlet.kubeapi.CustomObjects`."""

    def __init__(self, node_name: str, custom_api: CustomObjects) -> None:
        self.node_name = node_name
        self._api = custom_api

    def get(self, resource_version: str | None = "0") -> dict[str, Any] | None:
        """The stored object, None when there is none; ``"0"``: from the watch cache, None: the newest (etcd)."""
        try:
            return self._api.get_cluster_custom_object(NRT_GROUP, NRT_VERSION, NRT_PLURAL, self.node_name,
                                                       resource_version=resource_version)
        except Throttled:
            raise
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise NRTReportError(f"get NodeResourceTopology {self.node_name}: {exc.status} {exc.reason}") from exc

    def write(self, desired: Mapping[str, Any],
              stored: Mapping[str, Any] | None | type[_Unread] = _Unread) -> tuple[str, dict[str, Any]]:
        """Make the object carry ``desired``, starting from ``stored`` (what the last read or write returned; not
        given: read from the watch cache first): ("created" | "updated" | "unchanged", the stored object). A 409
        reads the newest once and tries again."""
        if stored is _Unread:
            stored = self.get("0")
        for attempt in (1, 2):
            if stored is None:
                try:
                    return "created", self._api.create_cluster_custom_object(NRT_GROUP, NRT_VERSION, NRT_PLURAL,
                                                                             dict(desired))
                except Throttled:
                    raise
                except ApiException as exc:
                    if exc.status != 409 or attempt == 2:  # 409: created by someone else meanwhile
                        raise NRTReportError(f"create NodeResourceTopology {self.node_name}: {exc.status} "
                                             f"{exc.body}") from exc
                stored = self.get(None)
                continue
            reason = change_reason(stored, desired)
            if reason is None:
                return "unchanged", dict(stored)
            try:
                written = self._api.replace_cluster_custom_object(NRT_GROUP, NRT_VERSION, NRT_PLURAL,
                                                                  self.node_name, merge_into(stored, desired))
            except Throttled:
                raise
            except ApiException as exc:
                if exc.status not in (404, 409) or attempt == 2:
                    raise NRTReportError(f"update NodeResourceTopology {self.node_name}: {exc.status} "
                                         f"{exc.body}") from exc
                logger.debug("NodeResourceTopology %s changed meanwhile; reading it again", self.node_name)
                stored = self.get(None)
                continue
            logger.info("NodeResourceTopology %s updated (%s)", self.node_name, reason)
            return "updated", written
        raise NRTReportError(f"update NodeResourceTopology {self.node_name}: still conflicting")


# --------------------------------------------------------------------------------------------- the loop


class NRTReportLoop:
    """Computes the node's NRT every ``interval_s`` and writes it when it changed, at most once per
    ``min_update_interval_s`` (creation is not held back).

    ``cpu_manager``: kubelet's CPU manager state, None when unknown (the integrator wires the reader of
    ``cpu_manager_state``). ``observe``: called with each tick's outcome (created, updated, unchanged,
    deferred, failed) and once per annotation the pools skipped (bad_annotation).
    """

    def __init__(
        self,
        reporter: NRTReporter,
        read_topology: Callable[[], NodeTopology],
        pods: Callable[[], Iterable[PodMeta]],
        cpu_manager: Callable[[], CPUManagerState | None],
        node_annotations: Callable[[], Mapping[str, str]] = dict,
        node_uid: Callable[[], str] = str,
        interval_s: float = DEFAULT_SYNC_INTERVAL_S,
        min_update_interval_s: float = DEFAULT_MIN_UPDATE_INTERVAL_S,
        resync_s: float = DEFAULT_RESYNC_S,
        observe: Callable[[str], None] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        read_hugepages: Callable[[], Mapping[int, Sequence[HugePages]]] | None = None,
        observe_pools: Callable[[CPUPools], None] | None = None,
        rng: random.Random | None = None,
        checkpoint: ApiCheckpoint | None = None,
    ) -> None:
        """``read_hugepages``: the NUMA nodes' huge page pools, read at every tick (gate ``HugePageReport``);
        ``observe_pools``: called with each tick's CPU pools (the share-pool gauges); ``checkpoint``: the object as
        koordlet last wrote or read it before a restart, taken at the first tick instead of a read, and kept after
        every read and write (koordlet/kubeclient/checkpoint.py)."""
        self._reporter = reporter
        self._read_topology = read_topology
        self._pods = pods
        self._cpu_manager = cpu_manager
        self._node_annotations = node_annotations
        self._node_uid = node_uid
        self._min_update_interval_s = min_update_interval_s
        self._resync_s = resync_s
        self._observe = observe or (lambda outcome: None)
        self._monotonic = monotonic
        self._read_hugepages = read_hugepages
        self._observe_pools = observe_pools
        self._topology: NodeTopology | None = None
        self._topology_read_at = -float("inf")
        self._rng = rng or random.Random()
        self._stored: dict[str, Any] | None = None  # the object as last written or read
        self._resync_at = -float("inf")  # when to read the object again
        self._written_at = -float("inf")
        self._backoff = Backoff(rng=self._rng)
        self._retry_at = -float("inf")  # after a failure: no API call before this
        self._failing = False
        self._last_problems: tuple[str, ...] = ()
        self.desired: dict[str, Any] | None = None  # the last object computed (the demo prints it)
        self.writes = 0
        self._checkpoint = checkpoint
        self._checkpoint_key = f"{NRT_PLURAL}/{reporter.node_name}"
        self.timer = PeriodicThread("nrt-reporter", interval_s, self.report_once, monotonic=monotonic, rng=self._rng)

    def _topology_now(self, now: float) -> NodeTopology:
        if self._topology is None or now - self._topology_read_at >= TOPOLOGY_REFRESH_S:
            try:
                self._topology = self._read_topology()
                self._topology_read_at = now
            except SysfsError as exc:
                if self._topology is None:
                    raise
                logger.warning("CPU topology unreadable, reporting the last one read: %s", exc)
        return self._topology

    def compute(self) -> dict[str, Any]:
        """The NRT object for the node as it is now (reads sysfs at most every TOPOLOGY_REFRESH_S)."""
        topology = self._topology_now(self._monotonic())
        kubelet = self._cpu_manager()
        annotations = self._node_annotations()
        pools = compute_cpu_pools(topology.cpus, self._pods(), kubelet, annotations)
        if pools.problems != self._last_problems:  # logged and counted once per new set of bad annotations
            for problem in pools.problems:
                logger.warning("CPU pools: skipped %s", problem)
                self._observe("bad_annotation")
            self._last_problems = pools.problems
        if self._observe_pools is not None:
            self._observe_pools(pools)
        hugepages = self._read_hugepages() if self._read_hugepages is not None else None
        self.desired = build_nrt(self._reporter.node_name, topology, pools, kubelet, annotations, self._node_uid(),
                                 hugepages)
        return self.desired

    def report_once(self) -> str:
        try:
            outcome = self._report()
        except Throttled:
            outcome = "throttled"
        except (NRTReportError, SysfsError, ApiException, urllib3.exceptions.HTTPError, OSError, ValueError) as err:
            outcome = "failed"
            delay = self._backoff.delay(retry_after_s(err.__cause__ or err))
            self._retry_at = self._monotonic() + delay
            if not self._failing:
                logger.warning("NodeResourceTopology report failed; retrying in %.1f s: %s", delay, err)
            self._failing = True
        else:
            if self._failing and outcome != "backoff":
                logger.info("NodeResourceTopology report recovered")
                self._failing = False
                self._backoff.reset()
        self._observe(outcome)
        return outcome

    def _report(self) -> str:
        desired = self.compute()
        now = self._monotonic()
        if now < self._retry_at:
            return "backoff"
        first = self._resync_at == -float("inf")
        if first and self._checkpoint is not None:
            # the object as it was before a restart stands in for the first read: a write carries its version (a
            # 409 if it changed meanwhile, and then it is read); the first resync at a random point of its interval
            restored = self._checkpoint.take(self._checkpoint_key, self._reporter.node_name)
            if restored is not None:
                self._stored = restored
                self._resync_at = now + phase(self._resync_s, self._rng)
                first = False
        if self._stored is None or now >= self._resync_at:
            self._stored = self._reporter.get("0")
            self._keep()
            # the first resync at a random point of its interval (nodes started together resync apart), then ±10 %
            self._resync_at = now + (phase(self._resync_s, self._rng) if first else spread(self._resync_s, self._rng))
        if change_reason(self._stored, desired) is None:
            return "unchanged"
        if self._stored is not None and now - self._written_at < self._min_update_interval_s:
            return "deferred"
        outcome, stored = self._reporter.write(desired, self._stored)
        self._stored = stored
        self._keep()
        if outcome != "unchanged":
            self._written_at = now
            self.writes += 1
        return outcome

    def _keep(self) -> None:
        if self._checkpoint is not None and self._stored is not None:
            self._checkpoint.put(self._checkpoint_key, self._stored)

    def start(self) -> None:
        """The first report at a random point of the first interval, then every interval ±10 %."""
        self.timer.start()

    def stop(self, timeout_s: float = 5.0) -> bool:
        return self.timer.stop(timeout_s)
