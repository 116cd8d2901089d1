"""Bounded in-memory time series of node, pod and container metrics (koordinator.md §7.2)."""

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
    GPU_DEVICES_KV,
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
    "DEFAULT_CAPACITY_BY_KIND",
    "GPU_DEVICES_KV",
    "GPUDevice",
    "NODE_WINDOW_CAPACITY",
    "POD_WINDOW_CAPACITY",
    "Aggregate",
    "Label",
    "MetricCache",
    "MetricKind",
    "Sample",
    "SeriesKey",
]
