"""Node resource collector: CPU cores from /proc/stat tick deltas, memory from /proc/meminfo.

CPU (koordinator.md §7.1): busy ticks = user+nice+system+irq+softirq of the ``cpu`` line;
cores = Δbusy_ticks / (Δt × CLK_TCK). The first collection only primes. Memory = MemTotal − MemAvailable
(and MemTotal − MemFree as the with-page-cache variant). Both files are read through kept descriptors.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from koordlet.metriccache import MetricKind, Sample, SeriesKey
from koordlet.system.procfs import NodeProcFiles, clock_ticks_per_second
from koordlet.system.roots import PROC_DIR

logger = logging.getLogger(__name__)

NODE_CPU = SeriesKey.of(MetricKind.NODE_CPU_USAGE)
NODE_MEMORY = SeriesKey.of(MetricKind.NODE_MEMORY_USAGE)
NODE_MEMORY_WITH_PAGE_CACHE = SeriesKey.of(MetricKind.NODE_MEMORY_USAGE_WITH_PAGE_CACHE)


@dataclass(frozen=True, slots=True)
class NodeUsage:
    """The node's latest usage, for collectors that derive from it (system = node − Σ pods)."""

    timestamp: float
    cpu_cores: float | None  # None until two /proc/stat readings exist
    memory_bytes: int


class NodeResourceCollector:
    name = "node_resource"

    def __init__(
        self,
        proc_dir: str = PROC_DIR,
        interval_s: float = 1.0,
        monotonic_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.interval_s = interval_s
        self._files = NodeProcFiles(proc_dir)
        self._ticks_per_s = clock_ticks_per_second()
        self._monotonic_ns = monotonic_ns
        self._prev: tuple[int, int] | None = None  # (monotonic ns, busy ticks)
        self.last_usage: NodeUsage | None = None

    def enabled(self) -> bool:
        return True

    def collect(self, now: float) -> list[Sample]:
        read_ns = self._monotonic_ns()
        busy = self._files.proc_stat().node.busy_ticks
        memory = self._files.meminfo()
        samples = [
            Sample(NODE_MEMORY, now, float(memory.used_bytes)),
            Sample(NODE_MEMORY_WITH_PAGE_CACHE, now, float(memory.used_with_page_cache_bytes)),
        ]
        cores: float | None = None
        if self._prev is not None:
            prev_ns, prev_busy = self._prev
            elapsed_s = (read_ns - prev_ns) / 1e9
            if elapsed_s > 0 and busy >= prev_busy:
                cores = (busy - prev_busy) / (elapsed_s * self._ticks_per_s)
                samples.append(Sample(NODE_CPU, now, cores))
        self._prev = (read_ns, busy)
        self.last_usage = NodeUsage(now, cores, memory.used_bytes)
        return samples

    def close(self) -> None:
        self._files.close()
