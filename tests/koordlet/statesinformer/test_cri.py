"""CriPodSource against the project's real containerd (pods made through tests.support.cri)."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from pathlib import Path

import pytest

from koordlet.api.qos import KubeQoS, QoSClass
from koordlet.statesinformer.cgroups import pod_cgroups
from koordlet.statesinformer.cri import CriPodSource
from koordlet.statesinformer.informer import PodSourceError
from koordlet.system.cgroup import CgroupDriver
from koordlet.system.kubepods import KubeCgroupLayout
from tests.support.containerd import CGROUP_ROOT
from tests.support.cri import CriClient, PodFactory
from wire import cri_pb2 as cri


@pytest.fixture
def factory(containerd_socket: str) -> Iterator[PodFactory]:
    client = CriClient(containerd_socket)
    pods = PodFactory(client)
    try:
        yield pods
    finally:
        pods.cleanup()
        client.close()


@pytest.mark.containerd
def test_pods_listed_from_cri_with_cgroup_parent_and_resources(containerd_socket: str, factory: PodFactory) -> None:
    be_sid, be_cid, be_config = factory.start_pod("si-be", labels={"koordinator.sh/qosClass": "BE"})
    ls_sid, ls_cid, ls_config = factory.start_pod(
        "si-ls", kube_qos="burstable",
        resources=cri.LinuxContainerResources(cpu_period=100000, cpu_quota=50000, cpu_shares=512,
                                              memory_limit_in_bytes=64 << 20))
    source = CriPodSource(containerd_socket)
    try:
        pods = {p.sandbox_id: p for p in source.list_pods()}
        be, ls = pods[be_sid], pods[ls_sid]
        assert be.uid == be_config.metadata.uid and be.name == "si-be" and be.namespace == "default"
        assert be.cgroup_parent == f"{CGROUP_ROOT}/kubepods/besteffort/pod{be.uid}"
        assert be.kube_qos is KubeQoS.BESTEFFORT and be.qos_class is QoSClass.BE
        assert [c.container_id for c in be.containers] == [be_cid]
        # NODE-network sandboxes: containerd reports the host's IP or none; either way at most one valid address.
        assert len(be.ips) <= 1 and all(ipaddress.ip_address(ip) for ip in be.ips)
        assert be.containers[0].requests == {} and be.containers[0].limits == {}
        assert ls.kube_qos is KubeQoS.BURSTABLE and ls.qos_class is QoSClass.LS
        (ctr,) = ls.containers
        assert ctr.container_id == ls_cid and ctr.name == "si-ls"
        assert ctr.limits == {"cpu": 500, "memory": 64 << 20} and ctr.requests == {"cpu": 500}
        # No memory or batch requests in the Linux resources: the pods say they do not know them.
        assert not be.requests_known and not ls.requests_known
        # The collectors' view: pod and container dirs under kubelet's --cgroup-root.
        layout = KubeCgroupLayout(CgroupDriver.CGROUPFS, CGROUP_ROOT)
        cgroups = {c.pod_uid: c for c in pod_cgroups([be, ls], layout)}
        pod_dir = f"{CGROUP_ROOT.lstrip('/')}/kubepods/besteffort/pod{be.uid}"
        assert cgroups[be.uid].cgroup_dir == pod_dir
        assert cgroups[be.uid].containers[0].cgroup_dir == f"{pod_dir}/{be_cid}"
        assert Path("/sys/fs/cgroup/cpu", cgroups[be.uid].containers[0].cgroup_dir).is_dir()
        assert cgroups[be.uid].qos == "BE" and cgroups[ls.uid].qos == "LS"
        # A removed pod is gone at the next listing, and so is its cached status.
        factory.cleanup()
        assert be_sid not in {p.sandbox_id for p in source.list_pods()}
        assert be_sid not in source._sandboxes
    finally:
        source.close()


def test_unreachable_runtime_is_a_pod_source_error(tmp_path: Path) -> None:
    source = CriPodSource(str(tmp_path / "no.sock"), timeout_s=0.5)
    try:
        with pytest.raises(PodSourceError, match="CRI pod listing failed"):
            source.list_pods()
    finally:
        source.close()


@pytest.mark.containerd
def test_a_resize_through_update_container_resources_is_seen_at_the_next_listing(
        containerd_socket: str, factory: PodFactory) -> None:
    """kubelet resizes a running container in place with UpdateContainerResources; local mode's pod list must show
    the new amounts, not the creation config it cached. containerd reports them in ContainerStatus.status.resources
    on every generation here (1.6.20 too)."""
    sid, cid, _ = factory.start_pod(
        "si-resize", kube_qos="burstable",
        resources=cri.LinuxContainerResources(cpu_period=100000, cpu_quota=50000, cpu_shares=512,
                                              memory_limit_in_bytes=64 << 20))
    source = CriPodSource(containerd_socket)
    try:
        (before,) = next(p for p in source.list_pods() if p.sandbox_id == sid).containers
        assert before.limits == {"cpu": 500, "memory": 64 << 20}
        factory.client.runtime.UpdateContainerResources(cri.UpdateContainerResourcesRequest(
            container_id=cid, linux=cri.LinuxContainerResources(cpu_period=100000, cpu_quota=150000, cpu_shares=1536,
                                                                memory_limit_in_bytes=128 << 20)), timeout=30)
        (after,) = next(p for p in source.list_pods() if p.sandbox_id == sid).containers
        assert after.limits == {"cpu": 1500, "memory": 128 << 20} and after.requests == {"cpu": 1500}
    finally:
        source.close()
