"""Runtime hook metrics (reference/koordinator.md §6), on the default registry koordlet serves."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

_BUCKETS_MS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 1000)

HOOK_DURATION_MS = Histogram(
    "koordlet_runtime_hook_invoked_duration_milliseconds",
    "Time of one runtime hook call served by koordlet.",
    ["hook", "stage", "status"],
    buckets=_BUCKETS_MS,
)
RECONCILER_DURATION_MS = Histogram(
    "koordlet_runtime_hook_reconciler_invoked_duration_milliseconds",
    "Time of one reconciler pass by level.",
    ["level", "resource_type", "status"],
    buckets=_BUCKETS_MS,
)
VALUES_REJECTED = Counter(
    "koordlet_runtime_hook_value_rejected",
    "Values hook plugins answered that the kernel or the node would refuse: dropped, the pod goes on as kubelet "
    "asked (hooks/validate.py), by field.",
    ["key"],
)
PLUGIN_ERRORS = Counter(
    "koordlet_runtime_hook_plugin_errors",
    "Hook plugin runs skipped because the plugin raised (malformed input such as an annotation or the NodeSLO, "
    "or a bug in the plugin); the other plugins' answers stand.",
    ["plugin"],
)
