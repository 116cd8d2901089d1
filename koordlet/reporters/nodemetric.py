"""NodeMetric ``.status`` every report interval (docs/koordinator.md §5.3), to the API server or a YAML file.

What is reported, from the metric cache:
  nodeUsage / systemUsage      avg over ``aggregateDurationSeconds`` (300 s) of node and system usage
  numaUsages                   the same per NUMA node of the node info collector (Koordinator #3138), sorted by
                               ``numaNodeID``: a node without CPU and memory samples is left out, its
                               ``systemUsage`` only when it has both system series
  aggregatedNodeUsages /       avg, p50, p90, p95, p99 over each of ``nodeAggregatePolicy.durations``
  aggregatedSystemUsages       (5m, 10m, 30m); a duration is reported only when its samples span at least
                               half of it, so a young agent does not pass 2 minutes off as "30m"
  podsMetric                   each pod's avg usage over the aggregate duration, sorted by namespace/name,
                               with its Koordinator QoS and priority class
  hostApplicationMetric        the same for each NodeSLO ``hostApplications`` entry, with its priority and QoS
  prodReclaimableMetric /      the peak predictor's prod reclaimable and prod peak (koordlet.prediction) over the
  prodPeakMetric               pods listed in podsMetric; ``{"resource": {}}`` and no peak while it cannot say
  nodeUsage.devices /          one ``gpu`` DeviceInfo per GPU of the cache's KV ``gpu_devices`` that has samples:
  podUsage.devices             avg ``koordinator.sh/gpu-core`` (percent of one GPU), ``gpu-memory`` (bytes) and
                               ``gpu-memory-ratio`` (100 × memory / total), truncated to integers, as
                               Koordinator's ``collectNodeGPUMetric`` / ``collectPodGPUMetric`` do
CPU is written in milli-cores (``1234m``), memory in bytes. ``nodeMemoryCollectPolicy`` picks the memory
series (``usageWithPageCache`` uses the with-page-cache one; ``usageWithHotPageCache`` the usage with only the
hot page cache that the cold page collector stores, gate ``ColdPageCollector``, and the default series of a
node, pod or host application it has no sample of, as Koordinator does when cold memory is not started).

Writing (docs/design.md §5, "One node of thousands"): the status is PUT to ``/status`` with the resourceVersion of
koordlet's last write, on the object that write returned; nothing is read before it. The object is read only to
begin (from the watch cache, ``resourceVersion=0``, once per start, and not even then when ``-api-checkpoint-file``
kept the last write's metadata and spec from before a restart: koordlet/kubeclient/checkpoint.py) and after a 409
(then from etcd: someone else wrote, koord-manager changing the spec), once, and the write tried again; the spec's
``metricCollectPolicy`` comes with the object and sets the next interval. Any other failure keeps the report for the
next tick (the newest report wins: a report is rebuilt every tick, and the kept one is used only when rebuilding
fails); a report the koordlet's API budget holds back (the API server pushing back) is skipped. A missing object is
skipped with a log line, as Koordinator does (koord-manager creates it), or created when asked to. The timer starts
at a random point of the first interval and keeps ±10 % jitter (koordlet/kubeclient/timing.py), so nodes that start
together do not report together; the interval is still the spec's on average.
Without an API server the whole object is written atomically as YAML under the report dir.
"""

from __future__ import annotations

import copy
import enum
import logging
import os
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import urllib3
import yaml
from kubernetes.client.exceptions import ApiException

from koordlet.api.nodeslo import HostApplication
from koordlet.api.pod import PodMeta
from koordlet.config import ConfigError, format_duration, parse_duration
from koordlet.kubeapi import CustomObjects, Throttled
from koordlet.kubeclient.checkpoint import ApiCheckpoint
from koordlet.kubeclient.timing import SYSTEM_CLOCK, Clock
from koordlet.metriccache import GPUDevice, Label, MetricCache, MetricKind, SeriesKey
from koordlet.metriccache.cache import Aggregate
from koordlet.metricsadvisor.node import numa_key
from koordlet.metricsadvisor.nodeinfo import NodeInfoKV
from koordlet.prediction.predictor import ProdPrediction
from koordlet.ticker import PeriodicThread
from wire.files import write_atomic

# libyaml's emitter where PyYAML was built with it: the same safe representation, a tenth of the CPU for
# a status of 150 pods, written every report interval.
_SAFE_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
# The pods podsMetric lists and now → the prod prediction (koordlet.prediction.predictor.predict_prod).
ProdPredict = Callable[[Sequence[PodMeta], float], ProdPrediction]

logger = logging.getLogger(__name__)

GROUP, VERSION, PLURAL, KIND = "slo.koordinator.sh", "v1alpha1", "nodemetrics", "NodeMetric"
API_VERSION = f"{GROUP}/{VERSION}"
MEMORY_WITHOUT_PAGE_CACHE = "usageWithoutPageCache"
MEMORY_WITH_PAGE_CACHE = "usageWithPageCache"
MEMORY_WITH_HOT_PAGE_CACHE = "usageWithHotPageCache"
AGGREGATIONS = ("avg", "p50", "p90", "p95", "p99")
# docs/koordinator.md §5.3: an aggregate is reported only if its samples span >= 50 % of the duration
MIN_COVERAGE = 0.5


@dataclass(frozen=True, slots=True)
class CollectPolicy:
    """``spec.metricCollectPolicy`` with Koordinator's defaults (docs/koordinator.md §5.3)."""

    aggregate_duration_s: float = 300.0
    report_interval_s: float = 60.0
    durations_s: tuple[float, ...] = (300.0, 600.0, 1800.0)
    memory_policy: str = MEMORY_WITHOUT_PAGE_CACHE


def collect_policy_from_spec(spec: Mapping[str, Any] | None, default_interval_s: float = 60.0) -> CollectPolicy:
    """The policy of a NodeMetric ``spec``; unset or unreadable fields take the defaults (logged)."""
    policy = (spec or {}).get("metricCollectPolicy") or {}
    aggregate = policy.get("aggregateDurationSeconds")
    interval = policy.get("reportIntervalSeconds")
    durations: list[float] = []
    for text in ((policy.get("nodeAggregatePolicy") or {}).get("durations") or ()):
        try:
            seconds = parse_duration(str(text))
        except ConfigError as err:
            logger.warning("NodeMetric nodeAggregatePolicy: ignoring %r: %s", text, err)
            continue
        if seconds > 0:
            durations.append(seconds)
    memory = policy.get("nodeMemoryCollectPolicy") or MEMORY_WITHOUT_PAGE_CACHE
    defaults = CollectPolicy()
    return CollectPolicy(
        aggregate_duration_s=float(aggregate) if isinstance(aggregate, int) and aggregate > 0
        else defaults.aggregate_duration_s,
        report_interval_s=float(interval) if isinstance(interval, int) and interval > 0 else default_interval_s,
        durations_s=tuple(durations) or defaults.durations_s,
        memory_policy=memory,
    )


def _cpu_quantity(cores: float) -> str:
    return f"{max(round(cores * 1000), 0)}m"


def _memory_quantity(memory_bytes: float) -> str:
    return str(max(round(memory_bytes), 0))


_AGGREGATORS: Mapping[str, Callable[[Aggregate], float]] = {
    "avg": lambda a: a.avg, "p50": lambda a: a.p50, "p90": lambda a: a.p90, "p95": lambda a: a.p95,
    "p99": lambda a: a.p99,
}


GPU_CORE = "koordinator.sh/gpu-core"
GPU_MEMORY = "koordinator.sh/gpu-memory"
GPU_MEMORY_RATIO = "koordinator.sh/gpu-memory-ratio"

_NODE_KINDS = (MetricKind.NODE_CPU_USAGE, MetricKind.NODE_MEMORY_USAGE, MetricKind.NODE_MEMORY_USAGE_WITH_PAGE_CACHE,
               MetricKind.NODE_MEMORY_WITH_HOT_PAGE_USAGE)
_POD_KINDS = (MetricKind.POD_CPU_USAGE, MetricKind.POD_MEMORY_USAGE, MetricKind.POD_MEMORY_USAGE_WITH_PAGE_CACHE,
              MetricKind.POD_MEMORY_WITH_HOT_PAGE_USAGE)
_HOST_APP_KINDS = (MetricKind.HOST_APP_CPU_USAGE, MetricKind.HOST_APP_MEMORY_USAGE,
                   MetricKind.HOST_APP_MEMORY_USAGE_WITH_PAGE_CACHE, MetricKind.HOST_APP_MEMORY_WITH_HOT_PAGE_USAGE)


@dataclass(frozen=True, slots=True)
class _Series:
    cpu: SeriesKey
    memory: SeriesKey


class StatusBuilder:
    """Builds the ``status`` dict from the metric cache and the pods."""

    def __init__(self, cache: MetricCache) -> None:
        self._cache = cache

    def _series(self, kinds: tuple[str, str, str, str], policy: CollectPolicy, **labels: str) -> _Series:
        """CPU and the memory series ``nodeMemoryCollectPolicy`` picks, for kinds (cpu, memory, with page cache,
        with hot page cache); the hot one only where it has samples."""
        cpu, memory, with_page_cache, with_hot_page_cache = kinds
        chosen = memory
        if policy.memory_policy == MEMORY_WITH_PAGE_CACHE:
            chosen = with_page_cache
        elif policy.memory_policy == MEMORY_WITH_HOT_PAGE_CACHE:
            hot = SeriesKey.of(with_hot_page_cache, **labels)
            if self._cache.latest(hot) is not None:
                return _Series(SeriesKey.of(cpu, **labels), hot)
        return _Series(SeriesKey.of(cpu, **labels), SeriesKey.of(chosen, **labels))

    _SYSTEM = _Series(SeriesKey.of(MetricKind.SYS_CPU_USAGE), SeriesKey.of(MetricKind.SYS_MEMORY_USAGE))

    def _avg_usage(self, series: _Series, start: float, end: float) -> dict[str, Any]:
        resources: dict[str, str] = {}
        cpu = self._cache.query(series.cpu, start, end)
        memory = self._cache.query(series.memory, start, end)
        if cpu is not None:
            resources["cpu"] = _cpu_quantity(cpu.avg)
        if memory is not None:
            resources["memory"] = _memory_quantity(memory.avg)
        return {"resources": resources}

    def _gpu_usage(self, gpus: Sequence[GPUDevice], core_kind: str, memory_kind: str, start: float, end: float,
                   **owner: str) -> list[dict[str, Any]]:
        """DeviceInfo entries (type gpu) with the avg usage of each GPU that has both series in the window."""
        devices = []
        for gpu in gpus:
            labels = {**owner, Label.GPU_MINOR.value: str(gpu.minor), Label.GPU_DEVICE_UUID.value: gpu.uuid}
            core = self._cache.query(SeriesKey.of(core_kind, **labels), start, end)
            memory = self._cache.query(SeriesKey.of(memory_kind, **labels), start, end)
            if core is None or memory is None:
                continue
            ratio = 100 * memory.avg / gpu.memory_total_bytes if gpu.memory_total_bytes > 0 else 0.0
            devices.append({
                "type": "gpu", "id": gpu.uuid, "minor": gpu.minor, "health": False,
                "resources": {GPU_CORE: str(max(int(core.avg), 0)), GPU_MEMORY: str(max(int(memory.avg), 0)),
                              GPU_MEMORY_RATIO: str(max(int(ratio), 0))},
            })
        return devices

    def _aggregated(self, series: _Series, durations_s: Sequence[float], now: float) -> list[dict[str, Any]]:
        out = []
        for duration in durations_s:
            cpu = self._cache.query(series.cpu, now - duration, now)
            memory = self._cache.query(series.memory, now - duration, now)
            if cpu is None or memory is None:
                continue
            if min(cpu.time_range_duration, memory.time_range_duration) < MIN_COVERAGE * duration:
                continue
            usage = {
                name: {"resources": {"cpu": _cpu_quantity(fn(cpu)), "memory": _memory_quantity(fn(memory))}}
                for name, fn in _AGGREGATORS.items()
            }
            out.append({"usage": usage, "duration": format_duration(duration)})
        return out

    def _pods_metric(self, pods: Sequence[PodMeta], policy: CollectPolicy, gpus: Sequence[GPUDevice], start: float,
                     now: float) -> tuple[list[dict[str, Any]], list[PodMeta]]:
        """podsMetric (sorted by namespace/name), and the pods it lists."""
        pods_metric: list[dict[str, Any]] = []
        reported: list[PodMeta] = []
        for pod in sorted(pods, key=lambda p: (p.namespace, p.name)):
            entry = self._pod_metric(pod, gpus, policy, start, now)
            if entry is not None:
                pods_metric.append(entry)
                reported.append(pod)
        return pods_metric, reported

    def build(self, pods: Sequence[PodMeta], policy: CollectPolicy, now: float,
              host_apps: Sequence[HostApplication] = (), prod_prediction: ProdPredict | None = None) -> dict[str, Any]:
        start = now - policy.aggregate_duration_s
        gpus = self._cache.gpu_devices()
        pods_metric, reported = self._pods_metric(pods, policy, gpus, start, now)
        status: dict[str, Any] = {
            "updateTime": datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "nodeMetric": self._node_metric(gpus, policy, start, now),
            "podsMetric": pods_metric,
        }
        host_app_metric = [entry for app in sorted(host_apps, key=lambda a: a.name)
                           if (entry := self._host_app_metric(app, policy, start, now)) is not None]
        if host_app_metric:
            status["hostApplicationMetric"] = host_app_metric
        if prod_prediction is not None:
            status.update(prod_prediction_status(prod_prediction(reported, now)))
        return status

    def _node_metric(self, gpus: Sequence[GPUDevice], policy: CollectPolicy, start: float,
                     now: float) -> dict[str, Any]:
        node_series = self._series(_NODE_KINDS, policy)
        node_metric: dict[str, Any] = {
            "nodeUsage": self._avg_usage(node_series, start, now),
            "systemUsage": self._avg_usage(self._SYSTEM, start, now),
        }
        node_devices = self._gpu_usage(gpus, MetricKind.NODE_GPU_CORE_USAGE, MetricKind.NODE_GPU_MEMORY_USAGE,
                                       start, now)
        if node_devices:
            node_metric["nodeUsage"]["devices"] = node_devices
        aggregated_node = self._aggregated(node_series, policy.durations_s, now)
        if aggregated_node:
            node_metric["aggregatedNodeUsages"] = aggregated_node
        aggregated_system = self._aggregated(self._SYSTEM, policy.durations_s, now)
        if aggregated_system:
            node_metric["aggregatedSystemUsages"] = aggregated_system
        numa_usages = self._numa_usages(start, now)
        if numa_usages:
            node_metric["numaUsages"] = numa_usages
        return node_metric

    def _numa_usages(self, start: float, now: float) -> list[dict[str, Any]]:
        """``numaUsages[]{numaNodeID, nodeUsage, systemUsage}``: the avg per NUMA node (Koordinator's
        collectNUMAUsages: a node needs both CPU and memory samples; its system usage is optional)."""
        usages = []
        for node_id in sorted(NodeInfoKV.of(self._cache).numa_node_ids):
            node = self._avg_usage(_Series(numa_key(MetricKind.NODE_NUMA_CPU_USAGE, node_id),
                                           numa_key(MetricKind.NODE_NUMA_MEMORY_USAGE, node_id)), start, now)
            if len(node["resources"]) < 2:
                continue
            entry: dict[str, Any] = {"numaNodeID": node_id, "nodeUsage": node}
            system = self._avg_usage(_Series(numa_key(MetricKind.SYS_NUMA_CPU_USAGE, node_id),
                                             numa_key(MetricKind.SYS_NUMA_MEMORY_USAGE, node_id)), start, now)
            if len(system["resources"]) == 2:
                entry["systemUsage"] = system
            usages.append(entry)
        return usages

    def _pod_metric(self, pod: PodMeta, gpus: Sequence[GPUDevice], policy: CollectPolicy, start: float,
                    now: float) -> dict[str, Any] | None:
        usage = self._avg_usage(self._series(_POD_KINDS, policy, **{Label.POD_UID: pod.uid}), start, now)
        if not usage["resources"]:
            return None  # no samples yet (new pod) or gone: nothing to say
        pod_devices = self._gpu_usage(gpus, MetricKind.POD_GPU_CORE_USAGE, MetricKind.POD_GPU_MEMORY_USAGE,
                                      start, now, **{Label.POD_UID.value: pod.uid})
        if pod_devices:
            usage["devices"] = pod_devices
        entry: dict[str, Any] = {"namespace": pod.namespace, "name": pod.name, "podUsage": usage}
        if pod.priority_class.value:
            entry["priority"] = pod.priority_class.value
        if pod.qos_class.value:
            entry["qos"] = pod.qos_class.value
        return entry

    def _host_app_metric(self, app: HostApplication, policy: CollectPolicy, start: float,
                         now: float) -> dict[str, Any] | None:
        usage = self._avg_usage(self._series(_HOST_APP_KINDS, policy, **{Label.HOST_APP_NAME: app.name}), start, now)
        if not usage["resources"]:
            return None  # no cgroup path, or not read yet
        entry: dict[str, Any] = {"name": app.name, "usage": usage}
        if app.priority:
            entry["priority"] = app.priority
        if app.qos.value:
            entry["qos"] = app.qos.value
        return entry


def _resource_map(amounts: Mapping[str, int]) -> dict[str, Any]:
    return {"resources": {"cpu": f"{max(amounts['cpu'], 0)}m", "memory": str(max(amounts["memory"], 0))}}


def prod_prediction_status(prediction: ProdPrediction) -> dict[str, Any]:
    """``prodReclaimableMetric`` (``{"resource": {}}`` when it cannot be computed, as Koordinator writes it) and
    ``prodPeakMetric`` (left out then)."""
    if prediction.problem:
        logger.debug("prod prediction: %s", prediction.problem)
    status: dict[str, Any] = {"prodReclaimableMetric": {"resource": _resource_map(prediction.reclaimable)
                                                        if prediction.reclaimable is not None else {}}}
    if prediction.peak is not None:
        status["prodPeakMetric"] = {"resource": _resource_map(prediction.peak)}
    return status


class ReportOutcome(enum.StrEnum):
    UPDATED = "updated"
    CREATED = "created"
    SKIPPED_MISSING = "skipped_missing"
    WRITTEN = "written"
    FAILED = "failed"
    THROTTLED = "throttled"  # held back by the koordlet's API budget: the server is pushing back
    NOT_READY = "not_ready"  # the node's CPU and memory usage not both collected yet: nothing sent


class NodeMetricReporter:
    """Reports the node's NodeMetric status on a timer; give ``custom_api`` or ``report_dir``."""

    def __init__(
        self,
        node_name: str,
        cache: MetricCache,
        pods: Callable[[], Sequence[PodMeta]],
        custom_api: CustomObjects | None = None,
        report_dir: str | None = None,
        default_interval_s: float = 60.0,
        create_missing: bool = False,
        observe: Callable[[str], None] | None = None,
        on_report: Callable[[dict[str, Any]], None] | None = None,
        wall_clock: Callable[[], float] = time.time,
        host_apps: Callable[[], Sequence[HostApplication]] = tuple,
        prod_prediction: ProdPredict | None = None,
        clock: Clock = SYSTEM_CLOCK,
        rng: random.Random | None = None,
        checkpoint: ApiCheckpoint | None = None,
    ) -> None:
        """``checkpoint``: the object as koordlet's last write (before a restart) left it, taken at start instead of
        a read, and kept after every write (koordlet/kubeclient/checkpoint.py)."""
        if custom_api is None and report_dir is None:
            raise ValueError("NodeMetricReporter needs a CustomObjects client or a report dir")
        self.node_name = node_name
        self._builder = StatusBuilder(cache)
        self._pods = pods
        self._host_apps = host_apps
        self._prod_prediction = prod_prediction
        self._api = custom_api
        self._report_dir = report_dir
        self._default_interval_s = default_interval_s
        self._create_missing = create_missing
        self._observe = observe or (lambda outcome: None)
        self._on_report = on_report
        self._wall_clock = wall_clock
        self.policy = CollectPolicy(report_interval_s=default_interval_s)
        self.pending: dict[str, Any] | None = None  # a report that could not be written yet
        self.last_written: dict[str, Any] | None = None
        self._object: dict[str, Any] | None = None  # as koordlet's last write (or read) left it on the server
        self._missing_logged = False
        self._clock = clock
        self._rng = rng or random.Random()
        self._thread: PeriodicThread | None = None
        self._checkpoint = checkpoint
        self._checkpoint_key = f"{PLURAL}/{node_name}"

    @property
    def file_path(self) -> str | None:
        if self._report_dir is None:
            return None
        return os.path.join(self._report_dir, f"nodemetric-{self.node_name}.yaml")

    # ------------------------------------------------------------------------------------- one report

    def _build(self) -> dict[str, Any]:
        try:
            status = self._builder.build(self._pods(), self.policy, self._wall_clock(), self._host_apps(),
                                         self._prod_prediction)
        except (ValueError, KeyError, ArithmeticError):
            if self.pending is None:
                raise
            logger.exception("building the NodeMetric status failed; sending the previous report")
            return self.pending
        self.pending = status
        return status

    def report_once(self) -> ReportOutcome:
        """Build the status and write it; never raises for API or file errors (they are logged, counted)."""
        try:
            outcome = self._report_api() if self._api is not None else self._report_file()
        except Throttled as held:
            logger.debug("NodeMetric report skipped: %s", held.reason)
            outcome = ReportOutcome.THROTTLED
        except (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError) as err:
            logger.warning("NodeMetric report failed, keeping it for the next tick: %s",
                           str(err).splitlines()[0] if str(err) else type(err).__name__)
            outcome = ReportOutcome.FAILED
        self._observe(outcome.value)
        return outcome

    def _written(self, status: dict[str, Any]) -> None:
        self.pending = None
        self.last_written = status
        if self._on_report is not None:
            self._on_report(status)

    def _read(self, resource_version: str | None) -> dict[str, Any] | None:
        """The object (None: there is none); ``resource_version="0"``: from the watch cache."""
        assert self._api is not None
        try:
            return self._api.get_cluster_custom_object(GROUP, VERSION, PLURAL, self.node_name,
                                                       resource_version=resource_version)
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    def _missing(self) -> ReportOutcome:
        self._object = None
        if not self._missing_logged:
            logger.info("NodeMetric %s does not exist; not reporting until it is created", self.node_name)
            self._missing_logged = True
        return ReportOutcome.SKIPPED_MISSING

    def _report_api(self) -> ReportOutcome:
        api = self._api
        assert api is not None
        obj = self._object
        if obj is None and self._checkpoint is not None:
            # what the last write before a restart answered: its version is the next write's precondition (a 409
            # if the object changed meanwhile, and then it is read)
            obj = self._object = self._checkpoint.take(self._checkpoint_key, self.node_name)
        if obj is None:
            obj = self._read("0")
            if obj is None:
                if not self._create_missing:
                    return self._missing()
                obj = api.create_cluster_custom_object(GROUP, VERSION, PLURAL, self._new_object())
                logger.info("created NodeMetric %s", self.node_name)
            self._object = obj
        self._missing_logged = False
        for attempt in (1, 2):
            self.policy = collect_policy_from_spec(obj.get("spec"), self._default_interval_s)
            status = self._build()
            usage = ((status.get("nodeMetric") or {}).get("nodeUsage") or {}).get("resources") or {}
            if not {"cpu", "memory"} <= usage.keys():
                # as Koordinator's "node metric is not ready, skip this round": a partial usage is never written (the
                # CPU's needs two samples)
                logger.debug("NodeMetric %s: no node usage collected yet; skipping this report", self.node_name)
                self.pending = None
                return ReportOutcome.NOT_READY
            body = copy.copy(obj)
            body["status"] = status
            try:
                stored = api.replace_cluster_custom_object_status(GROUP, VERSION, PLURAL, self.node_name, body)
            except ApiException as err:
                if err.status == 404:
                    return self._missing()
                if err.status != 409 or attempt == 2:
                    raise
                logger.debug("NodeMetric %s changed under us; reading it again", self.node_name)
                fresh = self._read(None)  # someone else wrote: the newest, not the watch cache's
                if fresh is None:
                    return self._missing()
                obj = self._object = fresh
                continue
            self._object = stored if isinstance(stored, dict) else body
            if self._checkpoint is not None:
                self._checkpoint.put(self._checkpoint_key, {k: v for k, v in self._object.items() if k != "status"})
            self._written(status)
            return ReportOutcome.UPDATED
        raise AssertionError("unreachable")

    def _new_object(self) -> dict[str, Any]:
        return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": self.node_name}, "spec": {}}

    def _report_file(self) -> ReportOutcome:
        status = self._build()
        obj = self._new_object()
        obj["status"] = status
        path = self.file_path
        if path is None:
            raise ValueError("no report dir")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_atomic(path, yaml.dump(obj, Dumper=_SAFE_DUMPER, sort_keys=False), prefix=".nodemetric-")
        self._written(status)
        return ReportOutcome.WRITTEN

    # ------------------------------------------------------------------------------------- timer

    def timer(self, first_delay_s: float | None = None) -> PeriodicThread:
        """The reporting loop, not started: every interval ±10 %, the first report after ``first_delay_s``
        (default: a random point of the first interval)."""
        return PeriodicThread("nodemetric-reporter", lambda: self.policy.report_interval_s, self.report_once,
                              first_delay_s=first_delay_s, monotonic=self._clock.monotonic, rng=self._rng)

    def start(self, first_delay_s: float | None = None) -> None:
        if self._thread is not None:
            raise RuntimeError("NodeMetric reporter already started")
        self._thread = self.timer(first_delay_s)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> bool:
        """Stop the timer; a report in flight is waited for at most ``timeout_s``."""
        thread, self._thread = self._thread, None
        return thread.stop(timeout_s) if thread is not None else True
