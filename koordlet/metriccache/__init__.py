"""Bounded in-memory time series of node, pod and container metrics (docs/koordinator.md §7.2)."""

from koordlet.metriccache.cache import (
    DEFAULT_CAPACITY_BY_KIND,
    NODE_WINDOW_CAPACITY,
    POD_WINDOW_CAPACITY,
    Aggregate,
    MetricCache,
)
from koordlet.metriccache.series import (
    BE_ALLOCATION_REAL_LIMIT,
    BE_ALLOCATION_REQUEST,
    BE_ALLOCATION_USAGE,
    CPI_RESOURCE_CYCLE,
    CPI_RESOURCE_INSTRUCTION,
    GPU_DEVICES_KV,
    NODE_CPU_INFO_KV,
    NODE_NUMA_INFO_KV,
    RESCTRL_TYPE_MB,
    GPUDevice,
    Label,
    MetricKind,
    Sample,
    SeriesKey,
)

__all__ = [
    "BE_ALLOCATION_REAL_LIMIT",
    "BE_ALLOCATION_REQUEST",
    "BE_ALLOCATION_USAGE",
    "CPI_RESOURCE_CYCLE",
    "CPI_RESOURCE_INSTRUCTION",
    "DEFAULT_CAPACITY_BY_KIND",
    "GPU_DEVICES_KV",
    "NODE_CPU_INFO_KV",
    "NODE_NUMA_INFO_KV",
    "GPUDevice",
    "NODE_WINDOW_CAPACITY",
    "POD_WINDOW_CAPACITY",
    "RESCTRL_TYPE_MB",
    "Aggregate",
    "Label",
    "MetricCache",
    "MetricKind",
    "Sample",
    "SeriesKey",
]
