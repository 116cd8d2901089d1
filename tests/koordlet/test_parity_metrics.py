"""Koordinator v1.8's metrics that issue 35 (part 4) adds, set where Koordinator sets them (facts: Koordinator's
pkg/koordlet/metrics/*.go and their callers at v1.8.0 and #3138), read back from what ``/metrics`` serves:

- ``koordlet_node_predicted_resource_reclaimable`` / ``_peak{predictor}``: every prod prediction of a NodeMetric
  build, per predictor (prediction/peak_predictor.go);
- ``koordlet_node_priority_resource_reclaimable`` / ``koordlet_node_resource_priority_reclaimable_status``: the
  prod reclaimable of that build, status 1 and zeros when it failed (statesinformer states_nodemetric.go);
- ``koordlet_collect_node_{cpu,numa,local_storage}_info_status{status}``: each reading of the CPU topology, the
  NUMA nodes (the node info collector) and the block devices (the BlkIOReconcile snapshot);
- ``koordlet_host_application_resource_usage``: each NodeSLO host application's latest usage.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

from koordlet.agent.wiring.prediction import prod_prediction
from koordlet.api.nodeslo import parse_node_slo_spec
from koordlet.metriccache import Label, MetricCache, MetricKind, SeriesKey
from koordlet.metrics import KoordletMetrics, exposition
from koordlet.metricsadvisor.nodeinfo import NodeInfoCollector
from koordlet.prediction.server import PredictServer
from koordlet.qosmanager.snapshot import Needs, SnapshotBuilder
from koordlet.statesinformer.api import StaticStates
from tests.koordlet.prediction.test_prediction import END, NODE, PODS, _server, _train
from tests.koordlet.qosmanager.factory import node
from tests.koordlet.system.topology_tree import build_tree, two_sockets_smt
from tests.support import promtext

NAME = "node-1"
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def served(metrics: KoordletMetrics) -> Samples:
    """What /metrics shows of the agent's registry, parsed back: (sample name, sorted labels) → value."""
    return promtext.samples(exposition([metrics.registry]).decode())


def _labels(**labels: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({"node": NAME, **labels}.items()))


def _predict_through_the_agent(server: PredictServer, metrics: KoordletMetrics) -> None:
    """The prediction as the agent hands it to the NodeMetric reporter (koordlet/agent/wiring/prediction.py), made
    once for PODS at END."""
    ctx = SimpleNamespace(predictor=server, states=StaticStates(node=NODE, pods=PODS), metrics=metrics)
    predict = prod_prediction(ctx)  # type: ignore[arg-type]
    assert predict is not None
    predict(PODS, END)


def test_every_prediction_is_recorded_per_predictor_and_as_the_prod_reclaimable(tmp_path: Path) -> None:
    cache = MetricCache()
    server = _server(tmp_path, cache=cache)
    _train(server, cache, range(60))
    metrics = KoordletMetrics(NAME)
    _predict_through_the_agent(server, metrics)
    got = served(metrics)
    # The figures of tests/koordlet/prediction/test_prediction.py::test_prod_reclaimable_and_peak_worked_by_hand.
    expected = {
        "podReclaimablePredictor": ((4.088, 4613926839), (4.912, 2902265929)),
        "priorityReclaimablePredictor": ((4.224, 4156177834), (4.776, 3360014934)),
        "minPredictor": ((4.088, 4156177834), (4.912, 3360014934)),
    }
    for predictor, ((cpu, memory), (peak_cpu, peak_memory)) in expected.items():
        for name, (cores, memory_bytes) in (("koordlet_node_predicted_resource_reclaimable", (cpu, memory)),
                                            ("koordlet_node_predicted_resource_peak", (peak_cpu, peak_memory))):
            assert got[(name, _labels(predictor=predictor, resource="cpu", unit="core"))] == cores
            assert got[(name, _labels(predictor=predictor, resource="memory", unit="byte"))] == memory_bytes
    reclaimable = "koordlet_node_priority_resource_reclaimable"
    assert got[(reclaimable, _labels(priority="koord-prod", resource="cpu", unit="core"))] == 4.088
    assert got[(reclaimable, _labels(priority="koord-prod", resource="memory", unit="byte"))] == 4156177834
    assert got[("koordlet_node_resource_priority_reclaimable_status", _labels(priority="koord-prod"))] == 0


def test_a_prediction_that_cannot_be_made_shows_status_1_and_zeros(tmp_path: Path) -> None:
    """Before the first training the priority predictor has no ``sys`` model: Koordinator's minPredictor fails,
    so the prod reclaimable is recorded as 0 with status 1; the pod predictor still says what it can (every pod
    unpredicted: their requests are its peak)."""
    metrics = KoordletMetrics(NAME)
    _predict_through_the_agent(_server(tmp_path, cache=MetricCache()), metrics)
    got = served(metrics)
    assert got[("koordlet_node_resource_priority_reclaimable_status", _labels(priority="koord-prod"))] == 1
    assert got[("koordlet_node_priority_resource_reclaimable",
                _labels(priority="koord-prod", resource="cpu", unit="core"))] == 0
    peak = ("koordlet_node_predicted_resource_peak",
            _labels(predictor="podReclaimablePredictor", resource="cpu", unit="core"))
    assert got[peak] > 0
    assert not any(name == "koordlet_node_predicted_resource_peak" and ("predictor", "minPredictor") in labels
                   for name, labels in got)


def test_node_info_readings_are_counted_succeeded_and_failed(tmp_path: Path) -> None:
    metrics = KoordletMetrics(NAME)
    sys_dir = build_tree(tmp_path, two_sockets_smt())
    collector = NodeInfoCollector(MetricCache(), sys_dir, observe=metrics.observe_node_info)
    collector.collect(1.0)
    (Path(sys_dir) / "devices/system/node/node1/meminfo").unlink()  # the NUMA nodes cannot be read
    try:
        collector.collect(2.0)
    except OSError:
        pass
    (Path(sys_dir) / "devices/system/cpu/online").unlink()  # nor the CPUs: the NUMA nodes are not tried
    try:
        collector.collect(3.0)
    except OSError:
        pass
    got = served(metrics)
    cpu, numa = "koordlet_collect_node_cpu_info_status", "koordlet_collect_node_numa_info_status"
    assert got[(cpu, _labels(status="succeeded"))] == 2 and got[(cpu, _labels(status="failed"))] == 1
    assert got[(numa, _labels(status="succeeded"))] == 1 and got[(numa, _labels(status="failed"))] == 1


def test_block_device_readings_are_counted_where_blkio_reads_them(tmp_path: Path) -> None:
    metrics = KoordletMetrics(NAME)
    (tmp_path / "sys" / "class" / "block").mkdir(parents=True)
    states = StaticStates(node=node())
    for sys_dir in (str(tmp_path / "sys"), str(tmp_path / "nowhere")):
        builder = SnapshotBuilder(states, MetricCache(), sys_dir=sys_dir,
                                  observe_storage=metrics.observe_local_storage_info)
        snap = builder.build(Needs(storage=True), now=10.0)
        assert snap is not None and snap.storage is not None
        builder.build(Needs(storage=True), now=11.0)  # within the refresh time: no second reading
    got = served(metrics)
    name = "koordlet_collect_node_local_storage_info_status"
    assert got[(name, _labels(status="succeeded"))] == 1 and got[(name, _labels(status="failed"))] == 1


def test_host_applications_usage_carries_their_priority_and_qos() -> None:
    spec = parse_node_slo_spec({"hostApplications": [
        {"name": "nginx", "priority": "koord-prod", "qos": "LS",
         "cgroupPath": {"base": "CgroupRoot", "relativePath": "nginx/"}},
        {"name": "idle", "priority": "koord-batch", "qos": "BE",
         "cgroupPath": {"base": "CgroupRoot", "relativePath": "idle/"}}]})
    cache = MetricCache()
    now = time.time()
    for kind, value in ((MetricKind.HOST_APP_CPU_USAGE, 0.25), (MetricKind.HOST_APP_MEMORY_USAGE, 3e8)):
        cache.append(SeriesKey.of(kind, **{Label.HOST_APP_NAME: "nginx"}), now, value)
    metrics = KoordletMetrics(NAME, cache, StaticStates(node=node(), node_slo=spec))
    got = served(metrics)
    name = "koordlet_host_application_resource_usage"
    labels = {"host_application_name": "nginx", "priority_class": "koord-prod", "qos": "LS"}
    assert got[(name, _labels(resource="cpu", **labels))] == 0.25
    assert got[(name, _labels(resource="memory", **labels))] == 3e8
    assert not any(("host_application_name", "idle") in key for _, key in got)  # no samples: no series
