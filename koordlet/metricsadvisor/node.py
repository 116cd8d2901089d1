"""Node resource collector: CPU cores from /proc/stat tick deltas, memory from /proc/meminfo.

CPU (docs/koordinator.md §7.1): busy ticks = user+nice+system+irq+softirq of the ``cpu`` line;
cores = Δbusy_ticks / (Δt × CLK_TCK). The first collection only primes. Memory = MemTotal − MemAvailable
(and MemTotal − MemFree as the with-page-cache variant). Both files are read through kept descriptors.

Per CPU (gate ``PerCPUMetric``): the same formula on each ``cpuN`` line of the same read, as
``node_per_cpu_usage{cpu}`` (cores of one CPU, 0..1), for the first :data:`MAX_PER_CPU` CPUs by id: the
memory of the per-CPU series is bounded whatever the node (a larger node is named once in the log). A CPU
whose counter went back (offlined and back) is left out of that tick.

Per NUMA node (Koordinator #3138; given ``numa_files`` and ``cpu_nodes``): CPU = Σ busy-tick deltas of the
node's CPUs / (Δt × CLK_TCK), every CPU counted whatever :data:`MAX_PER_CPU`; memory = MemTotal − (MemFree +
Active(file) + Inactive(file) + SReclaimable) of ``nodeN/meminfo`` (no MemAvailable there). As
``node_numa_cpu_usage`` / ``node_numa_memory_usage{numa_node_id}``, and :attr:`last_numa` for the system usage per
node. A NUMA reading that fails costs that part only, said once until it works again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from koordlet.metriccache import Label, MetricKind, Sample, SeriesKey
from koordlet.system.procfs import CpuTicks, NodeProcFiles, ProcParseError, clock_ticks_per_second
from koordlet.system.roots import PROC_DIR
from koordlet.system.sysfs import NUMAMemInfoFiles

logger = logging.getLogger(__name__)

NODE_CPU = SeriesKey.of(MetricKind.NODE_CPU_USAGE)
NODE_MEMORY = SeriesKey.of(MetricKind.NODE_MEMORY_USAGE)
NODE_MEMORY_WITH_PAGE_CACHE = SeriesKey.of(MetricKind.NODE_MEMORY_USAGE_WITH_PAGE_CACHE)
MAX_PER_CPU = 256
_PER_CPU_KEYS = tuple(SeriesKey.of(MetricKind.NODE_PER_CPU_USAGE, **{Label.CPU: str(cpu)})
                      for cpu in range(MAX_PER_CPU))


def numa_key(kind: str, node_id: int) -> SeriesKey:
    return SeriesKey.of(kind, **{Label.NUMA_NODE_ID: str(node_id)})


@dataclass(frozen=True, slots=True)
class NUMAUsage:
    """The node's latest usage per NUMA node: cores (empty until two readings exist) and bytes, by node id."""

    timestamp: float
    cpu_cores: Mapping[int, float]
    memory_bytes: Mapping[int, int]


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
        numa_files: NUMAMemInfoFiles | None = None,
        cpu_nodes: Callable[[], Mapping[int, int]] | None = None,
    ) -> None:
        """``per_cpu``: also each CPU's usage (gate ``PerCPUMetric``); ``numa_files`` and ``cpu_nodes`` (each CPU's
        NUMA node, the node info collector's): the usage per NUMA node."""
        self.interval_s = interval_s
        self._files = NodeProcFiles(proc_dir)
        self._ticks_per_s = clock_ticks_per_second()
        self._monotonic_ns = monotonic_ns
        self._prev: tuple[int, int] | None = None  # (monotonic ns, busy ticks)
        self._per_cpu = per_cpu
        self._prev_per_cpu: dict[int, int] = {}  # cpu id → busy ticks at the previous read
        self._warned_cpus = False
        self._numa_files = numa_files
        self._cpu_nodes = cpu_nodes
        self._numa_failing = False
        self._numa_keys: dict[tuple[str, int], SeriesKey] = {}
        self.last_usage: NodeUsage | None = None
        self.last_numa: NUMAUsage | None = None

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
        ]
        cores: float | None = None
        period_ticks = 0.0
        if self._prev is not None:
            prev_ns, prev_busy = self._prev
            elapsed_s = (read_ns - prev_ns) / 1e9
            if elapsed_s > 0 and busy >= prev_busy:
                cores = (busy - prev_busy) / (elapsed_s * self._ticks_per_s)
                samples.append(Sample(NODE_CPU, now, cores))
            period_ticks = max(elapsed_s, 0.0) * self._ticks_per_s
        deltas = self._per_cpu_deltas(stat.per_cpu) if self._per_cpu or self._numa_files is not None else {}
        if self._per_cpu and period_ticks > 0:
            self._per_cpu_samples(deltas, now, period_ticks, samples)
        if self._numa_files is not None:
            self._numa_samples(deltas, now, period_ticks, samples)
        self._prev = (read_ns, busy)
        self.last_usage = NodeUsage(now, cores, memory.used_bytes)
        return samples

    def _per_cpu_deltas(self, per_cpu: tuple[tuple[int, CpuTicks], ...]) -> dict[int, int]:
        """Each CPU's busy ticks since the previous read (a CPU new or whose counter went back is left out)."""
        previous, current, deltas = self._prev_per_cpu, {}, {}
        for cpu, ticks in per_cpu:
            busy = ticks.busy_ticks
            current[cpu] = busy
            before = previous.get(cpu)
            if before is not None and busy >= before:
                deltas[cpu] = busy - before
        self._prev_per_cpu = current
        return deltas

    def _per_cpu_samples(self, deltas: Mapping[int, int], now: float, period_ticks: float,
                         samples: list[Sample]) -> None:
        """Each CPU's cores since the previous read, for the first MAX_PER_CPU CPUs."""
        for cpu, delta in deltas.items():
            if cpu >= MAX_PER_CPU:
                if not self._warned_cpus:
                    self._warned_cpus = True
                    logger.warning("per-CPU usage kept for the first %d CPUs only (this node has CPU %d)",
                                   MAX_PER_CPU, cpu)
                continue
            samples.append(Sample(_PER_CPU_KEYS[cpu], now, min(delta / period_ticks, 1.0)))

    def _numa_key(self, kind: str, node_id: int) -> SeriesKey:
        key = self._numa_keys.get((kind, node_id))
        if key is None:
            key = self._numa_keys[(kind, node_id)] = numa_key(kind, node_id)
        return key

    def _numa_samples(self, deltas: Mapping[int, int], now: float, period_ticks: float,
                      samples: list[Sample]) -> None:
        """Memory and CPU per NUMA node (CPU once two readings exist and each CPU's node is known)."""
        assert self._numa_files is not None
        try:
            infos = self._numa_files.read()
        except (OSError, ProcParseError) as err:
            if not self._numa_failing:
                logger.warning("NUMA memory usage not collected (node-level usage goes on): %s", err)
            self._numa_failing = True
            infos = ()
        else:
            if self._numa_failing:
                logger.info("NUMA memory usage collected again")
            self._numa_failing = False
        memory = {info.node_id: info.used_bytes for info in infos}
        for node_id, used in memory.items():
            samples.append(Sample(self._numa_key(MetricKind.NODE_NUMA_MEMORY_USAGE, node_id), now, float(used)))
        cores: dict[int, float] = {}
        cpu_nodes = self._cpu_nodes() if self._cpu_nodes is not None else {}
        if period_ticks > 0 and cpu_nodes:
            ticks: dict[int, int] = {}
            for cpu, delta in deltas.items():
                node_id = cpu_nodes.get(cpu)
                if node_id is not None:
                    ticks[node_id] = ticks.get(node_id, 0) + delta
            for node_id, delta in ticks.items():
                cores[node_id] = delta / period_ticks
                samples.append(Sample(self._numa_key(MetricKind.NODE_NUMA_CPU_USAGE, node_id), now, cores[node_id]))
        self.last_numa = NUMAUsage(now, cores, memory) if memory or cores else None

    def close(self) -> None:
        self._files.close()
        if self._numa_files is not None:
            self._numa_files.close()
