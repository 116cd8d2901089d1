"""The frozen input of every strategy's ``decide``: node, NodeSLO, pods and the metrics the strategies read.

A :class:`Snapshot` is built once per strategy tick by :class:`SnapshotBuilder` from the states provider and
the metric cache; ``decide`` functions read nothing else (no files, no clock), so they are tested on
hand-made snapshots. "Latest" values are the newest sample inside 2 × the collect interval (docs/koordinator.md
§4.1); a series without such a sample is absent from the snapshot, never a stale number.

A snapshot is a copy: every value and mapping in it is read out of the cache, the states and the files when it
is built, and nothing in it changes afterwards, whatever the collectors write meanwhile (the mappings are
read-only views of dicts no one else holds). The per-pod and per-container usage maps are the costly part: a scan
of the cache over every pod or container each, 0.18 ms for all five at 150 pods here. Building them at each
strategy's tick would multiply that by the strategies (about ten, most at 1 s), so the builder reads them once per
``now`` and the QoS manager hands all the strategies of one tick the same ``now``: one scan of each map a tick,
about what the strategies that read them cost before, when each map was filled on its first read (a lazy view
into the live cache, which a strategy could see change between the samples of one tick and its decision).
"""

from __future__ import annotations

import enum
import functools
import logging
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from koordlet.actuator import PlanRecord
from koordlet.api.keys import (
    RESOURCE_BATCH_CPU,
    RESOURCE_BATCH_MEMORY,
    RESOURCE_CPU,
    RESOURCE_MEMORY,
    canonical_resource_name,
)
from koordlet.api.kubeletmemqos import KubeletMemoryQoS
from koordlet.api.nodeslo import NodeSLOSpec
from koordlet.api.pod import ContainerMeta, PodMeta, container_limit, pod_level_amount
from koordlet.api.qos import KubeQoS, QoSClass
from koordlet.executor import CgroupNotFoundError, ExecutorError, ResourceExecutor
from koordlet.executor.records import recorded_lines
from koordlet.metriccache import (
    Label,
    MetricCache,
    MetricKind,
    SeriesKey,
)
from koordlet.metricsadvisor.pods import (
    BE_CPU_REAL_LIMIT,
    BE_CPU_REQUEST,
    BE_CPU_USAGE,
    KUBEPODS_CPU,
    UsageDemand,
    fanout_turn,
)
from koordlet.plan import LineKey
from koordlet.statesinformer.api import NodeInfo, StatesProvider
from koordlet.system.blockdev import StorageInfo, read_storage_info
from koordlet.system.cgroup import CgroupVersion
from koordlet.system.cgroup_stats import parse_quota_us  # noqa: F401 - the strategies import it from here
from koordlet.system.kubepods import (
    CgroupPathError,
    KubeCgroupLayout,
    pod_cgroup_dir,  # noqa: F401 - the strategies import it from here
)
from koordlet.system.procfs import ProcParseError, parse_psi
from koordlet.system.resctrl import ResctrlInfo, ResctrlInfoError, read_resctrl_info
from koordlet.system.sysfs import CPUInfo

logger = logging.getLogger(__name__)

HOST_APP_CPU_USAGE = MetricKind.HOST_APP_CPU_USAGE
STORAGE_REFRESH_S = 5.0  # Koordinator collects node storage every second; devices change far less often
_READS_KEPT = 16  # selections with ``every_s`` whose last build is remembered, before those out of date are dropped

_EMPTY: Mapping[str, float] = MappingProxyType({})
_EMPTY_VALUES: Mapping[tuple[str, str], str] = MappingProxyType({})
_EMPTY_SYSTEM: Mapping[str, str] = MappingProxyType({})


# The node_be cpu series the pod collector writes (usage, request, real limit; milli-cores).
BE_CPU_USAGE_KEY = BE_CPU_USAGE
BE_CPU_REQUEST_KEY = BE_CPU_REQUEST
BE_CPU_REAL_LIMIT_KEY = BE_CPU_REAL_LIMIT


@dataclass(frozen=True, slots=True)
class BECPUWindow:
    """``node_be`` cpu metrics over the BE-eviction window, in milli-cores (docs/koordinator.md §4.4)."""

    window_s: float
    samples: int  # the smallest sample count of the three series
    avg_usage_milli: float
    avg_request_milli: float
    avg_real_limit_milli: float
    last_usage_milli: float
    last_request_milli: float
    last_real_limit_milli: float


class Scope(enum.StrEnum):
    """Which cgroup dirs a :class:`CgroupRead` covers."""

    ROOT = "root"  # the hierarchy's root (blk-iocost's io.cost.qos/model live only there)
    BESTEFFORT = "besteffort"  # the besteffort QoS dir
    PODS = "pods"  # every pod dir
    APP_CONTAINERS = "app-containers"  # every container dir but the init containers


@dataclass(frozen=True, slots=True)
class CgroupRead:
    """Read ``resource`` of every dir in ``scope`` into the snapshot (``Snapshot.cgroup_value``); with
    ``pods``, only of the pods it accepts (a strategy reads what it decides on, not every pod's files).

    With ``every_s``, each pod's once every ``every_s`` (in its own turn, :func:`fanout_turn`: spread over the
    ticks), but every tick those ``always`` accepts: for a strategy that acts on a few pods every tick and only looks
    after the others now and then. All of them at the first build after a pause of ``every_s`` or more (at start, when
    the strategy comes back on, when its config changed: a new read)."""

    resource: str
    scope: Scope
    pods: Callable[[PodMeta], bool] | None = None
    every_s: float | None = None
    always: Callable[[PodMeta], bool] | None = None


PodFilter = Callable[[PodMeta], bool]
_Selection = tuple[PodFilter | None, float, PodFilter | None]  # a CgroupRead's pods, every_s and always


def every_pod(pod: PodMeta) -> bool:  # noqa: ARG001 - the filter that takes every pod
    return True


@dataclass(frozen=True, slots=True)
class Needs:
    """What a strategy's ``decide`` reads beyond the node, NodeSLO, pods and latest metrics (its config says).

    ``pod_usage`` and ``container_usage``: the pods whose own latest usage (``pod_cpu_cores``, ``pod_memory_bytes``,
    ``pod_cpu_avg_cores``), and whose containers' (``container_cpu_cores``, ``container_throttled_ratio``), ``decide``
    reads; None: none. The QoS manager has the collector read those pods every tick and the others once every
    fan-out interval (koordlet/metricsadvisor/pods.py), and the snapshot holds only the pods some strategy that is on
    asks for. Every pod by default, so that a strategy that does not say (an out-of-tree one) sees what it saw before;
    the built-in ones say."""

    node_cpu_avg_window_s: float | None = None  # averages of node and pod CPU over this window
    be_window_s: float | None = None  # node_be CPU series over this window
    cgroup_reads: tuple[CgroupRead, ...] = ()
    kernel_files: tuple[str, ...] = ()  # cgroup files to probe on the kubepods dir (once per agent)
    resctrl: bool = False  # the resctrl tree's L3/MB facts
    kubelet_cpu_manager: bool = False  # kubelet's CPU manager state (policy, exclusive CPUs)
    system_files: tuple[str, ...] = ()  # node-wide kernel files (koordlet.system.sysctl names) to read
    storage: bool = False  # the node's block devices (koordlet.system.blockdev), refreshed every few seconds
    device_lines: bool = False  # the per-device blkio lines koordlet wrote (the executor's record)
    pod_usage: PodFilter | None = every_pod
    container_usage: PodFilter | None = every_pod
    kubelet_memory_qos: bool = False  # what kubelet's own memory QoS writes (its KubeletConfiguration)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What a strategy sees at one tick. Usage maps are keyed by pod uid / bare container id."""

    timestamp: float
    node: NodeInfo
    node_slo: NodeSLOSpec
    pods: tuple[PodMeta, ...] = ()
    cpus: tuple[CPUInfo, ...] = ()
    collect_interval_s: float = 1.0
    node_cpu_cores: float | None = None
    node_memory_bytes: float | None = None  # MemTotal − MemAvailable
    node_memory_with_page_cache_bytes: float | None = None  # MemTotal − MemFree
    node_swap_free_bytes: float | None = None
    pod_cpu_cores: Mapping[str, float] = field(default_factory=lambda: _EMPTY)
    pod_memory_bytes: Mapping[str, float] = field(default_factory=lambda: _EMPTY)
    container_cpu_cores: Mapping[str, float] = field(default_factory=lambda: _EMPTY)
    container_throttled_ratio: Mapping[str, float] = field(default_factory=lambda: _EMPTY)
    host_app_cpu_cores: Mapping[str, float] = field(default_factory=lambda: _EMPTY)
    # Every pod together (the kubepods dir) and the besteffort dir, latest, in cores: what "Σ pods" and "Σ BE pods"
    # are while most pods are read only once every fan-out interval (None without a fresh sample).
    kubepods_cpu_cores: float | None = None
    besteffort_cpu_cores: float | None = None
    # The pod and container maps hold every pod with a fresh sample (True), or only those the strategies that are on
    # asked for (False: Σ over them is not Σ pods).
    usage_of_every_pod: bool = True
    node_cpu_avg_cores: float | None = None  # average over the window the builder was asked for
    pod_cpu_avg_cores: Mapping[str, float] = field(default_factory=lambda: _EMPTY)  # same window
    besteffort_cpu_avg_cores: float | None = None  # same window
    be_cpu: BECPUWindow | None = None
    layout: KubeCgroupLayout = field(default_factory=KubeCgroupLayout)
    page_size: int = 4096
    cgroup_values: Mapping[tuple[str, str], str] = field(default_factory=lambda: _EMPTY_VALUES)
    kernel_files: frozenset[str] = frozenset()  # of the probed ones, those this kernel has
    resctrl: ResctrlInfo | None = None
    kubelet_cpu_manager: Any = None  # a statesinformer.cpumanager.CPUManagerState, None when unknown
    # ``Needs.system_files``: their current values (absent: not on this kernel), and the keys whose value before
    # koordlet's first write is recorded (what a strategy may put back)
    system_values: Mapping[str, str] = field(default_factory=lambda: _EMPTY_SYSTEM)
    system_recorded: frozenset[str] = frozenset()
    storage: StorageInfo | None = None  # ``Needs.storage``
    lines_recorded: frozenset[LineKey] = frozenset()  # ``Needs.device_lines``: the lines koordlet may put back
    cgroup_v2: bool = False  # the node's cgroup version (the executor's)
    kubelet_memory_qos: KubeletMemoryQoS = KubeletMemoryQoS()  # ``Needs.kubelet_memory_qos``; default: writes nothing
    memo: Any = None  # the strategy's ``Plan.memo`` of its previous tick
    last: PlanRecord | None = None  # what the runner did with the strategy's previous plan

    def cgroup_value(self, resource: str, cgroup_dir: str) -> str | None:
        """A value read for this tick (``Needs.cgroup_reads``); None when it was not read or not readable."""
        return self.cgroup_values.get((resource, cgroup_dir))

    def pod(self, uid: str) -> PodMeta | None:
        for pod in self.pods:
            if pod.uid == uid:
                return pod
        return None

    @property
    def capacity_cpu_milli(self) -> int:
        return int(self.node.capacity.get(RESOURCE_CPU, 0))

    @property
    def capacity_memory_bytes(self) -> int:
        return int(self.node.capacity.get(RESOURCE_MEMORY, 0))

    @property
    def num_cpus(self) -> int:
        """Logical CPUs: the topology when known, else the node's CPU capacity."""
        return len(self.cpus) if self.cpus else math.ceil(self.capacity_cpu_milli / 1000)


# ----------------------------------------------------------------------------------------- pod helpers


def is_be(pod: PodMeta) -> bool:
    """A BE pod: the qosClass label BE, or no label and kube QoS BestEffort (docs/koordinator.md §12)."""
    return pod.qos_class is QoSClass.BE


@dataclass(frozen=True, slots=True)
class LSPressure:
    """The highest ``some avg10`` (percent) among the LS pods' pressure files of one resource, and whose it is."""

    percent: float
    pod: str  # namespace/name


def ls_pressure(snapshot: Snapshot, resource_file: str) -> LSPressure | None:
    """The highest ``some avg10`` of ``resource_file`` (``cpu.pressure``, ``io.pressure``, ``memory.pressure``)
    among the LS (non-BE) pods whose file the snapshot read (``Needs.cgroup_reads``); None when none was."""
    worst: LSPressure | None = None
    for pod in snapshot.pods:
        if is_be(pod) or (pod_dir := pod_cgroup_dir(snapshot.layout, pod)) is None:
            continue
        raw = snapshot.cgroup_value(resource_file, pod_dir)
        if raw is None:
            continue
        try:
            some = parse_psi(raw.encode()).some.avg10
        except ProcParseError as exc:
            logger.debug("cannot parse the %s of %s: %s", resource_file, pod.key, exc)
            continue
        if worst is None or some > worst.percent:
            worst = LSPressure(some, pod.key)
    return worst


def container_resource(container: ContainerMeta, resource: str, limits: bool = False) -> int:
    """A container's request (or limit) of ``resource``, deprecated aliases included; 0 when unset."""
    amounts = container.limits if limits else container.requests
    total = 0
    for name, value in amounts.items():
        if canonical_resource_name(name) == resource:
            total = max(total, int(value))
    return total


def pod_batch_cpu_request_milli(pod: PodMeta) -> int:
    """Σ ``kubernetes.io/batch-cpu`` requests of the pod's containers, init (sidecar) containers included."""
    return sum(container_resource(c, RESOURCE_BATCH_CPU) for c in pod.containers)


def pod_memory_request_bytes(pod: PodMeta) -> int:
    """Σ container memory requests, or the pod-level memory request where the pod sets one (it wins, as in
    Kubernetes' PodRequests); BE pods count batch-memory (docs/koordinator.md §4.6), never pod-level."""
    if is_be(pod):
        return sum(container_resource(c, RESOURCE_BATCH_MEMORY) for c in pod.containers if not c.is_init)
    level = pod_level_amount(pod, RESOURCE_MEMORY)
    if level is not None:
        return level
    return sum(container_resource(c, RESOURCE_MEMORY) for c in pod.containers if not c.is_init)


def container_limit_of(pod: PodMeta, container: ContainerMeta, resource: str) -> int:
    """The container's limit of ``resource`` (aliases resolved), else its pod's pod-level limit
    (koordlet.api.pod.container_limit: what kubelet gives a container without one); 0 when neither is set."""
    return container_limit(pod, container, resource, own=container_resource(container, resource, limits=True))


def container_cgroup_dir(layout: KubeCgroupLayout, pod_dir: str, container: ContainerMeta) -> str | None:
    if not container.container_id:
        return None
    return _container_dir(layout, pod_dir, container.container_id, container.runtime)


# The strategies ask for the same dirs of the same pods every tick; building one checks each component. A pure
# function of its (hashable) arguments, so it is memoised in an LRU cache sized above a node's containers: pod
# churn replaces entries and never grows them. (Pod dirs: koordlet.system.kubepods.pod_cgroup_dir, memoised too.)
@functools.lru_cache(maxsize=4096)
def _container_dir(layout: KubeCgroupLayout, pod_dir: str, container_id: str, runtime: str) -> str | None:
    try:
        return layout.container_dir(pod_dir, container_id, runtime)
    except CgroupPathError:
        return None


def pod_kube_qos(pod: PodMeta) -> KubeQoS:
    """Kube QoS, BestEffort for a BE pod whose kube QoS is unknown (it lives under besteffort)."""
    kube_qos = pod.effective_kube_qos
    if kube_qos is not None:
        return kube_qos
    return KubeQoS.BESTEFFORT if is_be(pod) else KubeQoS.BURSTABLE


# The latest-sample maps every snapshot holds: (field, metric kind, the label that keys it).
_POD_MAPS = (
    ("pod_cpu_cores", MetricKind.POD_CPU_USAGE, Label.POD_UID),
    ("pod_memory_bytes", MetricKind.POD_MEMORY_USAGE, Label.POD_UID),
)
_CONTAINER_MAPS = (
    ("container_cpu_cores", MetricKind.CONTAINER_CPU_USAGE, Label.CONTAINER_ID),
    ("container_throttled_ratio", MetricKind.CONTAINER_CPU_THROTTLED, Label.CONTAINER_ID),
)
_HOST_APP_MAP = ("host_app_cpu_cores", HOST_APP_CPU_USAGE, Label.HOST_APP_NAME)
_LATEST_MAPS = (*_POD_MAPS, *_CONTAINER_MAPS, _HOST_APP_MAP)


def usage_demand(pods: tuple[PodMeta, ...], needs: Iterable[Needs]) -> UsageDemand:
    """The pods whose usage ``needs`` (those of the strategies that are on) read: the collector reads them every
    tick, and the snapshot holds them."""
    pod_filters = [n.pod_usage for n in needs if n.pod_usage is not None]
    container_filters = [n.container_usage for n in needs if n.container_usage is not None]
    if not pod_filters and not container_filters:
        return UsageDemand()
    return UsageDemand(
        pods=frozenset(p.uid for p in pods if any(wanted(p) for wanted in pod_filters)),
        containers=frozenset(p.uid for p in pods if any(wanted(p) for wanted in container_filters)),
    )


# ----------------------------------------------------------------------------------------- the builder


class SnapshotBuilder:
    """Reads the states provider, the metric cache and (through the executor's reads) the cgroup values a
    strategy's config needs into a :class:`Snapshot`."""

    def __init__(
        self,
        states: StatesProvider,
        cache: MetricCache,
        cpus: tuple[CPUInfo, ...] = (),
        collect_interval_s: float = 1.0,
        clock: Callable[[], float] = time.time,
        *,
        reader: ResourceExecutor | None = None,
        layout: KubeCgroupLayout | None = None,
        resctrl_vendor: str = "intel",
        page_size: int | None = None,
        cpu_manager: Callable[[], Any] | None = None,
        sys_dir: str | None = None,
        observe_storage: Callable[[bool], None] | None = None,
        kubelet_memory_qos: Callable[[], KubeletMemoryQoS] | None = None,
    ) -> None:
        """``reader``: the executor whose reads fill ``Needs.cgroup_reads``, ``kernel_files`` and ``resctrl``
        (without it those stay empty); ``layout``: kubelet's cgroup layout the dirs are built with;
        ``cpu_manager``: kubelet's CPU manager state (``Needs.kubelet_cpu_manager``), None when unknown;
        ``observe_storage``: told whether each reading of the block devices worked (Koordinator's
        collect_node_local_storage_info_status); ``kubelet_memory_qos``: what kubelet's own memory QoS writes
        (``Needs.kubelet_memory_qos``; without it: nothing)."""
        self._cpu_manager = cpu_manager
        self._kubelet_memory_qos = kubelet_memory_qos
        self._observe_storage = observe_storage
        self._sys_dir = sys_dir  # ``Needs.storage``: the block devices under <sys_dir>/class/block
        self._storage: tuple[float, StorageInfo] | None = None
        self._states = states
        self._cache = cache
        self._cpus = cpus
        self._interval_s = collect_interval_s
        self._clock = clock
        self._reader = reader
        self._layout = layout or KubeCgroupLayout()
        self._vendor = resctrl_vendor
        self._page_size = page_size or os.sysconf("SC_PAGE_SIZE")
        self._kernel_files: dict[str, bool] = {}  # probed once: the kernel does not grow files
        self._resctrl: ResctrlInfo | None = None
        self._resctrl_probed = False
        self._maps_at: tuple[float, dict[str, Mapping[str, float]]] | None = None  # (now, the latest-sample maps)
        self._demand: UsageDemand | None = None  # the pods the usage maps hold (None: every pod)
        # the newest build of each selection with ``every_s`` (which pods, how often, which always) and what it
        # selected: builds at one ``now`` (the reads of one strategy, the strategies of one tick) select the same pods,
        # once
        self._selections: dict[_Selection, tuple[float, tuple[PodMeta, ...]]] = {}

    def restrict(self, demand: UsageDemand | None) -> None:
        """Hold only these pods' usage in the snapshots (the manager's :func:`usage_demand`, set before each tick):
        the others are read once every fan-out interval, and a sample of those that happens to be fresh says
        nothing of the rest. None: every pod with a fresh sample."""
        if demand != self._demand:
            self._demand = demand
            self._maps_at = None

    def latest_collection(self) -> float | None:
        """Wall-clock time of the newest node memory sample (every node collection writes one)."""
        latest = self._cache.latest(SeriesKey.of(MetricKind.NODE_MEMORY_USAGE))
        return None if latest is None else latest[0]

    def _latest(self, key: SeriesKey, now: float) -> float | None:
        return self._cache.last_value(key, now - 2 * self._interval_s, now)

    def _latest_maps(self, now: float, pods: tuple[PodMeta, ...]) -> dict[str, Mapping[str, float]]:
        """The latest-sample maps at ``now``, copied out of the cache once per ``now``: the strategies of one
        manager tick share them (the manager hands every strategy of a tick the same ``now``)."""
        taken = self._maps_at
        if taken is not None and taken[0] == now:
            return taken[1]
        start, demand, cache = now - 2 * self._interval_s, self._demand, self._cache
        if demand is None:
            maps = {name: MappingProxyType(cache.last_values(kind, label, start, now))
                    for name, kind, label in _LATEST_MAPS}
        else:
            name, kind, label = _HOST_APP_MAP
            maps = {name: MappingProxyType(cache.last_values(kind, label, start, now))}
            wanted = demand.pods | demand.containers
            for name, kind, _label in _POD_MAPS:
                keys = {uid: SeriesKey(str(kind), ((Label.POD_UID.value, uid),)) for uid in wanted}
                maps[name] = MappingProxyType(cache.last_values_of(keys, start, now))
            containers = [(pod.uid, c.container_id) for pod in pods if pod.uid in demand.containers
                          for c in pod.containers if c.container_id]
            for name, kind, _label in _CONTAINER_MAPS:
                keys = {cid: SeriesKey.of(kind, **{Label.POD_UID: uid, Label.CONTAINER_ID: cid})
                        for uid, cid in containers}
                maps[name] = MappingProxyType(cache.last_values_of(keys, start, now))
        self._maps_at = (now, maps)  # one assignment: a reader sees the old pair or the new one
        return maps

    def _pod_cpu_averages(self, start: float, now: float) -> Mapping[str, float]:
        """Each pod's CPU average over [start, now]: of the pods the snapshot holds (every pod without a demand)."""
        if self._demand is None:
            keys = {uid: key for key in self._cache.keys(MetricKind.POD_CPU_USAGE)
                    if (uid := key.label(Label.POD_UID)) is not None}
        else:
            keys = {uid: SeriesKey(MetricKind.POD_CPU_USAGE.value, ((Label.POD_UID.value, uid),))
                    for uid in self._demand.pods | self._demand.containers}
        averages: dict[str, float] = {}
        for uid, key in keys.items():
            aggregate = self._cache.query(key, start, now)
            if aggregate is not None:
                averages[uid] = aggregate.avg
        return MappingProxyType(averages)

    def build(
        self,
        needs: Needs | None = None,
        *,
        node_cpu_avg_window_s: float | None = None,
        be_window_s: float | None = None,
        now: float | None = None,
        memo: Any = None,
        last: PlanRecord | None = None,
    ) -> Snapshot | None:
        """A snapshot of now with what ``needs`` asks for; None while the node is not known yet."""
        needs = needs or Needs(node_cpu_avg_window_s=node_cpu_avg_window_s, be_window_s=be_window_s)
        node = self._states.node()
        if node is None:
            return None
        now = self._clock() if now is None else now
        node_cpu_avg: float | None = None
        besteffort_cpu_avg: float | None = None
        pod_cpu_avg: Mapping[str, float] = _EMPTY
        if needs.node_cpu_avg_window_s is not None:
            start = now - needs.node_cpu_avg_window_s
            aggregate = self._cache.query(SeriesKey.of(MetricKind.NODE_CPU_USAGE), start, now)
            node_cpu_avg = None if aggregate is None else aggregate.avg
            besteffort = self._cache.query(BE_CPU_USAGE_KEY, start, now)
            besteffort_cpu_avg = None if besteffort is None else besteffort.avg / 1000.0
            pod_cpu_avg = self._pod_cpu_averages(start, now)
        pods = self._states.pods()
        besteffort_milli = self._latest(BE_CPU_USAGE_KEY, now)
        return Snapshot(
            timestamp=now,
            node=node,
            node_slo=self._states.node_slo(),
            pods=pods,
            cpus=self._cpus,
            collect_interval_s=self._interval_s,
            node_cpu_cores=self._latest(SeriesKey.of(MetricKind.NODE_CPU_USAGE), now),
            node_memory_bytes=self._latest(SeriesKey.of(MetricKind.NODE_MEMORY_USAGE), now),
            node_memory_with_page_cache_bytes=self._latest(
                SeriesKey.of(MetricKind.NODE_MEMORY_USAGE_WITH_PAGE_CACHE), now),
            node_swap_free_bytes=self._latest(SeriesKey.of(MetricKind.NODE_SWAP_FREE), now),
            **self._latest_maps(now, pods),
            kubepods_cpu_cores=self._latest(KUBEPODS_CPU, now),
            besteffort_cpu_cores=None if besteffort_milli is None else besteffort_milli / 1000.0,
            usage_of_every_pod=self._demand is None,
            node_cpu_avg_cores=node_cpu_avg,
            pod_cpu_avg_cores=pod_cpu_avg,
            besteffort_cpu_avg_cores=besteffort_cpu_avg,
            be_cpu=None if needs.be_window_s is None else self._be_window(needs.be_window_s, now),
            layout=self._layout,
            page_size=self._page_size,
            cgroup_values=self._read_cgroups(needs.cgroup_reads, pods, now),
            kernel_files=self._probe(needs.kernel_files),
            resctrl=self._resctrl_info() if needs.resctrl else None,
            kubelet_cpu_manager=self._cpu_manager() if needs.kubelet_cpu_manager and self._cpu_manager else None,
            system_values=self._read_system(needs.system_files),
            system_recorded=self._reader.originals.keys() if needs.system_files and self._reader else frozenset(),
            storage=self._storage_info(now) if needs.storage else None,
            lines_recorded=frozenset(recorded_lines(self._reader.records)) if needs.device_lines and self._reader
            else frozenset(),
            cgroup_v2=self._reader is not None and self._reader.cgroup_fs.version is CgroupVersion.V2,
            kubelet_memory_qos=self._kubelet_memory_qos() if needs.kubelet_memory_qos and self._kubelet_memory_qos
            else KubeletMemoryQoS(),
            memo=memo,
            last=last,
        )

    # ------------------------------------------------------------------------------------ the reads

    def scope_dirs(self, scope: Scope, pods: tuple[PodMeta, ...]) -> list[str]:
        """The cgroup dirs of ``scope`` for ``pods`` (dirs that cannot be built safely are left out)."""
        layout = self._layout
        if scope is Scope.BESTEFFORT:
            return [layout.qos_dir(KubeQoS.BESTEFFORT)]
        if scope is Scope.ROOT:
            return [""]
        dirs: list[str] = []
        for pod in pods:
            pod_dir = pod_cgroup_dir(layout, pod)
            if pod_dir is None:
                continue
            if scope is Scope.PODS:
                dirs.append(pod_dir)
            else:
                dirs.extend(d for c in pod.containers
                            if not c.is_init and (d := container_cgroup_dir(layout, pod_dir, c)) is not None)
        return dirs

    def _selected(self, read: CgroupRead, pods: tuple[PodMeta, ...], now: float) -> tuple[PodMeta, ...]:
        """The pods ``read`` reads at ``now`` (see :class:`CgroupRead`)."""
        if read.every_s is None:
            return pods if read.pods is None else tuple(p for p in pods if read.pods(p))
        key = (read.pods, read.every_s, read.always)
        at = self._selections.get(key)
        if at is not None and at[0] == now:
            return at[1]
        last = None if at is None else at[0]
        if len(self._selections) > _READS_KEPT:  # selections of configs long gone
            self._selections = {k: a for k, a in self._selections.items() if now - a[0] < k[1]}
        selected = pods if read.pods is None else tuple(p for p in pods if read.pods(p))
        every, always = read.every_s, read.always
        if last is not None and 0 <= now - last < every:
            selected = tuple(p for p in selected if (always is not None and always(p))
                             or fanout_turn(p.uid, now, every) != fanout_turn(p.uid, last, every))
        self._selections[key] = (now, selected)
        return selected

    def _read_cgroups(self, reads: tuple[CgroupRead, ...], pods: tuple[PodMeta, ...],
                      now: float) -> Mapping[tuple[str, str], str]:
        if not reads or self._reader is None:
            return _EMPTY_VALUES
        values: dict[tuple[str, str], str] = {}
        for read in reads:
            selected = self._selected(read, pods, now)
            for cgroup_dir in self.scope_dirs(read.scope, selected):
                try:
                    values[(read.resource, cgroup_dir)] = self._reader.read(read.resource, cgroup_dir,
                                                                         every_tick=True)
                except ExecutorError as exc:
                    logger.debug("cannot read %s of %s: %s", read.resource, cgroup_dir, exc)
        return MappingProxyType(values)

    def _storage_info(self, now: float) -> StorageInfo | None:
        """The block devices, read again at most every STORAGE_REFRESH_S (devices come and go rarely)."""
        if self._sys_dir is None:
            return None
        if self._storage is None or now - self._storage[0] >= STORAGE_REFRESH_S or now < self._storage[0]:
            try:
                info, ok = read_storage_info(self._sys_dir, strict=True), True
            except OSError as exc:
                logger.debug("cannot list the block devices: %s", exc)
                info, ok = StorageInfo(), False
            self._storage = (now, info)
            if self._observe_storage is not None:
                self._observe_storage(ok)
        return self._storage[1]

    def _read_system(self, names: tuple[str, ...]) -> Mapping[str, str]:
        if not names or self._reader is None:
            return _EMPTY_SYSTEM
        values: dict[str, str] = {}
        for name in names:
            try:
                values[name] = self._reader.read_system(name)
            except ExecutorError as exc:
                logger.debug("cannot read %s: %s", name, exc)
        return MappingProxyType(values)

    def _probe(self, files: tuple[str, ...]) -> frozenset[str]:
        if not files or self._reader is None:
            return frozenset()
        for name in files:
            if name not in self._kernel_files:
                try:
                    self._kernel_files[name] = self._reader.has(name, self._layout.kubepods_dir())
                except CgroupNotFoundError:
                    continue  # no kubepods dir yet: probed again next time
                except ExecutorError as exc:
                    logger.debug("cannot probe %s: %s", name, exc)
                    self._kernel_files[name] = False
        return frozenset(name for name in files if self._kernel_files.get(name))

    def _resctrl_info(self) -> ResctrlInfo | None:
        if not self._resctrl_probed:
            self._resctrl_probed = True
            root = self._reader.resctrl_root if self._reader is not None else None
            try:
                self._resctrl = read_resctrl_info(root, self._vendor) if root else None
            except ResctrlInfoError as exc:
                logger.warning("resctrl QoS is a no-op: %s", exc)
                self._resctrl = None
            if self._resctrl is None:
                logger.info("resctrl QoS is a no-op: no RDT (info/L3/cbm_mask) under %s", root)
        return self._resctrl

    def _be_window(self, window_s: float, now: float) -> BECPUWindow | None:
        start = now - window_s
        usage = self._cache.query(BE_CPU_USAGE_KEY, start, now)
        request = self._cache.query(BE_CPU_REQUEST_KEY, start, now)
        limit = self._cache.query(BE_CPU_REAL_LIMIT_KEY, start, now)
        if usage is None or request is None or limit is None:
            return None
        return BECPUWindow(
            window_s=window_s,
            samples=min(usage.count, request.count, limit.count),
            avg_usage_milli=usage.avg,
            avg_request_milli=request.avg,
            avg_real_limit_milli=limit.avg,
            last_usage_milli=usage.last,
            last_request_milli=request.last,
            last_real_limit_milli=limit.last,
        )
