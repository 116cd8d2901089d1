"""Pod and container resource collector, BE aggregate and system usage, in one pass per tick.

What it reads of a pod dir or a container dir the pod source returns (docs/koordinator.md §7.1):
  CPU        v1 ``cpuacct.usage`` / v2 ``cpu.stat`` usage_usec; cores = Δns / Δt_ns (first sighting primes)
  throttling ``cpu.stat``; ratio = Δnr_throttled / Δnr_periods (0 when no period elapsed)
  memory     ``memory.stat``: anon + unevictable ("usage"); optionally + file LRU ("with page cache")
and every tick
  kubepods   the same three of the kubepods dir, which holds every pod: ``kubepods_cpu_usage`` and
             ``kubepods_memory_usage`` ("Σ pods" as the kernel counts it, hierarchically)
  BE         the besteffort dir's CPU Δ in milli-cores, its real limit = min(cpuset size × 1000,
             quota × 1000 / period when quota ≠ −1), and Σ batch-cpu requests of BE pods
  host apps  CPU and memory of NodeSLO ``hostApplications`` (out-of-band processes in their own cgroups)
  system     node − kubepods − Σ host apps outside kubepods, clamped at 0, from the node collector's reading of the
             same tick; per NUMA node (Koordinator #3138): memory = the node's − the pods' memory on it, CPU = the
             system CPU shared out by the NUMA nodes' CPU use. With one NUMA node the pods' memory is the kubepods
             dir's; with more, the ``memory.numa_stat`` of the kubepods dir, which holds every pod's: one read a tick
             where Koordinator reads each pod's (the same sum; 150 pod reads cost +50 % of the tick, measured by
             bench/numa_usage.py). Host applications are not taken out, as in Koordinator.

**How often each pod is read.** Koordinator reads every pod and container every ``-collect-res-used-interval``
(1 s), and its CPU cost grows with the pods. Here a pod is read every tick only while something decides on its
usage every tick: the QoS strategies that are on say which pods (:class:`UsageDemand`, published by the QoS
manager). Every other pod and its containers are read once every ``fanout_interval_s``
(``-collect-pod-res-used-interval``, 10 s: Koordinator's ``-collect-sys-metric-outdated-interval``, the age up to
which its consumers take a pod's usage as current), each pod at its own phase of that period so that the reads
spread evenly over the ticks; a new pod is read at once and again at the next tick, so it has a CPU rate within
one interval. What reads the per-pod series of those (the NodeMetric report's averages over its aggregation
window, the peak predictor's per-minute p90) gets one sample per period, each the average over it. With
``fanout_interval_s`` equal to the interval every pod is read every tick, as in Koordinator.

Pods and containers come from a callable (the states informer provides it), as dirs relative to the
cgroup hierarchy root (``kubepods/besteffort/pod<uid>``); :class:`koordlet.system.cgroup.CgroupFS`
turns them into the per-controller dirs of v1 or the single dir of v2. A dir that vanished between
listing and reading (pod deleted) is skipped quietly; previous readings of pods and containers no
longer listed are forgotten, so the state is bounded by the live population. The per-cgroup files are
read through kept descriptors (:class:`koordlet.system.procfs.KeptFiles`), which halves the syscall
cost at 150 containers; give the agent a RLIMIT_NOFILE of a few thousand to keep them all.
"""

from __future__ import annotations

import functools
import logging
import math
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from koordlet.metriccache import (
    BE_ALLOCATION_REAL_LIMIT,
    BE_ALLOCATION_REQUEST,
    BE_ALLOCATION_USAGE,
    Label,
    MetricKind,
    Sample,
    SeriesKey,
)
from koordlet.metricsadvisor.node import NodeResourceCollector, NUMAUsage, numa_key
from koordlet.system import cgroup_stats
from koordlet.system.cgroup import CgroupFS
from koordlet.system.procfs import KeptFiles, ProcParseError

logger = logging.getLogger(__name__)

QOS_BE = "BE"


@dataclass(frozen=True, slots=True)
class ContainerCgroup:
    container_id: str
    cgroup_dir: str  # relative to the hierarchy root


@dataclass(frozen=True, slots=True)
class PodCgroup:
    pod_uid: str
    cgroup_dir: str  # relative to the hierarchy root
    containers: tuple[ContainerCgroup, ...]
    qos: str  # Koordinator QoS class: LSE, LSR, LS, BE, SYSTEM
    batch_cpu_request_milli: int = 0  # kubernetes.io/batch-cpu request of a BE pod


PodSource = Callable[[], Sequence[PodCgroup]]


@dataclass(frozen=True, slots=True)
class HostAppCgroup:
    name: str  # NodeSLO hostApplications[].name
    cgroup_dir: str  # relative to the hierarchy root


HostAppSource = Callable[[], Sequence[HostAppCgroup]]


@dataclass(frozen=True, slots=True)
class UsageDemand:
    """The pods whose usage is read at every collection, by pod uid: ``pods`` their own, ``containers`` their
    containers' (and their own). The QoS manager publishes the union of what its strategies that are on decide on;
    every other pod is read once every fan-out interval."""

    pods: frozenset[str] = frozenset()
    containers: frozenset[str] = frozenset()


NO_DEMAND = UsageDemand()
DemandSource = Callable[[], UsageDemand]


@functools.lru_cache(maxsize=8192)  # above a node's pods and containers: churn replaces entries
def _phase(ident: str) -> float:
    return zlib.crc32(ident.encode()) / 2**32


def fanout_turn(ident: str, t: float, period: float) -> int:
    """Which turn of a ``period`` long round ``t`` (seconds) falls in for the pod (or container) ``ident``: each has
    its own phase in the round, fixed by its name, so that work done once a turn (a fan-out read, CPU burst's visit
    of an idle pod) spreads evenly over the round."""
    return math.floor(t / period + _phase(ident))


class DemandBoard:
    """Where the QoS manager's thread leaves the :class:`UsageDemand` and the collector's thread takes it: a whole
    value replaced in one assignment (ARCHITECTURE.md, one owner)."""

    def __init__(self) -> None:
        self._demand = NO_DEMAND

    def get(self) -> UsageDemand:
        return self._demand

    def set(self, demand: UsageDemand) -> None:
        self._demand = demand


# Not frozen: built for every cgroup every tick, and a frozen dataclass's __init__ sets each field through
# object.__setattr__ (about three times the cost). Never changed after it is built.
@dataclass(slots=True)
class _CgroupReading:
    monotonic_ns: int
    usage_ns: int
    nr_periods: int
    nr_throttled: int
    memory_bytes: int
    memory_with_cache_bytes: int


@dataclass(frozen=True, slots=True)
class _Target:
    rel: str
    cpu_stat_path: str
    usage_path: str | None  # v1 cpuacct.usage; None on v2, where cpu.stat has usage_usec
    memory_stat_path: str
    keys: tuple[SeriesKey, SeriesKey, SeriesKey, SeriesKey | None]  # cpu, memory, with page cache, throttled

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(p for p in (self.cpu_stat_path, self.usage_path, self.memory_stat_path) if p is not None)


@dataclass(frozen=True, slots=True)
class _Kinds:
    cpu: str
    memory: str
    memory_with_cache: str
    throttled: str | None


_POD_KINDS = _Kinds(
    MetricKind.POD_CPU_USAGE,
    MetricKind.POD_MEMORY_USAGE,
    MetricKind.POD_MEMORY_USAGE_WITH_PAGE_CACHE,
    MetricKind.POD_CPU_THROTTLED,
)
_CONTAINER_KINDS = _Kinds(
    MetricKind.CONTAINER_CPU_USAGE,
    MetricKind.CONTAINER_MEMORY_USAGE,
    MetricKind.CONTAINER_MEMORY_USAGE_WITH_PAGE_CACHE,
    MetricKind.CONTAINER_CPU_THROTTLED,
)
# Koordinator keeps CPU and memory of host applications, not their throttling.
_HOST_APP_KINDS = _Kinds(
    MetricKind.HOST_APP_CPU_USAGE,
    MetricKind.HOST_APP_MEMORY_USAGE,
    MetricKind.HOST_APP_MEMORY_USAGE_WITH_PAGE_CACHE,
    None,
)
_KUBEPODS_KINDS = _Kinds(
    MetricKind.KUBEPODS_CPU_USAGE,
    MetricKind.KUBEPODS_MEMORY_USAGE,
    MetricKind.KUBEPODS_MEMORY_USAGE_WITH_PAGE_CACHE,
    None,
)
_KUBEPODS = "kubepods"  # the ident of the kubepods dir among the pods' and containers'


def _be_key(allocation: str) -> SeriesKey:
    return SeriesKey.of(MetricKind.NODE_BE, **{Label.BE_RESOURCE: "cpu", Label.BE_ALLOCATION: allocation})


BE_CPU_USAGE = _be_key(BE_ALLOCATION_USAGE)
BE_CPU_REQUEST = _be_key(BE_ALLOCATION_REQUEST)
BE_CPU_REAL_LIMIT = _be_key(BE_ALLOCATION_REAL_LIMIT)
SYS_CPU = SeriesKey.of(MetricKind.SYS_CPU_USAGE)
SYS_MEMORY = SeriesKey.of(MetricKind.SYS_MEMORY_USAGE)
KUBEPODS_CPU = SeriesKey.of(MetricKind.KUBEPODS_CPU_USAGE)


class PodResourceCollector:
    name = "pod_resource"

    def __init__(
        self,
        pods: PodSource,
        cgroup_fs: CgroupFS | None = None,
        interval_s: float = 1.0,
        be_cgroup_dir: str | None = None,
        node: NodeResourceCollector | None = None,
        collect_page_cache: bool = False,
        monotonic_ns: Callable[[], int] = time.monotonic_ns,
        host_apps: HostAppSource | None = None,
        kubepods_dir: str | None = None,
        fanout_interval_s: float | None = None,
        demand: DemandSource | None = None,
    ) -> None:
        """``cgroup_fs``: where the hierarchies are (detected from /proc/self/mountinfo if None);
        ``be_cgroup_dir``: the besteffort QoS dir relative to the hierarchy root (no BE samples if None);
        ``node``: the node collector whose reading of the same tick gives system usage (none if None);
        ``host_apps``: the host applications to read (none if None); ``kubepods_dir``: the dir holding every pod
        (relative to the hierarchy root), read every tick for Σ pods (and its memory.numa_stat for the pods' memory
        per NUMA node); ``fanout_interval_s``: how often a pod no one demands is read (default: every tick);
        ``demand``: the pods read every tick (none if None)."""
        self.interval_s = interval_s
        fanout_s = interval_s if fanout_interval_s is None else fanout_interval_s
        if fanout_s < interval_s:
            raise ValueError(f"fan-out interval {fanout_s} s is shorter than the collect interval {interval_s} s")
        self.fanout_interval_s = fanout_s
        self._every_tick = fanout_s <= interval_s
        self._pods = pods
        self._demand = demand
        self._host_apps = host_apps
        self._missing_apps: set[str] = set()  # host apps whose cgroup was not there, said once each
        self._fs = cgroup_fs if cgroup_fs is not None else CgroupFS.detect()
        self._be_dir = be_cgroup_dir
        self._kubepods_dir = kubepods_dir
        self._node = node
        self._collect_page_cache = collect_page_cache
        self._monotonic_ns = monotonic_ns
        self._prev: dict[str, _CgroupReading] = {}
        self._targets: dict[str, _Target] = {}
        # pod ident → the fan-out turn it was last read in (absent: not read twice yet, so read at the next tick)
        self._turns: dict[str, int] = {}
        # the pod and host app lists the state was last pruned to
        self._listed: tuple[tuple[PodCgroup, ...], tuple[HostAppCgroup, ...]] | None = None
        self._be_request_milli = 0  # Σ batch-cpu requests of the BE pods listed
        self._files = KeptFiles()
        self._prev_be: tuple[int, int] | None = None  # (monotonic ns, usage ns)
        self._kubepods_numa_stat = (cgroup_stats.numa_stat_path(self._fs.cgroup_dir("memory", kubepods_dir))
                                    if kubepods_dir is not None else None)
        self._kubepods_failing = False
        self.read_errors = 0

    def enabled(self) -> bool:
        return True

    @property
    def open_files(self) -> int:
        """Descriptors of cgroup files kept open between ticks."""
        return len(self._files)

    def close(self) -> None:
        """Close the kept descriptors of cgroup files."""
        self._files.close()

    def forget_dirs(self, cgroup_dirs: Sequence[str]) -> None:
        """Close the kept descriptors below ``cgroup_dirs`` now (their pod left the states; any thread): the next
        tick forgets their targets."""
        self._files.forget_under(cgroup_dirs)

    # ------------------------------------------------------------------------------------- reading

    def _target(self, ident: str, rel: str, kinds: _Kinds, labels: tuple[tuple[str, str], ...]) -> _Target:
        """File paths and series keys of one pod or container, built once and reused every tick."""
        target = self._targets.get(ident)
        if target is None or target.rel != rel:
            label_map = dict(labels)
            if target is not None:
                self._files.forget(target.paths)
            fs = self._fs
            files = cgroup_stats.usage_files(fs.cgroup_dir("cpu", rel), fs.cgroup_dir("cpuacct", rel),
                                             fs.cgroup_dir("memory", rel), fs.version)
            target = _Target(
                rel=rel,
                cpu_stat_path=files.cpu_stat,
                usage_path=files.cpuacct_usage,
                memory_stat_path=files.memory_stat,
                keys=(
                    SeriesKey.of(kinds.cpu, **label_map),
                    SeriesKey.of(kinds.memory, **label_map),
                    SeriesKey.of(kinds.memory_with_cache, **label_map),
                    SeriesKey.of(kinds.throttled, **label_map) if kinds.throttled is not None else None,
                ),
            )
            self._targets[ident] = target
        return target

    def _read(self, target: _Target) -> _CgroupReading:
        version, read = self._fs.version, self._files.read
        read_ns = self._monotonic_ns()
        usage_ns, nr_periods, nr_throttled = cgroup_stats.cpu_stat_counters(read(target.cpu_stat_path), version)
        if target.usage_path is not None:
            usage_ns = cgroup_stats.parse_cpuacct_usage(read(target.usage_path))
        elif usage_ns is None:
            raise cgroup_stats.CgroupStatError(f"{target.cpu_stat_path} has no usage_usec")
        memory, memory_with_cache = cgroup_stats.memory_usage(read(target.memory_stat_path), version)
        return _CgroupReading(read_ns, usage_ns, nr_periods, nr_throttled, memory, memory_with_cache)

    def _observe(
        self,
        ident: str,
        rel: str,
        kinds: _Kinds,
        labels: tuple[tuple[str, str], ...],
        now: float,
        samples: list[Sample],
    ) -> tuple[float | None, int] | None:
        """Reads one cgroup and appends its samples; (CPU cores or None on first sighting, memory bytes),
        or None when it cannot be read."""
        target = self._target(ident, rel, kinds, labels)
        try:
            reading = self._read(target)
        except FileNotFoundError:
            self._forget(ident)
            return None  # deleted since it was listed
        except (OSError, ProcParseError) as err:
            self._forget(ident)
            self.read_errors += 1
            logger.debug("cannot read cgroup %s: %s", rel, err)
            return None
        prev = self._prev.get(ident)
        self._prev[ident] = reading
        cpu_key, memory_key, memory_cache_key, throttled_key = target.keys
        samples.append(Sample(memory_key, now, float(reading.memory_bytes)))
        if self._collect_page_cache:
            samples.append(Sample(memory_cache_key, now, float(reading.memory_with_cache_bytes)))
        cores: float | None = None
        if prev is not None:
            elapsed_ns = reading.monotonic_ns - prev.monotonic_ns
            if elapsed_ns > 0 and reading.usage_ns >= prev.usage_ns:
                cores = (reading.usage_ns - prev.usage_ns) / elapsed_ns
                samples.append(Sample(cpu_key, now, cores))
            if throttled_key is not None:
                periods = reading.nr_periods - prev.nr_periods
                throttled = reading.nr_throttled - prev.nr_throttled
                ratio = throttled / periods if periods > 0 and throttled >= 0 else 0.0
                samples.append(Sample(throttled_key, now, ratio))
        return cores, reading.memory_bytes

    def _forget(self, ident: str) -> None:
        """Close a cgroup's kept files and drop its last reading (it is read again from scratch, when it is)."""
        target = self._targets.pop(ident, None)
        if target is not None:
            self._files.forget(target.paths)
        self._prev.pop(ident, None)

    # ------------------------------------------------------------------------------------- collect

    def collect(self, now: float) -> list[Sample]:
        samples: list[Sample] = []
        numa = self._node.last_numa if self._node is not None else None
        pods = self._pods()
        host_apps = self._host_apps() if self._host_apps is not None else ()
        listed = (tuple(pods), tuple(host_apps))
        if listed != self._listed:
            self._forget_gone(listed)
        read_cpu_cores, read_memory_bytes = self._collect_pods(pods, now, samples)
        app_cpu_cores, app_memory_bytes = self._collect_host_apps(host_apps, now, samples)
        pods_usage = self._collect_kubepods(now, samples)
        if pods_usage is None and self._every_tick:
            pods_usage = (read_cpu_cores, read_memory_bytes)
        if self._be_dir is not None:
            samples.extend(self._collect_be(self._be_dir, now, self._be_request_milli))
        if pods_usage is None:
            return samples  # Σ pods not known this tick: no system usage
        pods_cpu_cores, pods_memory_bytes = pods_usage
        system = self._system_usage(now, pods_cpu_cores, app_cpu_cores, pods_memory_bytes + app_memory_bytes)
        samples.extend(system)
        if numa is not None and abs(numa.timestamp - now) <= self.interval_s:
            on_nodes = (self._kubepods_numa_memory() if len(numa.memory_bytes) > 1
                        else dict.fromkeys(numa.memory_bytes, pods_memory_bytes))
            system_cpu = next((s.value for s in system if s.key == SYS_CPU), None)
            samples.extend(self._system_numa_usage(now, numa, on_nodes, system_cpu))
        return samples

    def _collect_pods(self, pods: Sequence[PodCgroup], now: float, samples: list[Sample]) -> tuple[float, int]:
        """The samples of the pods (and their containers) due this tick: those demanded, and those whose fan-out
        turn it is; (Σ CPU cores and Σ memory bytes of the pods read)."""
        every_tick, period = self._every_tick, self.fanout_interval_s
        demand = self._demand() if self._demand is not None else NO_DEMAND
        now_s = self._monotonic_ns() / 1e9
        turns = self._turns
        cpu_cores, memory_bytes = 0.0, 0
        for pod in pods:
            uid = pod.pod_uid
            pod_ident = "pod/" + uid
            containers_wanted = uid in demand.containers
            turn = 0 if every_tick else fanout_turn(pod_ident, now_s, period)
            fanout = every_tick or turns.get(pod_ident) != turn
            if not (fanout or containers_wanted or uid in demand.pods):
                continue
            had_reading = pod_ident in self._prev
            observed = self._observe(pod_ident, pod.cgroup_dir, _POD_KINDS, ((Label.POD_UID, uid),), now, samples)
            if observed is None:  # gone (or going): its containers' files are closed too
                for container in pod.containers:
                    self._forget("ctr/" + container.container_id)
                continue
            if fanout and had_reading and not every_tick:
                turns[pod_ident] = turn  # a new pod's first reading primes: its second comes at the next tick
            # A pod seen for the first time has no CPU rate yet and counts 0 towards Σ pods this tick.
            cpu_cores += observed[0] or 0.0
            memory_bytes += observed[1]
            if not (fanout or containers_wanted):
                continue
            for container in pod.containers:
                self._observe(
                    "ctr/" + container.container_id,
                    container.cgroup_dir,
                    _CONTAINER_KINDS,
                    ((Label.POD_UID, uid), (Label.CONTAINER_ID, container.container_id)),
                    now,
                    samples,
                )
        return cpu_cores, memory_bytes

    def _collect_kubepods(self, now: float, samples: list[Sample]) -> tuple[float | None, int] | None:
        """The kubepods dir's samples; its (CPU cores, None until two readings; memory bytes), or None without a
        kubepods dir or when it cannot be read (said once until it can)."""
        if self._kubepods_dir is None:
            return None
        observed = self._observe(_KUBEPODS, self._kubepods_dir, _KUBEPODS_KINDS, (), now, samples)
        if observed is None:
            if not self._kubepods_failing:
                logger.info("cannot read the kubepods dir %s: no system usage until it can be read, unless every "
                            "pod is read every tick", self._kubepods_dir)
            self._kubepods_failing = True
        elif self._kubepods_failing:
            logger.info("kubepods dir %s readable again", self._kubepods_dir)
            self._kubepods_failing = False
        return observed

    def _collect_host_apps(self, apps: Sequence[HostAppCgroup], now: float,
                           samples: list[Sample]) -> tuple[float, int]:
        """The host applications' samples; the CPU cores and memory bytes of those that system usage leaves out
        apart from the pods (those outside the kubepods dir, when that is read)."""
        cpu_cores, memory_bytes = 0.0, 0
        inside = None if self._kubepods_dir is None else self._kubepods_dir.rstrip("/") + "/"
        for app in apps:
            # Counted apart from pods: system usage leaves both out (docs/koordinator.md §7.1).
            observed = self._observe("app/" + app.name, app.cgroup_dir, _HOST_APP_KINDS,
                                     ((Label.HOST_APP_NAME, app.name),), now, samples)
            if observed is not None:
                if inside is None or not app.cgroup_dir.startswith(inside):  # else counted in kubepods already
                    cpu_cores += observed[0] or 0.0
                    memory_bytes += observed[1]
                self._missing_apps.discard(app.name)
            elif app.name not in self._missing_apps:
                self._missing_apps.add(app.name)
                logger.warning("host application %s: cannot read its cgroup %s (NodeSLO hostApplications); "
                               "its usage counts as system usage until it can be read", app.name, app.cgroup_dir)
        return cpu_cores, memory_bytes

    def _forget_gone(self, listed: tuple[tuple[PodCgroup, ...], tuple[HostAppCgroup, ...]]) -> None:
        """Forget pods, containers and host apps no longer listed: state stays bounded by the live population (run
        when a list changes; the pod source hands back the very same tuple while nothing changed)."""
        self._listed = listed
        pods, apps = listed
        self._be_request_milli = sum(pod.batch_cpu_request_milli for pod in pods if pod.qos == QOS_BE)
        live = {_KUBEPODS}
        for pod in pods:
            live.add("pod/" + pod.pod_uid)
            live.update("ctr/" + c.container_id for c in pod.containers)
        live.update("app/" + app.name for app in apps)
        for ident in [ident for ident in self._targets if ident not in live]:
            self._forget(ident)
        for state in (self._prev, self._turns):
            for ident in [ident for ident in state if ident not in live]:
                del state[ident]

    def _kubepods_numa_memory(self) -> dict[int, int] | None:
        """The pods' memory per NUMA node: the kubepods dir's memory.numa_stat (None without one, or unreadable:
        no system memory per NUMA node this tick)."""
        if self._kubepods_numa_stat is None:
            return None
        try:
            return cgroup_stats.numa_memory_usage(self._files.read(self._kubepods_numa_stat), self._fs.version)
        except (OSError, ProcParseError) as err:
            self.read_errors += 1
            logger.debug("cannot read %s: %s", self._kubepods_numa_stat, err)
            return None

    def _system_numa_usage(self, now: float, numa: NUMAUsage, pods_memory: dict[int, int] | None,
                           system_cpu_cores: float | None) -> list[Sample]:
        """Per NUMA node: memory = the node's − the pods' (≥ 0; none when the pods' is not known); CPU = the system
        CPU × the node's share of the NUMA nodes' CPU use (Koordinator #3138 sysresource: no per-NUMA CPU
        accounting exists for cgroups)."""
        samples = [] if pods_memory is None else [
            Sample(numa_key(MetricKind.SYS_NUMA_MEMORY_USAGE, node_id), now,
                   float(max(used - pods_memory.get(node_id, 0), 0))) for node_id, used in numa.memory_bytes.items()]
        if system_cpu_cores is not None and numa.cpu_cores:
            total = sum(numa.cpu_cores.values())
            for node_id, cores in numa.cpu_cores.items():
                share = system_cpu_cores * cores / total if total > 0 else 0.0
                samples.append(Sample(numa_key(MetricKind.SYS_NUMA_CPU_USAGE, node_id), now, share))
        return samples

    def _collect_be(self, be_dir: str, now: float, request_milli: int) -> list[Sample]:
        """BE usage, request and real limit in milli-cores (docs/koordinator.md §7.1, §4.4)."""
        fs, version = self._fs, self._fs.version
        samples = [Sample(BE_CPU_REQUEST, now, float(request_milli))]
        try:
            read_ns = self._monotonic_ns()
            usage_ns = cgroup_stats.read_cpu_usage_ns(fs.cgroup_dir("cpuacct", be_dir), version)
        except (OSError, ProcParseError) as err:
            self.read_errors += 1
            logger.debug("cannot read besteffort CPU usage under %s: %s", be_dir, err)
            self._prev_be = None
        else:
            if self._prev_be is not None:
                prev_ns, prev_usage = self._prev_be
                if read_ns > prev_ns and usage_ns >= prev_usage:
                    milli = (usage_ns - prev_usage) * 1000.0 / (read_ns - prev_ns)
                    samples.append(Sample(BE_CPU_USAGE, now, milli))
            self._prev_be = (read_ns, usage_ns)
        try:
            cpus = cgroup_stats.read_cpuset_cpus(fs.cgroup_dir("cpuset", be_dir), version)
            quota = cgroup_stats.read_cfs_quota(fs.cgroup_dir("cpu", be_dir), version)
        except (OSError, ProcParseError) as err:
            self.read_errors += 1
            logger.debug("cannot read besteffort cpuset or quota under %s: %s", be_dir, err)
            return samples
        limit_milli = float(len(cpus) * 1000)
        quota_milli = quota.limit_milli_cores
        if quota_milli is not None:
            limit_milli = min(limit_milli, quota_milli)
        samples.append(Sample(BE_CPU_REAL_LIMIT, now, limit_milli))
        return samples

    def _system_usage(self, now: float, pods_cpu_cores: float | None, apps_cpu_cores: float,
                      accounted_memory_bytes: int) -> list[Sample]:
        """node − Σ pods − Σ host apps (memory summed by the caller), clamped at 0 (docs/koordinator.md §7.1), only
        against a node reading of this tick; no CPU while Σ pods has no rate yet."""
        if self._node is None:
            return []
        usage = self._node.last_usage
        if usage is None or abs(usage.timestamp - now) > self.interval_s:
            return []
        samples = [Sample(SYS_MEMORY, now, float(max(usage.memory_bytes - accounted_memory_bytes, 0)))]
        if usage.cpu_cores is not None and pods_cpu_cores is not None:
            samples.append(Sample(SYS_CPU, now, max(usage.cpu_cores - pods_cpu_cores - apps_cpu_cores, 0.0)))
        return samples
