"""The node's own CPU and memory usage in a metric cache: what the NodeMetric reporter needs before it writes a
status (it skips a report until both are collected, as Koordinator's does)."""

from __future__ import annotations

from koordlet.metriccache import MetricCache, MetricKind, Sample, SeriesKey


def with_node_usage(cache: MetricCache, at: float, cpu_cores: float = 1.0, memory_bytes: float = 2e9) -> MetricCache:
    """``cache`` with one sample of the node's CPU and memory usage at ``at`` (Unix seconds)."""
    cache.append_samples([Sample(SeriesKey.of(MetricKind.NODE_CPU_USAGE), at, cpu_cores),
                          Sample(SeriesKey.of(MetricKind.NODE_MEMORY_USAGE), at, memory_bytes)])
    return cache
