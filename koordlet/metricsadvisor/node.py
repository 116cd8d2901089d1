"""Node resource collector: CPU cores from /proc/stat tick deltas, memory from /proc/meminfo.

CPU (docs/koordinator.md §7.1): busy ticks = user+nice+system+irq+softirq of the ``cpu`` line;
cores = Δbusy_ticks / (Δt × CLK_TCK). The first collection only primes. Memory = MemTotal − MemAvailable
(and MemTotal − MemFree as the with-page-cache variant), and SwapFree. Both files are read through kept
descriptors.

Per CPU (gate ``PerCPUMetric``): the same formula on each ``cpuN`` line of the same read, as
``node_per_cpu_usage{cpu}`` (cores of one CPU, 0..1), for the first :data:`MAX_PER_CPU` CPUs by id: the
memory of the per-CPU series is bounded whatever the node (a larger node is named once in the log). A CPU
whose counter went back (offlined and back) is left out of that tick.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from koordlet.metriccache import Label, MetricKind, Sample, SeriesKey
from koordlet.system.procfs import CpuTicks, NodeProcFiles, clock_ticks_per_second
from koordlet.system.roots import PROC_DIR

logger = logging.getLogger(__name__)

NODE_CPU = SeriesKey.of(MetricKind.NODE_CPU_USAGE)
NODE_MEMORY = SeriesKey.of(MetricKind.NODE_MEMORY_USAGE)
NODE_MEMORY_WITH_PAGE_CACHE = SeriesKey.of(MetricKind.NODE_MEMORY_USAGE_WITH_PAGE_CACHE)
NODE_SWAP_FREE = SeriesKey.of(MetricKind.NODE_SWAP_FREE)
MAX_PER_CPU = 256
_PER_CPU_KEYS = tuple(SeriesKey.of(MetricKind.NODE_PER_CPU_USAGE, **{Label.CPU: str(cpu)})
                      for cpu in range(MAX_PER_CPU))


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
        per_cpu: bool = False,
    ) -> None:
        """``per_cpu``: also each CPU's usage (gate ``PerCPUMetric``)."""
        self.interval_s = interval_s
        self._files = NodeProcFiles(proc_dir)
        self._ticks_per_s = clock_ticks_per_second()
        self._monotonic_ns = monotonic_ns
        self._prev: tuple[int, int] | None = None  # (monotonic ns, busy ticks)
        self._per_cpu = per_cpu
        self._prev_per_cpu: dict[int, int] = {}  # cpu id → busy ticks at the previous read
        self._warned_cpus = False
        self.last_usage: NodeUsage | None = None

    def enabled(self) -> bool:
        return True

    def collect(self, now: float) -> list[Sample]:
        read_ns = self._monotonic_ns()
        stat = self._files.proc_stat()
        busy = stat.node.busy_ticks
        memory = self._files.meminfo()
        samples = [
            Sample(NODE_MEMORY, now, float(memory.used_bytes)),
            Sample(NODE_MEMORY_WITH_PAGE_CACHE, now, float(memory.used_with_page_cache_bytes)),
            Sample(NODE_SWAP_FREE, now, float(memory.swap_free_bytes)),
        ]
        cores: float | None = None
        if self._prev is not None:
            prev_ns, prev_busy = self._prev
            elapsed_s = (read_ns - prev_ns) / 1e9
            if elapsed_s > 0 and busy >= prev_busy:
                cores = (busy - prev_busy) / (elapsed_s * self._ticks_per_s)
                samples.append(Sample(NODE_CPU, now, cores))
            if self._per_cpu and elapsed_s > 0:
                self._per_cpu_samples(stat.per_cpu, now, elapsed_s * self._ticks_per_s, samples)
        elif self._per_cpu:
            self._per_cpu_samples(stat.per_cpu, now, 0.0, samples)
        self._prev = (read_ns, busy)
        self.last_usage = NodeUsage(now, cores, memory.used_bytes)
        return samples

    def _per_cpu_samples(self, per_cpu: tuple[tuple[int, CpuTicks], ...], now: float, period_ticks: float,
                         samples: list[Sample]) -> None:
        """Each CPU's cores since the previous read (none when ``period_ticks`` is 0: priming)."""
        previous, current = self._prev_per_cpu, {}
        for cpu, ticks in per_cpu:
            if cpu >= MAX_PER_CPU:
                if not self._warned_cpus:
                    self._warned_cpus = True
                    logger.warning("per-CPU usage kept for the first %d CPUs only (this node has CPU %d)",
                                   MAX_PER_CPU, cpu)
                continue
            busy = ticks.busy_ticks
            current[cpu] = busy
            before = previous.get(cpu)
            if period_ticks > 0 and before is not None and busy >= before:
                samples.append(Sample(_PER_CPU_KEYS[cpu], now, min((busy - before) / period_ticks, 1.0)))
        self._prev_per_cpu = current

    def close(self) -> None:
        self._files.close()
