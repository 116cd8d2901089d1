"""Collector framework: each collector has a name, an interval and ``collect(now) -> samples``; one runner
thread ticks them all on their intervals and writes the samples into the metric cache. (The cold page collector's
page-idle pass is too long for a tick: its own thread, ``coldpage-scan``, scans, and the tick takes its last
count.)

One thread for all collectors keeps the agent's cost flat (Koordinator runs a goroutine per collector);
collectors are cheap file readers, so serialising them costs nothing that matters. The runner measures
each collection in ``koordlet_collector_duration_seconds{collector}`` and counts failures in
``koordlet_collector_errors_total{collector}``; a failing collector is logged when it starts failing
and when it recovers, never once per tick: a reading error (a path that is not there) in one line, anything else
(a bug) with its traceback.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram

from koordlet.metriccache import MetricCache, Sample
from koordlet.system.procfs import ProcParseError
from koordlet.ticker import TickerThread

logger = logging.getLogger(__name__)

# What a collector raises when the node does not give what it reads: a file or dir that is not there or not
# readable (OSError: SysfsError, PerfError), a kernel file in a format it cannot parse (ProcParseError). Said in
# one line, with the path the message names; anything else is a bug and is logged with its traceback.
_READING_ERRORS = (OSError, ProcParseError)
_DURATION_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class Collector(Protocol):
    """What the runner needs of a collector."""

    @property
    def name(self) -> str: ...

    @property
    def interval_s(self) -> float: ...

    def enabled(self) -> bool:
        """False when the node cannot provide this collector's data (checked once, at start)."""
        ...

    def collect(self, now: float) -> Sequence[Sample]:
        """Read the kernel once; samples carry ``now`` (unix seconds) as their timestamp."""
        ...


class _Scheduled:
    __slots__ = ("collector", "failing", "next_due")

    def __init__(self, collector: Collector, next_due: float) -> None:
        self.collector = collector
        self.next_due = next_due
        self.failing = False


class CollectorRunner(TickerThread):
    """Runs collectors on their intervals in one daemon thread until :meth:`stop`."""

    def __init__(
        self,
        cache: MetricCache,
        collectors: Sequence[Collector],
        registry: CollectorRegistry | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        names = [c.name for c in collectors]
        if len(set(names)) != len(names):
            raise ValueError(f"collector names must be unique: {names}")
        for collector in collectors:
            if collector.interval_s <= 0:
                raise ValueError(f"collector {collector.name}: interval must be positive")
        self._cache = cache
        self._wall_clock = wall_clock
        self._registry = registry if registry is not None else CollectorRegistry()
        self.duration = Histogram(
            "koordlet_collector_duration_seconds",
            "Time one collection took, per collector",
            ["collector"],
            buckets=_DURATION_BUCKETS,
            registry=self._registry,
        )
        self.errors = Counter(
            "koordlet_collector_errors",
            "Collections that raised, per collector",
            ["collector"],
            registry=self._registry,
        )
        self._active: list[_Scheduled] = []
        for collector in collectors:
            if collector.enabled():
                self._active.append(_Scheduled(collector, 0.0))
                self.errors.labels(collector.name)  # 0 before the first error: rate() and the alerts count it
            else:
                logger.info("collector %s disabled on this node", collector.name)
        super().__init__("metricsadvisor")

    @property
    def registry(self) -> CollectorRegistry:
        return self._registry

    @property
    def active_collectors(self) -> list[str]:
        return [entry.collector.name for entry in self._active]

    def run_collector(self, entry_name: str, now: float | None = None) -> int:
        """Run one collector immediately (tests, and the first tick); returns samples accepted."""
        for entry in self._active:
            if entry.collector.name == entry_name:
                return self._run(entry, self._wall_clock() if now is None else now)
        raise KeyError(entry_name)

    @property
    def period_s(self) -> float:
        """The shortest collector interval: a healthy runner ticks at least that often."""
        return min((entry.collector.interval_s for entry in self._active), default=1.0)

    def _run(self, entry: _Scheduled, now: float) -> int:
        name = entry.collector.name
        self.doing = f"collector {name}"
        started = time.perf_counter()
        try:
            samples = entry.collector.collect(now)
        except Exception as err:  # a daemon loop: log, count, go on (STYLE.md)
            self.errors.labels(name).inc()
            if not entry.failing:
                if isinstance(err, _READING_ERRORS):  # the node's answer (a path, a file's format), not a bug
                    logger.warning("collector %s cannot read the node: %s; will keep retrying", name, err)
                else:
                    logger.warning("collector %s failed; will keep retrying", name, exc_info=True)
            entry.failing = True
            return 0
        finally:
            self.duration.labels(name).observe(time.perf_counter() - started)
        if entry.failing:
            logger.info("collector %s recovered", name)
            entry.failing = False
        return self._cache.append_samples(samples)

    def tick(self, monotonic_now: float) -> float:
        """Run every collector that is due at ``monotonic_now``; returns the next due time."""
        for entry in self._active:
            if entry.next_due <= monotonic_now:
                self._run(entry, self._wall_clock())
                interval = entry.collector.interval_s
                entry.next_due += interval
                if entry.next_due <= monotonic_now:
                    # Fell more than a whole interval behind (suspend, overload): skip, do not catch up.
                    entry.next_due = monotonic_now + interval
        return min((entry.next_due for entry in self._active), default=monotonic_now + 1.0)

    def stop(self, timeout_s: float = 5.0) -> bool:
        """Stop the thread, then close the collectors that hold something open (kept files, perf counters)."""
        stopped = super().stop(timeout_s)
        if stopped:
            for entry in self._active:
                close = getattr(entry.collector, "close", None)
                if close is not None:
                    close()
        return stopped

    def forget_dirs(self, cgroup_dirs: Sequence[str]) -> None:
        """Close what the collectors keep open below ``cgroup_dirs`` (a pod that left the states), at once and from
        the caller's thread: a collector that keeps descriptors has ``forget_dirs`` (thread-safe)."""
        for entry in self._active:
            forget = getattr(entry.collector, "forget_dirs", None)
            if forget is not None:
                forget(cgroup_dirs)

    def _schedule_from(self, start: float) -> None:
        for entry in self._active:
            entry.next_due = start
