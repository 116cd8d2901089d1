"""Runtime hook metrics (docs/koordinator.md §6), on the default registry koordlet serves.

Koordinator's carry the node's name (``node``): :func:`set_node` is called once by the runtime hooks with it.
"""

from __future__ import annotations

from dataclasses import fields

from prometheus_client import Counter, Gauge, Histogram

from hooks.protocol import Changes
from hooks.registry import Plugin

_BUCKETS_MS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 1000)
_node = [""]


def set_node(name: str) -> None:
    """The ``node`` label of the metrics below."""
    _node[0] = name


def node() -> str:
    return _node[0]


HOOK_DURATION_MS = Histogram(
    "koordlet_runtime_hook_invoked_duration_milliseconds",
    "Time of one runtime hook call served by koordlet.",
    ["node", "hook", "stage", "status"],
    buckets=_BUCKETS_MS,
)
RECONCILER_DURATION_MS = Histogram(
    "koordlet_runtime_hook_reconciler_invoked_duration_milliseconds",
    "Time of one reconciler pass by level.",
    ["node", "level", "resource_type", "status"],
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

# NRI mode (koordlet as an NRI plugin; Koordinator exports no NRI metrics, so these names are our own).
NRI_EVENTS = Counter(
    "koordlet_nri_events",
    "NRI events answered, by event (RunPodSandbox, CreateContainer, UpdateContainer, RemovePodSandbox, "
    "Synchronize) and result: changed / unchanged (the answer did / did not change the container), ok (an "
    "event with nothing to answer), timeout (answered with no change to stay within the runtime's timeout), "
    "error (a koordlet bug; answered with no change unless the plugin failure policy is Fail).",
    ["event", "result"],
)
NRI_EVENT_DURATION_MS = Histogram(
    "koordlet_nri_event_duration_milliseconds",
    "Time koordlet took to answer one NRI event, from the request's arrival to the answer.",
    ["event"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 25, 100, 500, 2000),
)
NRI_ENABLED = Gauge(
    "koordlet_nri_enabled",
    "1 while koordlet runs as an NRI plugin (-enable-nri-runtime-hook), else 0; with koordlet_nri_registered 0 for "
    "long, the runtime offers no NRI or refuses the plugin.",
)
NRI_REGISTERED = Gauge(
    "koordlet_nri_registered",
    "1 while koordlet is registered with the runtime's NRI and synchronized (it gets events), else 0.",
)
NRI_RECONNECTS = Counter(
    "koordlet_nri_reconnects",
    "Registrations with the runtime after the first one (the connection had dropped: a runtime restart, ...).",
)
NRI_CONNECT_FAILURES = Counter(
    "koordlet_nri_connect_failures",
    "Attempts to connect and register that failed (socket refused, registration refused or timed out).",
)
NRI_SYNC_SIZE = Gauge(
    "koordlet_nri_sync_size",
    "The last NRI Synchronize: pods and containers the runtime sent, in how many messages and bytes, and the "
    "container updates koordlet answered.",
    ["item"],
)
CONTAINER_OOM_SCORE_ADJ = Gauge(
    "koordlet_container_oom_score_adj",
    "The oom_score_adj koordlet keeps on the processes of a container (OOMScoreAdj), while some process holds it.",
    ["node", "pod_namespace", "pod_name", "pod_uid", "container_name"],
)
PROCESS_WRITE_ERRORS = Counter(
    "koordlet_runtime_hook_process_write_errors",
    "Per-process writes the kernel refused (EACCES: lowering oom_score_adj needs CAP_SYS_RESOURCE), by file and "
    "errno.",
    ["resource", "errno"],
)


def zero_counts(plugins: list[Plugin]) -> None:
    """Export 0 for each plugin's errors and each field's dropped values before the first one, so that rate() and
    increase() (the alert rules, deploy/prometheus/koordlet-rules.yaml) count the first one too."""
    for plugin in plugins:
        PLUGIN_ERRORS.labels(plugin.name)
    for field in fields(Changes):
        VALUES_REJECTED.labels(field.name)
