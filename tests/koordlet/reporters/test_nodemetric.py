"""NodeMetric reporting: status built from a real metric cache, written to the in-repo API server (whose
CRD schema validation is the check) or to a YAML file."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterator
from pathlib import Path

import kubernetes.client
import pytest
import yaml

from koordlet.api.nodeslo import parse_node_slo_spec
from koordlet.api.pod import PodMeta
from koordlet.kubeapi import CustomObjects
from koordlet.kubeclient.checkpoint import ApiCheckpoint
from koordlet.metriccache import GPU_DEVICES_KV, GPUDevice, Label, MetricCache, MetricKind, Sample, SeriesKey
from koordlet.reporters.nodemetric import (
    CollectPolicy,
    NodeMetricReporter,
    ReportOutcome,
    StatusBuilder,
    collect_policy_from_spec,
)
from tests.support.apiserver import ApiServer, kube_api_client

NODE = "node-1"
NOW = 1_700_000_000.0
SPAN_S = 400  # seconds of samples in the cache


def pod(name: str, namespace: str, uid: str, labels: dict[str, str] | None = None,
        priority: int | None = None) -> PodMeta:
    return PodMeta(name=name, namespace=namespace, uid=uid, labels=labels or {}, priority=priority)


PODS = (
    pod("web", "shop", "u-web", {"koordinator.sh/qosClass": "LS"}, 9500),
    pod("spark", "batch", "u-spark", {"koordinator.sh/qosClass": "BE"}, 5500),
    pod("new", "batch", "u-new"),  # no samples yet
)


def node_cpu(i: int) -> float:
    return 2.0 + (i % 10) / 10  # 2.0 .. 2.9 cores


def _window(window_s: float) -> list[float]:
    """Node CPU values in [NOW - window_s, NOW] (both ends included, as Koordinator queries)."""
    return sorted(node_cpu(i) for i in range(SPAN_S) if NOW - SPAN_S + 1 + i >= NOW - window_s)


def expected_node_cpu_avg(window_s: float) -> str:
    values = _window(window_s)
    return f"{round(sum(values) / len(values) * 1000)}m"


def expected_node_cpu_percentile(window_s: float, p: int) -> str:
    values = _window(window_s)
    return f"{round(values[math.ceil(p / 100 * len(values)) - 1] * 1000)}m"  # nearest rank


def filled_cache(cache: MetricCache | None = None) -> MetricCache:
    cache = cache if cache is not None else MetricCache()
    samples = []
    for i in range(SPAN_S):
        t = NOW - SPAN_S + 1 + i
        samples += [
            Sample(SeriesKey.of(MetricKind.NODE_CPU_USAGE), t, node_cpu(i)),
            Sample(SeriesKey.of(MetricKind.NODE_MEMORY_USAGE), t, 4e9),
            Sample(SeriesKey.of(MetricKind.NODE_MEMORY_USAGE_WITH_PAGE_CACHE), t, 6e9),
            Sample(SeriesKey.of(MetricKind.SYS_CPU_USAGE), t, 0.25),
            Sample(SeriesKey.of(MetricKind.SYS_MEMORY_USAGE), t, 1e9),
            Sample(SeriesKey.of(MetricKind.POD_CPU_USAGE, **{Label.POD_UID: "u-web"}), t, 1.5),
            Sample(SeriesKey.of(MetricKind.POD_MEMORY_USAGE, **{Label.POD_UID: "u-web"}), t, 1e9),
            Sample(SeriesKey.of(MetricKind.POD_CPU_USAGE, **{Label.POD_UID: "u-spark"}), t, 0.5),
            Sample(SeriesKey.of(MetricKind.POD_MEMORY_USAGE, **{Label.POD_UID: "u-spark"}), t, 2e9),
            Sample(SeriesKey.of(MetricKind.HOST_APP_CPU_USAGE, **{Label.HOST_APP_NAME: "nginx"}), t, 0.125),
            Sample(SeriesKey.of(MetricKind.HOST_APP_MEMORY_USAGE, **{Label.HOST_APP_NAME: "nginx"}), t, 3e8),
        ]
    cache.append_samples(samples)
    return cache


def test_status_has_averages_percentiles_and_sorted_pods() -> None:
    status = StatusBuilder(filled_cache()).build(PODS, CollectPolicy(), NOW)
    node_metric = status["nodeMetric"]
    assert node_metric["nodeUsage"]["resources"] == {"cpu": expected_node_cpu_avg(300), "memory": "4000000000"}
    assert node_metric["systemUsage"]["resources"] == {"cpu": "250m", "memory": "1000000000"}
    # 400 s of samples: 5m and 10m are covered >= 50 %, 30m is not.
    assert [a["duration"] for a in node_metric["aggregatedNodeUsages"]] == ["5m0s", "10m0s"]
    usage = node_metric["aggregatedNodeUsages"][0]["usage"]
    assert set(usage) == {"avg", "p50", "p90", "p95", "p99"}
    assert usage["p50"]["resources"]["cpu"] == expected_node_cpu_percentile(300, 50)
    assert usage["p90"]["resources"]["cpu"] == expected_node_cpu_percentile(300, 90)
    assert usage["p99"]["resources"]["cpu"] == "2900m"
    assert [a["duration"] for a in node_metric["aggregatedSystemUsages"]] == ["5m0s", "10m0s"]
    assert status["podsMetric"] == [
        {"namespace": "batch", "name": "spark", "podUsage": {"resources": {"cpu": "500m", "memory": "2000000000"}},
         "priority": "koord-batch", "qos": "BE"},
        {"namespace": "shop", "name": "web", "podUsage": {"resources": {"cpu": "1500m", "memory": "1000000000"}},
         "priority": "koord-prod", "qos": "LS"},
    ]
    assert status["updateTime"] == "2023-11-14T22:13:20Z"


HOST_APPS = parse_node_slo_spec({"hostApplications": [
    {"name": "nginx", "priority": "koord-prod", "qos": "LS", "cgroupPath": {"relativePath": "host/nginx"}},
    {"name": "not-read-yet", "qos": "BE", "cgroupPath": {"relativePath": "host/later"}},
]}).host_applications


def test_host_applications_are_reported_with_their_priority_and_qos() -> None:
    status = StatusBuilder(filled_cache()).build(PODS, CollectPolicy(), NOW, HOST_APPS)
    assert status["hostApplicationMetric"] == [
        {"name": "nginx", "usage": {"resources": {"cpu": "125m", "memory": "300000000"}}, "priority": "koord-prod",
         "qos": "LS"},
    ]
    assert "hostApplicationMetric" not in StatusBuilder(filled_cache()).build(PODS, CollectPolicy(), NOW)


def test_memory_policy_with_page_cache_uses_that_series() -> None:
    policy = CollectPolicy(memory_policy="usageWithPageCache")
    status = StatusBuilder(filled_cache()).build((), policy, NOW)
    assert status["nodeMetric"]["nodeUsage"]["resources"]["memory"] == "6000000000"


def test_young_cache_reports_no_aggregates() -> None:
    cache = MetricCache()
    cache.append_samples(Sample(SeriesKey.of(MetricKind.NODE_CPU_USAGE), NOW - 60 + i, 1.0) for i in range(60))
    cache.append_samples(Sample(SeriesKey.of(MetricKind.NODE_MEMORY_USAGE), NOW - 60 + i, 1.0) for i in range(60))
    status = StatusBuilder(cache).build((), CollectPolicy(), NOW)
    assert "aggregatedNodeUsages" not in status["nodeMetric"]


def test_collect_policy_from_spec_and_defaults() -> None:
    assert collect_policy_from_spec(None, 60.0) == CollectPolicy()
    policy = collect_policy_from_spec({"metricCollectPolicy": {
        "aggregateDurationSeconds": 120, "reportIntervalSeconds": 30,
        "nodeAggregatePolicy": {"durations": ["1m", "2m30s", "forever"]},
        "nodeMemoryCollectPolicy": "usageWithPageCache"}})
    assert policy == CollectPolicy(120.0, 30.0, (60.0, 150.0), "usageWithPageCache")


# ------------------------------------------------------------------------------------ API server

@pytest.fixture
def custom(server: ApiServer) -> Iterator[CustomObjects]:
    with kube_api_client(server) as client:
        yield CustomObjects(client)


def seed_node_metric(server: ApiServer) -> None:
    server.seed({"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeMetric", "metadata": {"name": NODE},
                 "spec": {"metricCollectPolicy": {"aggregateDurationSeconds": 300, "reportIntervalSeconds": 45,
                                                  "nodeAggregatePolicy": {"durations": ["5m"]}}}})


def reporter(custom: CustomObjects, outcomes: list[str] | None = None,
             **kwargs: object) -> NodeMetricReporter:
    return NodeMetricReporter(NODE, filled_cache(), lambda: PODS, custom_api=custom,
                              observe=(outcomes.append if outcomes is not None else None),
                              wall_clock=lambda: NOW, **kwargs)  # type: ignore[arg-type]


def test_status_written_through_status_subresource_and_accepted_by_schema(
        server: ApiServer, custom: CustomObjects) -> None:
    seed_node_metric(server)
    outcomes: list[str] = []
    nm = reporter(custom, outcomes, host_apps=lambda: HOST_APPS)
    assert nm.report_once() is ReportOutcome.UPDATED
    stored = server.get_object("nodemetrics", NODE)
    assert stored is not None
    status = stored["status"]
    assert status["nodeMetric"]["nodeUsage"]["resources"]["cpu"] == expected_node_cpu_avg(300)
    assert [a["duration"] for a in status["nodeMetric"]["aggregatedNodeUsages"]] == ["5m0s"]
    assert [p["name"] for p in status["podsMetric"]] == ["spark", "web"]
    assert status["hostApplicationMetric"][0]["usage"]["resources"]["cpu"] == "125m"
    assert stored["spec"]["metricCollectPolicy"]["reportIntervalSeconds"] == 45
    assert nm.policy.report_interval_s == 45.0
    assert server.requests("PUT", r"/nodemetrics/node-1/status$")
    assert outcomes == ["updated"]


def _wire(server: ApiServer) -> list[tuple[str, str | None]]:
    """The NodeMetric requests since the last clear: (verb, the resourceVersion a GET asked for or a PUT carried)."""
    out: list[tuple[str, str | None]] = []
    for request in server.requests(path_regex=r"/nodemetrics/node-1(/status)?$"):
        if request.verb not in ("GET", "PUT"):
            continue
        version = request.query.get("resourceVersion") if request.verb == "GET" else \
            (request.body or {}).get("metadata", {}).get("resourceVersion")
        out.append((request.verb, version))
    return out


def test_status_is_written_with_the_version_of_the_last_write_and_never_read_before(
        server: ApiServer, custom: CustomObjects) -> None:
    seed_node_metric(server)
    nm = reporter(custom)
    stored_before = []
    for _ in range(3):
        stored_before.append(server.get_object("nodemetrics", NODE)["metadata"]["resourceVersion"])
        assert nm.report_once() is ReportOutcome.UPDATED
    assert [r.body["metadata"]["resourceVersion"] for r in server.requests("PUT")] == stored_before
    (first_get,) = server.requests("GET")
    assert first_get.query.get("resourceVersion") == "0"  # once, to begin: from the watch cache


def test_a_conflict_reads_the_newest_once_and_writes_again(server: ApiServer, custom: CustomObjects) -> None:
    seed_node_metric(server)
    nm = reporter(custom)
    assert nm.report_once() is ReportOutcome.UPDATED
    server.clear_requests()
    # koord-manager changes the spec: the next write conflicts, the reporter reads the newest (a consistent read)
    # and writes again; the new interval comes with it.
    custom_generated = kubernetes.client.CustomObjectsApi(custom.api_client)
    custom_generated.patch_cluster_custom_object("slo.koordinator.sh", "v1alpha1", "nodemetrics", NODE,
                                                 {"spec": {"metricCollectPolicy": {"reportIntervalSeconds": 90}}})
    assert nm.report_once() is ReportOutcome.UPDATED
    verbs = _wire(server)
    assert [verb for verb, _ in verbs] == ["PUT", "GET", "PUT"] and verbs[1][1] is None
    assert nm.policy.report_interval_s == 90.0
    server.clear_requests()
    server.fail_next("PUT", r"/nodemetrics/node-1/status$", status=409, count=2)
    assert nm.report_once() is ReportOutcome.FAILED  # one re-read per report, then the next tick
    assert [verb for verb, _ in _wire(server)] == ["PUT", "GET", "PUT"]
    server.clear_requests()
    assert nm.report_once() is ReportOutcome.UPDATED
    assert [verb for verb, _ in _wire(server)] == ["PUT"]
    assert server.get_object("nodemetrics", NODE)["status"]["podsMetric"]


def test_server_error_keeps_report_for_next_tick(server: ApiServer, custom: CustomObjects) -> None:
    seed_node_metric(server)
    outcomes: list[str] = []
    nm = reporter(custom, outcomes)
    server.fail_next("PUT", r"/nodemetrics/node-1/status$", status=500)
    assert nm.report_once() is ReportOutcome.FAILED
    assert nm.pending is not None and "status" not in server.get_object("nodemetrics", NODE)
    assert nm.report_once() is ReportOutcome.UPDATED
    assert nm.pending is None and nm.last_written is not None
    assert server.get_object("nodemetrics", NODE)["status"]["nodeMetric"]["nodeUsage"]["resources"]
    assert outcomes == ["failed", "updated"]


def test_a_report_the_budget_holds_back_is_skipped(server: ApiServer, custom: CustomObjects) -> None:
    """The API server pushed back (503): the next reports skip their turn without a request."""
    seed_node_metric(server)
    outcomes: list[str] = []
    nm = reporter(custom, outcomes)
    server.fail_next("PUT", r"/nodemetrics/node-1/status$", status=503)
    assert nm.report_once() is ReportOutcome.FAILED
    server.clear_requests()
    assert nm.report_once() is ReportOutcome.THROTTLED
    assert server.requests() == [] and outcomes == ["failed", "throttled"]


def test_missing_object_is_skipped_or_created_when_asked(server: ApiServer,
                                                         custom: CustomObjects) -> None:
    assert reporter(custom).report_once() is ReportOutcome.SKIPPED_MISSING
    assert server.get_object("nodemetrics", NODE) is None
    assert reporter(custom, create_missing=True).report_once() is ReportOutcome.UPDATED
    assert server.get_object("nodemetrics", NODE)["status"]["podsMetric"]


# ------------------------------------------------------------------------------------ file

def test_without_api_server_the_object_is_written_as_yaml(tmp_path: Path) -> None:
    nm = NodeMetricReporter(NODE, filled_cache(), lambda: PODS, report_dir=str(tmp_path), wall_clock=lambda: NOW)
    assert nm.report_once() is ReportOutcome.WRITTEN
    obj = yaml.safe_load((tmp_path / "nodemetric-node-1.yaml").read_text())
    assert obj["kind"] == "NodeMetric" and obj["metadata"]["name"] == NODE
    assert obj["status"]["nodeMetric"]["nodeUsage"]["resources"]["cpu"] == expected_node_cpu_avg(300)
    assert [p.name for p in tmp_path.iterdir()] == ["nodemetric-node-1.yaml"]  # no temp file left


def test_timer_reports_and_stops_quickly(tmp_path: Path) -> None:
    written = threading.Event()
    nm = NodeMetricReporter(NODE, filled_cache(), lambda: PODS, report_dir=str(tmp_path), default_interval_s=0.1,
                            on_report=lambda status: written.set())
    nm.start(first_delay_s=0.05)
    try:
        assert written.wait(3.0)
    finally:
        nm.stop(2.0)
    assert (tmp_path / "nodemetric-node-1.yaml").exists()


# ------------------------------------------------------------------------------------ GPU devices

GPU0 = GPUDevice("GPU-00000000-1a2b-3c4d-5e6f-00a0b0c0d0e0", 0, 85520809984)  # an H100 (docs/node-interfaces.md §15)
GPU1 = GPUDevice("GPU-00000001-1a2b-3c4d-5e6f-00a0b0c0d0e1", 1, 85520809984)


def gpu_cache() -> MetricCache:
    """filled_cache() plus GPU0 at 60 % / 40 GiB on the node, of which pod web holds 45 % / 20 GiB; GPU1 unsampled."""
    cache = filled_cache()
    cache.set_kv(GPU_DEVICES_KV, (GPU0, GPU1))
    gpu = {Label.GPU_MINOR: "0", Label.GPU_DEVICE_UUID: GPU0.uuid}
    pod_gpu = {Label.POD_UID: "u-web", **gpu}
    samples = []
    for i in range(SPAN_S):
        t = NOW - SPAN_S + 1 + i
        samples += [
            Sample(SeriesKey.of(MetricKind.NODE_GPU_CORE_USAGE, **gpu), t, 60.0),
            Sample(SeriesKey.of(MetricKind.NODE_GPU_MEMORY_USAGE, **gpu), t, float(40 << 30)),
            Sample(SeriesKey.of(MetricKind.POD_GPU_CORE_USAGE, **pod_gpu), t, 45.0),
            Sample(SeriesKey.of(MetricKind.POD_GPU_MEMORY_USAGE, **pod_gpu), t, float(20 << 30)),
        ]
    cache.append_samples(samples)
    return cache


def test_gpu_usage_reported_as_devices_of_node_and_pod_usage(server: ApiServer,
                                                              custom: CustomObjects) -> None:
    seed_node_metric(server)
    nm = NodeMetricReporter(NODE, gpu_cache(), lambda: PODS, custom_api=custom, wall_clock=lambda: NOW)
    assert nm.report_once() is ReportOutcome.UPDATED  # the CRD schema accepted the devices
    status = server.get_object("nodemetrics", NODE)["status"]
    assert status["nodeMetric"]["nodeUsage"]["devices"] == [
        {"type": "gpu", "id": GPU0.uuid, "minor": 0, "health": False,
         "resources": {"koordinator.sh/gpu-core": "60", "koordinator.sh/gpu-memory": str(40 << 30),
                       "koordinator.sh/gpu-memory-ratio": "50"}},
    ]
    pods = {p["name"]: p for p in status["podsMetric"]}
    assert pods["web"]["podUsage"]["devices"] == [
        {"type": "gpu", "id": GPU0.uuid, "minor": 0, "health": False,
         "resources": {"koordinator.sh/gpu-core": "45", "koordinator.sh/gpu-memory": str(20 << 30),
                       "koordinator.sh/gpu-memory-ratio": "25"}},
    ]
    assert "devices" not in pods["spark"]["podUsage"]
    assert pods["web"]["podUsage"]["resources"] == {"cpu": "1500m", "memory": "1000000000"}


def test_a_report_before_any_node_usage_is_collected_writes_nothing(server: ApiServer, custom: CustomObjects) -> None:
    """A first report early in its interval finds no samples yet: it is skipped, the next one writes."""
    seed_node_metric(server)
    outcomes: list[str] = []
    cache = MetricCache()
    nm = NodeMetricReporter(NODE, cache, lambda: PODS, custom_api=custom, observe=outcomes.append,
                            wall_clock=lambda: NOW)
    assert nm.report_once() is ReportOutcome.NOT_READY
    assert "status" not in server.get_object("nodemetrics", NODE) and nm.last_written is None
    assert [verb for verb, _ in _wire(server)] == ["GET"]  # the object, from the watch cache; no write
    filled_cache(cache)  # the collectors' first samples
    assert nm.report_once() is ReportOutcome.UPDATED
    assert server.get_object("nodemetrics", NODE)["status"]["nodeMetric"]["nodeUsage"]["resources"]["cpu"]
    assert outcomes == ["not_ready", "updated"]


# ------------------------------------------------------------------------------- across a restart


def test_a_restarted_reporter_writes_with_the_version_its_checkpoint_kept_and_reads_nothing(
        server: ApiServer, custom: CustomObjects, tmp_path: Path) -> None:
    seed_node_metric(server)
    path = str(tmp_path / "api-checkpoint.json")
    first = reporter(custom, checkpoint=ApiCheckpoint(path))
    assert first.report_once() is ReportOutcome.UPDATED
    assert first.report_once() is ReportOutcome.UPDATED
    server.clear_requests()
    # a new process: the object as the last write answered it, without its status or managedFields
    kept = json.loads(Path(path).read_text())["nodemetrics/node-1"]["object"]
    assert "status" not in kept and "managedFields" not in kept["metadata"]
    assert kept["spec"]["metricCollectPolicy"]["reportIntervalSeconds"] == 45
    again = reporter(custom, checkpoint=ApiCheckpoint(path))
    assert again.report_once() is ReportOutcome.UPDATED
    assert _wire(server) == [("PUT", kept["metadata"]["resourceVersion"])]  # no read before it
    assert again.policy.report_interval_s == 45.0  # the spec came with the checkpoint


def test_a_checkpoint_older_than_the_object_costs_a_conflict_and_one_read(
        server: ApiServer, custom: CustomObjects, tmp_path: Path) -> None:
    seed_node_metric(server)
    path = str(tmp_path / "api-checkpoint.json")
    assert reporter(custom, checkpoint=ApiCheckpoint(path)).report_once() is ReportOutcome.UPDATED
    # while koordlet was down, koord-manager changed the spec
    kubernetes.client.CustomObjectsApi(custom.api_client).patch_cluster_custom_object(
        "slo.koordinator.sh", "v1alpha1", "nodemetrics", NODE,
        {"spec": {"metricCollectPolicy": {"reportIntervalSeconds": 90}}})
    server.clear_requests()
    again = reporter(custom, checkpoint=ApiCheckpoint(path))
    assert again.report_once() is ReportOutcome.UPDATED
    assert [verb for verb, _ in _wire(server)] == ["PUT", "GET", "PUT"]
    assert again.policy.report_interval_s == 90.0


@pytest.mark.parametrize("content", ["", "not json", "[1, 2]", '{"nodemetrics/node-1": {"at": "x", "object": {}}}',
                                     '{"nodemetrics/node-1": {"at": 1, "object": {"metadata": {"name": "other", '
                                     '"resourceVersion": "5"}}}}'])
def test_an_unusable_checkpoint_means_a_read_first(server: ApiServer, custom: CustomObjects, tmp_path: Path,
                                                     content: str) -> None:
    seed_node_metric(server)
    path = tmp_path / "api-checkpoint.json"
    path.write_text(content)
    server.clear_requests()
    assert reporter(custom, checkpoint=ApiCheckpoint(str(path))).report_once() is ReportOutcome.UPDATED
    assert [verb for verb, _ in _wire(server)] == ["GET", "PUT"]
