"""koordlet's Prometheus metrics (Koordinator's names, docs/koordinator.md §6) and the HTTP server on ``-addr``.

One registry per agent (:class:`KoordletMetrics`) holds the component metrics and the collectors' own
timings; ``/metrics`` serves it merged with prometheus_client's default registry, where the executor,
the QoS manager and the evictor define their counters at import, and where the process collector
reports the agent's own cost (``process_resident_memory_bytes``, ``process_cpu_seconds_total``,
open fds). The text is in Koordinator's form (koordlet/gotext.py: its counters without ``_total``, no
``_created`` series, text format 0.0.4 to every scraper). ``/internal-metrics`` and ``/external-metrics``
serve the same text (Koordinator splits them; nothing reads them apart). ``/healthz`` answers 200 while the
agent's health check passes.

The real-time gauges (node usage, container requests/limits, node allocatable, pod and container PSI,
GPU usage) are computed at scrape time from the metric cache and the states provider (a custom collector): no
timer thread, and a scrape never shows a value older than the cache's latest sample.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import parse_qs

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

from koordlet.access import Refusal
from koordlet.api.quantity import QuantityError, parse_resource_quantity
from koordlet.gonet import ListenAddress, client_host, listen
from koordlet.gotext import CONTENT_TYPE, GoCounter, exposition
from koordlet.metriccache import (
    CPI_RESOURCE_CYCLE,
    CPI_RESOURCE_INSTRUCTION,
    Label,
    MetricCache,
    MetricKind,
    SeriesKey,
)
from koordlet.servingtls import HANDSHAKE_TIMEOUT_S, ServingCertificate
from koordlet.statesinformer.api import StatesProvider

logger = logging.getLogger(__name__)

REQUEST_THREAD = "metrics-http-request"  # the name of the thread that serves one HTTP request

NODE_CPU = SeriesKey.of(MetricKind.NODE_CPU_USAGE)
NODE_MEMORY = SeriesKey.of(MetricKind.NODE_MEMORY_USAGE)

# Resource name -> (Prometheus unit label, divisor from Koordinator units: milli-cores or bytes).
_RESOURCE_UNITS: dict[str, tuple[str, float]] = {
    "cpu": ("core", 1000.0),
    "memory": ("byte", 1.0),
    "kubernetes.io/batch-cpu": ("core", 1000.0),
    "kubernetes.io/batch-memory": ("byte", 1.0),
    "kubernetes.io/mid-cpu": ("core", 1000.0),
    "kubernetes.io/mid-memory": ("byte", 1.0),
}
_CONTAINER_LABELS = ("node", "resource", "unit", "pod_uid", "pod_name", "pod_namespace", "container_id",
                     "container_name")
_PSI_LABELS = ("psi_resource_type", "psi_precision", "psi_degree", "cpu_full_supported")
_POD_PSI_LABELS = ("node", "pod_uid", "pod_name", "pod_namespace", *_PSI_LABELS)
_CONTAINER_PSI_LABELS = ("node", "pod_uid", "pod_name", "pod_namespace", "container_id", "container_name",
                         *_PSI_LABELS)
# GPU gauges. Koordinator exports no GPU metric to Prometheus; these take the names of its metric-cache
# kinds (metriccache/metric_types.go: node_gpu_core_usage, node_gpu_memory_usage, node_gpu_memory_total,
# pod_gpu_*, container_gpu_*) under the koordlet subsystem, its GPU property labels (gpu_minor,
# gpu_device_uuid) and its Prometheus pod/container labels (metrics/metrics.go).
_GPU_LABELS = ("gpu_minor", "gpu_device_uuid")
_GPU_NODE_LABELS = ("node", *_GPU_LABELS)
_GPU_POD_LABELS = ("node", "pod_uid", "pod_name", "pod_namespace", *_GPU_LABELS)
_GPU_CONTAINER_LABELS = ("node", "pod_uid", "pod_name", "pod_namespace", "container_id", "container_name",
                         *_GPU_LABELS)
_GPU_SERIES = (  # (metric name, help, cache kind, level)
    ("koordlet_node_gpu_core_usage", "GPU core (SM) usage of one GPU, percent", MetricKind.NODE_GPU_CORE_USAGE,
     "node"),
    ("koordlet_node_gpu_memory_usage", "GPU memory used on one GPU, bytes", MetricKind.NODE_GPU_MEMORY_USAGE,
     "node"),
    ("koordlet_pod_gpu_core_usage", "GPU core (SM) usage of a pod on one GPU, percent",
     MetricKind.POD_GPU_CORE_USAGE, "pod"),
    ("koordlet_pod_gpu_memory_usage", "GPU memory a pod uses on one GPU, bytes", MetricKind.POD_GPU_MEMORY_USAGE,
     "pod"),
    ("koordlet_container_gpu_core_usage", "GPU core (SM) usage of a container on one GPU, percent",
     MetricKind.CONTAINER_GPU_CORE_USAGE, "container"),
    ("koordlet_container_gpu_memory_usage", "GPU memory a container uses on one GPU, bytes",
     MetricKind.CONTAINER_GPU_MEMORY_USAGE, "container"),
)
_GPU_LEVEL_LABELS = {"node": _GPU_NODE_LABELS, "pod": _GPU_POD_LABELS, "container": _GPU_CONTAINER_LABELS}
_PSI_RESOURCE_TYPE = {"cpu": "cpu", "memory": "mem", "io": "io"}  # Koordinator's psi_resource_type values
_CPI_LABELS = ("node", "container_id", "container_name", "pod_uid", "pod_name", "pod_namespace", "cpi_field")
_CPI_FIELD = {CPI_RESOURCE_CYCLE: "cycles", CPI_RESOURCE_INSTRUCTION: "instructions"}  # metrics/cpi.go


_HOST_APP_SERIES = (("cpu", MetricKind.HOST_APP_CPU_USAGE), ("memory", MetricKind.HOST_APP_MEMORY_USAGE))
_STATUS = {True: "succeeded", False: "failed"}  # Koordinator metrics.StatusSucceed / StatusFailed
_PRIORITY_PROD = "koord-prod"


def _unit(resource: str) -> tuple[str, float]:
    return _RESOURCE_UNITS.get(resource, ("integer", 1.0))


@dataclass(frozen=True, slots=True)
class _Owners:
    """Who the pod and container series of the cache belong to, from the states at scrape time."""

    pods: Mapping[str, tuple[str, str]]  # pod UID -> (name, namespace)
    containers: Mapping[str, tuple[str, str]]  # container ID -> (pod UID, container name)

    @classmethod
    def of(cls, states: StatesProvider | None) -> _Owners:
        pods: dict[str, tuple[str, str]] = {}
        containers: dict[str, tuple[str, str]] = {}
        for pod in states.pods() if states is not None else ():
            pods[pod.uid] = (pod.name, pod.namespace)
            for container in pod.containers:
                containers[container.container_id] = (pod.uid, container.name)
        return cls(pods, containers)


class _LiveGauges:
    """Gauges read at scrape time from the cache (node usage) and the states (requests, limits)."""

    def __init__(self, node_name: str, cache: MetricCache | None, states: StatesProvider | None,
                 stale_after_s: float, psi_stale_after_s: float = 30.0, slow_stale_after_s: float = 180.0) -> None:
        self._node = node_name
        self._cache = cache
        self._states = states
        self._stale_after_s = stale_after_s
        self._psi_stale_after_s = psi_stale_after_s
        self._slow_stale_after_s = slow_stale_after_s

    def describe(self) -> list[Metric]:
        return []  # collected at scrape time only; names are not reserved ahead

    def collect(self) -> Iterator[Metric]:
        node = self._node
        cpu = GaugeMetricFamily("koordlet_node_used_cpu_cores", "CPU cores the node uses (latest sample)",
                                labels=["node"])
        memory = GaugeMetricFamily("koordlet_node_used_memory_bytes", "Memory the node uses (latest sample)",
                                   labels=["node"])
        if self._cache is not None:
            now = time.time()
            for family, key in ((cpu, NODE_CPU), (memory, NODE_MEMORY)):
                latest = self._cache.latest(key)
                if latest is not None and now - latest[0] <= self._stale_after_s:
                    family.add_metric([node], latest[1])
        yield cpu
        yield memory
        yield from self._per_cpu()
        owners = _Owners.of(self._states)
        yield from self._gpu(owners)
        if self._states is None:
            return
        requests = GaugeMetricFamily("koordlet_container_resource_requests", "Container resource requests",
                                     labels=list(_CONTAINER_LABELS))
        limits = GaugeMetricFamily("koordlet_container_resource_limits", "Container resource limits",
                                   labels=list(_CONTAINER_LABELS))
        for pod in self._states.pods():
            for container in pod.containers:
                for family, amounts in ((requests, container.requests), (limits, container.limits)):
                    for resource, amount in amounts.items():
                        unit, divisor = _unit(resource)
                        family.add_metric([node, resource, unit, pod.uid, pod.name, pod.namespace,
                                           container.container_id, container.name], amount / divisor)
        yield requests
        yield limits
        allocatable = GaugeMetricFamily("koordlet_node_resource_allocatable", "Node allocatable resources",
                                        labels=["node", "resource", "unit"])
        node_info = self._states.node()
        if node_info is not None:
            for resource, amount in node_info.allocatable.items():
                unit, divisor = _unit(resource)
                allocatable.add_metric([node, resource, unit], amount / divisor)
        yield allocatable
        yield from self._psi(owners)
        yield from self._resctrl()
        yield from self._cpi(owners)
        yield from self._host_applications()

    def _host_applications(self) -> Iterator[Metric]:
        """``koordlet_host_application_resource_usage`` of each NodeSLO ``hostApplications`` entry from its latest
        samples: cpu in cores, memory in bytes (anon + unevictable), with its priority class and QoS (Koordinator
        metrics/host_application.go; no unit label there)."""
        apps = self._states.node_slo().host_applications if self._states is not None else ()
        if self._cache is None or not apps:
            return
        family = GaugeMetricFamily("koordlet_host_application_resource_usage",
                                   "Latest usage of a NodeSLO host application",
                                   labels=["node", "host_application_name", "resource", "priority_class", "qos"])
        now = time.time()
        for app in apps:
            for resource, kind in _HOST_APP_SERIES:
                latest = self._cache.latest(SeriesKey.of(kind, **{Label.HOST_APP_NAME: app.name}))
                if latest is not None and now - latest[0] <= self._stale_after_s:
                    family.add_metric([self._node, app.name, resource, app.priority, app.qos.value], latest[1])
        yield family

    def _latest(self, kind: str) -> dict[SeriesKey, float]:
        """The newest sample of every series of ``kind`` within the slow collectors' staleness."""
        if self._cache is None:
            return {}
        now = time.time()
        return self._cache.last_by_key(kind, now - self._slow_stale_after_s, now)

    def _resctrl(self) -> Iterator[Metric]:
        """``koordlet_resctrl_llc_occupancy`` (bytes) and ``koordlet_resctrl_memory_bandwidth`` (bytes per
        second; Koordinator exports the raw counter) of the QoS groups (gate ``ResctrlCollector``)."""
        llc, mb = self._latest(MetricKind.RESCTRL_LLC), self._latest(MetricKind.RESCTRL_MB)
        if llc:
            family = GaugeMetricFamily("koordlet_resctrl_llc_occupancy",
                                       "resctrl default qos(LSR, LS, BE) llc occupancy collected by koordlet",
                                       labels=["node", "cache_id", "qos"])
            for key, value in llc.items():
                family.add_metric([self._node, key.label(Label.CACHE_ID) or "", key.label(Label.QOS) or ""], value)
            yield family
        if mb:
            family = GaugeMetricFamily("koordlet_resctrl_memory_bandwidth",
                                       "resctrl default qos(LSR, LS, BE) memory bandwidth collected by koordlet, "
                                       "bytes per second", labels=["node", "cache_id", "qos", "mb_type"])
            for key, value in mb.items():
                family.add_metric([self._node, key.label(Label.CACHE_ID) or "", key.label(Label.QOS) or "",
                                   key.label(Label.RESCTRL_MB_TYPE) or ""], value)
            yield family

    def _cpi(self, owners: _Owners) -> Iterator[Metric]:
        """``koordlet_container_cpi{cpi_field=cycles|instructions}`` of the last CPI window (gate ``CPICollector``)."""
        latest = self._latest(MetricKind.CONTAINER_CPI)
        if not latest:
            return
        family = GaugeMetricFamily("koordlet_container_cpi", "Container cpi collected by koordlet",
                                   labels=list(_CPI_LABELS))
        for key, value in latest.items():
            container_id = key.label(Label.CONTAINER_ID) or ""
            pod_uid, container_name = owners.containers.get(container_id, ("", ""))
            if pod_uid not in owners.pods:
                continue
            pod_name, namespace = owners.pods[pod_uid]
            field = _CPI_FIELD.get(key.label(Label.CPI_RESOURCE) or "", "")
            family.add_metric([self._node, container_id, container_name, pod_uid, pod_name, namespace, field], value)
        yield family

    def _per_cpu(self) -> Iterator[Metric]:
        """``koordlet_node_used_cpu_cores_per_cpu{cpu}`` from the latest per-CPU samples (gate ``PerCPUMetric``;
        no family at all without them)."""
        if self._cache is None:
            return
        now = time.time()
        latest = self._cache.last_values(MetricKind.NODE_PER_CPU_USAGE, Label.CPU, now - self._stale_after_s, now)
        if not latest:
            return
        family = GaugeMetricFamily("koordlet_node_used_cpu_cores_per_cpu",
                                   "Cores one logical CPU used (latest sample, 0..1)", labels=["node", "cpu"])
        for cpu in sorted(latest, key=int):
            family.add_metric([self._node, cpu], latest[cpu])
        yield family

    def _gpu(self, owners: _Owners) -> Iterator[Metric]:
        """The GPU gauges from the cache's latest GPU samples and its GPU list (KV ``gpu_devices``)."""
        cache = self._cache
        if cache is None:
            return
        gpus = cache.gpu_devices()
        if not gpus:
            return  # no GPU on this node (or gate Accelerators off): no GPU family at all
        total = GaugeMetricFamily("koordlet_node_gpu_memory_total", "GPU memory of one GPU, bytes",
                                  labels=list(_GPU_NODE_LABELS))
        for gpu in gpus:
            total.add_metric([self._node, str(gpu.minor), gpu.uuid], gpu.memory_total_bytes)
        yield total
        pods, containers = owners.pods, owners.containers
        now = time.time()
        for name, help_text, kind, level in _GPU_SERIES:
            family = GaugeMetricFamily(name, help_text, labels=list(_GPU_LEVEL_LABELS[level]))
            for key in cache.keys(kind):
                sample = cache.latest(key)
                if sample is None or now - sample[0] > self._stale_after_s:
                    continue
                gpu_labels = [key.label(Label.GPU_MINOR) or "", key.label(Label.GPU_DEVICE_UUID) or ""]
                if level == "node":
                    family.add_metric([self._node, *gpu_labels], sample[1])
                    continue
                if level == "pod":
                    pod_uid, container_id, container_name = key.label(Label.POD_UID) or "", None, ""
                else:
                    container_id = key.label(Label.CONTAINER_ID) or ""
                    pod_uid, container_name = containers.get(container_id, ("", ""))
                if pod_uid not in pods:
                    continue  # gone (or not known yet): its series go at the next cache GC
                pod_name, namespace = pods[pod_uid]
                owner = [pod_uid, pod_name, namespace]
                if container_id is not None:
                    owner += [container_id, container_name]
                family.add_metric([self._node, *owner, *gpu_labels], sample[1])
            yield family

    def _psi(self, owners: _Owners) -> Iterator[Metric]:
        """``koordlet_pod_psi`` and ``koordlet_container_psi`` from the cache's latest PSI samples."""
        pod_family = GaugeMetricFamily("koordlet_pod_psi", "Pod pressure stall information (percent)",
                                       labels=list(_POD_PSI_LABELS))
        container_family = GaugeMetricFamily("koordlet_container_psi",
                                             "Container pressure stall information (percent)",
                                             labels=list(_CONTAINER_PSI_LABELS))
        cache, states = self._cache, self._states
        if cache is None or states is None:
            return
        names = owners.pods
        now = time.time()
        for kind, family in ((MetricKind.POD_PSI, pod_family), (MetricKind.CONTAINER_PSI, container_family)):
            latest: dict[SeriesKey, float] = {}
            cpu_full: set[tuple[str | None, str | None]] = set()
            for key in cache.keys(kind):
                sample = cache.latest(key)
                if sample is None or now - sample[0] > self._psi_stale_after_s:
                    continue
                latest[key] = sample[1]
                if key.label(Label.PSI_RESOURCE) == "cpu" and key.label(Label.PSI_DEGREE) == "full":
                    cpu_full.add((key.label(Label.POD_UID), key.label(Label.CONTAINER_ID)))
            for key, value in latest.items():
                pod_uid, container_id = key.label(Label.POD_UID), key.label(Label.CONTAINER_ID)
                if pod_uid not in names:
                    continue  # the pod is gone; its series go at the next cache GC
                psi = [_PSI_RESOURCE_TYPE.get(key.label(Label.PSI_RESOURCE) or "", ""),
                       key.label(Label.PSI_PRECISION) or "", key.label(Label.PSI_DEGREE) or "",
                       "true" if (pod_uid, container_id) in cpu_full else "false"]
                pod_name, namespace = names[pod_uid]
                if container_id is None:
                    family.add_metric([self._node, pod_uid, pod_name, namespace, *psi], value)
                else:
                    family.add_metric([self._node, pod_uid, pod_name, namespace, container_id,
                                       owners.containers.get(container_id, ("", ""))[1], *psi], value)
        yield pod_family
        yield container_family


class KoordletMetrics:
    """The agent's registry and its component metrics; every Koordinator metric carries ``node``."""

    def __init__(self, node_name: str, cache: MetricCache | None = None, states: StatesProvider | None = None,
                 stale_after_s: float = 10.0) -> None:
        self.node_name = node_name
        self.registry = CollectorRegistry()
        self.start_time = Gauge("koordlet_start_time", "Unix time koordlet started", ["node"],
                                registry=self.registry)
        self.start_time.labels(node_name).set(time.time())
        self.node_metric_node_usage = Gauge(
            "koordlet_node_metric_node_usage", "Node usage as last reported in NodeMetric",
            ["node", "resource", "unit"], registry=self.registry)
        self.node_metric_system_usage = Gauge(
            "koordlet_node_metric_system_usage", "System usage as last reported in NodeMetric",
            ["node", "resource", "unit"], registry=self.registry)
        self.node_metric_numa_node_usage = Gauge(
            "koordlet_node_metric_numa_node_usage", "Usage of one NUMA node as last reported in NodeMetric numaUsages",
            ["node", "numa_node_id", "resource", "unit"], registry=self.registry)
        self.node_metric_numa_system_usage = Gauge(
            "koordlet_node_metric_numa_system_usage",
            "System usage on one NUMA node as last reported in NodeMetric numaUsages",
            ["node", "numa_node_id", "resource", "unit"], registry=self.registry)
        self.node_metric_reports = Counter(
            "koordlet_node_metric_reports", "NodeMetric status reports by outcome", ["node", "status"],
            registry=self.registry)
        self.node_topology_reports = Counter(
            "koordlet_node_topology_reports", "NodeResourceTopology report ticks by outcome (created, updated, "
            "unchanged, deferred, failed, bad_annotation)", ["node", "status"], registry=self.registry)
        self.states_errors = Counter(
            "koordlet_states_informer_errors", "States informer failures by source", ["node", "source"],
            registry=self.registry)
        self.node_slo_rejected = Counter(
            "koordlet_node_slo_rejected", "NodeSLO specs rejected as invalid (the last good one stays)",
            ["node"], registry=self.registry)
        self.kubelet_request_duration = Histogram(
            "koordlet_kubelet_request_duration_seconds", "kubelet API request duration",
            ["verb", "path", "code"], buckets=tuple(0.001 * 4**k for k in range(7)), registry=self.registry)
        self.share_pool_cores = Gauge("koordlet_cpuset_share_pool_cpu_cores", "Number of share pool cores",
                                      ["node"], registry=self.registry)
        self.be_share_pool_cores = Gauge("koordlet_cpuset_be_share_pool_cpu_cores", "Number of be share pool cores",
                                         ["node"], registry=self.registry)
        self.share_pool_info = Gauge(
            "koordlet_cpuset_share_pool_info",
            "Indicates whether the CPU ID is currently part of the share pool (1 = in pool; gate PerCPUMetric)",
            ["node", "cpu"], registry=self.registry)
        self.be_share_pool_info = Gauge(
            "koordlet_cpuset_be_share_pool_info",
            "Indicates whether the CPU ID is currently part of the BE share pool (1 = in pool; gate PerCPUMetric)",
            ["node", "cpu"], registry=self.registry)
        # Koordinator metrics/common.go: each reading of the node's CPU info, NUMA info and local storage
        # (status succeeded/failed). Koordinator's counters keep its bare names (koordlet/gotext.py).
        self.collect_node_cpu_info_status = GoCounter(
            "koordlet_collect_node_cpu_info_status", "Readings of the CPU topology, by outcome", ["node", "status"],
            registry=self.registry)
        self.collect_node_numa_info_status = GoCounter(
            "koordlet_collect_node_numa_info_status", "Readings of the NUMA nodes, by outcome", ["node", "status"],
            registry=self.registry)
        self.collect_node_local_storage_info_status = GoCounter(
            "koordlet_collect_node_local_storage_info_status", "Readings of the block devices, by outcome",
            ["node", "status"], registry=self.registry)
        # Koordinator metrics/prediction.go and resource_summary.go: set at every NodeMetric build.
        self.node_predicted_resource_reclaimable = Gauge(
            "koordlet_node_predicted_resource_reclaimable", "Prod reclaimable as each predictor last said",
            ["node", "predictor", "resource", "unit"], registry=self.registry)
        self.node_predicted_resource_peak = Gauge(
            "koordlet_node_predicted_resource_peak", "Prod peak as each predictor last said",
            ["node", "predictor", "resource", "unit"], registry=self.registry)
        self.node_priority_resource_reclaimable = Gauge(
            "koordlet_node_priority_resource_reclaimable",
            "Reclaimable resources of a priority as last reported in NodeMetric",
            ["node", "priority", "resource", "unit"], registry=self.registry)
        self.node_resource_priority_reclaimable_status = Gauge(
            "koordlet_node_resource_priority_reclaimable_status",
            "Whether the reclaimable of a priority could be predicted at the last report (0 yes, 1 no)",
            ["node", "priority"], registry=self.registry)
        # Ours (Prometheus naming: the counter is exported as ..._total): koordlet.access.
        self.access_refused = Counter(
            "koordlet_access_refused", "Calls the API server or kubelet refused (401, 403), by what was refused",
            ["node", "source", "code", "verb", "resource"], registry=self.registry)
        self.xpu_device_info_problems = Counter(
            "koordlet_xpu_device_info_problems", "Device-info files or entries of -xpu-device-infos-dir refused "
            "(each problem counted once until a file changes)", ["node"], registry=self.registry)
        self._pools_shown: tuple[frozenset[int], frozenset[int]] | None = None
        self._bound = False
        if cache is not None or states is not None:
            self.bind(cache, states, stale_after_s)

    def bind(self, cache: MetricCache | None, states: StatesProvider | None, stale_after_s: float = 10.0,
             psi_stale_after_s: float = 30.0, slow_stale_after_s: float = 180.0) -> None:
        """Attach the cache and states the scrape-time gauges read (once; the agent builds them after this).

        Samples older than ``stale_after_s`` (usage) or ``psi_stale_after_s`` (PSI, collected less often)
        are not shown."""
        if self._bound:
            raise RuntimeError("metrics already bound to a cache and states")
        self.registry.register(_LiveGauges(self.node_name, cache, states, stale_after_s, psi_stale_after_s,
                                           slow_stale_after_s))
        self._bound = True

    def observe_node_metric_status(self, status: Mapping[str, Any]) -> None:
        """The node and system usage of a NodeMetric status just reported, and per NUMA node (gate
        ``NodeMetricPromMetrics``). Every series is cleared first, so a NUMA node (or resource) the report no longer
        carries goes (Koordinator statesinformer recordNodeMetricPromMetrics)."""
        node_metric = status.get("nodeMetric") or {}
        gauges = (self.node_metric_node_usage, self.node_metric_system_usage, self.node_metric_numa_node_usage,
                  self.node_metric_numa_system_usage)
        for gauge in gauges:
            gauge.clear()
        for gauge, part in ((self.node_metric_node_usage, "nodeUsage"), (self.node_metric_system_usage, "systemUsage")):
            self._set_usage(gauge, node_metric.get(part))
        for numa in node_metric.get("numaUsages") or ():
            node_id = str(numa.get("numaNodeID", ""))
            self._set_usage(self.node_metric_numa_node_usage, numa.get("nodeUsage"), node_id)
            self._set_usage(self.node_metric_numa_system_usage, numa.get("systemUsage"), node_id)

    def _set_usage(self, gauge: Gauge, usage: Mapping[str, Any] | None, *labels: str) -> None:
        """cpu (cores) and memory (bytes) of a ResourceMap; other resources are not Koordinator's series."""
        for resource, text in ((usage or {}).get("resources") or {}).items():
            if resource not in ("cpu", "memory"):
                continue
            try:
                amount = parse_resource_quantity(resource, str(text))
            except QuantityError:
                continue
            unit, divisor = _unit(resource)
            gauge.labels(self.node_name, *labels, resource, unit).set(amount / divisor)

    def observe_cpu_pools(self, shared: frozenset[int], be_shared: frozenset[int], per_cpu: bool) -> None:
        """The node's share pools as the NodeResourceTopology reports them: their sizes, and with ``per_cpu``
        (gate ``PerCPUMetric``) one ``_info{cpu}`` series per CPU in each (Koordinator metrics/cpu_cpuset.go)."""
        self.share_pool_cores.labels(self.node_name).set(len(shared))
        self.be_share_pool_cores.labels(self.node_name).set(len(be_shared))
        if not per_cpu or (shared, be_shared) == self._pools_shown:
            return
        self._pools_shown = (shared, be_shared)
        for gauge, cpus in ((self.share_pool_info, shared), (self.be_share_pool_info, be_shared)):
            gauge.clear()
            for cpu in sorted(cpus):
                gauge.labels(self.node_name, str(cpu)).set(1)

    def observe_node_info(self, what: str, ok: bool) -> None:
        """One reading of the CPU topology (``cpu_info``) or the NUMA nodes (``numa_info``) by the node info
        collector."""
        counter = self.collect_node_cpu_info_status if what == "cpu_info" else self.collect_node_numa_info_status
        counter.labels(self.node_name, _STATUS[ok]).inc()

    def observe_local_storage_info(self, ok: bool) -> None:
        """One reading of the node's block devices (the BlkIOReconcile snapshot's)."""
        self.collect_node_local_storage_info_status.labels(self.node_name, _STATUS[ok]).inc()

    def observe_prediction(self, predictors: Mapping[str, tuple[Mapping[str, int] | None, Mapping[str, int] | None]],
                           prod_reclaimable: Mapping[str, int] | None) -> None:
        """A prod prediction made for NodeMetric: each predictor's reclaimable and peak (None: it could not say),
        and the prod reclaimable of priority ``koord-prod`` with its status (1 and zeros when it failed;
        Koordinator statesinformer states_nodemetric.go)."""
        for predictor, (reclaimable, peak) in predictors.items():
            for gauge, amounts in ((self.node_predicted_resource_reclaimable, reclaimable),
                                   (self.node_predicted_resource_peak, peak)):
                if amounts is not None:
                    self._set_amounts(gauge, amounts, predictor)
        failed = prod_reclaimable is None
        self._set_amounts(self.node_priority_resource_reclaimable,
                          {"cpu": 0, "memory": 0} if failed else prod_reclaimable, _PRIORITY_PROD)
        self.node_resource_priority_reclaimable_status.labels(self.node_name, _PRIORITY_PROD).set(int(failed))

    def _set_amounts(self, gauge: Gauge, amounts: Mapping[str, int], label: str) -> None:
        """cpu (milli-cores, shown in cores) and memory (bytes) under ``label`` (predictor or priority)."""
        for resource in ("cpu", "memory"):
            unit, divisor = _unit(resource)
            gauge.labels(self.node_name, label, resource, unit).set(amounts.get(resource, 0) / divisor)

    def observe_xpu_problem(self, message: str) -> None:
        """A device-info file or entry refused (the XPU inventory logs the message)."""
        self.xpu_device_info_problems.labels(self.node_name).inc()

    def observe_report(self, status: str) -> None:
        self.node_metric_reports.labels(self.node_name, status).inc()

    def observe_node_topology_report(self, status: str) -> None:
        self.node_topology_reports.labels(self.node_name, status).inc()

    def zero_states_errors(self, sources: Iterable[str]) -> None:
        """Export 0 errors for each states source (and 0 NodeSLOs rejected) before the first one, so that increase()
        (the alert rules) counts it."""
        for source in sources:
            self.states_errors.labels(self.node_name, source)
        self.node_slo_rejected.labels(self.node_name)

    def observe_states_error(self, source: str) -> None:
        self.states_errors.labels(self.node_name, source).inc()
        if source == "nodeslo":
            self.node_slo_rejected.labels(self.node_name).inc()

    def observe_kubelet_request(self, code: str, seconds: float) -> None:
        """One ``GET /pods/`` (the only kubelet call koordlet makes here)."""
        self.kubelet_request_duration.labels("GET", "/pods/", code).observe(seconds)

    def observe_access_refused(self, refusal: Refusal) -> None:
        self.access_refused.labels(self.node_name, refusal.source, str(refusal.code), refusal.verb,
                                   refusal.resource).inc()



class Answer(Protocol):
    """What a handler added with :meth:`MetricsServer.handle` or :meth:`MetricsServer.route` answers."""

    status: int
    content_type: str
    body: bytes
    headers: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Reply:
    """An :class:`Answer` (what the route handlers of koordlet's own endpoints return)."""

    status: int
    content_type: str
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def text(cls, status: int, text: str) -> Reply:
        return cls(status, "text/plain; charset=utf-8", text.encode() + (b"" if text.endswith("\n") else b"\n"))


@dataclass(frozen=True, slots=True)
class Request:
    """One GET as a route handler or a guard sees it: the path, its query, the headers (names in any case) and
    the peer's address."""

    path: str
    query: Mapping[str, Sequence[str]]
    headers: Mapping[str, str]
    client: str

    @property
    def accept(self) -> list[str]:
        get_all = getattr(self.headers, "get_all", None)
        return list(get_all("Accept") or []) if get_all is not None else [self.headers.get("Accept", "")]


PathHandler = Callable[[Mapping[str, Sequence[str]], Sequence[str]], Answer]  # (query, Accept values) -> answer
RouteHandler = Callable[[Request], Answer]
Guard = Callable[[Request], Answer | None]  # None: let the request through; else the refusal to send


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix.rstrip("/") + "/")


class _Server(ThreadingHTTPServer):
    """The HTTP server on a socket :func:`koordlet.gonet.listen` opened (AF_INET or AF_INET6)."""

    def __init__(self, sock: socket.socket, handler: type[BaseHTTPRequestHandler]) -> None:
        self.address_family = sock.family
        super().__init__(sock.getsockname(), handler, bind_and_activate=False)
        self.socket.close()
        self.socket = sock
        self.server_address = sock.getsockname()
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])

    def handle_error(self, request: object, client_address: object) -> None:
        # A client that drops the connection or fails the TLS handshake (plain HTTP to an HTTPS port) is the
        # client's problem: one debug line, not socketserver's traceback on stderr.
        logger.debug("metrics http: request from %s failed", client_address, exc_info=True)


class MetricsServer:
    """``/metrics``, ``/internal-metrics``, ``/external-metrics`` and ``/healthz`` on one port, the paths added
    with :meth:`handle` (``/events``) and :meth:`route` (``/readyz``, ``/debug/...``), and the guards added with
    :meth:`guard`, which see every request under their prefixes before any handler does."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int,
                 healthy: Callable[[], bool] = lambda: True, include_default: bool = True,
                 tls: tuple[str, str] | None = None) -> None:
        """Bound at once, as Go's ``net.Listen`` binds ``host:port`` (koordlet/gonet.py: ``""``, ``0.0.0.0`` and
        ``::`` are IPv4 and IPv6 together); ``tls``: (certificate, key) files to serve HTTPS with."""
        registries = (registry, REGISTRY) if include_default else (registry,)
        self._registries = registries
        self._healthy = healthy
        self._handlers: dict[str, PathHandler] = {}
        self._routes: list[tuple[str, bool, RouteHandler]] = []  # (path, also the paths under it, handler)
        self._guards: list[tuple[str, Guard]] = []
        self.certificate = ServingCertificate(*tls) if tls is not None else None
        sock = listen(ListenAddress(host, port))
        server = _Server(sock, self._handler_class())
        server.daemon_threads = True
        self._server = server
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    def handle(self, path: str, handler: PathHandler) -> None:
        """Serve ``GET path`` with ``handler`` (its query and the request's Accept header values)."""
        self._handlers[path] = handler

    def route(self, path: str, handler: RouteHandler, *, prefix: bool = False) -> None:
        """Serve ``GET path`` (with ``prefix``, also every path under it) with ``handler``, which gets the whole
        :class:`Request`; a route comes before the built-in paths and the first route added that matches wins."""
        self._routes.append((path, prefix, handler))

    def guard(self, prefix: str, check: Guard) -> None:
        """Run ``check`` on every request for ``prefix`` or a path under it before it is served (authorization)."""
        self._guards.append((prefix, check))

    def _serve(self, request: Request) -> tuple[bytes, int, str, Mapping[str, str]] | None:
        """A guard's refusal, or a route's or a handler's answer; None for the built-in paths."""
        path = request.path
        try:
            for prefix, check in self._guards:
                if _under(path, prefix):
                    refusal = check(request)
                    if refusal is not None:
                        return refusal.body, refusal.status, refusal.content_type, refusal.headers
            answer: Answer | None = None
            for route_path, prefix_match, route_handler in self._routes:
                if path == route_path or (prefix_match and _under(path, route_path)):
                    answer = route_handler(request)
                    break
            else:
                handler = self._handlers.get(path)
                if handler is None:
                    return None
                answer = handler(request.query, request.accept)
        except Exception:  # one broken handler must not take the port down
            logger.exception("handler of %s failed", path)
            return b"internal error\n", 500, "text/plain", {}
        return answer.body, answer.status, answer.content_type, answer.headers

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def setup(self) -> None:
                # ThreadingHTTPServer starts a thread a request and gives it no name of ours.
                threading.current_thread().name = REQUEST_THREAD
                if outer.certificate is not None:  # the handshake here, in the request's thread, not the accept loop
                    self.request.settimeout(HANDSHAKE_TIMEOUT_S)
                    self.request = outer.certificate.context().wrap_socket(self.request, server_side=True)
                super().setup()

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - base signature
                logger.debug("metrics http: " + format, *args)

            def do_GET(self) -> None:  # noqa: N802 - http.server naming
                path, _, query = self.path.partition("?")
                headers: Mapping[str, str] = {}
                request = Request(path, parse_qs(query, keep_blank_values=True), self.headers,
                                  client_host(str(self.client_address[0])))
                served = outer._serve(request)
                if served is not None:
                    body, status, ctype, headers = served
                elif path in ("/metrics", "/internal-metrics", "/external-metrics"):
                    try:
                        body, status, ctype = exposition(outer._registries), 200, CONTENT_TYPE
                    except Exception:  # a scrape must answer even when one collector is broken
                        logger.exception("metrics exposition failed")
                        body, status, ctype = b"exposition failed\n", 500, "text/plain"
                elif path == "/healthz":
                    ok = outer._healthy()
                    body, status, ctype = (b"ok\n", 200, "text/plain") if ok else (b"unhealthy\n", 503, "text/plain")
                else:
                    body, status, ctype = b"not found\n", 404, "text/plain"
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

        return Handler

    def start(self) -> None:
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics-http", daemon=True)
        self._thread.start()
        host, port = self._server.server_address[:2]
        logger.info("metrics served on %s (%s)", f"[{host}]:{port}" if ":" in host else f"{host}:{port}",
                    "HTTPS" if self.certificate is not None else "HTTP")

    def stop(self, timeout_s: float = 2.0) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout_s)
            self._thread = None
        self._server.server_close()
