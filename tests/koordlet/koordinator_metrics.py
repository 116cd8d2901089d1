"""Facts: every Prometheus metric family Koordinator's koordlet exports, with its type and label names, and how its
``/metrics`` writes them. Facts only (names, types, labels, versions), no code of theirs.

Recorded from koordinator-sh/koordinator, ``pkg/koordlet/metrics/*.go`` (no ``_test.go``): every
``prometheus.New{Counter,Gauge,Histogram}Vec`` there, its ``Subsystem`` ("koordlet") and ``Name`` joined by ``_``,
and its label keys with the package's constants resolved (metrics.go, and each file's own). No package of
``pkg/koordlet`` or ``cmd/koordlet`` outside that directory declares a metric.

- :data:`V1_8_0`: at tag v1.8.0 (commit :data:`V1_8_0_COMMIT`), the version Koordinator's chart v1.8.0 runs: 33
  families.
- :data:`MAIN_ADDITIONS`: what the three commits of main after v1.8.0 that touch that directory add (8 families;
  :data:`MAIN_COMMITS`), which koordlet-py exports under the same names.

:data:`NOT_EXPORTED` is not a fact of Koordinator's: the two families koordlet-py leaves out, and why.

``registry``: ``internal`` (``internal_metrics.go``, k8s.io/component-base's legacyregistry) or ``external``
(``external_metrics.go``); ``/metrics`` serves both (cmd/koordlet/main.go, ``MergedGatherFunc``).

Besides these, the Go binary's ``/metrics`` carries what is not Koordinator's own and not listed here: ``go_*`` and
``process_*`` (client_golang's collectors, which legacyregistry registers), Kubernetes' ``registered_metrics_total``
and friends (component-base's KubeRegistry), and ``prometheus_tsdb_*`` (the embedded Prometheus TSDB v0.39.2, on the
external registry while ``-tsdb-enable-prometheus-metric`` is true, metriccache/tsdb_storage.go).
"""

from __future__ import annotations

from dataclasses import dataclass

V1_8_0_COMMIT = "989ca85c62abcca92b303aa12fd2ccff2ed30fed"
MAIN_COMMITS = {
    "58cdc35332d7620a716525bcc58e63b0998d53a2": "koordlet: add cpuset sharepool cpu info to metrics. (#2800)",
    "72ebfd8780878bd25e2bcff41ae7f5f665fe0640": "koordlet: support pod-level oom_score_adj hot update (#3139)",
    "a7a1b76bbf81abd26f9c377de1f31a60dd965f6e": "koordlet: support NUMA-level metrics and node peak reporting (#3138)",
}

# How cmd/koordlet/main.go serves them at v1.8.0: promhttp.HandlerFor(..., promhttp.HandlerOpts{}) from
# client_golang v1.23.2 (go.mod), with prometheus/common v0.67.5. EnableOpenMetrics is false, so the handler calls
# expfmt.Negotiate, which offers only the text format 0.0.4 and protobuf: to Prometheus' Accept header
# (OpenMetrics first, text/plain;version=0.0.4 next) it answers CONTENT_TYPE. The text format writes a counter
# under the name it was declared with: TYPE line and samples "koordlet_pod_eviction", no "_total" and no
# "_created" series (expfmt MetricFamilyToText).
CLIENT_GOLANG = "v1.23.2"
PROMETHEUS_COMMON = "v0.67.5"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8; escaping=underscores"


@dataclass(frozen=True, slots=True)
class Family:
    type: str  # counter, gauge or histogram
    labels: tuple[str, ...]  # in declaration order (the text format writes them sorted by name)
    source: str  # the file under pkg/koordlet/metrics/
    registry: str  # internal or external


_POD = ("pod_uid", "pod_name", "pod_namespace")
_CONTAINER = ("container_id", "container_name")
_PSI = ("psi_resource_type", "psi_precision", "psi_degree", "cpu_full_supported")

V1_8_0: dict[str, Family] = {
    # common.go
    "koordlet_start_time": Family("gauge", ("node",), "common.go", "internal"),
    "koordlet_collect_node_cpu_info_status": Family("counter", ("node", "status"), "common.go", "internal"),
    "koordlet_collect_node_numa_info_status": Family("counter", ("node", "status"), "common.go", "internal"),
    "koordlet_collect_node_local_storage_info_status": Family("counter", ("node", "status"), "common.go", "internal"),
    "koordlet_pod_eviction": Family("counter", ("node", "reason"), "common.go", "internal"),
    "koordlet_pod_eviction_detail": Family("counter", ("node", "pod_namespace", "pod_name", "reason"), "common.go",
                                           "internal"),
    "koordlet_node_used_cpu_cores": Family("gauge", ("node",), "common.go", "internal"),
    "koordlet_node_used_memory_bytes": Family("gauge", ("node",), "common.go", "internal"),
    # cpu_suppress.go
    "koordlet_be_suppress_cpu_cores": Family("gauge", ("node", "type"), "cpu_suppress.go", "internal"),
    "koordlet_be_suppress_ls_used_cpu_cores": Family("gauge", ("node",), "cpu_suppress.go", "internal"),
    "koordlet_be_suppress_be_used_cpu_cores": Family("gauge", ("node",), "cpu_suppress.go", "internal"),
    # cpu_burst.go
    "koordlet_container_scaled_cfs_burst_us": Family("gauge", ("node", "pod_namespace", "pod_name", *_CONTAINER),
                                                     "cpu_burst.go", "internal"),
    "koordlet_container_scaled_cfs_quota_us": Family("gauge", ("node", "pod_namespace", "pod_name", *_CONTAINER),
                                                     "cpu_burst.go", "internal"),
    # cpu_cpuset.go
    "koordlet_cpuset_share_pool_cpu_cores": Family("gauge", ("node",), "cpu_cpuset.go", "internal"),
    "koordlet_cpuset_be_share_pool_cpu_cores": Family("gauge", ("node",), "cpu_cpuset.go", "internal"),
    # prediction.go
    "koordlet_node_predicted_resource_reclaimable": Family("gauge", ("node", "predictor", "resource", "unit"),
                                                           "prediction.go", "internal"),
    # core_sched.go
    "koordlet_container_core_sched_cookie": Family(
        "gauge", ("node", "pod_name", "pod_namespace", "pod_uid", "container_name", "container_id", "core_sched_group",
                  "core_sched_cookie"), "core_sched.go", "internal"),
    "koordlet_core_sched_cookie_manage_status": Family("counter", ("node", "core_sched_group", "status"),
                                                       "core_sched.go", "internal"),
    # resource_executor.go
    "koordlet_resource_update_duration_milliseconds": Family("histogram", ("type", "status"), "resource_executor.go",
                                                             "internal"),
    # kubelet.go
    "koordlet_kubelet_request_duration_seconds": Family("histogram", ("verb", "path", "code"), "kubelet.go",
                                                        "internal"),
    # runtime_hook.go
    "koordlet_runtime_hook_invoked_duration_milliseconds": Family("histogram", ("node", "hook", "stage", "status"),
                                                                  "runtime_hook.go", "internal"),
    "koordlet_runtime_hook_reconciler_invoked_duration_milliseconds": Family(
        "histogram", ("node", "level", "resource_type", "status"), "runtime_hook.go", "internal"),
    # host_application.go
    "koordlet_host_application_resource_usage": Family(
        "gauge", ("node", "host_application_name", "resource", "priority_class", "qos"), "host_application.go",
        "internal"),
    # resource_summary.go
    "koordlet_node_resource_allocatable": Family("gauge", ("node", "resource", "unit"), "resource_summary.go",
                                                 "external"),
    "koordlet_node_priority_resource_reclaimable": Family("gauge", ("node", "priority", "resource", "unit"),
                                                          "resource_summary.go", "external"),
    "koordlet_node_resource_priority_reclaimable_status": Family("gauge", ("node", "priority"), "resource_summary.go",
                                                                 "external"),
    "koordlet_container_resource_requests": Family("gauge", ("node", "resource", "unit", *_POD, *_CONTAINER),
                                                   "resource_summary.go", "external"),
    "koordlet_container_resource_limits": Family("gauge", ("node", "resource", "unit", *_POD, *_CONTAINER),
                                                 "resource_summary.go", "external"),
    # cpi.go
    "koordlet_container_cpi": Family("gauge", ("node", *_CONTAINER, *_POD, "cpi_field"), "cpi.go", "external"),
    # psi.go
    "koordlet_container_psi": Family("gauge", ("node", *_CONTAINER, *_POD, *_PSI), "psi.go", "external"),
    "koordlet_pod_psi": Family("gauge", ("node", *_POD, *_PSI), "psi.go", "external"),
    # resctrl.go
    "koordlet_resctrl_llc_occupancy": Family("gauge", ("node", "cache_id", "qos"), "resctrl.go", "external"),
    "koordlet_resctrl_memory_bandwidth": Family("gauge", ("node", "cache_id", "qos", "mb_type"), "resctrl.go",
                                                "external"),
}

MAIN_ADDITIONS: dict[str, tuple[str, Family]] = {  # name -> (commit of MAIN_COMMITS, family)
    "koordlet_cpuset_share_pool_info": ("58cdc35332d7620a716525bcc58e63b0998d53a2",
                                        Family("gauge", ("node", "cpu"), "cpu_cpuset.go", "internal")),
    "koordlet_cpuset_be_share_pool_info": ("58cdc35332d7620a716525bcc58e63b0998d53a2",
                                           Family("gauge", ("node", "cpu"), "cpu_cpuset.go", "internal")),
    "koordlet_container_oom_score_adj": ("72ebfd8780878bd25e2bcff41ae7f5f665fe0640",
                                         Family("gauge", ("node", "pod_name", "pod_namespace", "pod_uid",
                                                          "container_name"), "oom_score_adj.go", "internal")),
    "koordlet_node_metric_node_usage": ("a7a1b76bbf81abd26f9c377de1f31a60dd965f6e",
                                        Family("gauge", ("node", "resource", "unit"), "node_metric.go", "internal")),
    "koordlet_node_metric_system_usage": ("a7a1b76bbf81abd26f9c377de1f31a60dd965f6e",
                                          Family("gauge", ("node", "resource", "unit"), "node_metric.go", "internal")),
    "koordlet_node_metric_numa_node_usage": ("a7a1b76bbf81abd26f9c377de1f31a60dd965f6e",
                                             Family("gauge", ("node", "numa_node_id", "resource", "unit"),
                                                    "node_metric.go", "internal")),
    "koordlet_node_metric_numa_system_usage": ("a7a1b76bbf81abd26f9c377de1f31a60dd965f6e",
                                               Family("gauge", ("node", "numa_node_id", "resource", "unit"),
                                                      "node_metric.go", "internal")),
    "koordlet_node_predicted_resource_peak": ("a7a1b76bbf81abd26f9c377de1f31a60dd965f6e",
                                              Family("gauge", ("node", "predictor", "resource", "unit"),
                                                     "prediction.go", "internal")),
}

FAMILIES: dict[str, Family] = {**V1_8_0, **{name: family for name, (_, family) in MAIN_ADDITIONS.items()}}

# Not a fact of Koordinator's: the families koordlet-py does not export, and why (docs/koordinator.md §6 says so too).
# No cookie manager (prctl PR_SCHED_CORE) here: neither this host's kernel nor the v2 guest's Debian 6.1 has
# CONFIG_SCHED_CORE, so there is no kernel to build and test one on; the metrics would never be set.
NOT_EXPORTED = {
    "koordlet_container_core_sched_cookie": "no core scheduling cookies (CONFIG_SCHED_CORE)",
    "koordlet_core_sched_cookie_manage_status": "no core scheduling cookies (CONFIG_SCHED_CORE)",
}
EXPORTED: dict[str, Family] = {name: family for name, family in FAMILIES.items() if name not in NOT_EXPORTED}
