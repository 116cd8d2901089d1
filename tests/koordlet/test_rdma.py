"""RDMA (gates ``RDMADevices``, ``RDMADeviceInject``) on a sysfs and /dev laid out as the kernel and the mlx5
driver write them (tests/koordlet/system/rdma_tree.py; no RDMA hardware here): the devices read, the Device
object with Koordinator's layout (PFs, VFs, NUMA node, PCIe root) through the project's API server and
deploy/crds, alongside GPUs; the injection plugin's devices for PF and VF allocations; the hook server's
answer carrying them; bad annotations."""

from __future__ import annotations

import json
import os
from pathlib import Path

import grpc
import pytest

from hooks import registry
from hooks.protocol import ContainerContext, LinuxDevice, NodeContext, RDMANode
from hooks.rdma import container as rdma_container
from koordlet.api.annotations import AnnotationError
from koordlet.api.device import ANNOTATION_DEVICE_ALLOCATED
from koordlet.api.pod import PodMeta
from koordlet.executor import ResourceExecutor
from koordlet.gpu.reporter import DeviceReporter
from koordlet.gpu.service import GPUService
from koordlet.kubeapi import CustomObjects
from koordlet.reporters.device import DeviceReportLoop
from koordlet.reporters.rdma import RDMAInventory
from koordlet.runtimehooks import RuntimeHooks, RuntimeHooksConfig
from koordlet.statesinformer.api import NodeInfo, StaticStates
from koordlet.system.cgroup import CgroupFS
from koordlet.system.kubepods import KubeCgroupLayout
from koordlet.system.rdma import RDMADevice, RDMAFunction, rdma_device_nodes, read_rdma_devices
from tests.koordlet.gpu.fake_nvml import FakeNvml, h100_gpus
from tests.koordlet.system.rdma_tree import PF0, PF1, RDMA_CM_NUMBERS, UVERBS_MAJOR, VF0, VF1, rdma_tree
from tests.support.apiserver import ApiServer, kube_api_client
from wire import hookapi_pb2 as hookapi
from wire import hookapi_pb2_grpc as hookapi_grpc

NODE = "node-1"


@pytest.fixture
def node(tmp_path: Path) -> tuple[str, str]:
    if os.geteuid() != 0:
        pytest.skip("needs root to make the fixture's device nodes")
    return rdma_tree(tmp_path)


def test_the_rdma_pfs_are_read_with_their_vfs_numa_node_and_pcie_root(node: tuple[str, str]) -> None:
    sys_dir, _ = node
    assert read_rdma_devices(sys_dir) == (
        RDMADevice(bus_id=PF0, minor=0, ib_devices=("mlx5_0",), uverbs=("uverbs0",), vendor="0x15b3",
                   device="0x1017", numa_node=1, pcie_root="pci0000:3a", healthy=True, vf_enabled=True,
                   vfs=(RDMAFunction(VF0, ("mlx5_2",), ("uverbs2",)), RDMAFunction(VF1, ("mlx5_3",), ("uverbs3",)))),
        RDMADevice(bus_id=PF1, minor=1, ib_devices=("mlx5_1",), uverbs=("uverbs1",), vendor="0x15b3",
                   device="0x1017", numa_node=1, pcie_root="pci0000:3a", healthy=False),  # port DOWN
    )
    rdma_cm, uverbs = rdma_device_nodes(*node)
    assert rdma_cm is not None and (rdma_cm.path, rdma_cm.type, rdma_cm.major, rdma_cm.minor) == (
        "/dev/infiniband/rdma_cm", "c", *RDMA_CM_NUMBERS)
    assert {bus: (d.path, d.major, d.minor) for bus, d in uverbs.items()} == {
        PF0: ("/dev/infiniband/uverbs0", UVERBS_MAJOR, 192), PF1: ("/dev/infiniband/uverbs1", UVERBS_MAJOR, 193),
        VF0: ("/dev/infiniband/uverbs2", UVERBS_MAJOR, 194), VF1: ("/dev/infiniband/uverbs3", UVERBS_MAJOR, 195)}


EXPECTED_RDMA = [
    {"type": "rdma", "id": PF0, "minor": 0, "health": True, "resources": {"koordinator.sh/rdma": "100"},
     "topology": {"socketID": -1, "nodeID": 1, "pcieID": "pci0000:3a", "busID": PF0},
     "vfGroups": [{"vfs": [{"minor": -1, "busID": VF0}, {"minor": -1, "busID": VF1}]}]},
    {"type": "rdma", "id": PF1, "minor": 1, "health": False, "resources": {"koordinator.sh/rdma": "100"},
     "topology": {"socketID": -1, "nodeID": 1, "pcieID": "pci0000:3a", "busID": PF1}},
]


def test_the_device_object_has_koordinators_rdma_layout_through_the_crd(node: tuple[str, str]) -> None:
    sys_dir, _ = node
    with ApiServer() as server, kube_api_client(server) as api:
        loop = DeviceReportLoop(None, DeviceReporter(NODE, custom_api=CustomObjects(api)),
                                node_uid=lambda: "uid-1", rdma=RDMAInventory(sys_dir))
        assert loop.report_once()
        stored = server.get_object("devices", NODE)
        assert stored["spec"]["devices"] == EXPECTED_RDMA
        assert stored["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
        assert loop.report_once() and len(server.requests("PUT")) == 0  # unchanged: not written again


def test_gpus_and_rdma_share_one_device_object(node: tuple[str, str], tmp_path: Path) -> None:
    sys_dir, _ = node
    service = GPUService.start(FakeNvml(h100_gpus(2)), sys_dir=str(tmp_path / "gpu-sys"), poll_timeout_ms=50)
    assert service is not None
    try:
        with ApiServer() as server, kube_api_client(server) as api:
            loop = DeviceReportLoop(service, DeviceReporter(NODE, custom_api=CustomObjects(api)),
                                    rdma=RDMAInventory(sys_dir))
            assert loop.report_once()
            devices = server.get_object("devices", NODE)["spec"]["devices"]
    finally:
        service.stop()
    assert [(d["type"], d["minor"]) for d in devices] == [("gpu", 0), ("gpu", 1), ("rdma", 0), ("rdma", 1)]
    assert devices[2:] == EXPECTED_RDMA


def _allocated(entries: list[dict]) -> dict[str, str]:
    return {ANNOTATION_DEVICE_ALLOCATED: json.dumps({"rdma": entries})}


def _ctx(annotations: dict[str, str]) -> ContainerContext:
    return ContainerContext(PodMeta("trainer", "ml", "uid-1", annotations=annotations), "main")


def test_the_plugin_adds_rdma_cm_and_the_uverbs_of_each_allocated_pf_or_vf(node: tuple[str, str]) -> None:
    rdma_cm, uverbs = rdma_device_nodes(*node)
    assert rdma_cm is not None

    def device(d) -> LinuxDevice:  # noqa: ANN001
        return LinuxDevice(d.path, d.type, d.major, d.minor)

    rdma = RDMANode(device(rdma_cm), {bus: device(d) for bus, d in uverbs.items()})
    # a PF by itself, and VFs of the other PF: the VFs' uverbs, not the PF's (Koordinator's rule)
    annotations = _allocated([{"minor": 1, "id": PF1, "resources": {"koordinator.sh/rdma": "100"}},
                              {"minor": 0, "id": PF0, "extension": {"vfs": [{"minor": -1, "busID": VF1}]}}])
    changes = rdma_container(_ctx(annotations), rdma)
    assert [(d.path, d.major, d.minor, d.file_mode) for d in changes.devices] == [
        ("/dev/infiniband/rdma_cm", *RDMA_CM_NUMBERS, 0o666), ("/dev/infiniband/uverbs1", UVERBS_MAJOR, 193, 0o666),
        ("/dev/infiniband/uverbs3", UVERBS_MAJOR, 195, 0o666)]
    assert not rdma_container(_ctx({}), rdma)  # no allocation: nothing
    assert not rdma_container(_ctx({ANNOTATION_DEVICE_ALLOCATED: '{"gpu":[{"minor":0}]}'}), rdma)
    with pytest.raises(ValueError, match="0000:af:00.0 .* no uverbs device"):
        rdma_container(_ctx(_allocated([{"minor": 5, "id": "0000:af:00.0"}])), rdma)
    with pytest.raises(ValueError, match="no /dev/infiniband/rdma_cm"):
        rdma_container(_ctx(annotations), None)
    with pytest.raises(AnnotationError, match="not a PCI bus id"):
        rdma_container(_ctx(_allocated([{"minor": 0, "id": "../../etc"}])), rdma)
    with pytest.raises(AnnotationError, match="vfs"):
        rdma_container(_ctx(_allocated([{"minor": 0, "extension": {"vfs": "all"}}])), rdma)


def test_the_hook_server_answers_the_devices(node: tuple[str, str], tmp_path: Path) -> None:
    sys_dir, dev_dir = node
    config = RuntimeHooksConfig(socket_path=str(tmp_path / "koordlet.sock"), host_endpoint=str(tmp_path / "k.sock"),
                                config_dir=str(tmp_path / "hookserver.d"), sys_dir=sys_dir, dev_dir=dev_dir,
                                feature_gates={"RDMADeviceInject": True})
    hooks = RuntimeHooks(config, StaticStates(node=NodeInfo(NODE)),
                         ResourceExecutor(CgroupFS(str(tmp_path / "cgroup"))), KubeCgroupLayout())
    assert [p.name for p in hooks.plugins] == ["rdma"] and "PreCreateContainer" in hooks.stages()
    hooks.start()
    try:
        with grpc.insecure_channel(f"unix://{config.socket_path}") as channel:
            stub = hookapi_grpc.RuntimeHookServiceStub(channel)
            answer = stub.PreCreateContainerHook(hookapi.ContainerResourceHookRequest(
                pod_meta=hookapi.PodSandboxMetadata(name="trainer", namespace="ml", uid="uid-1"),
                container_meta=hookapi.ContainerMetadata(name="main"),
                pod_annotations=_allocated([{"minor": 0, "id": PF0}])), timeout=5)
    finally:
        hooks.stop()
    assert [(d.container_path, d.host_path, d.permissions, d.type, d.major, d.minor, d.file_mode)
            for d in answer.container_devices] == [
        ("/dev/infiniband/rdma_cm", "/dev/infiniband/rdma_cm", "rwm", "c", *RDMA_CM_NUMBERS, 0o666),
        ("/dev/infiniband/uverbs0", "/dev/infiniband/uverbs0", "rwm", "c", UVERBS_MAJOR, 192, 0o666)]


def test_a_device_outside_dev_is_dropped_by_the_value_check() -> None:
    from hooks import validate
    from hooks.protocol import Changes

    changes = Changes(devices=(LinuxDevice("/dev/infiniband/uverbs0", "c", 231, 192),
                               LinuxDevice("/etc/shadow", "c", 1, 3), LinuxDevice("/dev/../etc/x", "c", 1, 3)))
    kept, rejected = validate.check(changes, NodeContext())
    assert [d.path for d in kept.devices] == ["/dev/infiniband/uverbs0"]
    assert [r.key for r in rejected] == ["devices", "devices"]
    assert registry.PLUGINS["rdma"].gate == "RDMADeviceInject"
