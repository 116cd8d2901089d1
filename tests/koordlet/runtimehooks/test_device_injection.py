"""Devices and mounts of the hook plugins through the proxy and through NRI onto real containerd and runc
(Koordinator gives them through NRI only): a pod the scheduler gave an RDMA PF and a HAMi-core GPU share starts with
``/dev/infiniband/rdma_cm`` and the PF's ``uverbs`` device (``RDMADeviceInject``; the RDMA functions from a
sysfs laid out as the mlx5 driver writes it), HAMi-core's library and lock dir mounted, and its usage region
written where HAMi's vGPU monitor reads it on the host (``HamiCoreVGPUMonitor``).

This machine has no RDMA device: the host's ``/dev/infiniband/{rdma_cm,uverbs0}`` are made for the test as
character devices with the numbers of ``/dev/null`` and ``/dev/zero`` (and removed after), which is all
containerd needs to hand a device to a container."""

from __future__ import annotations

import json
import os
import shutil
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from koordlet.api.nodeslo import default_node_slo_spec
from koordlet.executor import ResourceExecutor
from koordlet.runtimehooks import RuntimeHooks, RuntimeHooksConfig
from koordlet.runtimehooks.nri import NriConfig
from koordlet.statesinformer.api import NodeInfo, StaticStates
from koordlet.system.cgroup import CgroupFS
from koordlet.system.kubepods import KubeCgroupLayout
from tests.koordlet.system.rdma_tree import PF0, rdma_tree
from tests.support.containerd import CGROUP_ROOT
from tests.support.cri import CriClient, PodFactory, container_config, sandbox_config
from tests.support.nri import NriContainerd, clean_up_dead_instances
from tests.support.proxy import ProxyProcess
from wire import cri_pb2 as cri

pytestmark = [pytest.mark.containerd, pytest.mark.cgroupv1]

UID = "0c1d2e3f-4a5b-4c6d-8e7f-8091a2b3c4d5"
GATES = {"RDMADeviceInject": True, "GPUEnvInject": True, "HamiCoreVGPUMonitor": True}


@pytest.fixture
def host_rdma_nodes() -> Iterator[None]:
    """/dev/infiniband/rdma_cm (1:3) and uverbs0 (1:5) on the host, for as long as the test runs."""
    base = Path("/dev/infiniband")
    if base.exists():
        pytest.skip("this host has /dev/infiniband: not touching a real RDMA node's devices")
    base.mkdir()
    try:
        os.mknod(base / "rdma_cm", 0o20666, os.makedev(1, 3))
        os.mknod(base / "uverbs0", 0o20666, os.makedev(1, 5))
        yield
    finally:
        shutil.rmtree(base)


@pytest.fixture
def vgpu_lock() -> Iterator[None]:
    lock = Path("/tmp/vgpulock")
    made = not lock.exists()
    lock.mkdir(exist_ok=True)
    try:
        yield
    finally:
        if made:
            shutil.rmtree(lock, ignore_errors=True)


def _hooks(tmp_path: Path, nri: NriConfig | None = None) -> tuple[RuntimeHooks, Path]:
    sys_dir, _ = rdma_tree(tmp_path / "node", dev_nodes=False)
    library = tmp_path / "vgpu" / "libvgpu.so"
    library.parent.mkdir()
    library.write_text("HAMi-core stands in here\n")
    config = RuntimeHooksConfig(socket_path=str(tmp_path / "koordlet.sock"),
                                host_endpoint=str(tmp_path / "koordlet.sock"),
                                config_dir=str(tmp_path / "hookserver.d"), reconcile_interval_s=60.0,
                                feature_gates=GATES, sys_dir=sys_dir, dev_dir="/dev",
                                hami_core_library=str(library), serve_hooks=nri is None, nri=nri)
    states = StaticStates(node=NodeInfo("n1"), node_slo=default_node_slo_spec())
    hooks = RuntimeHooks(config, states, ResourceExecutor(CgroupFS()), KubeCgroupLayout(cgroup_root=CGROUP_ROOT))
    return hooks, library


@pytest.fixture
def stack(containerd_socket: str, tmp_path: Path, host_rdma_nodes: None, vgpu_lock: None) -> Iterator[tuple]:
    hooks, library = _hooks(tmp_path)
    hooks.start()
    proxy = ProxyProcess(str(tmp_path / "proxy.sock"), containerd_socket, state_dir=str(tmp_path)).start()
    client = CriClient(proxy.listen)
    pods = PodFactory(client)
    try:
        yield pods, library
    finally:
        pods.cleanup()
        client.close()
        proxy.terminate()
        hooks.stop()


@pytest.fixture
def nri_stack(tmp_path: Path, host_rdma_nodes: None, vgpu_lock: None) -> Iterator[tuple]:
    """koordlet as the NRI plugin of containerd 2.1, no proxy: kubelet's calls go to containerd directly."""
    clean_up_dead_instances()
    runtime = NriContainerd.for_process("2.1", instance="devices").up()
    hooks, library = _hooks(tmp_path, NriConfig(socket_path=runtime.nri_socket, socket_poll_s=0.2))
    client = CriClient(runtime.socket)
    pods = PodFactory(client)
    try:
        hooks.start()
        assert hooks.nri is not None and hooks.nri.registered.wait(15), "koordlet did not register with NRI"
        yield pods, library
    finally:
        pods.cleanup()
        client.close()
        hooks.stop()
        runtime.down()


def test_rdma_devices_and_hami_core_mounts_reach_the_container_through_the_proxy(stack: tuple) -> None:
    _devices_and_mounts_reach_the_container(*stack)


def test_rdma_devices_and_hami_core_mounts_reach_the_container_through_nri(nri_stack: tuple) -> None:
    _devices_and_mounts_reach_the_container(*nri_stack)


def _devices_and_mounts_reach_the_container(pods: PodFactory, library: Path) -> None:
    allocated = {"gpu": [{"minor": 0, "resources": {"koordinator.sh/gpu-core": "30",
                                                    "koordinator.sh/gpu-memory-ratio": "25",
                                                    "koordinator.sh/gpu-memory": "4Gi"}}],
                 "rdma": [{"minor": 0, "id": PF0, "resources": {"koordinator.sh/rdma": "100"}}]}
    sandbox = sandbox_config("trainer", uid=UID, annotations={
        "scheduling.koordinator.sh/device-allocated": json.dumps(allocated)},
        labels={"koordinator.sh/gpu-isolation-provider": "HAMi-core"})
    sid = pods.run_pod(sandbox)
    # What HAMi-core does in the container: write its usage region to $CUDA_DEVICE_MEMORY_SHARED_CACHE; and
    # what the devices look like from inside.
    script = ("stat -c '%F %t:%T' /dev/infiniband/rdma_cm /dev/infiniband/uverbs0"
              " > \"$CUDA_DEVICE_MEMORY_SHARED_CACHE\""
              f" && cat {library} >> \"$CUDA_DEVICE_MEMORY_SHARED_CACHE\""
              " && echo \"$CUDA_DEVICE_MEMORY_LIMIT $CUDA_DEVICE_SM_LIMIT $NVIDIA_VISIBLE_DEVICES\""
              " >> \"$CUDA_DEVICE_MEMORY_SHARED_CACHE\" && test -d /tmp/vgpulock && sleep 3600")
    cid = pods.create_container(sid, sandbox, container_config("main", command=["sh", "-c", script]))
    pods.client.runtime.StartContainer(cri.StartContainerRequest(container_id=cid), timeout=60)
    region = library.parent / "containers" / f"{UID}_main" / f"{UID}_main.cache"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (region.exists() and len(region.read_text().splitlines()) >= 4):
        time.sleep(0.2)
    lines = region.read_text().splitlines()
    assert lines[:2] == ["character special file 1:3", "character special file 1:5"]  # rdma_cm, uverbs0
    assert lines[2] == "HAMi-core stands in here"  # the library bind-mounted at its own path
    assert lines[3] == f"{4 << 30} 30 0"
    assert stat.S_IMODE(region.parent.stat().st_mode) == 0o777  # made by koordlet for HAMi's monitor
    status = pods.client.runtime.ContainerStatus(cri.ContainerStatusRequest(container_id=cid), timeout=10)
    assert status.status.state == cri.CONTAINER_RUNNING
