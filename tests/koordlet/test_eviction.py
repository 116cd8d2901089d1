"""The evictor against the test API server with the real kubernetes client: PDBs, Events, never non-BE."""

from __future__ import annotations

from dataclasses import replace

import kubernetes.client
import pytest

from koordlet.actuator import PlanRunner
from koordlet.api.eviction import opt_in_rule
from koordlet.api.keys import LABEL_EVICTION_ENABLED, LABEL_QOS_CLASS
from koordlet.api.pod import ContainerMeta, PodMeta
from koordlet.api.qos import KubeQoS
from koordlet.eviction import POD_EVICTION, POD_EVICTION_DETAIL, EvictionOutcome, Evictor, reason_for
from koordlet.executor import ResourceExecutor
from koordlet.kubeapi import CoreV1
from koordlet.metriccache import MetricCache, MetricKind, SeriesKey
from koordlet.qosmanager import QoSManager, QoSManagerConfig, cpuevict, memoryevict
from koordlet.qosmanager.snapshot import (
    BE_CPU_REAL_LIMIT_KEY,
    BE_CPU_REQUEST_KEY,
    BE_CPU_USAGE_KEY,
    SnapshotBuilder,
)
from koordlet.statesinformer.api import NodeInfo, StaticStates
from koordlet.system.cgroup import CgroupFS
from tests.koordlet.qosmanager.factory import seed_pod, spec
from tests.support.apiserver import ApiServer

GiB = 1 << 30


def _manager(states: StaticStates, builder: SnapshotBuilder, evictor: Evictor, strategy, clock: list[float],
             started_at: float | None = None, gates: tuple[str, ...] | None = None) -> QoSManager:
    """The QoS manager with one eviction strategy (its first gate on, or ``gates``), its plans carried out by a
    runner with ``evictor``."""
    config = QoSManagerConfig(node_name="node-1", started_at=started_at,
                              feature_gates=dict.fromkeys(gates or strategy.gates[:1], True))
    runner = PlanRunner(ResourceExecutor(CgroupFS("/nonexistent-root/sys/fs/cgroup")), evictor)
    return QoSManager(states, [strategy], config, wall_clock=lambda: clock[0], builder=builder, runner=runner)


class FakeClock:
    """Monotonic seconds the test moves by hand (the evictor's retry and evicting windows)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _evictions(server: ApiServer, name: str) -> int:
    return len(server.requests("POST", rf"/pods/{name}/eviction$"))


def test_be_pod_is_evicted_through_the_api_with_a_warning_event(
        server: ApiServer, api_client: kubernetes.client.ApiClient) -> None:
    pod = seed_pod(server, "job-0", "BE", "BestEffort")
    evictor = Evictor("node-1", api_client=api_client)
    before = POD_EVICTION.labels(node="node-1", reason=reason_for("BEMemoryEvict")).get()
    result = evictor.evict(pod, "BEMemoryEvict", "node memory usage 75% >= threshold 70%")
    assert result.outcome is EvictionOutcome.EVICTED
    assert server.get_object("pods", "job-0", "default") is None
    (event,) = server.list_objects("events", "default")
    assert event["type"] == "Warning" and event["reason"] == "BEMemoryEvict"
    assert "75%" in event["message"] and "70%" in event["message"]
    assert event["involvedObject"]["name"] == "job-0" and event["involvedObject"]["uid"] == pod.uid
    assert POD_EVICTION.labels(node="node-1", reason=reason_for("BEMemoryEvict")).get() == before + 1
    assert POD_EVICTION_DETAIL.labels(node="node-1", pod_namespace="default", pod_name="job-0",
                                      reason=reason_for("BEMemoryEvict")).get() >= 1
    assert evictor.is_evicting(pod.uid)
    assert evictor.evict(pod, "BEMemoryEvict", "again").outcome is EvictionOutcome.ALREADY_EVICTING
    assert _evictions(server, "job-0") == 1


def test_disruption_budget_429_keeps_the_pod_and_is_retried_later(
        server: ApiServer, api_client: kubernetes.client.ApiClient) -> None:
    pod = seed_pod(server, "job-0", "BE", "BestEffort")
    seed_pod(server, "job-1", "BE", "BestEffort")
    policy = kubernetes.client.PolicyV1Api(api_client)
    policy.create_namespaced_pod_disruption_budget("default", {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "batch-pdb"},
        "spec": {"selector": {"matchLabels": {"app": "batch"}}, "minAvailable": 2}})
    clock = FakeClock()
    evictor = Evictor("node-1", api_client=api_client, retry_after_s=5.0, clock=clock)
    assert evictor.evict(pod, "BECPUEvict", "satisfaction 0.3").outcome is EvictionOutcome.BLOCKED
    assert server.get_object("pods", "job-0", "default") is not None
    assert not server.list_objects("events", "default")
    clock.now += 1.0
    assert evictor.evict(pod, "BECPUEvict", "satisfaction 0.3").outcome is EvictionOutcome.BLOCKED
    assert _evictions(server, "job-0") == 1  # "not now": no second request inside the retry window
    policy.patch_namespaced_pod_disruption_budget("batch-pdb", "default", {"spec": {"minAvailable": 1}})
    clock.now += 5.0
    assert evictor.evict(pod, "BECPUEvict", "satisfaction 0.3").outcome is EvictionOutcome.EVICTED
    assert _evictions(server, "job-0") == 2
    assert server.get_object("pods", "job-0", "default") is None


def test_non_be_pod_is_never_evicted(server: ApiServer, api_client: kubernetes.client.ApiClient) -> None:
    pod = seed_pod(server, "web-0", "LS", "Burstable")
    evictor = Evictor("node-1", api_client=api_client)
    assert evictor.evict(pod, "BEMemoryEvict", "x").outcome is EvictionOutcome.NOT_BE
    assert _evictions(server, "web-0") == 0 and server.get_object("pods", "web-0", "default") is not None


def test_pod_is_checked_again_against_the_api_server(
        server: ApiServer, api_client: kubernetes.client.ApiClient) -> None:
    """A stale caller view that says BE does not evict a pod the API server knows as LS."""
    seed_pod(server, "web-0", "LS", "Burstable")
    live_uid = server.get_object("pods", "web-0", "default")["metadata"]["uid"]
    stale = PodMeta(name="web-0", namespace="default", uid=live_uid, labels={LABEL_QOS_CLASS: "BE"},
                    kube_qos=KubeQoS.BESTEFFORT)
    result = Evictor("node-1", api_client=api_client).evict(stale, "BEMemoryEvict", "x")
    assert result.outcome is EvictionOutcome.NOT_BE
    assert _evictions(server, "web-0") == 0


def test_evictor_needs_an_api_server_or_a_runtime() -> None:
    with pytest.raises(ValueError):
        Evictor("node-1")
    assert Evictor("node-1", cri_endpoint="/run/containerd/containerd.sock").uses_cri


def test_memory_evict_strategy_evicts_be_pods_in_order_and_rests(
        server: ApiServer, api_client: kubernetes.client.ApiClient) -> None:
    pods = (
        seed_pod(server, "web", "LS", "Burstable", app="web"),
        seed_pod(server, "big", "BE", "BestEffort"),
        seed_pod(server, "small", "BE", "BestEffort"),
    )
    uids = {p.name: p.uid for p in pods}
    node = NodeInfo("node-1", capacity={"cpu": 8000, "memory": 16 * GiB}, allocatable={"memory": 16 * GiB})
    states = StaticStates(node=node, node_slo=spec(), pods=pods)
    cache = MetricCache()
    now = 1000.0
    cache.append(SeriesKey.of(MetricKind.NODE_MEMORY_USAGE), now, 12 * GiB)  # 75 %: release 7 % = 1.12 GiB
    for name, used in (("web", 6 * GiB), ("big", 1 * GiB), ("small", GiB // 2)):
        cache.append(SeriesKey.of(MetricKind.POD_MEMORY_USAGE, pod_uid=uids[name]), now, used)
    clock = [now]
    manager = _manager(states, SnapshotBuilder(states, cache), Evictor("node-1", api_client=api_client),
                       memoryevict.STRATEGY, clock)
    assert manager.run_strategy("memoryevict")
    record = manager.last_record("memoryevict")
    assert record is not None and record.evicted == ("default/big", "default/small")
    assert server.get_object("pods", "web", "default") is not None
    assert _evictions(server, "web") == 0
    messages = [e["message"] for e in server.list_objects("events", "default")]
    assert any("75%" in m and "1073741824 bytes" in m for m in messages)
    server.clear_requests()
    cache.append(SeriesKey.of(MetricKind.NODE_MEMORY_USAGE), now + 1, 12 * GiB)
    clock[0] = now + 1
    assert manager.run_strategy("memoryevict")  # inside the 4 s cool-down
    assert not server.requests("POST")


@pytest.mark.containerd
def test_local_mode_kills_a_be_pods_containers_through_the_cri(containerd_socket: str) -> None:
    from tests.support.cri import CriClient, PodFactory
    from wire import cri_pb2 as cri

    client = CriClient(containerd_socket)
    factory = PodFactory(client)
    try:
        be_sid, be_cid, _ = factory.start_pod("evict-be", kube_qos="besteffort")
        ls_sid, ls_cid, _ = factory.start_pod("evict-ls", kube_qos="burstable")
        be = PodMeta(name="evict-be", namespace="default", uid="uid-evict-be", labels={LABEL_QOS_CLASS: "BE"},
                     kube_qos=KubeQoS.BESTEFFORT, sandbox_id=be_sid)
        ls = PodMeta(name="evict-ls", namespace="default", uid="uid-evict-ls", labels={LABEL_QOS_CLASS: "LS"},
                     kube_qos=KubeQoS.BURSTABLE, sandbox_id=ls_sid)
        evictor = Evictor("node-1", cri_endpoint=containerd_socket, pods=lambda: (be, ls))
        assert evictor.evict(ls, "BEMemoryEvict", "x").outcome is EvictionOutcome.NOT_BE
        assert evictor.evict(be, "BEMemoryEvict", "node memory 75%").outcome is EvictionOutcome.EVICTED

        def state(cid: str) -> int:
            request = cri.ContainerStatusRequest(container_id=cid)
            return client.runtime.ContainerStatus(request, timeout=10).status.state

        assert state(be_cid) == cri.CONTAINER_EXITED
        assert state(ls_cid) == cri.CONTAINER_RUNNING
    finally:
        factory.cleanup()
        client.close()


def _be_cpu_series(cache: MetricCache, start: float, end: float, usage: float, request: float, limit: float) -> None:
    t = start
    while t <= end:
        cache.append(BE_CPU_USAGE_KEY, t, usage)
        cache.append(BE_CPU_REQUEST_KEY, t, request)
        cache.append(BE_CPU_REAL_LIMIT_KEY, t, limit)
        t += 1.0


def test_cpu_evict_strategy_evicts_for_low_satisfaction_and_rests_after_start(
        server: ApiServer, api_client: kubernetes.client.ApiClient) -> None:
    big = replace(seed_pod(server, "big", "BE", "BestEffort"), priority=5000)
    small = replace(seed_pod(server, "small", "BE", "BestEffort"), priority=3000)
    web = seed_pod(server, "web", "LS", "Burstable", app="web")
    big = replace(big, containers=(ContainerMeta("m", requests={"kubernetes.io/batch-cpu": 3000}),))
    small = replace(small, containers=(ContainerMeta("m", requests={"kubernetes.io/batch-cpu": 1000}),))
    node = NodeInfo("node-1", capacity={"cpu": 8000, "memory": 16 * GiB})
    slo = spec(cpuEvictBESatisfactionUpperPercent=80, cpuEvictBESatisfactionLowerPercent=50,
               cpuEvictTimeWindowSeconds=30)
    states = StaticStates(node=node, node_slo=slo, pods=(web, big, small))
    cache = MetricCache()
    _be_cpu_series(cache, 970.0, 1000.0, usage=1450.0, request=4000.0, limit=1500.0)
    builder = SnapshotBuilder(states, cache)
    evictor = Evictor("node-1", api_client=api_client)
    clock = [1000.0]
    just_started = _manager(states, builder, evictor, cpuevict.STRATEGY, clock, started_at=990.0)
    assert just_started.run_strategy("cpuevict")  # within 20 s of the start
    plan = just_started.last_plan("cpuevict")
    assert plan is not None and plan.report is None and not plan.evictions and not server.requests("POST")
    manager = _manager(states, builder, evictor, cpuevict.STRATEGY, clock, started_at=900.0)
    assert manager.run_strategy("cpuevict")
    # release = 4000 × (0.8 − 1500/4000) = 1700m: small (prio 3000, 1000m) then big (3000m)
    plan = manager.last_plan("cpuevict")
    assert plan is not None and plan.report["BECPUEvict"].release_milli == pytest.approx(1700)
    record = manager.last_record("cpuevict")
    assert record is not None and record.evicted == ("default/small", "default/big")
    assert _evictions(server, "web") == 0
    reasons = {e["reason"] for e in server.list_objects("events", "default")}
    assert reasons == {"BECPUEvict"}


def test_an_unreachable_api_server_fails_the_eviction_cleanly() -> None:
    import kubernetes

    from koordlet.eviction import EvictionOutcome, Evictor

    config = kubernetes.client.Configuration()
    config.host = "http://127.0.0.1:9"  # discard port: nothing listens
    config.retries = 0
    api_client = kubernetes.client.ApiClient(config)
    try:
        evictor = Evictor("node-1", api_client=api_client)
        result = evictor._evict_by_api(_unreachable_pod(), "BEMemoryEvict", "test")
        assert result.outcome is EvictionOutcome.FAILED and "unreachable" in result.detail
    finally:
        api_client.close()


def _unreachable_pod():
    from koordlet.api.pod import PodMeta

    return PodMeta(name="p", namespace="default", uid="u", labels={"koordinator.sh/qosClass": "BE"})


def _seed_opted(server: ApiServer, name: str, qos: str, kube_qos: str, priority: int, opted: bool) -> PodMeta:
    labels = {"app": name, LABEL_QOS_CLASS: qos, **({LABEL_EVICTION_ENABLED: "true"} if opted else {})}
    obj = server.seed({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        "spec": {"nodeName": "node-1", "priority": priority,
                 "containers": [{"name": "main", "image": "localhost/busybox"}]},
        "status": {"phase": "Running", "qosClass": kube_qos},
    })
    return PodMeta(name=name, namespace="default", uid=obj["metadata"]["uid"], labels=labels,
                   kube_qos=KubeQoS(kube_qos), priority=priority, phase="Running")


def test_memory_evict_takes_an_opted_in_ls_pod_through_the_api_and_never_the_others(
        server: ApiServer, api_client: kubernetes.client.ApiClient) -> None:
    """MemoryEvict (the opt-in feature): an LS pod labelled eviction-enabled at or below the priority threshold is
    evicted through the Eviction API (PDBs hold); an LS pod without the label and one above the threshold stay."""
    opted = _seed_opted(server, "cache", "LS", "Burstable", 7100, opted=True)
    plain = _seed_opted(server, "web", "LS", "Burstable", 7100, opted=False)
    high = _seed_opted(server, "db", "LS", "Burstable", 9500, opted=True)
    node = NodeInfo("node-1", capacity={"cpu": 8000, "memory": 16 * GiB}, allocatable={"memory": 16 * GiB})
    states = StaticStates(node=node, node_slo=spec(evictEnabledPriorityThreshold=7999),
                          pods=(opted, plain, high))
    cache = MetricCache()
    now = 1000.0
    cache.append(SeriesKey.of(MetricKind.NODE_MEMORY_USAGE), now, 12 * GiB)  # 75 %: release 7 % = 1.12 GiB
    for pod, used in ((opted, 1 * GiB), (plain, 6 * GiB), (high, 3 * GiB)):
        cache.append(SeriesKey.of(MetricKind.POD_MEMORY_USAGE, pod_uid=pod.uid), now, used)
    manager = _manager(states, SnapshotBuilder(states, cache), Evictor("node-1", api_client=api_client),
                       memoryevict.STRATEGY, [now], gates=("MemoryEvict",))
    assert manager.run_strategy("memoryevict")
    record = manager.last_record("memoryevict")
    assert record is not None and record.evicted == ("default/cache",)
    assert dict(record.released) == {"MemoryEvict": float(GiB)}  # all there was to take
    assert _evictions(server, "web") == 0 and _evictions(server, "db") == 0
    (event,) = server.list_objects("events", "default")
    assert event["reason"] == "MemoryEvict" and "75%" in event["message"]
    assert f"this pod uses {GiB} bytes" in event["message"]


def test_an_opted_in_pod_that_opted_out_since_is_not_evicted(
        server: ApiServer, api_client: kubernetes.client.ApiClient) -> None:
    """The evictor checks the rule again on the API server's object: a label removed since the pods were listed
    keeps the pod."""
    stale = _seed_opted(server, "cache", "LS", "Burstable", 7100, opted=True)
    CoreV1(api_client).patch_namespaced_pod("cache", "default",
                                            {"metadata": {"labels": {LABEL_EVICTION_ENABLED: None}}})
    result = Evictor("node-1", api_client=api_client).evict(stale, "MemoryEvict", "x",
                                                            opt_in_rule("MemoryEvict", 7999))
    assert result.outcome is EvictionOutcome.NOT_BE and "eviction-enabled" in result.detail
    assert _evictions(server, "cache") == 0
