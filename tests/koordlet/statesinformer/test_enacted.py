"""The enacted amounts of a resize laid over the pod list until kubelet's status reports them."""

from __future__ import annotations

from koordlet.api.pod import ContainerMeta, PodMeta
from koordlet.statesinformer.enacted import EnactedResources
from wire import cri_pb2 as cri

OLD = ContainerMeta("app", "c1", requests={"cpu": 1000, "memory": 256 << 20, "kubernetes.io/batch-cpu": 5},
                    limits={"cpu": 1000, "memory": 512 << 20})
POD = PodMeta("web", "ns", "uid", containers=(OLD, ContainerMeta("side", "c2")))
RESIZED = cri.LinuxContainerResources(cpu_period=100000, cpu_quota=200000, cpu_shares=2048,
                                      memory_limit_in_bytes=1 << 30)


def test_nothing_recorded_gives_the_very_same_pods() -> None:
    pods = (POD,)
    assert EnactedResources().apply(pods) is pods


def test_a_recorded_resize_lies_over_the_container_until_the_status_reports_it() -> None:
    enacted = EnactedResources()
    enacted.record("c1", RESIZED)
    pods = (POD,)
    (pod,) = enacted.apply(pods)
    app = pod.containers[0]
    assert app.limits == {"cpu": 2000, "memory": 1 << 30}
    assert app.requests == {"cpu": 2000, "memory": 256 << 20, "kubernetes.io/batch-cpu": 5}  # memory: the status'
    assert pod.containers[1] is POD.containers[1]
    assert enacted.apply(pods) == (pod,)  # the same list: the same answer
    reported = PodMeta("web", "ns", "uid", containers=(ContainerMeta(
        "app", "c1", requests={"cpu": 2000, "memory": 256 << 20}, limits={"cpu": 2000, "memory": 1 << 30}),))
    assert enacted.apply((reported,)) == (reported,)
    assert len(enacted) == 0  # caught up: the record is gone


def test_a_record_kubelet_never_reports_expires() -> None:
    now = [0.0]
    enacted = EnactedResources(ttl_s=60, clock=lambda: now[0])
    enacted.record("c1", RESIZED)
    now[0] = 61.0
    assert enacted.apply((POD,)) == (POD,)
    assert len(enacted) == 0
