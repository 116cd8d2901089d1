"""Node info collector: the CPU topology and the NUMA nodes into the metric cache's KV, every
``-collect-node-cpu-info-interval`` (60 s; Koordinator metricsadvisor/collectors/nodeinfo).

What reads them: the node collector's per-NUMA CPU usage (each CPU's NUMA node) and the NodeMetric reporter's
``numaUsages`` (the node's NUMA nodes). Each reading is counted in ``koordlet_collect_node_cpu_info_status`` and
``koordlet_collect_node_numa_info_status`` (``status`` succeeded/failed) through ``observe``; as in Koordinator,
the NUMA nodes are not read when the CPU topology could not be, and a failure keeps the last good values.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from koordlet.metriccache import NODE_CPU_INFO_KV, NODE_NUMA_INFO_KV, MetricCache, Sample
from koordlet.system.roots import SYS_DIR
from koordlet.system.sysfs import CPUInfo, NUMANode, SysfsError, read_cpu_topology, read_numa_nodes

DEFAULT_INTERVAL_S = 60.0
CPU_INFO, NUMA_INFO = "cpu_info", "numa_info"  # what ``observe`` is told about

# (what was read: CPU_INFO or NUMA_INFO, whether it succeeded)
InfoObserver = Callable[[str, bool], None]


class NodeInfoCollector:
    name = "node_info"

    def __init__(self, cache: MetricCache, sys_dir: str = SYS_DIR, interval_s: float = DEFAULT_INTERVAL_S,
                 observe: InfoObserver | None = None) -> None:
        self.interval_s = interval_s
        self._cache = cache
        self._sys_dir = sys_dir
        self._observe = observe or (lambda what, ok: None)

    def enabled(self) -> bool:
        return True

    def collect(self, now: float) -> list[Sample]:
        """Reads both; raises SysfsError (counted and logged by the runner) when either cannot be read."""
        try:
            cpus = read_cpu_topology(self._sys_dir)
        except SysfsError:
            self._observe(CPU_INFO, False)
            raise
        self._cache.set_kv(NODE_CPU_INFO_KV, cpus)
        self._observe(CPU_INFO, True)
        try:
            nodes = read_numa_nodes(self._sys_dir, tuple(cpu.cpu_id for cpu in cpus))
        except SysfsError:
            self._observe(NUMA_INFO, False)
            raise
        self._cache.set_kv(NODE_NUMA_INFO_KV, nodes)
        self._observe(NUMA_INFO, True)
        return []


@dataclass(frozen=True, slots=True)
class NodeInfoKV:
    """What the node info collector last read; empty before its first reading."""

    cpus: tuple[CPUInfo, ...] = ()
    numa_nodes: tuple[NUMANode, ...] = ()

    @classmethod
    def of(cls, cache: MetricCache) -> NodeInfoKV:
        cpus, nodes = cache.get_kv(NODE_CPU_INFO_KV, ()), cache.get_kv(NODE_NUMA_INFO_KV, ())
        return cls(tuple(c for c in cpus if isinstance(c, CPUInfo)) if isinstance(cpus, tuple) else (),
                   tuple(n for n in nodes if isinstance(n, NUMANode)) if isinstance(nodes, tuple) else ())

    @property
    def cpu_nodes(self) -> Mapping[int, int]:
        """Logical CPU id → its NUMA node."""
        return {cpu.cpu_id: cpu.node_id for cpu in self.cpus}

    @property
    def numa_node_ids(self) -> tuple[int, ...]:
        return tuple(node.node_id for node in self.numa_nodes)


class CPUNodeMap:
    """Each CPU's NUMA node as the node info collector last read it (the node collector asks every tick; the
    map is built again only when a new reading was stored)."""

    def __init__(self, cache: MetricCache) -> None:
        self._cache = cache
        self._read: object = None
        self._map: Mapping[int, int] = {}

    def __call__(self) -> Mapping[int, int]:
        cpus = self._cache.get_kv(NODE_CPU_INFO_KV)
        if cpus is not self._read:
            self._read = cpus
            self._map = NodeInfoKV.of(self._cache).cpu_nodes
        return self._map
