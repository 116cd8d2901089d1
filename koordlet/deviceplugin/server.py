"""Kubelet device plugin (API v1beta1, docs/node-interfaces.md §7.1) for this node's GPUs.

Resource name: `nvidia.com/gpu` by default. Koordinator accepts that community resource for whole
GPUs and its scheduler writes the chosen GPUs into `scheduling.koordinator.sh/device-allocated`
(docs/koordinator.md §5.4); kubelet only calls a device plugin for the resource it registered, and fractional
`koordinator.sh/gpu-core`/`gpu-memory` requests never reach one (the GPU runtime hook covers
those). So this plugin replaces NVIDIA's for `nvidia.com/gpu` on nodes where it runs; the name is
a constructor argument for clusters that use another.

Device IDs are GPU UUIDs (≤ 63 chars), with the NUMA node as topology when known. Health comes
from the shared HealthBoard: a GPU going unhealthy and coming back are both streamed.

Lifecycle, as NVIDIA's plugin: serve on our own socket in kubelet's device-plugin directory,
dial it to be sure it answers, then Register with kubelet. kubelet wipes the directory when it
restarts and re-creates `kubelet.sock`; a watch on the directory (watchdog/inotify) notices the
new kubelet socket, or our own socket vanishing, and restarts the server and registers again.

In the daemon it is the ``device plugin`` part (koordlet/agent/wiring/devices.py; after the GPU service, gate
``Accelerators``), started with ``require_kubelet=False``: a kubelet that is not up yet is waited for.
"""

from __future__ import annotations

import logging
import os
import threading
import time
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
from koordlet.kubeapi import CoreV1
from koordlet.nodelock import NodeLocker
from koordlet.system.roots import DEV_DIR
from koordlet.ticker import PeriodicThread, start_observer
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
    def __init__(self, kubelet_socket: str, own_socket: str, wake: Callable[[], None],
                 registered: Callable[[], bool]) -> None:
        self._kubelet_socket = kubelet_socket
        self._own_socket = own_socket
        self._wake = wake
        self._registered = registered

    def on_any_event(self, event: FileSystemEvent) -> None:
        path = os.fsdecode(event.src_path)
        dest = os.fsdecode(getattr(event, "dest_path", "") or "")
        if (event.event_type == "created" and path == self._kubelet_socket) or (
            event.event_type == "moved" and dest == self._kubelet_socket
        ):
            _log.info("kubelet socket %s (re)created: kubelet restarted", self._kubelet_socket)
            self._wake()
        elif event.event_type == "deleted" and path == self._own_socket and self._registered():
            # Only while registered: before that, every retry removes and makes our socket itself, and waking on
            # that would start the next retry at once, a busy loop past the retry's backoff (the retry timer and
            # kubelet's socket drive the retries).
            _log.info("device plugin socket %s removed", path)
            self._wake()


def _identity(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


# While not registered (kubelet not up yet, or it refused us), the watch loop also retries on its own,
# 1 s after the failure, doubling up to this bound; a new kubelet.sock retries at once.
_RETRY_MIN_S = 1.0
_RETRY_MAX_S = 30.0
# While registered, only a directory event (or a stop) wakes the watch; this is the loop's idle period.
_REGISTERED_CHECK_S = 24 * 3600.0


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
        self._stop = threading.Event()  # cuts a registration wait short
        self._observer: Any = None
        self._retry_s = _RETRY_MIN_S
        self._watch: PeriodicThread | None = None
        self._lock = threading.Lock()
        self.registrations = 0
        self.registered = threading.Event()  # set while the last registration with kubelet succeeded
        self._registered_kubelet: tuple[int, int, int] | None = None

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

    def _halt(self, grace_s: float = 1.0) -> bool:
        """Stop the gRPC server, waiting at most ``grace_s`` (+ a little) for its calls; True when it ended."""
        if self._servicer is not None:
            self._servicer.stop()
        done = True
        if self._server is not None:
            grace_s = max(grace_s, 0.0)
            done = self._server.stop(grace=grace_s).wait(grace_s + 0.5)
        self._server = self._servicer = None
        return bool(done)

    def register(self) -> None:
        """Register with kubelet; raises DevicePluginError when kubelet refuses or is not there."""
        self.registered.clear()
        request = pb.RegisterRequest(
            version=API_VERSION,
            endpoint=self.socket_name,
            resource_name=self.resource_name,
            options=pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True),
        )
        if not os.path.exists(self.kubelet_socket):
            # Not there at all: fail at once (the directory watch sees it appear) rather than wait the dial out.
            raise DevicePluginError(f"kubelet socket {self.kubelet_socket} does not answer (no such socket)")
        with grpc.insecure_channel(f"unix://{self.kubelet_socket}") as channel:
            call = pb_grpc.RegistrationStub(channel).Register.future(
                request, timeout=self._dial_timeout_s, wait_for_ready=True
            )
            finished = threading.Event()
            call.add_done_callback(lambda _call: finished.set())
            # A stop cuts the wait for kubelet short.
            while not finished.wait(0.05):
                if self._stop.is_set():
                    call.cancel()
                    raise DevicePluginError(f"stopped while registering with {self.kubelet_socket}")
            try:
                call.result()
            except grpc.FutureCancelledError as exc:
                raise DevicePluginError(f"registration with {self.kubelet_socket} cancelled") from exc
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
        self.registered.set()
        _log.info("registered %s with kubelet at %s", self.resource_name, self.kubelet_socket)

    def _needs_restart(self) -> bool:
        # Our own unlink/bind in _serve fires events too, and a kubelet.sock event may arrive after we
        # already registered with that very socket (a restart woken by our socket's removal): only a
        # kubelet socket other than the one we registered with (device, inode and change time), a missing
        # socket of ours or a registration still to be done is a reason to start over.
        if not self.registered.is_set():
            return True
        current = _identity(self.kubelet_socket)
        return not os.path.exists(self.socket_path) or (current is not None and current != self._registered_kubelet)

    def _restart(self) -> None:
        with self._lock:
            if self._stop.is_set():
                return
            self._halt()
            self._serve()
            self.register()

    def start(self, require_kubelet: bool = True) -> None:
        """Serve, register, and watch the directory for kubelet restarts.

        ``require_kubelet``: a failed first registration raises DevicePluginError (and nothing is left
        running); with False (the daemon) it is logged and retried when kubelet's socket appears, and
        every ``_RETRY_MIN_S``..``_RETRY_MAX_S`` (doubling) until it succeeds."""
        self._stop.clear()
        self._retry_s = _RETRY_MIN_S
        os.makedirs(self.plugin_dir, exist_ok=True)
        self._observer = Observer()
        self._observer.schedule(
            _DirWatch(self.kubelet_socket, self.socket_path, self._wake_watch, self.registered.is_set),
            self.plugin_dir,
        )
        start_observer(self._observer, "deviceplugin-dir-watch")
        try:
            self._restart()
        except DevicePluginError as exc:
            if require_kubelet:
                self.stop()
                raise
            _log.warning("device plugin for %s not registered yet: %s; waiting for kubelet", self.resource_name,
                         exc)
        # Registered: check at once (a kubelet restart during the first registration woke nobody yet);
        # not: the first retry after its delay.
        self._watch = PeriodicThread("deviceplugin-watch", self._check_interval_s, self._check,
                                     first_delay_s=0.0 if self.registered.is_set() else self._retry_s)
        self._watch.start()

    def _wake_watch(self) -> None:
        watch = self._watch
        if watch is not None:
            watch.wake()

    def _check_interval_s(self) -> float:
        return _REGISTERED_CHECK_S if self.registered.is_set() else self._retry_s

    def _check(self) -> None:
        """One round of the watch (woken by a directory event, or the retry while unregistered)."""
        if self._stop.is_set() or not self._needs_restart():
            return
        try:
            self._restart()
            self._retry_s = _RETRY_MIN_S
        except DevicePluginError as exc:
            # kubelet may still be coming up; its socket's creation wakes us again, else the retry.
            _log.warning("device plugin registration failed (next try within %.0f s): %s", self._retry_s, exc)
            self._retry_s = min(self._retry_s * 2, _RETRY_MAX_S)

    def stop(self, timeout_s: float = 10.0) -> bool:
        """Stop watching and serving within ``timeout_s``; remove our socket. True when everything ended in
        time (a registration attempt in flight may hold the loop for up to the dial timeout)."""
        deadline = time.monotonic() + max(timeout_s, 0.0)

        def left() -> float:
            return max(deadline - time.monotonic(), 0.0)

        self._stop.set()
        ended = True
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=left())
            ended = not self._observer.is_alive()
            self._observer = None
        if self._watch is not None:
            ended = self._watch.stop(left()) and ended
            self._watch = None
        if self._lock.acquire(timeout=left()):
            try:
                ended = self._halt(grace_s=min(1.0, left() / 2)) and ended
            finally:
                self._lock.release()
        else:
            ended = False
        self.registered.clear()
        remove_socket(self.socket_path)
        return ended


def gpu_device_plugin(
    core_api: CoreV1 | None,
    node_name: str,
    service: GPUService,
    resource_name: str = api.RESOURCE_NVIDIA_GPU,
    plugin_dir: str = DEVICE_PLUGIN_PATH,
    lock_key: str = api.ANNOTATION_NODE_LOCK,
    dev_dir: str = DEV_DIR,
) -> DevicePluginServer:
    """The device plugin wired to koordlet's GPU service and the API server (call .start()). Without an API
    server (``core_api`` None: local mode) it registers and lists the GPUs, but Allocate fails with a clear
    error: the scheduler's choice lives in the API server."""

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
