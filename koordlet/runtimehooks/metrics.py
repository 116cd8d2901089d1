"""Runtime hook metrics (reference/koordinator.md §6), on the default registry koordlet serves."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

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
    "Hook plugin runs skipped because their input (an annotation, the NodeSLO) was malformed.",
    ["plugin"],
)
CONTAINER_OOM_SCORE_ADJ = Gauge(
    "koordlet_container_oom_score_adj",
    "The oom_score_adj koordlet keeps on the processes of a container (OOMScoreAdj), while some process holds it.",
    ["pod_namespace", "pod_name", "pod_uid", "container_name"],
)
PROCESS_WRITE_ERRORS = Counter(
    "koordlet_runtime_hook_process_write_errors",
    "Per-process writes the kernel refused (EACCES: lowering oom_score_adj needs CAP_SYS_RESOURCE), by file and "
    "errno.",
    ["resource", "errno"],
)
