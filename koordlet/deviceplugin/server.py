"""Kubelet device plugin (API v1beta1, reference/peers.md §7.1) for this node's GPUs.

Resource name: `nvidia.com/gpu` by default. Koordinator accepts that community resource for whole
GPUs and its scheduler writes the chosen GPUs into `scheduling.koordinator.sh/device-allocated`
(seed 004); kubelet only calls a device plugin for the resource it registered, and fractional
`koordinator.sh/gpu-core`/`gpu-memory` requests never reach one (the GPU runtime hook covers
those). So this plugin replaces NVIDIA's for `nvidia.com/gpu` on nodes where it runs; the name is
a constructor argument for clusters that use another.

Device IDs are GPU UUIDs (≤ 63 chars), with the NUMA node as topology when known. Health comes
from the shared HealthBoard: a GPU going unhealthy and coming back are both streamed.

Lifecycle, as NVIDIA's plugin: serve on our own socket in kubelet's device-plugin directory,
dial it to be sure it answers, then Register with kubelet. kubelet wipes the directory when it
restarts and re-creates `kubelet.sock`; a watch on the directory (watchdog/inotify) notices the
new kubelet socket, or our own socket vanishing, and restarts the server and registers again.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent import futures
from typing import Any

import grpc
from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

from koordlet.api import device as api
from koordlet.deviceplugin.allocator import AllocationError, AllocationTimeoutError, SchedulerAllocator
from koordlet.gpu.health import GPUHealth, HealthBoard
from koordlet.gpu.nvml import GPUInfo
from koordlet.gpu.service import GPUService
from koordlet.nodelock import NodeLocker
from koordlet.system.roots import DEV_DIR
from wire import deviceplugin_pb2 as pb
from wire import deviceplugin_pb2_grpc as pb_grpc
from wire.sockets import remove_socket

_log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
DEVICE_PLUGIN_PATH = "/var/lib/kubelet/device-plugins"
KUBELET_SOCKET = "kubelet.sock"
DEFAULT_SOCKET_NAME = "koordlet-nvidia-gpu.sock"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
# How often an idle ListAndWatch stream wakes to notice a cancelled call or a stopped server.
_STREAM_POLL_S = 0.5
_DIAL_TIMEOUT_S = 5.0


class DevicePluginError(RuntimeError):
    """The plugin could not serve or register."""


def device_list(gpus: Sequence[GPUInfo], health: Mapping[str, GPUHealth]) -> list[pb.Device]:
    devices = []
    for gpu in sorted(gpus, key=lambda g: g.minor):
        state = health.get(gpu.uuid)
        device = pb.Device(ID=gpu.uuid, health=HEALTHY if state is None or state.healthy else UNHEALTHY)
        if gpu.numa_node is not None:
            device.topology.nodes.append(pb.NUMANode(ID=gpu.numa_node))
        devices.append(device)
    return devices


class GPUDevicePluginServicer(pb_grpc.DevicePluginServicer):
    def __init__(
        self,
        gpus: Callable[[], Sequence[GPUInfo]],
        board: HealthBoard,
        allocator: SchedulerAllocator,
    ) -> None:
        self._gpus = gpus
        self._board = board
        self._allocator = allocator
        self._stopped = threading.Event()

    def stop(self) -> None:
        """End every ListAndWatch stream (server shutdown or restart)."""
        self._stopped.set()

    def GetDevicePluginOptions(self, request: pb.Empty, context: grpc.ServicerContext) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    def ListAndWatch(self, request: pb.Empty, context: grpc.ServicerContext) -> Iterator[pb.ListAndWatchResponse]:
        generation, health = self._board.versioned_snapshot()
        sent = device_list(self._gpus(), health)
        yield pb.ListAndWatchResponse(devices=sent)
        while context.is_active() and not self._stopped.is_set() and not self._board.closed:
            self._board.wait_for_change(generation, _STREAM_POLL_S)
            # Every intermediate state, so a quick unhealthy-and-back is reported both ways.
            for seen, health in self._board.snapshots_since(generation):
                generation = seen
                devices = device_list(self._gpus(), health)
                if devices != sent:
                    yield pb.ListAndWatchResponse(devices=devices)
                    sent = devices

    def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> pb.PreferredAllocationResponse:
        responses = [
            pb.ContainerPreferredAllocationResponse(
                deviceIDs=self._allocator.preferred(
                    list(req.available_deviceIDs), list(req.must_include_deviceIDs), req.allocation_size
                )
            )
            for req in request.container_requests
        ]
        return pb.PreferredAllocationResponse(container_responses=responses)

    def Allocate(self, request: pb.AllocateRequest, context: grpc.ServicerContext) -> pb.AllocateResponse:
        try:
            answers = self._allocator.allocate([list(req.devices_ids) for req in request.container_requests])
        except AllocationTimeoutError as exc:
            _log.error("Allocate failed: %s", exc)
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, str(exc))
        except AllocationError as exc:
            _log.error("Allocate failed: %s", exc)
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        response = pb.AllocateResponse()
        for answer in answers:
            container = response.container_responses.add()
            container.envs.update(answer.envs)
            for node in answer.devices:
                container.devices.add(
                    container_path=node.container_path, host_path=node.host_path, permissions=node.permissions
                )
        return response

    def PreStartContainer(
        self, request: pb.PreStartContainerRequest, context: grpc.ServicerContext
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()


class _DirWatch(FileSystemEventHandler):
    def __init__(self, kubelet_socket: str, own_socket: str, wake: threading.Event) -> None:
        self._kubelet_socket = kubelet_socket
        self._own_socket = own_socket
        self._wake = wake

    def on_any_event(self, event: FileSystemEvent) -> None:
        path = os.fsdecode(event.src_path)
        if event.event_type == "created" and path == self._kubelet_socket:
            _log.info("kubelet socket %s re-created: kubelet restarted", path)
            self._wake.set()
        elif event.event_type == "deleted" and path == self._own_socket:
            _log.info("device plugin socket %s removed", path)
            self._wake.set()


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


class DevicePluginServer:
    """Runs the gRPC server on a unix socket, registers with kubelet, and re-registers on restart."""

    def __init__(
        self,
        servicer_factory: Callable[[], GPUDevicePluginServicer],
        resource_name: str,
        plugin_dir: str = DEVICE_PLUGIN_PATH,
        socket_name: str = DEFAULT_SOCKET_NAME,
        kubelet_socket_name: str = KUBELET_SOCKET,
        max_workers: int = 8,
        dial_timeout_s: float = _DIAL_TIMEOUT_S,
    ) -> None:
        self.resource_name = resource_name
        self._dial_timeout_s = dial_timeout_s
        self.plugin_dir = plugin_dir
        self.socket_name = socket_name
        self.socket_path = os.path.join(plugin_dir, socket_name)
        self.kubelet_socket = os.path.join(plugin_dir, kubelet_socket_name)
        self._factory = servicer_factory
        self._max_workers = max_workers
        self._server: grpc.Server | None = None
        self._servicer: GPUDevicePluginServicer | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._observer: Any = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.registrations = 0
        self._registered_kubelet: tuple[int, int] | None = None

    def _serve(self) -> None:
        remove_socket(self.socket_path)  # ours from a previous run; kubelet never reuses our name
        servicer = self._factory()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=self._max_workers, thread_name_prefix="devplugin"))
        pb_grpc.add_DevicePluginServicer_to_server(servicer, server)
        if server.add_insecure_port(f"unix://{self.socket_path}") == 0:
            raise DevicePluginError(f"cannot listen on {self.socket_path}")
        server.start()
        self._server, self._servicer = server, servicer
        # A real call rather than channel_ready_future: the latter polls and costs ~200 ms.
        with grpc.insecure_channel(f"unix://{self.socket_path}") as channel:
            try:
                pb_grpc.DevicePluginStub(channel).GetDevicePluginOptions(
                    pb.Empty(), timeout=self._dial_timeout_s, wait_for_ready=True
                )
            except grpc.RpcError as exc:
                raise DevicePluginError(f"device plugin socket {self.socket_path} does not answer: {exc}") from exc
        _log.info("device plugin for %s serving on %s", self.resource_name, self.socket_path)

    def _halt(self) -> None:
        if self._servicer is not None:
            self._servicer.stop()
        if self._server is not None:
            self._server.stop(grace=1.0).wait()
        self._server = self._servicer = None

    def register(self) -> None:
        """Register with kubelet; raises DevicePluginError when kubelet refuses or is not there."""
        request = pb.RegisterRequest(
            version=API_VERSION,
            endpoint=self.socket_name,
            resource_name=self.resource_name,
            options=pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True),
        )
        with grpc.insecure_channel(f"unix://{self.kubelet_socket}") as channel:
            try:
                pb_grpc.RegistrationStub(channel).Register(request, timeout=self._dial_timeout_s, wait_for_ready=True)
            except grpc.RpcError as exc:
                if exc.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE):
                    raise DevicePluginError(
                        f"kubelet socket {self.kubelet_socket} does not answer ({exc.code().name})"
                    ) from exc
                raise DevicePluginError(
                    f"kubelet refused registration of {self.resource_name}: {exc.code().name} {exc.details()}"
                ) from exc
        self.registrations += 1
        self._registered_kubelet = _identity(self.kubelet_socket)
        _log.info("registered %s with kubelet at %s", self.resource_name, self.kubelet_socket)

    def _needs_restart(self) -> bool:
        # Our own unlink/bind in _serve fires events too; only a new kubelet socket or a missing
        # socket of ours is a reason to start over.
        current = _identity(self.kubelet_socket)
        return not os.path.exists(self.socket_path) or (current is not None and current != self._registered_kubelet)

    def _restart(self) -> None:
        with self._lock:
            self._halt()
            self._serve()
            self.register()

    def start(self) -> None:
        """Serve, register, and watch the directory for kubelet restarts."""
        os.makedirs(self.plugin_dir, exist_ok=True)
        self._observer = Observer()
        self._observer.schedule(_DirWatch(self.kubelet_socket, self.socket_path, self._wake), self.plugin_dir)
        self._observer.start()
        try:
            self._restart()
        except DevicePluginError:
            self.stop()
            raise
        self._thread = threading.Thread(target=self._loop, name="deviceplugin-watch", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait()
            if self._stop.is_set():
                return
            self._wake.clear()
            if not self._needs_restart():
                continue
            try:
                self._restart()
            except DevicePluginError as exc:
                # kubelet may still be coming up; its socket's creation wakes us again.
                _log.warning("device plugin restart failed: %s", exc)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=5)
            self._observer = None
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
            self._thread = None
        with self._lock:
            self._halt()
        remove_socket(self.socket_path)


def gpu_device_plugin(
    core_api: Any,
    node_name: str,
    service: GPUService,
    resource_name: str = api.RESOURCE_NVIDIA_GPU,
    plugin_dir: str = DEVICE_PLUGIN_PATH,
    lock_key: str = api.ANNOTATION_NODE_LOCK,
    dev_dir: str = DEV_DIR,
) -> DevicePluginServer:
    """The device plugin wired to koordlet's GPU service and the API server (call .start())."""

    def gpus() -> Sequence[GPUInfo]:
        return service.inventory.gpus

    allocator = SchedulerAllocator(
        core_api,
        node_name,
        NodeLocker(core_api, key=lock_key),
        gpus,
        service.board.snapshot,
        resource_name=resource_name,
        dev_dir=dev_dir,
    )
    return DevicePluginServer(
        lambda: GPUDevicePluginServicer(gpus, service.board, allocator), resource_name, plugin_dir=plugin_dir
    )
