"""``PodResourcesProxy`` against the project's test kubelet (tests/koordlet/deviceplugin/kubelet.py serving
kubelet's ``v1.PodResourcesLister``), through real gRPC on unix sockets: kubelet's answer with the scheduler's
GPUs and RDMA devices added to the pod's first container, sorted by resource name (Koordinator's
fillPodDevicesAllocatedByKoord), kubelet's own fields and unknown fields kept, kubelet's errors passed on."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from koordlet.api.device import ANNOTATION_DEVICE_ALLOCATED
from koordlet.api.pod import PodMeta
from koordlet.statesinformer.podresources import PodResourcesProxy, PodResourcesServer
from tests.koordlet.deviceplugin.kubelet import TestKubelet
from wire import podresources_pb2 as pb
from wire import podresources_pb2_grpc as pb_grpc

PF, VF0, VF1 = "0000:3b:00.0", "0000:af:00.2", "0000:af:00.3"
ALLOCATED = {"gpu": [{"minor": 0, "id": "GPU-6a1b2c3d-0000-1111-2222-333344445555",
                      "resources": {"koordinator.sh/gpu-core": "100"}}],
             "rdma": [{"minor": 0, "id": PF, "resources": {"koordinator.sh/rdma": "100"}},
                      {"minor": 1, "id": "0000:af:00.0", "extension": {"vfs": [{"minor": -1, "busID": VF0},
                                                                               {"minor": -1, "busID": VF1}]}}]}
PODS = (
    PodMeta("trainer", "ml", "u-1", annotations={ANNOTATION_DEVICE_ALLOCATED: json.dumps(ALLOCATED)}),
    PodMeta("plugin-gpu", "ml", "u-2", annotations={ANNOTATION_DEVICE_ALLOCATED: json.dumps(
        {"gpu": [{"minor": 1, "id": "GPU-aaaa"}]})}),
    PodMeta("broken", "ml", "u-3", annotations={ANNOTATION_DEVICE_ALLOCATED: '{"rdma":[{"minor":0,"id":"../x"}]}'}),
    PodMeta("web", "shop", "u-4"),
)


def _kubelets_view() -> list[pb.PodResources]:
    """What kubelet knows: its CPU manager's exclusive CPUs, its device manager's devices."""
    memory = pb.ContainerMemory(memory_type="memory", size=1 << 30, topology=pb.TopologyInfo(nodes=[pb.NUMANode(ID=0)]))
    trainer = pb.PodResources(name="trainer", namespace="ml", containers=[
        pb.ContainerResources(name="main", cpu_ids=[2, 3], memory=[memory],
                              devices=[pb.ContainerDevices(resource_name="example.com/fpga", device_ids=["f0"])]),
        pb.ContainerResources(name="sidecar")])
    # kubelet's answer may carry fields newer than our proto: field 99 stands for one.
    trainer = pb.PodResources.FromString(trainer.SerializeToString() + bytes([0x98, 0x06, 0x2A]))
    plugin_gpu = pb.PodResources(name="plugin-gpu", namespace="ml", containers=[pb.ContainerResources(
        name="main", devices=[pb.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=["GPU-aaaa"])])])
    broken = pb.PodResources(name="broken", namespace="ml", containers=[pb.ContainerResources(name="main")])
    web = pb.PodResources(name="web", namespace="shop", containers=[pb.ContainerResources(name="nginx")])
    no_containers = pb.PodResources(name="trainer-init-only", namespace="ml")
    return [trainer, plugin_gpu, broken, web, no_containers]


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A short dir for this module's unix sockets, which must fit in 107 bytes: pytest's own temp path is long (an
    xdist worker's adds ``popen-gw1/``, a long user name or run number more)."""
    with tempfile.TemporaryDirectory(prefix="kpy-podres-") as short:
        yield Path(short)


@pytest.fixture
def lister(tmp_path: Path) -> Iterator[tuple[pb_grpc.PodResourcesListerStub, TestKubelet]]:
    (tmp_path / "device-plugins").mkdir()
    kubelet = TestKubelet(str(tmp_path / "device-plugins"), pod_resources_dir=str(tmp_path / "pod-resources"))
    kubelet.pod_resources = _kubelets_view()
    kubelet.allocatable = pb.AllocatableResourcesResponse(cpu_ids=[0, 1, 2, 3], devices=[
        pb.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=["GPU-aaaa"])])
    server = PodResourcesServer(PodResourcesProxy(lambda: PODS, kubelet.pod_resources_socket),
                                str(tmp_path / "koordlet" / "pod-resources" / "kubelet.sock"))
    server.start()
    channel = grpc.insecure_channel(f"unix://{server.socket_path}")
    try:
        yield pb_grpc.PodResourcesListerStub(channel), kubelet
    finally:
        channel.close()
        server.stop()
        kubelet.stop()


def _devices(container: pb.ContainerResources) -> list[tuple[str, list[str]]]:
    return [(d.resource_name, list(d.device_ids)) for d in container.devices]


def test_list_adds_the_schedulers_devices_to_the_first_container(lister) -> None:
    stub, kubelet = lister
    by_name = {p.name: p for p in stub.List(pb.ListPodResourcesRequest(), timeout=5).pod_resources}
    main, sidecar = by_name["trainer"].containers
    assert _devices(main) == [("example.com/fpga", ["f0"]), ("koordinator.sh/rdma", [PF, VF0, VF1]),
                              ("nvidia.com/gpu", ["GPU-6a1b2c3d-0000-1111-2222-333344445555"])]
    assert list(main.cpu_ids) == [2, 3] and main.memory[0].size == 1 << 30  # kubelet's fields kept
    assert _devices(sidecar) == []
    assert by_name["trainer"].SerializeToString().endswith(bytes([0x98, 0x06, 0x2A]))  # kubelet's unknown field
    # a GPU kubelet's device manager reports already is not added twice
    assert _devices(by_name["plugin-gpu"].containers[0]) == [("nvidia.com/gpu", ["GPU-aaaa"])]
    assert _devices(by_name["broken"].containers[0]) == []  # a malformed annotation: kubelet's answer
    assert _devices(by_name["web"].containers[0]) == []
    assert by_name["trainer-init-only"].containers == []
    assert kubelet.pod_resource_calls == ["List"]


def test_get_adds_the_devices_and_passes_kubelets_errors_on(lister) -> None:
    stub, _ = lister
    got = stub.Get(pb.GetPodResourcesRequest(pod_name="trainer", pod_namespace="ml"), timeout=5)
    assert [name for name, _ in _devices(got.pod_resources.containers[0])] == [
        "example.com/fpga", "koordinator.sh/rdma", "nvidia.com/gpu"]
    with pytest.raises(grpc.RpcError) as raised:
        stub.Get(pb.GetPodResourcesRequest(pod_name="nope", pod_namespace="ml"), timeout=5)
    assert raised.value.code() == grpc.StatusCode.UNKNOWN
    assert "pod nope in namespace ml not found" in raised.value.details()


def test_allocatable_is_kubelets(lister) -> None:
    stub, _ = lister
    allocatable = stub.GetAllocatableResources(pb.AllocatableResourcesRequest(), timeout=5)
    assert list(allocatable.cpu_ids) == [0, 1, 2, 3]
    assert _devices(allocatable) == [("nvidia.com/gpu", ["GPU-aaaa"])]


def test_kubelet_down_is_unavailable_and_the_socket_is_koordlets(lister, tmp_path: Path) -> None:
    stub, kubelet = lister
    socket = tmp_path / "koordlet" / "pod-resources" / "kubelet.sock"
    assert oct(socket.stat().st_mode & 0o777) == "0o660"
    kubelet.stop()
    with pytest.raises(grpc.RpcError) as raised:
        stub.List(pb.ListPodResourcesRequest(), timeout=5)
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE


def test_a_malformed_annotation_is_named_once_while_its_pod_is_there_and_forgotten_after(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "device-plugins").mkdir()
    kubelet = TestKubelet(str(tmp_path / "device-plugins"), pod_resources_dir=str(tmp_path / "pod-resources"))
    broken = [PodMeta(f"broken-{i}", "ml", f"u-{i}", annotations={ANNOTATION_DEVICE_ALLOCATED: "{not json"})
              for i in range(50)]
    kubelet.pod_resources = [pb.PodResources(name=p.name, namespace="ml", containers=[pb.ContainerResources(
        name="main")]) for p in broken]
    listed = [broken[:10]]
    proxy = PodResourcesProxy(lambda: listed[0], kubelet.pod_resources_socket)
    server = PodResourcesServer(proxy, str(tmp_path / "koordlet" / "kubelet.sock"))
    server.start()
    channel = grpc.insecure_channel(f"unix://{server.socket_path}")
    stub = pb_grpc.PodResourcesListerStub(channel)
    try:
        with caplog.at_level("WARNING", logger="koordlet.statesinformer.podresources"):
            for _ in range(3):
                stub.List(pb.ListPodResourcesRequest(), timeout=5)
            assert len(caplog.records) == 10 and proxy.warned == {p.key for p in broken[:10]}
            for start in range(10, 50, 10):  # pods come and go: the set holds only the ones still there
                listed[0] = broken[start:start + 10]
                stub.List(pb.ListPodResourcesRequest(), timeout=5)
                assert proxy.warned == {p.key for p in broken[start:start + 10]}
            listed[0] = broken[:1]  # a pod that is back is named again
            stub.List(pb.ListPodResourcesRequest(), timeout=5)
            assert len(caplog.records) == 51 and proxy.warned == {broken[0].key}
            listed[0] = []
            stub.Get(pb.GetPodResourcesRequest(pod_name="broken-0", pod_namespace="ml"), timeout=5)
            assert proxy.warned == frozenset()
    finally:
        channel.close()
        server.stop()
        kubelet.stop()
