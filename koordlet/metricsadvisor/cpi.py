"""CPI: cycles and instructions per container (gate ``CPICollector``; ``Libpfm4`` for grouped counters encoded
by libpfm4; Koordinator metricsadvisor/collectors/performance).

Every ``-cpi-collector-interval`` (60 s) the collector opens perf counters on every container's cgroup (one per
online CPU, :mod:`koordlet.system.perf`), lets them count for ``-collect-cpi-timewindow`` (10 s) and stores
what they counted: ``container_cpi{cpi_resource=cycle|instruction}`` (Koordinator's kinds), exported as
``koordlet_container_cpi{cpi_field=cycles|instructions}``. Koordinator sleeps through the window in a goroutine
per container; here the runner ticks this collector every window: one tick opens and starts, the next reads
and closes, so no thread waits and no descriptor stays open between windows.

The counters need the CPU's performance monitoring unit. At start the collector opens each event once for
itself (:func:`koordlet.system.perf.probe`); where the kernel lacks them (ENOENT: no PMU, as on a virtual
machine without PMU passthrough) it says so once and stays off. It also needs the ``perf_event`` cgroup
hierarchy on cgroup v1 (cgroup v2 always has it). A container whose counters cannot be opened (gone
meanwhile) is skipped for that window and named once.

Descriptors: each container counted holds one per online CPU and event for the window (200 containers on 96
CPUs would be 38,400). The collector holds at most an eighth of the soft RLIMIT_NOFILE (``max_descriptors``;
``koordlet.system.procfs.SHARE_PERF_COUNTERS``, the executor's kept reads take another eighth): when the
containers need more, each window counts as many as fit, the next ones in container id order after the last
window's, so every container is counted every few windows (said once). Running out of descriptors anyway
(EMFILE, ENFILE) ends that window's opening. Its memos (series keys, the containers named) hold live containers
only.
"""

from __future__ import annotations

import bisect
import errno
import logging
import os
import time
from collections.abc import Callable, Sequence

from koordlet.metriccache import CPI_RESOURCE_CYCLE, CPI_RESOURCE_INSTRUCTION, Label, MetricKind, Sample, SeriesKey
from koordlet.metricsadvisor.pods import PodSource
from koordlet.system.cgroup import CgroupFS, CgroupVersion
from koordlet.system.perf import CYCLES, INSTRUCTIONS, CgroupCounters, PerfError, PerfEvent, encode_with_libpfm, probe
from koordlet.system.procfs import SHARE_PERF_COUNTERS, descriptor_budget

logger = logging.getLogger(__name__)

PERF_SUBSYSTEM = "perf_event"
UNLIMITED_DESCRIPTORS = 1 << 16  # the budget without an RLIMIT_NOFILE
_OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE)


def _started(counters: CgroupCounters) -> CgroupCounters:
    try:
        counters.start()
    except BaseException:
        counters.close()
        raise
    return counters


class CPICollector:
    """``events``: what stands for (cycles, instructions); the hardware events by default (tests count software
    events on a machine without a PMU). ``group``: grouped counters (gate ``Libpfm4``)."""

    name = "cpi"

    def __init__(self, pods: PodSource, cgroup_fs: CgroupFS, cpus: Sequence[int], cpi_interval_s: float = 60.0,
                 window_s: float = 10.0, events: tuple[PerfEvent, PerfEvent] = (CYCLES, INSTRUCTIONS),
                 group: bool = False, libpfm: bool = False, monotonic: Callable[[], float] = time.monotonic,
                 max_descriptors: int | None = None) -> None:
        """``libpfm``: encode the events' names with libpfm4 (gate ``Libpfm4``); without the library the
        built-in encoding of the generic events is used and that is said once. ``max_descriptors``: the most
        perf descriptors held at once (default: an eighth of the soft RLIMIT_NOFILE when a window starts)."""
        if window_s >= cpi_interval_s:
            raise ValueError("the CPI window must be shorter than the CPI interval")
        self.interval_s = window_s
        self._pods = pods
        self._cgroup_fs = cgroup_fs
        self._cpus = tuple(cpus)
        self._cpi_interval_s = cpi_interval_s
        self._window_s = window_s
        self._events = events
        self._group = group
        self._libpfm = libpfm
        self._monotonic = monotonic
        self._next_start = float("-inf")
        self._window_end: float | None = None
        self._max_descriptors = max_descriptors
        self._counting: list[tuple[str, str, CgroupCounters]] = []  # (pod uid, container id, counters)
        self._named: set[str] = set()  # live containers whose counters failed, named once
        self._keys: dict[tuple[str, str, str], SeriesKey] = {}
        self._last_counted = ""  # the highest container id of the last window, when they did not all fit
        self._said_budget: tuple[int, int] | None = None  # (containers, per window) last said

    def enabled(self) -> bool:
        for event in self._events:  # the built-in encoding first: libpfm4 is loaded only where it can count
            try:
                probe(event)
            except PerfError as err:
                logger.warning("CPI collector off: the kernel lacks the %s counter (%s)", event.name, err)
                return False
        if self._libpfm:
            try:
                encoded = encode_with_libpfm([event.name for event in self._events])
                for event in encoded:
                    probe(event)
                self._events = encoded  # type: ignore[assignment]
            except PerfError as err:
                logger.warning("gate Libpfm4: %s; the built-in encoding of %s is used", err,
                               ", ".join(e.name for e in self._events))
        perf_root = self._cgroup_fs.hierarchy_dir(PERF_SUBSYSTEM)
        if self._cgroup_fs.version is CgroupVersion.V1 and not os.path.isfile(os.path.join(perf_root,
                                                                                           "cgroup.procs")):
            logger.warning("CPI collector off: no perf_event cgroup hierarchy at %s", perf_root)
            return False
        logger.info("CPI collector on: %s every %gs over %gs%s", ", ".join(e.name for e in self._events),
                    self._cpi_interval_s, self._window_s, " (grouped)" if self._group else "")
        return True

    def collect(self, now: float) -> list[Sample]:
        moment = self._monotonic()
        if self._window_end is not None:
            if moment < self._window_end:
                return []
            return self._finish(now)
        if moment < self._next_start:
            return []
        self._start()
        self._next_start = moment + self._cpi_interval_s
        self._window_end = moment + self._window_s
        return []

    def per_window(self, containers: int) -> int:
        """How many containers one window counts within the descriptor budget (one descriptor stays free for
        the cgroup dir opened while a container's counters are)."""
        budget = (self._max_descriptors if self._max_descriptors is not None
                  else descriptor_budget(SHARE_PERF_COUNTERS, UNLIMITED_DESCRIPTORS))
        return min(containers, max(budget - 1, 0) // max(len(self._cpus) * len(self._events), 1))

    def _this_window(self, containers: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
        """The (container id, pod uid, cgroup dir) to count now: all of them, or the next that fit after the last
        window's, in container id order."""
        fit = self.per_window(len(containers))
        if (len(containers), fit) != self._said_budget and fit < len(containers):
            logger.info("CPI: %d containers need %d perf descriptors each, %d fit in the budget: each window "
                        "counts %d, the next ones in turn", len(containers), len(self._cpus) * len(self._events),
                        fit, fit)
        self._said_budget = (len(containers), fit)
        if fit >= len(containers):
            self._last_counted = ""
            return containers
        start = bisect.bisect_right([ident for ident, _, _ in containers], self._last_counted)
        chosen = (containers[start:] + containers[:start])[:fit]
        if chosen:
            self._last_counted = chosen[-1][0]
        return chosen

    def _start(self) -> None:
        containers = sorted((container.container_id, pod.pod_uid, container.cgroup_dir)
                            for pod in self._pods() for container in pod.containers)
        live = {ident for ident, _, _ in containers}
        self._named &= live
        self._keys = {key: value for key, value in self._keys.items() if key[1] in live}
        for container_id, pod_uid, cgroup_dir in self._this_window(containers):
            path = self._cgroup_fs.cgroup_dir(PERF_SUBSYSTEM, cgroup_dir)
            try:
                counters = _started(CgroupCounters(path, self._cpus, self._events, self._group))
            except OSError as err:
                if err.errno in _OUT_OF_DESCRIPTORS:
                    logger.warning("CPI: out of descriptors after %d containers this window: %s", len(self._counting),
                                   err)
                    return
                if container_id not in self._named:
                    self._named.add(container_id)
                    logger.info("CPI of container %s not counted: %s", container_id, err)
                continue
            self._counting.append((pod_uid, container_id, counters))

    def _finish(self, now: float) -> list[Sample]:
        samples: list[Sample] = []
        counting, self._counting, self._window_end = self._counting, [], None
        cycles_name, instructions_name = (event.name for event in self._events)
        for pod_uid, container_id, counters in counting:
            try:
                values = counters.read()
            except OSError as err:
                logger.debug("CPI of container %s unreadable: %s", container_id, err)
                continue
            samples.append(Sample(self._key(pod_uid, container_id, CPI_RESOURCE_CYCLE), now, values[cycles_name]))
            samples.append(Sample(self._key(pod_uid, container_id, CPI_RESOURCE_INSTRUCTION), now,
                                  values[instructions_name]))
        return samples

    def _key(self, pod_uid: str, container_id: str, resource: str) -> SeriesKey:
        ident = (pod_uid, container_id, resource)
        key = self._keys.get(ident)
        if key is None:  # pruned to the live containers at every window's start
            key = self._keys[ident] = SeriesKey.of(MetricKind.CONTAINER_CPI, **{
                Label.POD_UID: pod_uid, Label.CONTAINER_ID: container_id, Label.CPI_RESOURCE: resource})
        return key

    def close(self) -> None:
        for _, _, counters in self._counting:
            counters.close()
        self._counting = []
