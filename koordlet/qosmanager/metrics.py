"""Prometheus metrics of the QoS manager and the evictor, with Koordinator's names (docs/koordinator.md §6).

Defined once, at import, on prometheus_client's default registry (the one koordlet's ``/metrics`` serves),
like the executor's. Every Koordinator metric carries the ``node`` label.
"""

from __future__ import annotations

from prometheus_client import REGISTRY, Counter, Gauge

BE_SUPPRESS_CPU_CORES_NAME = "koordlet_be_suppress_cpu_cores"
BE_SUPPRESS_CPU_CORES = Gauge(
    BE_SUPPRESS_CPU_CORES_NAME,
    "CPU cores left to BE pods by the suppress strategy",
    ["node", "type"],
    registry=REGISTRY,
)
BE_SUPPRESS_LS_USED_CPU_CORES_NAME = "koordlet_be_suppress_ls_used_cpu_cores"
BE_SUPPRESS_LS_USED_CPU_CORES = Gauge(
    BE_SUPPRESS_LS_USED_CPU_CORES_NAME,
    "CPU cores used by non-BE pods and host applications when suppress last ran",
    ["node"],
    registry=REGISTRY,
)
BE_SUPPRESS_BE_USED_CPU_CORES_NAME = "koordlet_be_suppress_be_used_cpu_cores"
BE_SUPPRESS_BE_USED_CPU_CORES = Gauge(
    BE_SUPPRESS_BE_USED_CPU_CORES_NAME,
    "CPU cores used by BE pods when suppress last ran",
    ["node"],
    registry=REGISTRY,
)
CONTAINER_SCALED_CFS_QUOTA_US_NAME = "koordlet_container_scaled_cfs_quota_us"
CONTAINER_SCALED_CFS_QUOTA_US = Gauge(
    CONTAINER_SCALED_CFS_QUOTA_US_NAME,
    "CFS quota the CPU burst strategy set on a container",
    ["node", "pod_namespace", "pod_name", "container_id", "container_name"],
    registry=REGISTRY,
)
CONTAINER_SCALED_CFS_BURST_US_NAME = "koordlet_container_scaled_cfs_burst_us"
CONTAINER_SCALED_CFS_BURST_US = Gauge(
    CONTAINER_SCALED_CFS_BURST_US_NAME,
    "CFS burst the CPU burst strategy set on a container",
    ["node", "pod_namespace", "pod_name", "container_id", "container_name"],
    registry=REGISTRY,
)
# The gauges a strategy's Plan may set (koordlet.plan.GaugeSet), by name: the plan runner gets this map.
GAUGES = {
    BE_SUPPRESS_CPU_CORES_NAME: BE_SUPPRESS_CPU_CORES,
    BE_SUPPRESS_LS_USED_CPU_CORES_NAME: BE_SUPPRESS_LS_USED_CPU_CORES,
    BE_SUPPRESS_BE_USED_CPU_CORES_NAME: BE_SUPPRESS_BE_USED_CPU_CORES,
    CONTAINER_SCALED_CFS_QUOTA_US_NAME: CONTAINER_SCALED_CFS_QUOTA_US,
    CONTAINER_SCALED_CFS_BURST_US_NAME: CONTAINER_SCALED_CFS_BURST_US,
}
STRATEGY_RUNS = Counter(
    "koordlet_qosmanager_strategy_runs",
    "QoS strategy ticks, by strategy and outcome (ok, error, skipped)",
    ["strategy", "status"],
    registry=REGISTRY,
)
STRATEGY_WRITE_FAILURES = Counter(
    "koordlet_qosmanager_write_failures",
    "Cgroup writes a QoS strategy asked for that the executor did not carry out",
    ["strategy"],
    registry=REGISTRY,
)


def value_of(metric: Counter | Gauge, **labels: str) -> float:
    """Current value of one labelled child (tests and debugging)."""
    return metric.labels(**labels)._value.get()
