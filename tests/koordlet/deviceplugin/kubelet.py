"""A test kubelet: the real Registration gRPC service on a unix socket, and a client of the plugin.

It records each RegisterRequest and, like kubelet's device manager, dials the plugin at the
endpoint it announced (relative to the device plugin directory). With ``pod_resources_dir`` it also serves
kubelet's pod resources API (``v1.PodResourcesLister``) on ``<dir>/kubelet.sock``, answering from
``pod_resources`` and ``allocatable`` as kubelet answers from its managers (``Get`` of an unknown pod: kubelet's
error, status Unknown).
"""

from __future__ import annotations

import os
import queue
from concurrent import futures

import grpc

from wire import deviceplugin_pb2 as pb
from wire import deviceplugin_pb2_grpc as pb_grpc
from wire import podresources_pb2 as prpb
from wire import podresources_pb2_grpc as prpb_grpc
from wire.sockets import remove_socket


class _Registration(pb_grpc.RegistrationServicer):
    def __init__(self, requests: queue.Queue, refuse: str | None) -> None:
        self._requests = requests
        self._refuse = refuse

    def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> pb.Empty:
        if self._refuse:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, self._refuse)
        self._requests.put(request)
        return pb.Empty()


class _PodResources(prpb_grpc.PodResourcesListerServicer):
    def __init__(self, kubelet: TestKubelet) -> None:
        self._kubelet = kubelet

    def List(self, request, context):  # noqa: N802 - gRPC method name
        self._kubelet.pod_resource_calls.append("List")
        return prpb.ListPodResourcesResponse(pod_resources=self._kubelet.pod_resources)

    def Get(self, request, context):  # noqa: N802
        self._kubelet.pod_resource_calls.append("Get")
        for pod in self._kubelet.pod_resources:
            if pod.name == request.pod_name and pod.namespace == request.pod_namespace:
                return prpb.GetPodResourcesResponse(pod_resources=pod)
        context.abort(grpc.StatusCode.UNKNOWN, f"pod {request.pod_name} in namespace {request.pod_namespace} "
                                               "not found")

    def GetAllocatableResources(self, request, context):  # noqa: N802
        self._kubelet.pod_resource_calls.append("GetAllocatableResources")
        return self._kubelet.allocatable


class TestKubelet:
    __test__ = False  # not a test class

    def __init__(self, plugin_dir: str, refuse: str | None = None, pod_resources_dir: str | None = None) -> None:
        self.plugin_dir = plugin_dir
        self.socket = os.path.join(plugin_dir, "kubelet.sock")
        self.registrations: queue.Queue[pb.RegisterRequest] = queue.Queue()
        self.pod_resources: list[prpb.PodResources] = []
        self.allocatable = prpb.AllocatableResourcesResponse()
        self.pod_resource_calls: list[str] = []
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        pb_grpc.add_RegistrationServicer_to_server(_Registration(self.registrations, refuse), self._server)
        self._server.add_insecure_port(f"unix://{self.socket}")
        self.pod_resources_socket = ""
        if pod_resources_dir is not None:
            os.makedirs(pod_resources_dir, exist_ok=True)
            self.pod_resources_socket = os.path.join(pod_resources_dir, "kubelet.sock")
            prpb_grpc.add_PodResourcesListerServicer_to_server(_PodResources(self), self._server)
            self._server.add_insecure_port(f"unix://{self.pod_resources_socket}")
        self._server.start()

    def next_registration(self, timeout_s: float = 10.0) -> pb.RegisterRequest:
        return self.registrations.get(timeout=timeout_s)

    def plugin_channel(self, request: pb.RegisterRequest) -> grpc.Channel:
        return grpc.insecure_channel(f"unix://{os.path.join(self.plugin_dir, request.endpoint)}")

    def stop(self) -> None:
        self._server.stop(grace=None).wait()
        remove_socket(self.socket)
        if self.pod_resources_socket:
            remove_socket(self.pod_resources_socket)
