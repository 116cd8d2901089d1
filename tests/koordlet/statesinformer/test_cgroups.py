"""Where the collectors look: pod dirs and NodeSLO host applications' cgroupPath, for both drivers; the pod
source the collectors ask every second, built from the informer's pods once per change."""

from __future__ import annotations

import pytest

from koordlet.api.nodeslo import NodeSLOError, parse_node_slo_spec
from koordlet.api.pod import ContainerMeta, PodMeta
from koordlet.api.qos import KubeQoS
from koordlet.metricsadvisor.pods import HostAppCgroup
from koordlet.statesinformer.cgroups import host_app_cgroups, pod_cgroup_source
from koordlet.system.cgroup import CgroupDriver
from koordlet.system.kubepods import KubeCgroupLayout


def _apps(*paths: dict) -> list[dict]:
    return [{"name": f"app{i}", "qos": "LS", "cgroupPath": path} for i, path in enumerate(paths)]


@pytest.mark.parametrize(("driver", "root", "expected"), [
    (CgroupDriver.CGROUPFS, "/", ["host-latency-sensitive/nginx", "kubepods/agents/sidecar",
                                  "kubepods/burstable/agents", "kubepods/besteffort/batch/sweeper"]),
    (CgroupDriver.SYSTEMD, "/", ["host-latency-sensitive/nginx", "kubepods.slice/agents/sidecar",
                                 "kubepods.slice/kubepods-burstable.slice/agents",
                                 "kubepods.slice/kubepods-besteffort.slice/batch/sweeper"]),
    (CgroupDriver.CGROUPFS, "/custom-root", ["host-latency-sensitive/nginx", "custom-root/kubepods/agents/sidecar",
                                             "custom-root/kubepods/burstable/agents",
                                             "custom-root/kubepods/besteffort/batch/sweeper"]),
])
def test_host_application_cgroup_path_per_base_and_driver(driver: CgroupDriver, root: str,
                                                           expected: list[str]) -> None:
    spec = parse_node_slo_spec({"hostApplications": _apps(
        {"base": "CgroupRoot", "parentDir": "host-latency-sensitive", "relativePath": "nginx"},
        {"base": "Kubepods", "parentDir": "agents", "relativePath": "sidecar"},
        {"base": "KubepodsBurstable", "relativePath": "/agents/"},
        {"base": "KubepodsBesteffort", "parentDir": "batch", "relativePath": "sweeper"},
    ) + [{"name": "no-path", "qos": "LS"}, {"name": "empty", "cgroupPath": {"base": "CgroupRoot"}}]})
    got = host_app_cgroups(spec, KubeCgroupLayout(driver, root))
    assert got == [HostAppCgroup(f"app{i}", rel) for i, rel in enumerate(expected)]


@pytest.mark.parametrize("bad", ["../etc", "host/../../etc", "a\x00b"])
def test_a_path_that_climbs_out_is_refused_with_the_field_named(bad: str) -> None:
    with pytest.raises(NodeSLOError, match="cgroupPath: relativePath: must be a plain relative path"):
        parse_node_slo_spec({"hostApplications": _apps({"relativePath": bad})})


def _pod(uid: str, container_id: str, qos: KubeQoS = KubeQoS.BURSTABLE) -> PodMeta:
    return PodMeta(name=uid, namespace="default", uid=uid, kube_qos=qos,
                   containers=(ContainerMeta("c", container_id),))


def test_dirs_are_built_again_only_when_the_informer_publishes_new_pods() -> None:
    layout = KubeCgroupLayout(CgroupDriver.CGROUPFS, "/")
    published = [(_pod("u1", "c1"),)]
    calls = [0]

    def pods() -> tuple[PodMeta, ...]:
        calls[0] += 1
        return published[0]

    source = pod_cgroup_source(pods, layout)
    first = source()
    assert [(p.pod_uid, p.cgroup_dir, p.containers[0].cgroup_dir) for p in first] == [
        ("u1", "kubepods/burstable/podu1", "kubepods/burstable/podu1/c1")]
    assert source() is first  # the same pods: the same (immutable) dirs, nothing rebuilt
    # A sync publishes a new tuple, even with an equal pod: built again, and a new pod is seen at once.
    published[0] = (_pod("u1", "c1"), _pod("u2", "c2", KubeQoS.BESTEFFORT))
    second = source()
    assert second is not first
    assert [p.cgroup_dir for p in second] == ["kubepods/burstable/podu1", "kubepods/besteffort/podu2"]
    published[0] = ()
    assert source() == ()
    assert calls[0] == 4  # the informer is asked every time; only the building is saved
