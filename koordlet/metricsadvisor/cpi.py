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
meanwhile, out of descriptors) is skipped for that window and named once.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence

from koordlet.metriccache import CPI_RESOURCE_CYCLE, CPI_RESOURCE_INSTRUCTION, Label, MetricKind, Sample, SeriesKey
from koordlet.metricsadvisor.pods import PodSource
from koordlet.system.cgroup import CgroupFS, CgroupVersion
from koordlet.system.perf import CYCLES, INSTRUCTIONS, CgroupCounters, PerfError, PerfEvent, encode_with_libpfm, probe

logger = logging.getLogger(__name__)

PERF_SUBSYSTEM = "perf_event"


class CPICollector:
    """``events``: what stands for (cycles, instructions); the hardware events by default (tests count software
    events on a machine without a PMU). ``group``: grouped counters (gate ``Libpfm4``)."""

    name = "cpi"

    def __init__(self, pods: PodSource, cgroup_fs: CgroupFS, cpus: Sequence[int], cpi_interval_s: float = 60.0,
                 window_s: float = 10.0, events: tuple[PerfEvent, PerfEvent] = (CYCLES, INSTRUCTIONS),
                 group: bool = False, libpfm: bool = False, monotonic: Callable[[], float] = time.monotonic) -> None:
        """``libpfm``: encode the events' names with libpfm4 (gate ``Libpfm4``); without the library the
        built-in encoding of the generic events is used and that is said once."""
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
        self._counting: list[tuple[str, str, CgroupCounters]] = []  # (pod uid, container id, counters)
        self._named: set[str] = set()  # containers whose counters failed, named once
        self._keys: dict[tuple[str, str, str], SeriesKey] = {}

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

    def _start(self) -> None:
        for pod in self._pods():
            for container in pod.containers:
                path = self._cgroup_fs.cgroup_dir(PERF_SUBSYSTEM, container.cgroup_dir)
                try:
                    counters = CgroupCounters(path, self._cpus, self._events, self._group)
                    counters.start()
                except OSError as err:
                    if container.container_id not in self._named:
                        self._named.add(container.container_id)
                        logger.info("CPI of container %s not counted: %s", container.container_id, err)
                    continue
                self._counting.append((pod.pod_uid, container.container_id, counters))

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
        if key is None:
            if len(self._keys) > 8192:  # containers come and go: keep the memo bounded
                self._keys.clear()
            key = self._keys[ident] = SeriesKey.of(MetricKind.CONTAINER_CPI, **{
                Label.POD_UID: pod_uid, Label.CONTAINER_ID: container_id, Label.CPI_RESOURCE: resource})
        return key

    def close(self) -> None:
        for _, _, counters in self._counting:
            counters.close()
        self._counting = []
