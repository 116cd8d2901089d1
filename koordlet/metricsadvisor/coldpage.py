"""Cold page cache per node, pod, container and host application (gate ``ColdPageCollector``; Koordinator
metricsadvisor/collectors/coldmemoryresource), and the memory usage counting only the hot page cache.

Every ``-coldpage-collector-interval`` (5 s) it stores, per cgroup, ``*_memory_cold_page_size`` (bytes of
cold page cache) and ``*_memory_with_hot_page_usage`` (usage with page cache minus the cold bytes: for a
cgroup from its ``memory.stat``, for the node MemTotal − MemFree − cold, as Koordinator computes them).
NodeMetric reports the latter under ``nodeMemoryCollectPolicy: usageWithHotPageCache``.

Where the cold bytes come from (:mod:`koordlet.system.coldpage`), said once at start:

- ``kidled`` (Anolis kernels), started with Koordinator's settings (scan every 5 s, hierarchical stats); each
  cgroup's ``memory.idle_page_stats`` is read at every tick. The settings are written through the executor (a
  plan run, so audited), which records what kidled had before (the executor's record file, which survives a
  restart); they are put back when the collector stops (koordlet stops), when it cannot start, and at start when
  the ``ColdPageCollector`` gate is off (:func:`restore_kidled`). A setting koordlet did not change (already
  koordlet's value) is not recorded and never reset.
- ``page-idle`` (mainline kernels built with ``CONFIG_IDLE_PAGE_TRACKING``): every ``cold_age_s`` (300 s: the
  age kidled's default boundary stands for) a pass counts the file pages left idle since the previous mark, by
  owning memory cgroup, then marks every page idle again through the executor; the pass runs in its own thread,
  in chunks within a CPU share (koordlet/metricsadvisor/pageidle.py), and between two passes the last counts
  stand. A pod's cold bytes are those of its dir and its containers' dirs, a host application's those of its dir.

Without either it says so once at start and stays off.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from koordlet.actuator import PlanRecord, PlanRunner
from koordlet.executor import ResourceExecutor
from koordlet.metriccache import Label, MetricKind, Sample, SeriesKey
from koordlet.metricsadvisor.pageidle import DEFAULT_CPU_SHARE, PageIdleScanner
from koordlet.metricsadvisor.pods import HostAppSource, PodSource
from koordlet.plan import Plan, SystemRestore, SystemWrite
from koordlet.system.cgroup import CgroupFS
from koordlet.system.cgroup_stats import read_memory_stat
from koordlet.system.coldpage import (
    KIDLED_DEFAULT_SCAN_PERIOD_S,
    KIDLED_DEFAULT_USE_HIERARCHY,
    PAGE_SIZE,
    ColdPageError,
    IdlePages,
    cgroup_inode,
    kidled_present,
    page_idle_present,
    read_idle_page_stats,
)
from koordlet.system.procfs import read_meminfo
from koordlet.system.roots import PROC_DIR, SYS_DIR
from koordlet.system.sysctl import KIDLED_SCAN_PERIOD, KIDLED_USE_HIERARCHY

logger = logging.getLogger(__name__)

SOURCE_KIDLED = "kidled"
SOURCE_PAGE_IDLE = "page-idle"
DEFAULT_COLD_AGE_S = 300.0
SOURCE = "coldpage"  # the plans' source in the record and the audit
_KIDLED_SETTINGS = ((KIDLED_SCAN_PERIOD, KIDLED_DEFAULT_SCAN_PERIOD_S), (KIDLED_USE_HIERARCHY,
                                                                        KIDLED_DEFAULT_USE_HIERARCHY))

_NODE_KINDS = (MetricKind.NODE_MEMORY_COLD_PAGE_SIZE, MetricKind.NODE_MEMORY_WITH_HOT_PAGE_USAGE)
_LEVEL_KINDS = {
    "pod": (MetricKind.POD_MEMORY_COLD_PAGE_SIZE, MetricKind.POD_MEMORY_WITH_HOT_PAGE_USAGE, Label.POD_UID),
    "container": (MetricKind.CONTAINER_MEMORY_COLD_PAGE_SIZE, MetricKind.CONTAINER_MEMORY_WITH_HOT_PAGE_USAGE,
                  Label.CONTAINER_ID),
    "host_app": (MetricKind.HOST_APP_MEMORY_COLD_PAGE_SIZE, MetricKind.HOST_APP_MEMORY_WITH_HOT_PAGE_USAGE,
                 Label.HOST_APP_NAME),
}


@dataclass(frozen=True, slots=True)
class _Target:
    level: str  # pod, container, host_app
    ident: str  # pod uid, container id, host app name
    dirs: tuple[str, ...]  # memory cgroup dirs (relative); the first is its own


def restore_kidled(executor: ResourceExecutor, reason: str) -> PlanRecord:
    """Put back the kidled settings koordlet changed (as the executor recorded them); nothing when it changed
    none. A plan run, so each one put back is audited."""
    plan = Plan(system=tuple(SystemRestore(name, reason) for name, _ in _KIDLED_SETTINGS), reason="ColdPageCollector")
    record = PlanRunner(executor).run(plan, SOURCE)
    if record.system_written or record.system_errors:
        logger.info("kidled settings put back (%s): %d restored, %d failed", reason, record.system_written,
                    len(record.system_errors))
    return record


class ColdPageCollector:
    name = "coldpage"

    def __init__(self, pods: PodSource, cgroup_fs: CgroupFS, interval_s: float = 5.0, *,
                 executor: ResourceExecutor, host_apps: HostAppSource | None = None, proc_dir: str = PROC_DIR,
                 sys_dir: str = SYS_DIR, cold_age_s: float = DEFAULT_COLD_AGE_S,
                 cpu_share: float = DEFAULT_CPU_SHARE, monotonic: Callable[[], float] = time.monotonic) -> None:
        """``executor``: writes kidled's settings and the page-idle marks (with ``sys_dir`` as its sys root);
        ``cpu_share``: of one CPU, what a page-idle pass may take."""
        self.interval_s = interval_s
        self._pods = pods
        self._host_apps = host_apps
        self._fs = cgroup_fs
        self._executor = executor
        self._proc_dir = proc_dir
        self._sys_dir = sys_dir
        self._cold_age_s = cold_age_s
        self._monotonic = monotonic
        self.source: str | None = None
        self.scanner = PageIdleScanner(sys_dir, proc_dir, executor.mark_page_idle, cpu_share)
        self._idle: IdlePages | None = None  # page-idle: the counts of the last finished pass
        self._asked_at: float | None = None  # page-idle: when the last pass was asked for
        self._keys: dict[tuple[str, str, str], SeriesKey] = {}

    def _start_kidled(self) -> bool:
        why = "Koordinator's kidled settings for the cold page collector"
        plan = Plan(system=tuple(SystemWrite(name, str(value), why) for name, value in _KIDLED_SETTINGS),
                    reason="ColdPageCollector")
        record = PlanRunner(self._executor).run(plan, SOURCE)
        if not record.system_errors:
            return True
        logger.warning("cold page collector off: kidled is there but cannot be started: %s",
                       "; ".join(record.system_errors))
        restore_kidled(self._executor, "kidled could not be started")
        return False

    def enabled(self) -> bool:
        if kidled_present(self._sys_dir):
            if not self._start_kidled():
                return False
            self.source = SOURCE_KIDLED
            logger.info("cold page collector on: kidled (memory.idle_page_stats)")
            return True
        if page_idle_present(self._sys_dir, self._proc_dir):
            self.source = SOURCE_PAGE_IDLE
            logger.info("cold page collector on: the page-idle bitmap (cold = file pages untouched for %gs)",
                        self._cold_age_s)
            return True
        logger.info("cold page collector off: this kernel has neither kidled (Anolis) nor the page-idle bitmap "
                    "(CONFIG_IDLE_PAGE_TRACKING)")
        return False

    def _targets(self) -> Iterator[_Target]:
        for pod in self._pods():
            yield _Target("pod", pod.pod_uid, (pod.cgroup_dir, *(c.cgroup_dir for c in pod.containers)))
            for container in pod.containers:
                yield _Target("container", container.container_id, (container.cgroup_dir,))
        for app in self._host_apps() if self._host_apps is not None else ():
            yield _Target("host_app", app.name, (app.cgroup_dir,))

    def _key(self, kind: str, label: str, ident: str) -> SeriesKey:
        memo = (kind, label, ident)
        key = self._keys.get(memo)
        if key is None:
            if len(self._keys) > 16384:  # pods come and go: keep the memo bounded
                self._keys.clear()
            key = self._keys[memo] = SeriesKey.of(kind, **{label: ident})
        return key

    def collect(self, now: float) -> list[Sample]:
        if self.source == SOURCE_PAGE_IDLE:
            self._scan_when_due()
            self._idle = self.scanner.latest
            if self._idle is None:
                return []  # the first cold age has not passed yet
        samples = self._node(now)
        for target in self._targets():
            cold = self._cold_bytes(target)
            if cold is None:
                continue
            memory_dir = self._fs.cgroup_dir("memory", target.dirs[0])
            try:
                with_cache = read_memory_stat(memory_dir, self._fs.version).usage_with_page_cache_bytes
            except (OSError, ValueError):
                continue  # gone meanwhile
            cold_kind, hot_kind, label = _LEVEL_KINDS[target.level]
            samples.append(Sample(self._key(cold_kind, label, target.ident), now, float(cold)))
            samples.append(Sample(self._key(hot_kind, label, target.ident), now, float(max(with_cache - cold, 0))))
        return samples

    def _node(self, now: float) -> list[Sample]:
        if self.source == SOURCE_KIDLED:
            try:
                cold = read_idle_page_stats(self._fs.hierarchy_dir("memory"))
            except (OSError, ColdPageError) as err:
                logger.debug("node cold pages unreadable: %s", err)
                return []
        else:
            assert self._idle is not None
            cold = self._idle.total * PAGE_SIZE
        memory = read_meminfo(self._proc_dir)
        hot = max(memory.mem_total_bytes - memory.mem_free_bytes - cold, 0)
        return [Sample(SeriesKey.of(_NODE_KINDS[0]), now, float(cold)), Sample(SeriesKey.of(_NODE_KINDS[1]), now,
                                                                                 float(hot))]

    def _cold_bytes(self, target: _Target) -> int | None:
        if self.source == SOURCE_KIDLED:
            try:
                return read_idle_page_stats(self._fs.cgroup_dir("memory", target.dirs[0]))
            except (OSError, ColdPageError) as err:
                logger.debug("cold pages of %s %s unreadable: %s", target.level, target.ident, err)
                return None
        assert self._idle is not None
        pages = 0
        for rel in target.dirs:
            inode = cgroup_inode(self._fs.cgroup_dir("memory", rel))
            if inode is None:
                if rel == target.dirs[0]:
                    return None  # the cgroup is gone
                continue
            pages += self._idle.by_cgroup_inode.get(inode, 0)
        return pages * PAGE_SIZE

    def _scan_when_due(self) -> None:
        """Ask for a pass once per cold age (the first one only marks); one still under way is let be."""
        moment = self._monotonic()
        if self._asked_at is not None and moment - self._asked_at < self._cold_age_s:
            return
        if self.scanner.request(count=self._asked_at is not None):
            self._asked_at = moment

    def close(self) -> None:
        """koordlet stops: the page-idle thread ends, kidled's settings go back to what they were."""
        self.scanner.stop()
        if self.source == SOURCE_KIDLED:
            restore_kidled(self._executor, "koordlet stops")


__all__ = ["ColdPageCollector", "DEFAULT_COLD_AGE_S", "SOURCE_KIDLED", "SOURCE_PAGE_IDLE", "restore_kidled"]
