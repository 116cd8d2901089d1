from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

import koordlet.executor.metrics  # noqa: F401 - defines its counters on the default registry
from koordlet.api.pod import ContainerMeta, PodMeta
from koordlet.metriccache import GPU_DEVICES_KV, GPUDevice, MetricCache, MetricKind, SeriesKey
from koordlet.metrics import KoordletMetrics, MetricsServer, exposition
from koordlet.statesinformer.api import NodeInfo, StaticStates

NODE = "node-1"


def states() -> StaticStates:
    container = ContainerMeta("app", container_id="c1", requests={"cpu": 500, "memory": 256 << 20},
                              limits={"cpu": 1000, "kubernetes.io/batch-memory": 1 << 30})
    pod = PodMeta(name="web", namespace="shop", uid="u1", containers=(container,))
    node = NodeInfo(NODE, allocatable={"cpu": 8000, "kubernetes.io/batch-cpu": 3500})
    return StaticStates(node=node, pods=(pod,))


def test_live_gauges_come_from_cache_and_states() -> None:
    cache = MetricCache()
    now = time.time()
    cache.append(SeriesKey.of(MetricKind.NODE_CPU_USAGE), now, 1.25)
    cache.append(SeriesKey.of(MetricKind.NODE_MEMORY_USAGE), now - 3600, 5e9)  # stale: not shown
    metrics = KoordletMetrics(NODE, cache, states())
    text = exposition([metrics.registry]).decode()
    assert 'koordlet_node_used_cpu_cores{node="node-1"} 1.25' in text
    assert "koordlet_node_used_memory_bytes{" not in text
    assert ('koordlet_container_resource_requests{container_id="c1",container_name="app",node="node-1",'
            'pod_name="web",pod_namespace="shop",pod_uid="u1",resource="cpu",unit="core"} 0.5') in text
    assert 'resource="memory",unit="byte"} 2.68435456e+08' in text
    assert 'koordlet_container_resource_limits{' in text and 'resource="kubernetes.io/batch-memory"' in text
    assert ('koordlet_node_resource_allocatable{node="node-1",resource="kubernetes.io/batch-cpu",unit="core"} 3.5'
            in text)
    assert 'koordlet_start_time{node="node-1"}' in text


def _psi_key(kind: MetricKind, resource: str, degree: str, **ids: str) -> SeriesKey:
    return SeriesKey.of(kind, psi_resource=resource, psi_precision="avg10", psi_degree=degree, **ids)


def test_pod_and_container_psi_gauges_carry_names_and_koordinators_labels() -> None:
    cache = MetricCache()
    now = time.time()
    cache.append(_psi_key(MetricKind.POD_PSI, "cpu", "some", pod_uid="u1"), now, 12.5)
    cache.append(_psi_key(MetricKind.POD_PSI, "memory", "full", pod_uid="u1"), now, 0.5)
    cache.append(_psi_key(MetricKind.POD_PSI, "io", "some", pod_uid="gone"), now, 3.0)  # pod no longer on the node
    cache.append(_psi_key(MetricKind.CONTAINER_PSI, "cpu", "some", pod_uid="u1", container_id="c1"), now, 7.0)
    cache.append(_psi_key(MetricKind.CONTAINER_PSI, "cpu", "full", pod_uid="u1", container_id="c1"), now, 2.0)
    cache.append(_psi_key(MetricKind.CONTAINER_PSI, "io", "some", pod_uid="u1", container_id="c1"), now - 600, 9.0)
    metrics = KoordletMetrics(NODE)
    metrics.bind(cache, states(), psi_stale_after_s=30.0)
    text = exposition([metrics.registry]).decode()
    assert ('koordlet_pod_psi{cpu_full_supported="false",node="node-1",pod_name="web",pod_namespace="shop",'
            'pod_uid="u1",psi_degree="some",psi_precision="avg10",psi_resource_type="cpu"} 12.5') in text
    assert 'psi_degree="full",psi_precision="avg10",psi_resource_type="mem"} 0.5' in text
    assert 'pod_uid="gone"' not in text
    assert ('koordlet_container_psi{container_id="c1",container_name="app",cpu_full_supported="true",node="node-1",'
            'pod_name="web",pod_namespace="shop",pod_uid="u1",psi_degree="some",psi_precision="avg10",'
            'psi_resource_type="cpu"} 7.0') in text
    assert 'psi_resource_type="io"' not in text  # stale container sample, unknown pod's sample


def test_bind_only_once() -> None:
    metrics = KoordletMetrics(NODE)
    metrics.bind(MetricCache(), states())
    with pytest.raises(RuntimeError):
        metrics.bind(MetricCache(), states())


def test_counters_carry_node_label() -> None:
    metrics = KoordletMetrics(NODE)
    metrics.observe_report("updated")
    metrics.observe_states_error("kubelet")
    metrics.observe_states_error("nodeslo")
    metrics.observe_kubelet_request("200", 0.002)
    text = exposition([metrics.registry]).decode()
    assert 'koordlet_node_metric_reports_total{node="node-1",status="updated"} 1.0' in text
    assert 'koordlet_states_informer_errors_total{node="node-1",source="kubelet"} 1.0' in text
    assert 'koordlet_node_slo_rejected_total{node="node-1"} 1.0' in text
    assert 'koordlet_kubelet_request_duration_seconds_count{code="200",path="/pods/",verb="GET"} 1.0' in text


def test_node_metric_status_becomes_prometheus_gauges() -> None:
    metrics = KoordletMetrics(NODE)
    metrics.observe_node_metric_status({"nodeMetric": {
        "nodeUsage": {"resources": {"cpu": "2450m", "memory": "4000000000"}},
        "systemUsage": {"resources": {"cpu": "250m", "memory": "bogus"}}}})
    text = exposition([metrics.registry]).decode()
    assert 'koordlet_node_metric_node_usage{node="node-1",resource="cpu",unit="core"} 2.45' in text
    assert 'koordlet_node_metric_node_usage{node="node-1",resource="memory",unit="byte"} 4e+09' in text
    assert 'koordlet_node_metric_system_usage{node="node-1",resource="cpu",unit="core"} 0.25' in text
    assert 'koordlet_node_metric_system_usage{node="node-1",resource="memory"' not in text


@pytest.fixture
def server() -> Iterator[tuple[MetricsServer, list[bool]]]:
    health = [True]
    running = MetricsServer(KoordletMetrics(NODE, MetricCache(), states()).registry, "127.0.0.1", 0,
                            healthy=lambda: health[0])
    running.start()
    try:
        yield running, health
    finally:
        running.stop()


def fetch(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_http_serves_merged_registries_health_and_404(server: tuple[MetricsServer, list[bool]]) -> None:
    running, health = server
    status, text = fetch(running.port, "/metrics")
    assert status == 200
    assert "koordlet_start_time" in text
    assert "koordlet_resource_update_total" in text  # the executor's, from the default registry
    assert "process_resident_memory_bytes" in text  # the agent's own cost
    assert fetch(running.port, "/external-metrics")[0] == 200
    assert fetch(running.port, "/healthz") == (200, "ok\n")
    health[0] = False
    assert fetch(running.port, "/healthz")[0] == 503
    assert fetch(running.port, "/nope")[0] == 404


def test_gpu_series_are_served_with_gpu_and_owner_labels() -> None:
    uuid = "GPU-00000000-1a2b-3c4d-5e6f-00a0b0c0d0e0"
    gpu = {"gpu_minor": "0", "gpu_device_uuid": uuid}
    cache = MetricCache()
    cache.set_kv(GPU_DEVICES_KV, (GPUDevice(uuid, 0, 85520809984),))
    now = time.time()
    cache.append(SeriesKey.of(MetricKind.NODE_GPU_CORE_USAGE, **gpu), now, 60.0)
    cache.append(SeriesKey.of(MetricKind.NODE_GPU_MEMORY_USAGE, **gpu), now, float(40 << 30))
    cache.append(SeriesKey.of(MetricKind.POD_GPU_CORE_USAGE, pod_uid="u1", **gpu), now, 45.0)
    cache.append(SeriesKey.of(MetricKind.CONTAINER_GPU_CORE_USAGE, container_id="c1", **gpu), now, 45.0)
    cache.append(SeriesKey.of(MetricKind.CONTAINER_GPU_MEMORY_USAGE, container_id="c1", **gpu), now, float(20 << 30))
    cache.append(SeriesKey.of(MetricKind.CONTAINER_GPU_CORE_USAGE, container_id="c-gone", **gpu), now, 5.0)
    running = MetricsServer(KoordletMetrics(NODE, cache, states()).registry, "127.0.0.1", 0)
    running.start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{running.port}/metrics", timeout=5) as response:
            text = response.read().decode()
    finally:
        running.stop()
    node = f'gpu_device_uuid="{uuid}",gpu_minor="0",node="node-1"'
    assert f"koordlet_node_gpu_core_usage{{{node}}} 60.0" in text
    assert f"koordlet_node_gpu_memory_usage{{{node}}} 4.294967296e+10" in text
    assert f"koordlet_node_gpu_memory_total{{{node}}} 8.5520809984e+10" in text
    assert (f'koordlet_pod_gpu_core_usage{{gpu_device_uuid="{uuid}",gpu_minor="0",node="node-1",pod_name="web",'
            f'pod_namespace="shop",pod_uid="u1"}} 45.0') in text
    container = (f'container_id="c1",container_name="app",gpu_device_uuid="{uuid}",gpu_minor="0",node="node-1",'
                 f'pod_name="web",pod_namespace="shop",pod_uid="u1"')
    assert f"koordlet_container_gpu_core_usage{{{container}}} 45.0" in text
    assert f"koordlet_container_gpu_memory_usage{{{container}}} 2.147483648e+10" in text
    assert "c-gone" not in text
    # a node without GPUs shows no GPU family at all
    assert "gpu" not in exposition([KoordletMetrics(NODE, MetricCache(), states()).registry]).decode()
