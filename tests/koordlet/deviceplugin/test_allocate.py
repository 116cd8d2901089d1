"""Allocate through real gRPC from a test kubelet, against a real API server (tests/support/apiserver.py)."""

import json
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import grpc
import pytest

from koordlet.api import device as api
from koordlet.deviceplugin.allocator import AllocationTimeoutError, SchedulerAllocator
from koordlet.deviceplugin.server import gpu_device_plugin
from koordlet.gpu.health import HealthBoard
from koordlet.gpu.nvml import discover, open_nvml
from koordlet.gpu.service import GPUService
from koordlet.nodelock import NodeLocker
from tests.koordlet.deviceplugin.kube import (
    gpu_pod,
    node_annotations,
    pod_annotations,
    set_node_lock,
    warning_events,
)
from tests.koordlet.deviceplugin.kubelet import TestKubelet
from tests.koordlet.gpu.fake_nvml import FakeNvml, h100_gpus
from wire import deviceplugin_pb2 as pb
from wire import deviceplugin_pb2_grpc as pb_grpc

NODE = "node-a"
KEY = api.ANNOTATION_NODE_LOCK


def allocated(*minors: int) -> str:
    return json.dumps({"gpu": [{"minor": m, "resources": {api.RESOURCE_GPU_CORE: "100"}} for m in minors]})


@dataclass
class Plugin:
    kube: object
    stub: pb_grpc.DevicePluginStub
    gpus: tuple
    board: HealthBoard
    locker: NodeLocker

    def allocate(self, *requests: list[str]) -> pb.AllocateResponse:
        request = pb.AllocateRequest(
            container_requests=[pb.ContainerAllocateRequest(devices_ids=ids) for ids in requests]
        )
        return self.stub.Allocate(request, timeout=10)

    def uuid(self, minor: int) -> str:
        return next(g.uuid for g in self.gpus if g.minor == minor)


@pytest.fixture
def plugin(kube, tmp_path) -> Iterator[Plugin]:
    kube.node(NODE)
    service = GPUService.start(FakeNvml(h100_gpus(4)), sys_dir=str(tmp_path / "sys"), poll_timeout_ms=20)
    assert service is not None
    dev_root = tmp_path / "dev"
    dev_root.mkdir()
    for name in ("nvidiactl", "nvidia-uvm"):
        (dev_root / name).write_text("")
    plugin_dir = tempfile.mkdtemp(prefix="kdp-", dir="/tmp")
    kubelet = TestKubelet(plugin_dir)
    server = gpu_device_plugin(kube.agent_core, NODE, service, plugin_dir=plugin_dir, dev_dir=str(dev_root))
    try:
        server.start()
        with kubelet.plugin_channel(kubelet.next_registration()) as channel:
            # The scheduler's side of the protocol: it locks the node in Bind.
            scheduler = NodeLocker(kube.agent_core)
            yield Plugin(kube, pb_grpc.DevicePluginStub(channel), service.inventory.gpus, service.board, scheduler)
    finally:
        server.stop()
        service.stop()
        kubelet.stop()
        shutil.rmtree(plugin_dir, ignore_errors=True)


def test_allocate_gives_the_scheduler_choice_not_kubelet_choice_and_releases_the_lock(plugin: Plugin) -> None:
    plugin.kube.pod(gpu_pod("p1", node=NODE, annotations={api.ANNOTATION_DEVICE_ALLOCATED: allocated(2, 3)},
                            gpus={"main": 2}))
    plugin.locker.lock(NODE, "ns", "p1")
    # kubelet picked minors 0 and 1; the scheduler chose 2 and 3.
    response = plugin.allocate([plugin.uuid(0), plugin.uuid(1)])
    (container,) = response.container_responses
    assert container.envs["NVIDIA_VISIBLE_DEVICES"] == "2,3"
    assert container.envs["NVIDIA_VISIBLE_DEVICES"] == api.nvidia_visible_devices(
        api.parse_device_allocated(allocated(2, 3)).gpus
    ), "the same value the GPU env hook computes from the annotation"
    assert [(d.container_path, d.host_path, d.permissions) for d in container.devices] == [
        ("/dev/nvidia2", "/dev/nvidia2", "rw"),
        ("/dev/nvidia3", "/dev/nvidia3", "rw"),
        ("/dev/nvidiactl", "/dev/nvidiactl", "rw"),
        ("/dev/nvidia-uvm", "/dev/nvidia-uvm", "rw"),
    ]
    assert json.loads(pod_annotations(plugin.kube, "p1")[api.ANNOTATION_DEVICE_BOUND]) == {"main": [2, 3]}
    assert KEY not in node_annotations(plugin.kube, NODE)


def test_each_gpu_container_gets_its_share_and_the_lock_is_kept_until_the_last(plugin: Plugin) -> None:
    plugin.kube.pod(gpu_pod("p1", node=NODE, annotations={api.ANNOTATION_DEVICE_ALLOCATED: allocated(1, 0, 3)},
                            gpus={"trainer": 2, "sidecar": 0, "logger": 1}))
    plugin.locker.lock(NODE, "ns", "p1")
    first = plugin.allocate([plugin.uuid(0), plugin.uuid(1)])
    assert first.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == "1,0"
    assert KEY in node_annotations(plugin.kube, NODE), "the logger container is still to come"
    second = plugin.allocate([plugin.uuid(2)])
    assert second.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == "3"
    assert KEY not in node_annotations(plugin.kube, NODE)
    assert json.loads(pod_annotations(plugin.kube, "p1")[api.ANNOTATION_DEVICE_BOUND]) == {
        "trainer": [1, 0], "logger": [3]}


def test_allocate_without_a_node_lock_fails_naming_the_lock_annotation(plugin: Plugin) -> None:
    with pytest.raises(grpc.RpcError) as info:
        plugin.allocate([plugin.uuid(0)])
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert KEY in info.value.details() and "missing" in info.value.details()


@pytest.mark.parametrize(
    "annotations, gpus, match",
    [
        ({}, {"main": 1}, f"pod ns/p1: annotation {api.ANNOTATION_DEVICE_ALLOCATED} is missing"),
        ({api.ANNOTATION_DEVICE_ALLOCATED: "{oops"}, {"main": 1}, "not JSON"),
        ({api.ANNOTATION_DEVICE_ALLOCATED: allocated(0, 1)}, {"main": 1}, "lists 2 GPUs .* request 1 .*mismatched"),
        ({api.ANNOTATION_DEVICE_ALLOCATED: allocated(7)}, {"main": 1}, "minor 7, which node node-a does not have"),
        ({api.ANNOTATION_DEVICE_ALLOCATED: allocated(0), api.ANNOTATION_DEVICE_BOUND: '{"main":[0]}'},
         {"main": 1}, "already in annotation .*device-bound"),
    ],
)
def test_allocate_that_cannot_match_fails_naming_pod_and_annotation_and_releases_the_lock(
    plugin: Plugin, annotations, gpus, match
) -> None:
    plugin.kube.pod(gpu_pod("p1", node=NODE, annotations=annotations, gpus=gpus))
    plugin.locker.lock(NODE, "ns", "p1")
    with pytest.raises(grpc.RpcError) as info:
        plugin.allocate([plugin.uuid(0)])
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "ns/p1" in info.value.details()
    assert re.search(match, info.value.details()), info.value.details()
    assert KEY not in node_annotations(plugin.kube, NODE)


def test_kubelet_asking_for_a_different_count_is_a_mismatch(plugin: Plugin) -> None:
    plugin.kube.pod(gpu_pod("p1", node=NODE, annotations={api.ANNOTATION_DEVICE_ALLOCATED: allocated(0)},
                            gpus={"main": 1}))
    plugin.locker.lock(NODE, "ns", "p1")
    with pytest.raises(grpc.RpcError, match="kubelet asks for 2"):
        plugin.allocate([plugin.uuid(0), plugin.uuid(1)])
    assert KEY not in node_annotations(plugin.kube, NODE)


def test_lock_of_a_deleted_pod_is_stale_and_released(plugin: Plugin) -> None:
    plugin.locker.lock(NODE, "ns", "gone")
    with pytest.raises(grpc.RpcError, match="pod ns/gone .* does not exist"):
        plugin.allocate([plugin.uuid(0)])
    assert KEY not in node_annotations(plugin.kube, NODE)


def test_pod_bound_to_another_node_is_a_mismatch(plugin: Plugin) -> None:
    plugin.kube.pod(gpu_pod("p1", node="node-b", annotations={api.ANNOTATION_DEVICE_ALLOCATED: allocated(0)},
                            gpus={"main": 1}))
    plugin.locker.lock(NODE, "ns", "p1")
    with pytest.raises(grpc.RpcError, match="bound to node node-b"):
        plugin.allocate([plugin.uuid(0)])


def test_unhealthy_gpu_chosen_by_the_scheduler_fails_the_allocate(plugin: Plugin) -> None:
    plugin.kube.pod(gpu_pod("p1", node=NODE, annotations={api.ANNOTATION_DEVICE_ALLOCATED: allocated(1)},
                            gpus={"main": 1}))
    plugin.locker.lock(NODE, "ns", "p1")
    plugin.board.set(plugin.uuid(1), False, "Xid79")
    with pytest.raises(grpc.RpcError, match="unhealthy .*Xid79"):
        plugin.allocate([plugin.uuid(0)])
    assert KEY not in node_annotations(plugin.kube, NODE)


def test_allocate_past_its_time_budget_fails_and_releases_the_lock(kube, tmp_path) -> None:
    kube.node(NODE)
    kube.pod(gpu_pod("p1", node=NODE, annotations={api.ANNOTATION_DEVICE_ALLOCATED: allocated(0)}, gpus={"main": 1}))
    with open_nvml(FakeNvml(h100_gpus(1))) as session:
        gpus = discover(session, sys_dir=str(tmp_path / "sys")).gpus
    locker = NodeLocker(kube.agent_core)
    ticks = iter(range(0, 1000, 20))  # every clock read is 20 s later: a very slow API server
    allocator = SchedulerAllocator(kube.agent_core, NODE, locker, lambda: gpus, dict, timeout_s=10,
                                   clock=lambda: float(next(ticks)))
    locker.lock(NODE, "ns", "p1")
    with pytest.raises(AllocationTimeoutError, match="timed out"):
        allocator.allocate([[gpus[0].uuid]])
    assert KEY not in node_annotations(kube, NODE)
    assert api.ANNOTATION_DEVICE_BOUND not in pod_annotations(kube, "p1")


def test_preferred_allocation_points_kubelet_at_the_scheduler_choice(plugin: Plugin) -> None:
    plugin.kube.pod(gpu_pod("p1", node=NODE, annotations={api.ANNOTATION_DEVICE_ALLOCATED: allocated(3)},
                            gpus={"main": 1}))
    plugin.locker.lock(NODE, "ns", "p1")
    available = [g.uuid for g in plugin.gpus]
    request = pb.PreferredAllocationRequest(container_requests=[
        pb.ContainerPreferredAllocationRequest(available_deviceIDs=available, allocation_size=1)])
    response = plugin.stub.GetPreferredAllocation(request, timeout=10)
    assert list(response.container_responses[0].deviceIDs) == [plugin.uuid(3)]
    assert KEY in node_annotations(plugin.kube, NODE), "advice has no side effects"


def test_preferred_allocation_without_a_lock_falls_back_to_a_plain_pick(plugin: Plugin) -> None:
    available = [g.uuid for g in plugin.gpus]
    request = pb.PreferredAllocationRequest(container_requests=[
        pb.ContainerPreferredAllocationRequest(available_deviceIDs=available, must_include_deviceIDs=[available[2]],
                                               allocation_size=2)])
    response = plugin.stub.GetPreferredAllocation(request, timeout=10)
    assert list(response.container_responses[0].deviceIDs) == [available[2], available[0]]


def test_api_failure_while_recording_the_binding_fails_the_allocate_and_releases_the_lock(plugin: Plugin) -> None:
    plugin.kube.pod(gpu_pod("p1", node=NODE, annotations={api.ANNOTATION_DEVICE_ALLOCATED: allocated(0)},
                            gpus={"main": 1}))
    plugin.locker.lock(NODE, "ns", "p1")
    plugin.kube.server.fail_next("PATCH", r"/namespaces/ns/pods/p1$", status=500)
    with pytest.raises(grpc.RpcError, match="recording annotation .*device-bound failed: 500"):
        plugin.allocate([plugin.uuid(0)])
    assert KEY not in node_annotations(plugin.kube, NODE)


def test_allocate_serves_the_lock_holder_not_other_pending_gpu_pods(plugin: Plugin) -> None:
    plugin.kube.pod(gpu_pod("older", node=NODE, annotations={api.ANNOTATION_DEVICE_ALLOCATED: allocated(0)}))
    plugin.kube.pod(gpu_pod("p1", node=NODE, annotations={api.ANNOTATION_DEVICE_ALLOCATED: allocated(2)}))
    plugin.kube.pod(gpu_pod("newer", node=NODE, annotations={api.ANNOTATION_DEVICE_ALLOCATED: allocated(3)}))
    plugin.locker.lock(NODE, "ns", "p1")
    response = plugin.allocate([plugin.uuid(0)])
    assert response.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == "2"
    assert api.ANNOTATION_DEVICE_BOUND in pod_annotations(plugin.kube, "p1")
    assert api.ANNOTATION_DEVICE_BOUND not in pod_annotations(plugin.kube, "older")
    assert api.ANNOTATION_DEVICE_BOUND not in pod_annotations(plugin.kube, "newer")


# -- the bare-timestamp lock of docs/node-lock.md; locks nobody can use (issue #16) ----------------------------------


def go_rfc3339_now() -> str:
    """What the scheduler of docs/node-lock.md writes: Go's time.Now().Format(time.RFC3339Nano) in a +08:00 zone."""
    now = datetime.now(timezone(timedelta(hours=8)))
    return now.strftime("%Y-%m-%dT%H:%M:%S.%f") + "123" + now.strftime("%z")[:3] + ":" + now.strftime("%z")[3:]


def test_bare_timestamp_lock_of_the_seed_is_served_to_the_pending_pod_and_released(plugin: Plugin) -> None:
    plugin.kube.pod(gpu_pod("done", node=NODE, annotations={api.ANNOTATION_DEVICE_ALLOCATED: allocated(0),
                                                            api.ANNOTATION_DEVICE_BOUND: '{"main":[0]}'}))
    plugin.kube.pod(gpu_pod("running", node=NODE, phase="Running",
                            annotations={api.ANNOTATION_DEVICE_ALLOCATED: allocated(1)}))
    plugin.kube.pod(gpu_pod("elsewhere", node="node-b", annotations={api.ANNOTATION_DEVICE_ALLOCATED: allocated(0)}))
    plugin.kube.pod(gpu_pod("p1", node=NODE, annotations={api.ANNOTATION_DEVICE_ALLOCATED: allocated(2, 3)},
                            gpus={"main": 2}))
    set_node_lock(plugin.kube, NODE, go_rfc3339_now())
    response = plugin.allocate([plugin.uuid(0), plugin.uuid(1)])
    assert response.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == "2,3"
    assert json.loads(pod_annotations(plugin.kube, "p1")[api.ANNOTATION_DEVICE_BOUND]) == {"main": [2, 3]}
    assert KEY not in node_annotations(plugin.kube, NODE), "the device plugin releases the lock after Allocate"
    assert warning_events(plugin.kube) == [], "serving a lock is no warning"


def test_bare_timestamp_lock_serves_the_latest_bound_pod_and_keeps_the_lock_for_its_next_container(
    plugin: Plugin,
) -> None:
    plugin.kube.pod(gpu_pod("older", node=NODE, annotations={api.ANNOTATION_DEVICE_ALLOCATED: allocated(0),
                                                             api.ANNOTATION_BIND_TIMESTAMP: "1000"}))
    plugin.kube.pod(gpu_pod("latest", node=NODE, gpus={"a": 1, "b": 1},
                            annotations={api.ANNOTATION_DEVICE_ALLOCATED: allocated(3, 1),
                                         api.ANNOTATION_BIND_TIMESTAMP: "2000"}))
    raw = "2026-11-23T07:00:00Z"
    set_node_lock(plugin.kube, NODE, raw)
    assert plugin.allocate([plugin.uuid(0)]).container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == "3"
    assert node_annotations(plugin.kube, NODE)[KEY] == raw, "container b is still to come"
    assert plugin.allocate([plugin.uuid(0)]).container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == "1"
    assert KEY not in node_annotations(plugin.kube, NODE)
    assert api.ANNOTATION_DEVICE_BOUND not in pod_annotations(plugin.kube, "older")


def test_bare_timestamp_lock_with_no_pod_waiting_is_released_with_a_warning_event(plugin: Plugin) -> None:
    raw = "2026-11-23T15:00:00+08:00"
    set_node_lock(plugin.kube, NODE, raw)
    with pytest.raises(grpc.RpcError) as info:
        plugin.allocate([plugin.uuid(0)])
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert repr(raw) in info.value.details()
    assert KEY not in node_annotations(plugin.kube, NODE)
    (event,) = warning_events(plugin.kube)
    assert repr(raw) in event["message"] and NODE in event["message"]


@pytest.mark.parametrize("raw", ["locked-by-someone", "2026-11-23T07:00:00.123456789Z,ns", " 2026-11-23 07:00:00Z"])
def test_unreadable_lock_is_released_with_a_warning_event_carrying_the_raw_value(plugin: Plugin, raw: str) -> None:
    plugin.kube.pod(gpu_pod("p1", node=NODE, annotations={api.ANNOTATION_DEVICE_ALLOCATED: allocated(0)}))
    set_node_lock(plugin.kube, NODE, raw)
    # GetPreferredAllocation is advice: it falls back to a plain pick and leaves the lock alone.
    available = [g.uuid for g in plugin.gpus]
    plugin.stub.GetPreferredAllocation(pb.PreferredAllocationRequest(container_requests=[
        pb.ContainerPreferredAllocationRequest(available_deviceIDs=available, allocation_size=1)]), timeout=10)
    assert node_annotations(plugin.kube, NODE)[KEY] == raw and warning_events(plugin.kube) == []
    with pytest.raises(grpc.RpcError) as info:
        plugin.allocate([plugin.uuid(0)])
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert repr(raw) in info.value.details(), "the error shows the value as it is on the node"
    assert KEY not in node_annotations(plugin.kube, NODE)
    (event,) = warning_events(plugin.kube)
    assert event["involvedObject"]["kind"] == "Node" and event["involvedObject"]["name"] == NODE
    assert repr(raw) in event["message"] and NODE in event["message"]
    assert api.ANNOTATION_DEVICE_BOUND not in pod_annotations(plugin.kube, "p1"), "nobody is served"


def test_lock_whose_pod_is_gone_is_released_with_a_warning_event_naming_the_pod(plugin: Plugin) -> None:
    raw = "2026-11-23T15:00:00.5+08:00,ns,gone"
    set_node_lock(plugin.kube, NODE, raw)
    plugin.kube.server.clear_requests()
    with pytest.raises(grpc.RpcError, match="pod ns/gone .* does not exist") as info:
        plugin.allocate([plugin.uuid(0)])
    assert repr(raw) in info.value.details()
    assert KEY not in node_annotations(plugin.kube, NODE)
    (event,) = warning_events(plugin.kube)
    assert "ns/gone" in event["message"] and NODE in event["message"] and repr(raw) in event["message"]
    # The release was one patch, guarded by the node's resourceVersion.
    (patch,) = plugin.kube.server.requests("PATCH", rf"/nodes/{NODE}$")
    assert patch.body["metadata"]["resourceVersion"] and patch.body["metadata"]["annotations"] == {KEY: None}

