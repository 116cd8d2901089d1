"""The pod-resources proxy (gate ``PodResourcesProxy``; Koordinator statesinformer/impl/states_pod_resources.go):
kubelet's ``v1.PodResourcesLister`` served by koordlet at ``<-pod-resources-proxy-path>/kubelet.sock``, so that
a node agent that asks kubelet which devices a pod holds (a monitoring exporter, a CNI) also learns the devices
Koordinator's scheduler allocated, which kubelet does not know.

Every call goes to kubelet's own socket (``<-var-lib-kubelet-dir>/pod-resources/kubelet.sock``) first and
answers what kubelet answered (its errors as they came, unknown fields kept). To ``List`` and, beyond
Koordinator, to ``Get``, each pod's ``scheduling.koordinator.sh/device-allocated`` devices are added to its
first container: ``nvidia.com/gpu`` (the GPUs' ids: UUIDs, or the VFs' bus ids) and ``koordinator.sh/rdma``
(the PFs' bus ids, or their VFs'), the container's devices sorted by resource name, as Koordinator does; a
resource kubelet already reports for that container (a GPU a kubelet device plugin gave) is not added twice,
and a device type without a Kubernetes resource name (fpga) is left out rather than added nameless. A pod
whose annotation is malformed gets kubelet's answer unchanged (logged once while the pod is there: the pods
warned about are kept under a lock, as gRPC's worker threads answer at once, and forgotten when they are gone).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent import futures

import grpc

from koordlet.api.device import (
    ANNOTATION_DEVICE_ALLOCATED,
    RESOURCE_NVIDIA_GPU,
    RESOURCE_RDMA,
    DeviceAnnotationError,
    parse_device_allocated,
    parse_rdma_allocated,
)
from koordlet.api.pod import PodMeta
from wire import podresources_pb2 as pb
from wire import podresources_pb2_grpc as pb_grpc
from wire.sockets import chmod_socket, prepare_socket, remove_socket

logger = logging.getLogger(__name__)

SOCKET_NAME = "kubelet.sock"
KUBELET_TIMEOUT_S = 10.0
WARNED_MAX = 4096  # pods warned about at most kept; beyond it the set starts again (a pod may be warned twice)


def allocated_devices(pod: PodMeta) -> list[pb.ContainerDevices]:
    """The devices the scheduler gave ``pod``, by resource name (Koordinator's fillPodDevicesAllocatedByKoord)."""
    raw = pod.annotations.get(ANNOTATION_DEVICE_ALLOCATED)
    if not raw:
        return []
    out: list[pb.ContainerDevices] = []
    gpu_ids = [gpu.uuid for gpu in parse_device_allocated(raw).gpus if gpu.uuid]
    if gpu_ids:
        out.append(pb.ContainerDevices(resource_name=RESOURCE_NVIDIA_GPU, device_ids=gpu_ids))
    rdma_ids: list[str] = []
    for entry in parse_rdma_allocated(raw):
        rdma_ids += [vf.bus_id for vf in entry.vfs] if entry.vfs else [entry.bus_id]
    if rdma_ids:
        out.append(pb.ContainerDevices(resource_name=RESOURCE_RDMA, device_ids=rdma_ids))
    return out


class PodResourcesProxy(pb_grpc.PodResourcesListerServicer):
    """``pods``: the states informer's pods (their annotations); ``kubelet_socket``: kubelet's own."""

    def __init__(self, pods: Callable[[], Sequence[PodMeta]], kubelet_socket: str) -> None:
        self._pods = pods
        self._channel = grpc.insecure_channel(f"unix://{kubelet_socket}")
        self._kubelet = pb_grpc.PodResourcesListerStub(self._channel)
        self._warned: set[str] = set()
        self._warned_lock = threading.Lock()

    @property
    def warned(self) -> frozenset[str]:
        """The pods (namespace/name) whose device annotation was found malformed and named in the log."""
        with self._warned_lock:
            return frozenset(self._warned)

    def _warn_once(self, pod: PodMeta, err: DeviceAnnotationError) -> None:
        with self._warned_lock:
            if pod.key in self._warned:
                return
            if len(self._warned) >= WARNED_MAX:
                self._warned.clear()
            self._warned.add(pod.key)
        logger.warning("pod resources of %s: its device annotation is ignored: %s", pod.key, err)

    def _forget_gone(self, by_key: dict[str, PodMeta]) -> None:
        with self._warned_lock:
            self._warned.intersection_update(by_key)

    def close(self) -> None:
        self._channel.close()

    def _call(self, method: Callable, request: object, context: grpc.ServicerContext):  # noqa: ANN202
        try:
            return method(request, timeout=KUBELET_TIMEOUT_S)
        except grpc.RpcError as err:
            code = err.code() if isinstance(err, grpc.Call) else grpc.StatusCode.UNAVAILABLE
            details = err.details() if isinstance(err, grpc.Call) else str(err)
            context.abort(code, f"kubelet pod resources: {details}")

    def _fill(self, resources: pb.PodResources, by_key: dict[str, PodMeta]) -> None:
        if not resources.containers:
            return
        pod = by_key.get(f"{resources.namespace}/{resources.name}")
        if pod is None:
            return
        try:
            devices = allocated_devices(pod)
        except DeviceAnnotationError as err:
            self._warn_once(pod, err)
            return
        first = resources.containers[0]
        known = {device.resource_name for device in first.devices}
        added = [device for device in devices if device.resource_name not in known]
        if not added:
            return
        merged = sorted([*first.devices, *added], key=lambda device: device.resource_name)
        del first.devices[:]
        first.devices.extend(merged)

    def List(self, request: pb.ListPodResourcesRequest, context: grpc.ServicerContext) -> pb.ListPodResourcesResponse:  # noqa: N802
        response = self._call(self._kubelet.List, request, context)
        by_key = {pod.key: pod for pod in self._pods()}
        self._forget_gone(by_key)
        for resources in response.pod_resources:
            self._fill(resources, by_key)
        return response

    def Get(self, request: pb.GetPodResourcesRequest, context: grpc.ServicerContext) -> pb.GetPodResourcesResponse:  # noqa: N802
        response = self._call(self._kubelet.Get, request, context)
        by_key = {pod.key: pod for pod in self._pods()}
        self._forget_gone(by_key)
        self._fill(response.pod_resources, by_key)
        return response

    def GetAllocatableResources(self, request: pb.AllocatableResourcesRequest,  # noqa: N802
                                context: grpc.ServicerContext) -> pb.AllocatableResourcesResponse:
        return self._call(self._kubelet.GetAllocatableResources, request, context)


class PodResourcesServer:
    """The proxy on its unix socket (mode 0660, a stale socket replaced, a live one refused)."""

    def __init__(self, proxy: PodResourcesProxy, socket_path: str, workers: int = 2) -> None:
        self._proxy = proxy
        self.socket_path = socket_path
        self._workers = workers
        self._server: grpc.Server | None = None

    def start(self) -> None:
        prepare_socket(self.socket_path)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=self._workers,
                                                        thread_name_prefix="pod-resources"))
        pb_grpc.add_PodResourcesListerServicer_to_server(self._proxy, server)
        if server.add_insecure_port(f"unix://{self.socket_path}") == 0:
            raise OSError(f"cannot serve pod resources on {self.socket_path}")
        server.start()
        chmod_socket(self.socket_path)
        self._server = server
        logger.info("pod resources proxy on %s", self.socket_path)

    def stop(self, timeout_s: float = 2.0) -> bool:
        if self._server is not None:
            self._server.stop(grace=min(timeout_s, 1.0)).wait(timeout_s)
            self._server = None
            remove_socket(self.socket_path)
        self._proxy.close()
        return True
