"""A test kubelet: the real Registration gRPC service on a unix socket, and a client of the plugin.

It records each RegisterRequest and, like kubelet's device manager, dials the plugin at the
endpoint it announced (relative to the device plugin directory).
"""

from __future__ import annotations

import os
import queue
from concurrent import futures

import grpc

from wire import deviceplugin_pb2 as pb
from wire import deviceplugin_pb2_grpc as pb_grpc
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


class TestKubelet:
    __test__ = False  # not a test class

    def __init__(self, plugin_dir: str, refuse: str | None = None) -> None:
        self.plugin_dir = plugin_dir
        self.socket = os.path.join(plugin_dir, "kubelet.sock")
        self.registrations: queue.Queue[pb.RegisterRequest] = queue.Queue()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        pb_grpc.add_RegistrationServicer_to_server(_Registration(self.registrations, refuse), self._server)
        self._server.add_insecure_port(f"unix://{self.socket}")
        self._server.start()

    def next_registration(self, timeout_s: float = 10.0) -> pb.RegisterRequest:
        return self.registrations.get(timeout=timeout_s)

    def plugin_channel(self, request: pb.RegisterRequest) -> grpc.Channel:
        return grpc.insecure_channel(f"unix://{os.path.join(self.plugin_dir, request.endpoint)}")

    def stop(self) -> None:
        self._server.stop(grace=None).wait()
        remove_socket(self.socket)
