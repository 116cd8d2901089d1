"""koordlet as an NRI plugin on a real cgroup v2 kernel, in the VM stage of `make test`: containerd 2.1.9 with NRI
on, no proxy, pods started straight on its CRI, the hook values read back from the v2 files. In the systemd
guest (``KPY_CGROUP_DRIVER=systemd``, ``CTRD_SYSTEMD_CGROUP=1``) that is the stack a current node runs:
cgroup v2, containerd's and kubelet's systemd driver (``kubepods.slice/.../cri-containerd-<id>.scope``) and
containerd 2.x; in the cgroupfs guest the same on the cgroupfs layout. The containerd is the guest session's (it
serves NRI in a guest: tests/support/v2stack.py); koordlet registers as its NRI plugin for this module's tests only,
so the proxy's pods of other modules never meet it. Every test here runs in the guest only (``cgroupv2``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from koordlet.api.qos import KubeQoS
from koordlet.runtimehooks import RuntimeHooks
from koordlet.system.resources import cpu_shares_to_weight
from tests.support.cri import CriClient, PodFactory, container_config
from tests.support.nri import oci_spec
from tests.support.v2stack import STARTUP_TIMEOUT_S, V2, V2Stack, kubelet_sandbox, pod_dirs
from tests.support.waiting import wait_for
from wire import cri_pb2 as cri

pytestmark = [pytest.mark.cgroupv2, pytest.mark.containerd]

MiB = 1 << 20
SPEC = {"containers": {"job": {"requests": {"kubernetes.io/batch-cpu": "500", "kubernetes.io/batch-memory": "64Mi"},
                               "limits": {"kubernetes.io/batch-cpu": "1500", "kubernetes.io/batch-memory": "96Mi"}}}}
BE_LABELS = {"koordinator.sh/qosClass": "BE"}
BE_ANNOTATIONS = {"node.koordinator.sh/extended-resource-spec": json.dumps(SPEC)}


@pytest.fixture(scope="module")
def koordlet(v2_stack: V2Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RuntimeHooks]:
    """koordlet's hooks registered as an NRI plugin of the session's containerd, for this module's tests."""
    with v2_stack.nri_plugin(tmp_path_factory.mktemp("nri-koordlet")) as hooks:
        yield hooks


@pytest.fixture()
def client(v2_stack: V2Stack, koordlet: RuntimeHooks) -> Iterator[CriClient]:
    """containerd's own CRI, as kubelet calls it on a node without the proxy."""
    client = CriClient(v2_stack.containerd_socket)
    try:
        yield client
    finally:
        client.close()


def test_v2_nri_be_pod_gets_its_batch_values_in_the_v2_files_and_an_update_lands(client: CriClient) -> None:
    pods = PodFactory(client)
    try:
        sandbox = kubelet_sandbox("job", KubeQoS.BESTEFFORT, BE_LABELS, BE_ANNOTATIONS)
        sid = pods.run_pod(sandbox, timeout=STARTUP_TIMEOUT_S)
        cid = pods.create_container(sid, sandbox, container_config("job"), timeout=STARTUP_TIMEOUT_S)
        client.runtime.StartContainer(cri.StartContainerRequest(container_id=cid), timeout=STARTUP_TIMEOUT_S)
        pod_dir, container_dir = pod_dirs(sandbox, cid)
        read = lambda d, name: (d / name).read_text().strip()  # noqa: E731
        # the CreateContainer adjustment, as runc wrote it on v2: shares 512 as weight, quota, memory limit
        assert read(container_dir, "cpu.weight") == str(cpu_shares_to_weight(512))
        assert read(container_dir, "cpu.max") == "150000 100000"
        assert read(container_dir, "memory.max") == str(96 * MiB)
        assert oci_spec(client, cid)["linux"]["resources"]["cpu"]["shares"] == 512
        # RunPodSandbox: the pod level, written by koordlet's executor through its v2 names
        assert wait_for(lambda: read(pod_dir, "cpu.max") == "150000 100000", 5)
        assert read(pod_dir, "memory.max") == str(96 * MiB)
        # UpdateContainerResources through NRI: kubelet asks for more, the BE pod's batch values still win
        client.runtime.UpdateContainerResources(cri.UpdateContainerResourcesRequest(
            container_id=cid, linux=cri.LinuxContainerResources(cpu_shares=1024, cpu_quota=300000, cpu_period=100000,
                                                                memory_limit_in_bytes=1 << 30)),
            timeout=STARTUP_TIMEOUT_S)
        assert read(container_dir, "cpu.max") == "150000 100000"
        assert read(container_dir, "memory.max") == str(96 * MiB)
    finally:
        pods.cleanup()


def test_v2_nri_bound_ls_pod_gets_its_cpuset_and_no_quota(client: CriClient) -> None:
    pods = PodFactory(client)
    try:
        online = (V2 / "cpuset.cpus.effective").read_text().strip()
        cpus = "1" if online not in ("0", "") else "0"
        sandbox = kubelet_sandbox("app", KubeQoS.BURSTABLE, {"koordinator.sh/qosClass": "LS"},
                           {"scheduling.koordinator.sh/resource-status": json.dumps({"cpuset": cpus})})
        sid = pods.run_pod(sandbox, timeout=STARTUP_TIMEOUT_S)
        resources = cri.LinuxContainerResources(cpu_period=100000, cpu_quota=200000, cpu_shares=1024)
        cid = pods.create_container(sid, sandbox, container_config("app", resources=resources),
                                    timeout=STARTUP_TIMEOUT_S)
        client.runtime.StartContainer(cri.StartContainerRequest(container_id=cid), timeout=STARTUP_TIMEOUT_S)
        _, container_dir = pod_dirs(sandbox, cid)
        assert (container_dir / "cpuset.cpus").read_text().strip() == cpus
        assert (container_dir / "cpu.max").read_text().strip() == "max 100000"  # bound: not throttled
    finally:
        pods.cleanup()
