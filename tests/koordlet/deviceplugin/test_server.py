import os
import shutil
import tempfile
import threading
from collections.abc import Iterator

import grpc
import pytest

from koordlet.deviceplugin.allocator import SchedulerAllocator
from koordlet.deviceplugin.server import DevicePluginError, DevicePluginServer, GPUDevicePluginServicer
from koordlet.gpu.health import HealthBoard
from koordlet.gpu.nvml import discover, open_nvml
from koordlet.nodelock import NodeLocker
from tests.koordlet.deviceplugin.kubelet import TestKubelet
from tests.koordlet.gpu.fake_nvml import FakeNvml, h100_gpus
from wire import deviceplugin_pb2 as pb
from wire import deviceplugin_pb2_grpc as pb_grpc


@pytest.fixture
def plugin_dir() -> Iterator[str]:
    # Short path: unix socket paths are limited to 107 bytes.
    path = tempfile.mkdtemp(prefix="kdp-", dir="/tmp")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def gpus(tmp_path):
    nvml = FakeNvml(h100_gpus(2))
    nvml.gpus[1].numa_node = 1
    with open_nvml(nvml) as session:
        return discover(session, sys_dir=str(tmp_path / "sys")).gpus


def make_server(plugin_dir: str, gpus, board: HealthBoard) -> DevicePluginServer:
    # ListAndWatch and registration never reach the API server; Allocate is tested in test_allocate.
    allocator = SchedulerAllocator(None, "node-a", NodeLocker(None), lambda: gpus, board.snapshot)
    return DevicePluginServer(
        lambda: GPUDevicePluginServicer(lambda: gpus, board, allocator), "nvidia.com/gpu", plugin_dir=plugin_dir
    )


@pytest.fixture
def running(plugin_dir, gpus):
    kubelet = TestKubelet(plugin_dir)
    board = HealthBoard(g.uuid for g in gpus)
    server = make_server(plugin_dir, gpus, board)
    try:
        server.start()
        yield kubelet, server, board
    finally:
        board.close()
        server.stop()
        kubelet.stop()


def test_plugin_registers_with_kubelet_and_answers_on_its_endpoint(running) -> None:
    kubelet, server, _board = running
    request = kubelet.next_registration()
    assert request.version == "v1beta1"
    assert request.resource_name == "nvidia.com/gpu"
    assert request.endpoint == server.socket_name and "/" not in request.endpoint
    assert request.options.get_preferred_allocation_available is True
    with kubelet.plugin_channel(request) as channel:
        options = pb_grpc.DevicePluginStub(channel).GetDevicePluginOptions(pb.Empty(), timeout=5)
    assert options.get_preferred_allocation_available is True and options.pre_start_required is False


def test_list_and_watch_streams_devices_and_health_changes_both_ways(running, gpus) -> None:
    kubelet, _server, board = running
    request = kubelet.next_registration()
    with kubelet.plugin_channel(request) as channel:
        stream = pb_grpc.DevicePluginStub(channel).ListAndWatch(pb.Empty(), timeout=20)
        first = next(stream)
        assert [(d.ID, d.health) for d in first.devices] == [(g.uuid, "Healthy") for g in gpus]
        assert [n.ID for n in first.devices[1].topology.nodes] == [1]
        assert len(first.devices[0].topology.nodes) == 0, "unknown NUMA node: no topology"
        board.set(gpus[1].uuid, False, "Xid79")
        second = next(stream)
        assert [d.health for d in second.devices] == ["Healthy", "Unhealthy"]
        board.set(gpus[1].uuid, True)
        third = next(stream)
        assert [d.health for d in third.devices] == ["Healthy", "Healthy"]
        stream.cancel()


def test_kubelet_restart_recreating_its_socket_makes_the_plugin_register_again(plugin_dir, gpus) -> None:
    kubelet = TestKubelet(plugin_dir)
    board = HealthBoard(g.uuid for g in gpus)
    server = make_server(plugin_dir, gpus, board)
    restarted = None
    try:
        server.start()
        kubelet.next_registration()
        # kubelet restart: it stops, wipes the directory (our socket too), and serves a new socket.
        kubelet.stop()
        os.unlink(server.socket_path)
        restarted = TestKubelet(plugin_dir)
        request = restarted.next_registration(timeout_s=10)
        assert request.resource_name == "nvidia.com/gpu"
        with restarted.plugin_channel(request) as channel:
            listed = next(pb_grpc.DevicePluginStub(channel).ListAndWatch(pb.Empty(), timeout=5))
        assert len(listed.devices) == 2
    finally:
        board.close()
        server.stop()
        kubelet.stop()
        if restarted is not None:
            restarted.stop()
    assert not os.path.exists(server.socket_path), "stop removes the plugin socket"


def test_registration_refused_by_kubelet_is_an_error_and_leaves_nothing_running(plugin_dir, gpus) -> None:
    kubelet = TestKubelet(plugin_dir, refuse="resource name already taken")
    board = HealthBoard(g.uuid for g in gpus)
    server = make_server(plugin_dir, gpus, board)
    try:
        with pytest.raises(DevicePluginError, match="already taken"):
            server.start()
        assert not os.path.exists(server.socket_path)
        assert not any(t.name == "deviceplugin-watch" for t in threading.enumerate())
    finally:
        server.stop()
        kubelet.stop()


def test_stream_ends_when_the_server_stops(running) -> None:
    kubelet, server, _board = running
    request = kubelet.next_registration()
    with kubelet.plugin_channel(request) as channel:
        stream = pb_grpc.DevicePluginStub(channel).ListAndWatch(pb.Empty(), timeout=10)
        next(stream)
        server.stop()
        with pytest.raises((StopIteration, grpc.RpcError)):
            next(stream)


def test_no_kubelet_listening_is_a_clear_error(plugin_dir, gpus) -> None:
    board = HealthBoard(g.uuid for g in gpus)
    allocator = SchedulerAllocator(None, "node-a", NodeLocker(None), lambda: gpus, board.snapshot)
    server = DevicePluginServer(
        lambda: GPUDevicePluginServicer(lambda: gpus, board, allocator), "nvidia.com/gpu", plugin_dir=plugin_dir,
        dial_timeout_s=0.3,
    )
    try:
        with pytest.raises(DevicePluginError, match="kubelet socket .*kubelet.sock does not answer"):
            server.start()
    finally:
        server.stop()


def test_without_kubelet_the_retries_keep_their_backoff(plugin_dir, gpus, caplog: pytest.LogCaptureFixture) -> None:
    """Each retry removes and makes the plugin's own socket; those events must not start the next retry at once
    (a busy loop that logged hundreds of failures a second): within 1.5 s, the first try and the one after 1 s."""
    import time

    board = HealthBoard(g.uuid for g in gpus)
    allocator = SchedulerAllocator(None, "node-a", NodeLocker(None), lambda: gpus, board.snapshot)
    server = DevicePluginServer(
        lambda: GPUDevicePluginServicer(lambda: gpus, board, allocator), "nvidia.com/gpu", plugin_dir=plugin_dir,
        dial_timeout_s=0.1,
    )
    with caplog.at_level("WARNING", logger="koordlet.deviceplugin.server"):
        try:
            server.start(require_kubelet=False)
            time.sleep(1.5)
        finally:
            server.stop()
            board.close()
    failures = [r for r in caplog.records if "registration failed" in r.getMessage()]
    assert 1 <= len(failures) <= 2, [r.getMessage() for r in caplog.records]


def test_a_quick_flap_is_still_streamed_as_unhealthy_then_healthy(running, gpus) -> None:
    kubelet, _server, board = running
    request = kubelet.next_registration()
    with kubelet.plugin_channel(request) as channel:
        stream = pb_grpc.DevicePluginStub(channel).ListAndWatch(pb.Empty(), timeout=20)
        next(stream)
        board.set(gpus[0].uuid, False, "Xid79")
        board.set(gpus[0].uuid, True)
        assert [d.health for d in next(stream).devices] == ["Unhealthy", "Healthy"]
        assert [d.health for d in next(stream).devices] == ["Healthy", "Healthy"]
        stream.cancel()
