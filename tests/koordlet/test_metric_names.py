"""Every metric Koordinator's koordlet exports, by name and label names, against what koordlet-py serves and what
docs/koordinator.md §6 lists.

The facts: Koordinator's pkg/koordlet/metrics/*.go at v1.8.0 plus #3138 (NUMA-level metrics and node peak
reporting, the newest main): each ``Subsystem: "koordlet"`` metric and its label keys, recorded below. Ours are
read from the metric objects (declared labels) and, for the families computed at scrape time, from a scrape of an
agent whose cache and states hold a sample of everything.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

import koordlet.eviction  # noqa: F401 - defines its metrics at import
import koordlet.executor.metrics  # noqa: F401
import koordlet.qosmanager.metrics  # noqa: F401
import koordlet.runtimehooks.metrics  # noqa: F401
from koordlet.api.nodeslo import parse_node_slo_spec
from koordlet.api.pod import ContainerMeta, PodMeta
from koordlet.metriccache import CPI_RESOURCE_CYCLE, Label, MetricCache, MetricKind, SeriesKey
from koordlet.metrics import KoordletMetrics, exposition
from koordlet.statesinformer.api import NodeInfo, StaticStates

REPO = Path(__file__).resolve().parents[2]
POD = ("pod_uid", "pod_name", "pod_namespace")
CONTAINER = ("container_id", "container_name")
PSI = ("psi_resource_type", "psi_precision", "psi_degree", "cpu_full_supported")
# Koordinator v1.8.0 + #3138, pkg/koordlet/metrics: metric (without the koordlet_ prefix) -> label keys.
KOORDINATOR = {
    "start_time": ("node",),
    "collect_node_cpu_info_status": ("node", "status"),
    "collect_node_numa_info_status": ("node", "status"),
    "collect_node_local_storage_info_status": ("node", "status"),
    "pod_eviction": ("node", "reason"),
    "pod_eviction_detail": ("node", "pod_namespace", "pod_name", "reason"),
    "node_used_cpu_cores": ("node",),
    "node_used_memory_bytes": ("node",),
    "container_core_sched_cookie": ("node", "pod_name", "pod_namespace", "pod_uid", "container_name", "container_id",
                                    "core_sched_group", "core_sched_cookie"),
    "core_sched_cookie_manage_status": ("node", "core_sched_group", "status"),
    "container_cpi": ("node", *CONTAINER, *POD, "cpi_field"),
    "container_scaled_cfs_burst_us": ("node", "pod_namespace", "pod_name", *CONTAINER),
    "container_scaled_cfs_quota_us": ("node", "pod_namespace", "pod_name", *CONTAINER),
    "cpuset_share_pool_cpu_cores": ("node",),
    "cpuset_be_share_pool_cpu_cores": ("node",),
    "cpuset_share_pool_info": ("node", "cpu"),
    "cpuset_be_share_pool_info": ("node", "cpu"),
    "be_suppress_cpu_cores": ("node", "type"),
    "be_suppress_ls_used_cpu_cores": ("node",),
    "be_suppress_be_used_cpu_cores": ("node",),
    "host_application_resource_usage": ("node", "host_application_name", "resource", "priority_class", "qos"),
    "kubelet_request_duration_seconds": ("verb", "path", "code"),
    "node_metric_node_usage": ("node", "resource", "unit"),
    "node_metric_system_usage": ("node", "resource", "unit"),
    "node_metric_numa_node_usage": ("node", "numa_node_id", "resource", "unit"),
    "node_metric_numa_system_usage": ("node", "numa_node_id", "resource", "unit"),
    "container_oom_score_adj": ("node", "pod_name", "pod_namespace", "pod_uid", "container_name"),
    "node_predicted_resource_reclaimable": ("node", "predictor", "resource", "unit"),
    "node_predicted_resource_peak": ("node", "predictor", "resource", "unit"),
    "container_psi": ("node", *CONTAINER, *POD, *PSI),
    "pod_psi": ("node", *POD, *PSI),
    "resctrl_llc_occupancy": ("node", "cache_id", "qos"),
    "resctrl_memory_bandwidth": ("node", "cache_id", "qos", "mb_type"),
    "resource_update_duration_milliseconds": ("type", "status"),
    "node_resource_allocatable": ("node", "resource", "unit"),
    "node_priority_resource_reclaimable": ("node", "priority", "resource", "unit"),
    "node_resource_priority_reclaimable_status": ("node", "priority"),
    "container_resource_requests": ("node", "resource", "unit", *POD, *CONTAINER),
    "container_resource_limits": ("node", "resource", "unit", *POD, *CONTAINER),
    "runtime_hook_invoked_duration_milliseconds": ("node", "hook", "stage", "status"),
    "runtime_hook_reconciler_invoked_duration_milliseconds": ("node", "level", "resource_type", "status"),
}
# Koordinator's that koordlet-py does not export, and why (docs/koordinator.md §6 says so too).
NOT_EXPORTED = {
    # No cookie manager (prctl PR_SCHED_CORE) here: neither this host's kernel nor the v2 guest's Debian 6.1 has
    # CONFIG_SCHED_CORE, so there is no kernel to build and test one on; the metrics would never be set.
    "container_core_sched_cookie": "no core scheduling cookies (CONFIG_SCHED_CORE)",
    "core_sched_cookie_manage_status": "no core scheduling cookies (CONFIG_SCHED_CORE)",
}


def _declared() -> dict[str, tuple[str, ...]]:
    """Name -> label names of every metric object on the default registry and the agent's."""
    found: dict[str, tuple[str, ...]] = {}
    for registry in (REGISTRY, KoordletMetrics("n1").registry):
        for collector in list(registry._collector_to_names):  # noqa: SLF001 - the declared objects
            name, labels = getattr(collector, "_name", None), getattr(collector, "_labelnames", None)
            if name and labels is not None:
                found[name] = tuple(labels)
    return found


def _scraped() -> dict[str, tuple[str, ...]]:
    """Name -> label names of the scrape-time families of an agent whose cache and states hold one of each."""
    now = time.time()
    cache = MetricCache()
    pod, ctr = {Label.POD_UID: "u1"}, {Label.POD_UID: "u1", Label.CONTAINER_ID: "c1"}
    psi = {Label.PSI_RESOURCE: "cpu", Label.PSI_PRECISION: "avg10", Label.PSI_DEGREE: "some"}
    for key in (SeriesKey.of(MetricKind.NODE_CPU_USAGE), SeriesKey.of(MetricKind.NODE_MEMORY_USAGE),
                SeriesKey.of(MetricKind.POD_PSI, **pod, **psi), SeriesKey.of(MetricKind.CONTAINER_PSI, **ctr, **psi),
                SeriesKey.of(MetricKind.CONTAINER_CPI, **ctr, **{Label.CPI_RESOURCE: CPI_RESOURCE_CYCLE}),
                SeriesKey.of(MetricKind.RESCTRL_LLC, **{Label.QOS: "LS", Label.CACHE_ID: "0"}),
                SeriesKey.of(MetricKind.RESCTRL_MB, **{Label.QOS: "LS", Label.CACHE_ID: "0",
                                                       Label.RESCTRL_MB_TYPE: "mbm_total_bytes"}),
                SeriesKey.of(MetricKind.HOST_APP_CPU_USAGE, **{Label.HOST_APP_NAME: "nginx"})):
        cache.append(key, now, 1.0)
    slo = parse_node_slo_spec({"hostApplications": [{"name": "nginx", "priority": "koord-prod", "qos": "LS"}]})
    states = StaticStates(node=NodeInfo("n1", allocatable={"cpu": 4000}), node_slo=slo, pods=(
        PodMeta(name="p", namespace="ns", uid="u1", containers=(ContainerMeta("c", "c1", requests={"cpu": 100},
                                                                               limits={"cpu": 200}),)),))
    metrics = KoordletMetrics("n1", cache, states)
    text = exposition([metrics.registry]).decode()
    return {family.name: tuple(family.samples[0].labels) for family in text_string_to_metric_families(text)
            if family.samples}


def test_every_koordinator_metric_is_ours_with_its_labels() -> None:
    ours = {**_declared(), **_scraped()}
    missing, different = [], {}
    for name, labels in KOORDINATOR.items():
        if name in NOT_EXPORTED:
            assert f"koordlet_{name}" not in ours, f"{name} is exported now: take it out of NOT_EXPORTED"
            continue
        got = ours.get(f"koordlet_{name}")
        if got is None:
            missing.append(name)
        elif set(got) != set(labels):
            different[name] = (got, labels)
    assert missing == [] and different == {}


def test_docs_section_6_lists_every_koordinator_metric_and_says_which_are_not_exported() -> None:
    text = (REPO / "docs/koordinator.md").read_text()
    section = text[text.index("## 6. Prometheus metrics"):text.index("## 7.")]
    listed = set(re.findall(r"`(koordlet_[a-z_]+)`", section))
    assert {f"koordlet_{name}" for name in KOORDINATOR} - listed == set()
    for name in NOT_EXPORTED:
        assert re.search(rf"`koordlet_{name}`[^\n]*not exported", section), \
            f"docs/koordinator.md §6 does not say {name} is not exported"
