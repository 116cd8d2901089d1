"""Prometheus metrics of the resource executor.

Defined once, at import, on prometheus_client's default registry, which koordlet's /metrics endpoint
serves; tests read the counters through :func:`update_count`. Names:
``koordlet_resource_update_total{resource,status}`` (ours) and
``koordlet_resource_update_duration_milliseconds{type,status}`` with Koordinator's buckets 0.01×4^k
(docs/koordinator.md §6).
"""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram

# Outcome of one update() call.
STATUS_WRITTEN = "written"
STATUS_SKIPPED = "skipped"  # same value written less than force-update-seconds ago
STATUS_INVALID = "invalid"
STATUS_UNSAFE_PATH = "unsafe_path"
STATUS_UNSUPPORTED = "unsupported"
STATUS_NOT_FOUND = "not_found"
STATUS_FAILED = "failed"
STATUS_PARTIAL = "partial"  # an action file did part of what was asked (memory.reclaim: EAGAIN)

_DURATION_BUCKETS_MS = tuple(0.01 * 4**k for k in range(8))


def _build(registry: CollectorRegistry) -> tuple[Counter, Histogram]:
    updates = Counter(
        "koordlet_resource_update_total",
        "Resource executor updates by resource and outcome",
        ["resource", "status"],
        registry=registry,
    )
    duration = Histogram(
        "koordlet_resource_update_duration_milliseconds",
        "Time to write one kernel file, in milliseconds",
        ["type", "status"],
        buckets=_DURATION_BUCKETS_MS,
        registry=registry,
    )
    return updates, duration


RESOURCE_UPDATES, RESOURCE_UPDATE_DURATION_MS = _build(REGISTRY)


_update_counters: dict[tuple[str, str], object] = {}


def count_update(resource: str, status: str) -> None:
    """One more ``koordlet_resource_update_total{resource,status}``. The labelled child is kept (resources and
    statuses are both fixed sets), which saves the label lookup on every skipped update of every tick."""
    child = _update_counters.get((resource, status))
    if child is None:
        child = _update_counters[(resource, status)] = RESOURCE_UPDATES.labels(resource=resource, status=status)
    child.inc()  # type: ignore[attr-defined]


def update_count(resource: str, status: str) -> float:
    """Current value of ``koordlet_resource_update_total{resource,status}`` (for tests and debugging)."""
    return RESOURCE_UPDATES.labels(resource=resource, status=status)._value.get()
