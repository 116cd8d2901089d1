"""Plugin results onto a hook answer's CRI resources: a container answer takes all of them, a pod sandbox
answer shares, quota and the memory limit only."""

from __future__ import annotations

from hooks.protocol import Changes, ContainerResources
from koordlet.api.pod import ContainerMeta, PodMeta
from koordlet.runtimehooks.apply import apply_to_container_response, apply_to_resources, container_context_from_meta
from wire import hookapi_pb2 as hookapi

CHANGES = Changes(cpu_shares=2, cfs_quota_us=50_000, cpuset_cpus="0-1", memory_limit_bytes=-1, envs={"A": "1"})


def test_a_container_answer_takes_every_setting_and_a_period_for_its_quota() -> None:
    resp = hookapi.ContainerResourceHookResponse()
    apply_to_container_response(CHANGES, resp)
    r = resp.container_resources
    assert (r.cpu_shares, r.cpu_quota, r.cpu_period, r.cpuset_cpus, r.memory_limit_in_bytes) == \
        (2, 50_000, 100_000, "0-1", -1)
    assert dict(resp.container_envs) == {"A": "1"}


def test_a_pod_sandbox_answer_takes_no_cpuset_and_no_period() -> None:
    r = hookapi.LinuxContainerResources()
    apply_to_resources(CHANGES, r, container=False)
    assert (r.cpu_shares, r.cpu_quota, r.cpu_period, r.cpuset_cpus, r.memory_limit_in_bytes) == (2, 50_000, 0, "", -1)


def test_no_opinion_leaves_the_answer_as_it_was() -> None:
    r = hookapi.LinuxContainerResources(cpu_shares=1024, cpu_quota=-1, cpuset_cpus="3")
    apply_to_resources(Changes(), r)
    assert (r.cpu_shares, r.cpu_quota, r.cpuset_cpus) == (1024, -1, "3")


def test_the_reconciler_sees_a_container_without_limits_with_its_pod_level_ones() -> None:
    """kubelet gives such a container the pod-level cpu and memory limits (getCPULimit/getMemoryLimit): the plugins
    that read the container's quota (CPU normalization) must see that quota, not "unlimited"."""
    pod = PodMeta("p", "ns", "uid", containers=(ContainerMeta("app", "c" * 64), ContainerMeta("own", "d" * 64,
                                                                                             limits={"cpu": 500})),
                  pod_requests={"cpu": 1000}, pod_limits={"cpu": 2000, "memory": 1 << 30})
    app, own = (container_context_from_meta(pod, c) for c in pod.containers)
    assert app.resources == ContainerResources(cfs_quota_us=200000, memory_limit_bytes=1 << 30)
    assert own.resources == ContainerResources(cfs_quota_us=50000, memory_limit_bytes=1 << 30)
