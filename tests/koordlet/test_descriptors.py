"""No descriptor of koordlet's outlives its pod: the files it keeps open between ticks (the pod and PSI collectors'
cgroup files, the executor's kept reads of the QoS snapshot) pin a removed cgroup's memory in the kernel, so they are
closed as soon as the pod (or the container) leaves the states, not at a later tick or an idle sweep. On real
cgroups: v1 on this host, v2 in the VM stage."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import replace

import pytest

from koordlet.api.pod import ContainerMeta
from koordlet.api.qos import KubeQoS, QoSClass
from koordlet.metriccache import MetricCache
from koordlet.metricsadvisor import CollectorRunner, PodPsiCollector, PodResourceCollector
from koordlet.statesinformer.cgroups import close_with_pods, pod_cgroup_source
from tests.koordlet.qosmanager.realnode import BOTH_VERSIONS, RealNode

PODS = (("gone", QoSClass.BE, KubeQoS.BESTEFFORT), ("stays", QoSClass.LS, KubeQoS.BURSTABLE))


@pytest.fixture(params=BOTH_VERSIONS)
def node(request: pytest.FixtureRequest) -> Iterator[RealNode]:
    yield from RealNode.of_version_closed_after(request.param, "descriptors", PODS)


def _ours_into(directory: str) -> list[str]:
    """The files under ``directory`` this process holds open (by /proc/self/fd)."""
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed meanwhile (the listing's own descriptor)
        if target.startswith(directory.rstrip("/") + "/"):
            held.append(target)
    return held


def test_the_descriptors_of_a_pod_close_as_soon_as_it_leaves_the_states(node: RealNode) -> None:
    gone_dir = node.add_container("gone", ContainerMeta("job", container_id="a" * 12))
    node.add_container("stays", ContainerMeta("web", container_id="b" * 12))
    source = pod_cgroup_source(node.states.pods, node.layout)
    collectors = [PodResourceCollector(source, node.fs, interval_s=1.0), PodPsiCollector(source, node.fs, 10.0)]
    runner = CollectorRunner(MetricCache(), collectors)
    close_with_pods(node.states, node.layout, (runner.forget_dirs, node.executor.forget_reads))
    try:
        for name in ("pod_resource", "pod_psi"):
            runner.run_collector(name)
        pod_dir = node.pod_dir(node.pod("gone"))
        for pod in node.pods:  # what the QoS snapshot reads every tick
            node.executor.read("memory.stat", node.pod_dir(pod), every_tick=True)
        node.executor.read("cpu.shares", gone_dir, every_tick=True)
        places = [node.fs.cgroup_dir(controller, pod_dir) for controller in ("cpu", "cpuacct", "memory")]
        assert any(_ours_into(place) for place in places)  # held between ticks, as they should be while it runs

        # kubelet removes the pod's cgroups, then the pod leaves the states: nothing of ours points there any more
        for place in places:
            if os.path.isdir(os.path.join(place, "a" * 12)):
                os.rmdir(os.path.join(place, "a" * 12))
            if os.path.isdir(place):
                os.rmdir(place)
        node.states.set_pods([pod for pod in node.states.pods() if pod.name != "gone"])
        assert [path for place in places for path in _ours_into(place)] == []
        stays = node.fs.cgroup_dir("memory", node.pod_dir(node.pod("stays")))
        assert _ours_into(stays)  # the pod that runs on keeps its descriptors

        # a container of it goes the same way: its cgroup removed, then it leaves the states
        container = os.path.join(node.pod_dir(node.pod("stays")), "b" * 12)
        assert _ours_into(node.fs.cgroup_dir("memory", container))
        for controller in ("cpu", "cpuacct", "memory"):
            if os.path.isdir(node.fs.cgroup_dir(controller, container)):
                os.rmdir(node.fs.cgroup_dir(controller, container))
        node.states.set_pods([replace(pod, containers=()) for pod in node.states.pods()])
        assert [path for c in ("cpu", "cpuacct", "memory") for path in _ours_into(node.fs.cgroup_dir(c, container))] \
            == []
        assert _ours_into(stays)
    finally:
        runner.stop()
        for collector in collectors:
            collector.close()
