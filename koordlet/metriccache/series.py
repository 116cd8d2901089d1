"""What a time series is called: metric kinds and label names (Koordinator's names, docs/koordinator.md §7.2)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class MetricKind(StrEnum):
    NODE_CPU_USAGE = "node_cpu_usage"  # cores
    NODE_MEMORY_USAGE = "node_memory_usage"  # bytes, MemTotal − MemAvailable
    NODE_MEMORY_USAGE_WITH_PAGE_CACHE = "node_memory_usage_with_page_cache"  # bytes, MemTotal − MemFree
    NODE_SWAP_FREE = "node_swap_free"  # bytes, SwapFree (what BE memory reclaim may still swap out)
    NODE_PER_CPU_USAGE = "node_per_cpu_usage"  # cores of one CPU (0..1), label cpu (gate PerCPUMetric)
    # Per NUMA node (Koordinator #3138), label numa_node_id: CPU from the per-CPU ticks of the node's CPUs,
    # memory from nodeN/meminfo; system = the node's − Σ pods' memory on it, CPU apportioned by the nodes' use.
    NODE_NUMA_CPU_USAGE = "node_numa_cpu_usage"  # cores
    NODE_NUMA_MEMORY_USAGE = "node_numa_memory_usage"  # bytes
    NODE_PSI = "node_psi"  # percent (avg10/60/300), labels psi_resource/psi_precision/psi_degree
    NODE_BE = "node_be"  # milli-cores, labels be_resource/be_allocation
    SYS_CPU_USAGE = "sys_cpu_usage"  # cores, node − Σ pods
    SYS_MEMORY_USAGE = "sys_memory_usage"  # bytes, node − Σ pods
    SYS_NUMA_CPU_USAGE = "sys_numa_cpu_usage"  # cores, label numa_node_id
    SYS_NUMA_MEMORY_USAGE = "sys_numa_memory_usage"  # bytes, label numa_node_id
    # The kubepods dir: every pod together, read every collection (Koordinator has no such series; it sums the pods
    # it reads each second). What "Σ pods" is for system usage, CPU suppress and CPU burst's share pool, now that the
    # pods no strategy asks for are read less often (koordlet/metricsadvisor/pods.py).
    KUBEPODS_CPU_USAGE = "kubepods_cpu_usage"  # cores
    KUBEPODS_MEMORY_USAGE = "kubepods_memory_usage"  # bytes, anon + unevictable
    KUBEPODS_MEMORY_USAGE_WITH_PAGE_CACHE = "kubepods_memory_usage_with_page_cache"  # bytes, + file LRU
    POD_CPU_USAGE = "pod_cpu_usage"  # cores
    POD_MEMORY_USAGE = "pod_memory_usage"  # bytes, anon + unevictable
    POD_MEMORY_USAGE_WITH_PAGE_CACHE = "pod_memory_usage_with_page_cache"  # bytes, + file LRU
    POD_CPU_THROTTLED = "pod_cpu_throttled"  # ratio 0..1 of periods throttled
    POD_PSI = "pod_psi"
    CONTAINER_CPU_USAGE = "container_cpu_usage"
    CONTAINER_MEMORY_USAGE = "container_memory_usage"
    CONTAINER_MEMORY_USAGE_WITH_PAGE_CACHE = "container_memory_usage_with_page_cache"
    CONTAINER_CPU_THROTTLED = "container_cpu_throttled"
    CONTAINER_PSI = "container_psi"
    # Out-of-band host applications of NodeSLO ``hostApplications``, label host_app_name.
    HOST_APP_CPU_USAGE = "host_application_cpu_usage"  # cores
    HOST_APP_MEMORY_USAGE = "host_application_memory_usage"  # bytes, anon + unevictable
    HOST_APP_MEMORY_USAGE_WITH_PAGE_CACHE = "host_application_memory_usage_with_page_cache"
    NODE_GPU_CORE_USAGE = "node_gpu_core_usage"  # percent, labels gpu_minor/gpu_device_uuid
    NODE_GPU_MEMORY_USAGE = "node_gpu_memory_usage"  # bytes
    POD_GPU_CORE_USAGE = "pod_gpu_core_usage"
    POD_GPU_MEMORY_USAGE = "pod_gpu_memory_usage"
    CONTAINER_GPU_CORE_USAGE = "container_gpu_core_usage"
    CONTAINER_GPU_MEMORY_USAGE = "container_gpu_memory_usage"
    # CPI (gate CPICollector): cycles or instructions over one collection window, labels pod_uid,
    # container_id, cpi_resource (cycle/instruction)
    CONTAINER_CPI = "container_cpi"
    # resctrl monitoring of the QoS groups (gate ResctrlCollector), labels qos, cache_id (+ resctrl_type mb,
    # resctrl_mb_type mbm_total_bytes/mbm_local_bytes): LLC bytes occupied; memory bandwidth bytes per second
    RESCTRL_LLC = "resctrl_resource_llc"
    RESCTRL_MB = "resctrl_resource_mb"
    # cold memory (gate ColdPageCollector): bytes of cold page cache, and usage with only the hot page cache
    NODE_MEMORY_WITH_HOT_PAGE_USAGE = "node_memory_with_hot_page_usage"
    POD_MEMORY_WITH_HOT_PAGE_USAGE = "pod_memory_with_hot_page_usage"
    CONTAINER_MEMORY_WITH_HOT_PAGE_USAGE = "container_memory_with_hot_page_usage"
    HOST_APP_MEMORY_WITH_HOT_PAGE_USAGE = "host_application_memory_with_hot_page_usage"
    NODE_MEMORY_COLD_PAGE_SIZE = "node_memory_cold_page_size"
    POD_MEMORY_COLD_PAGE_SIZE = "pod_memory_cold_page_size"
    CONTAINER_MEMORY_COLD_PAGE_SIZE = "container_memory_cold_page_size"
    HOST_APP_MEMORY_COLD_PAGE_SIZE = "host_application_memory_cold_page_size"


class Label(StrEnum):
    POD_UID = "pod_uid"
    CONTAINER_ID = "container_id"
    QOS = "qos"
    NUMA_NODE_ID = "numa_node_id"
    BE_RESOURCE = "be_resource"
    BE_ALLOCATION = "be_allocation"
    PSI_RESOURCE = "psi_resource"
    PSI_PRECISION = "psi_precision"
    PSI_DEGREE = "psi_degree"
    GPU_MINOR = "gpu_minor"
    GPU_DEVICE_UUID = "gpu_device_uuid"
    HOST_APP_NAME = "host_app_name"
    CPU = "cpu"  # a logical CPU id (Koordinator's Prometheus label for per-CPU series)
    CPI_RESOURCE = "cpi_resource"
    CACHE_ID = "cache_id"
    RESCTRL_TYPE = "resctrl_type"
    RESCTRL_MB_TYPE = "resctrl_mb_type"


# Values of cpi_resource and resctrl_type (Koordinator metriccache/metric_types.go).
CPI_RESOURCE_CYCLE = "cycle"
CPI_RESOURCE_INSTRUCTION = "instruction"
RESCTRL_TYPE_MB = "mb"


# The GPUs of the node in the cache's KV (Koordinator keeps ``GPUDevices`` there: uuid, minor, memory
# total); NodeMetric needs the totals for ``koordinator.sh/gpu-memory-ratio``.
GPU_DEVICES_KV = "gpu_devices"
# The node's CPU topology and NUMA nodes, read by the node info collector (Koordinator's NodeCPUInfoKey and
# NodeNUMAInfoKey): a tuple of koordlet.system.sysfs.CPUInfo, a tuple of koordlet.system.sysfs.NUMANode.
NODE_CPU_INFO_KV = "node_cpu_info"
NODE_NUMA_INFO_KV = "node_numa_info"


@dataclass(frozen=True, slots=True)
class GPUDevice:
    uuid: str
    minor: int
    memory_total_bytes: int


# Values of be_allocation (docs/koordinator.md §4.4 spells the last one "real-limit").
BE_ALLOCATION_USAGE = "usage"
BE_ALLOCATION_REQUEST = "request"
BE_ALLOCATION_REAL_LIMIT = "real-limit"


@dataclass(frozen=True, slots=True)
class SeriesKey:
    """One series: a metric kind plus its labels, sorted by name so equal label sets compare equal."""

    kind: str
    labels: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, kind: str, **labels: str) -> SeriesKey:
        return cls(str(kind), tuple(sorted((str(name), str(value)) for name, value in labels.items())))

    def label(self, name: str) -> str | None:
        for key, value in self.labels:
            if key == name:
                return value
        return None


@dataclass(frozen=True, slots=True)
class Sample:
    key: SeriesKey
    timestamp: float  # unix seconds
    value: float
