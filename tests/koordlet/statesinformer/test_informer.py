from __future__ import annotations

import threading

from koordlet.api.nodeslo import default_node_slo_spec, parse_node_slo_spec
from koordlet.api.pod import ContainerMeta, PodMeta
from koordlet.metriccache import Label, MetricCache, MetricKind, SeriesKey
from koordlet.statesinformer.api import CallbackKind, NodeInfo
from koordlet.statesinformer.informer import PodSourceError, StatesInformer
from tests.support.waiting import wait_for


class ScriptedPods:
    """A pod source that answers from a script: a tuple of pods, or an exception to raise."""

    name = "scripted"

    def __init__(self, *answers: tuple[PodMeta, ...] | Exception) -> None:
        self.answers = list(answers)
        self.calls = 0

    def list_pods(self) -> tuple[PodMeta, ...]:
        self.calls += 1
        answer = self.answers[min(self.calls, len(self.answers)) - 1]
        if isinstance(answer, Exception):
            raise answer
        return answer


def pod(name: str, uid: str, container_id: str = "") -> PodMeta:
    containers = (ContainerMeta("c", container_id=container_id),) if container_id else ()
    return PodMeta(name=name, namespace="ns", uid=uid, containers=containers)


def test_synced_only_after_node_node_slo_and_pods() -> None:
    informer = StatesInformer(ScriptedPods((pod("a", "u1"),)))
    assert informer.sync_pods()
    assert not informer.has_synced()
    informer.set_node(NodeInfo("node-1"))
    assert not informer.has_synced()
    informer.set_node_slo(default_node_slo_spec())
    assert informer.has_synced()
    assert [p.name for p in informer.pods()] == ["a"]


def test_failed_sync_keeps_last_good_pods_and_counts() -> None:
    errors: list[str] = []
    source = ScriptedPods((pod("a", "u1"),), PodSourceError("kubelet down"), (pod("b", "u2"),))
    informer = StatesInformer(source, count_error=errors.append, needs_node=False, needs_node_slo=False)
    assert informer.sync_pods()
    assert not informer.sync_pods()
    assert [p.name for p in informer.pods()] == ["a"]
    assert errors == ["scripted"] and informer.pod_sync_failures == 1
    assert informer.sync_pods()
    assert [p.name for p in informer.pods()] == ["b"]


def test_all_pods_callback_fires_on_change_only() -> None:
    same = (pod("a", "u1"),)
    informer = StatesInformer(ScriptedPods(same, same, (pod("b", "u2"),)), needs_node=False, needs_node_slo=False)
    fired: list[str] = []
    informer.register_callback(CallbackKind.ALL_PODS, "test", lambda: fired.append("pods"))
    informer.sync_pods()
    informer.sync_pods()
    informer.sync_pods()
    assert fired == ["pods", "pods"]


def test_metric_series_of_gone_pods_are_dropped() -> None:
    cache = MetricCache()
    for uid, cid in (("u1", "c1"), ("u2", "c2")):
        cache.append(SeriesKey.of(MetricKind.POD_CPU_USAGE, **{Label.POD_UID: uid}), 1.0, 0.5)
        cache.append(SeriesKey.of(MetricKind.CONTAINER_CPU_USAGE, **{Label.POD_UID: uid, Label.CONTAINER_ID: cid}),
                     1.0, 0.5)
    cache.append(SeriesKey.of(MetricKind.NODE_CPU_USAGE), 1.0, 2.0)
    informer = StatesInformer(ScriptedPods((pod("a", "u1", "c1"),)), metric_cache=cache, needs_node=False,
                              needs_node_slo=False)
    informer.sync_pods()
    left = {(k.kind, k.label(Label.POD_UID)) for k in cache.keys()}
    assert left == {("pod_cpu_usage", "u1"), ("container_cpu_usage", "u1"), ("node_cpu_usage", None)}


def _host_apps(*names: str) -> dict:
    return {"hostApplications": [{"name": n, "cgroupPath": {"parentDir": "host", "relativePath": n}} for n in names]}


def test_metric_series_of_host_applications_no_longer_in_node_slo_are_dropped() -> None:
    cache = MetricCache()
    for name in ("nginx", "etcd"):
        cache.append(SeriesKey.of(MetricKind.HOST_APP_CPU_USAGE, **{Label.HOST_APP_NAME: name}), 1.0, 0.5)
    cache.append(SeriesKey.of(MetricKind.NODE_CPU_USAGE), 1.0, 2.0)
    informer = StatesInformer(ScriptedPods(()), metric_cache=cache, needs_node=False)
    informer.set_node_slo(parse_node_slo_spec(_host_apps("nginx", "etcd")))
    assert len(cache.keys()) == 3
    informer.set_node_slo(parse_node_slo_spec(_host_apps("nginx")))
    assert {(k.kind, k.label(Label.HOST_APP_NAME)) for k in cache.keys()} == {
        ("host_application_cpu_usage", "nginx"), ("node_cpu_usage", None)}


def test_rejected_node_slo_keeps_last_good_and_counts() -> None:
    errors: list[str] = []
    informer = StatesInformer(ScriptedPods(()), count_error=errors.append, needs_node=False)
    good = parse_node_slo_spec({"resourceUsedThresholdWithBE": {"enable": True, "cpuSuppressThresholdPercent": 50}})
    fired: list[str] = []
    informer.register_callback(CallbackKind.NODE_SLO_SPEC, "test", lambda: fired.append("slo"))
    informer.set_node_slo(good)
    informer.reject_node_slo("bad threshold")
    assert informer.node_slo() == good
    assert errors == ["nodeslo"] and fired == ["slo"]


def test_bad_node_slo_at_start_does_not_block_sync() -> None:
    informer = StatesInformer(ScriptedPods(()), needs_node=False)
    informer.sync_pods()
    informer.reject_node_slo("unparseable")
    assert informer.has_synced()
    assert informer.node_slo() == default_node_slo_spec()


def test_loop_polls_on_interval_and_resync_request_and_stops() -> None:
    polled = threading.Event()
    source = ScriptedPods((pod("a", "u1"),))
    informer = StatesInformer(source, sync_interval_s=30.0, needs_node=False, needs_node_slo=False)
    informer.register_callback(CallbackKind.ALL_PODS, "test", polled.set)
    informer.start()
    try:
        assert informer.wait_synced(5.0)
        calls = source.calls
        informer.request_resync()
        assert wait_for(lambda: source.calls > calls, timeout_s=1.0)
    finally:
        informer.stop(2.0)
    assert polled.is_set()


def test_first_node_triggers_an_immediate_pod_poll_after_a_failed_one() -> None:
    source = ScriptedPods(PodSourceError("kubelet address not known yet"), (pod("a", "u1"),))
    informer = StatesInformer(source, sync_interval_s=60.0, needs_node_slo=False)
    informer.start()
    try:
        assert wait_for(lambda: source.calls >= 1)
        informer.set_node(NodeInfo("node-1"))
        assert informer.wait_synced(3.0)  # not 60 s later
        assert [p.name for p in informer.pods()] == ["a"]
    finally:
        informer.stop(2.0)


def test_resync_request_with_follow_up_polls_twice() -> None:
    source = ScriptedPods((pod("a", "u1"),))
    informer = StatesInformer(source, sync_interval_s=60.0, needs_node=False, needs_node_slo=False)
    informer.start()
    try:
        assert informer.wait_synced(2.0)
        calls = source.calls
        informer.request_resync(follow_up_s=0.3)
        assert wait_for(lambda: source.calls >= calls + 2, timeout_s=2.0)
        settled = source.calls
        assert not wait_for(lambda: source.calls > settled, timeout_s=0.5)  # no polling storm after it
    finally:
        informer.stop(2.0)
