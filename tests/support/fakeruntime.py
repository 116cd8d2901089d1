"""A recording gRPC server standing in for the runtime where a test must see the raw bytes,
metadata and deadlines the proxy forwards, or needs answers containerd never gives (custom
metadata and trailers, server streams, slow calls). It is a real gRPC server on a unix socket;
the proxy in front of it is the thing under test.
"""

from __future__ import annotations

import threading
import time
from concurrent import futures
from dataclasses import dataclass, field

import grpc

from wire import cri_pb2 as cri


@dataclass
class Received:
    method: str
    payload: bytes
    metadata: dict[str, str | bytes]
    time_remaining: float | None


EVENTS = "/runtime.v1.RuntimeService/GetContainerEvents"


@dataclass
class FakeRuntime:
    socket_path: str
    received: list[Received] = field(default_factory=list)
    server: grpc.Server | None = None
    sleep_s: float = 0.0
    subscriptions_ended: list[float] = field(default_factory=list)  # when each GetContainerEvents call ended here
    _lock: threading.Lock = field(default_factory=threading.Lock)

    INITIAL = (("x-initial", "from-runtime"),)
    TRAILING = (("x-trailer", "bye"), ("x-blob-bin", b"\x00\xffbin"))

    def _record(self, method: str, request: bytes, context: grpc.ServicerContext) -> None:
        remaining = context.time_remaining()
        with self._lock:
            self.received.append(Received(
                method, request, dict(context.invocation_metadata()),
                None if remaining is None or remaining > 1e7 else remaining))

    def _unary(self, method: str):
        def handler(request: bytes, context: grpc.ServicerContext) -> bytes:
            self._record(method, request, context)
            meta = dict(context.invocation_metadata())
            if self.sleep_s or "x-sleep" in meta:
                time.sleep(float(meta.get("x-sleep", self.sleep_s)))
            if "x-fail" in meta:
                context.set_trailing_metadata(self.TRAILING)
                context.abort(grpc.StatusCode[str(meta["x-fail"])], "told to fail: ünïcode % message")
            context.send_initial_metadata(self.INITIAL)
            context.set_trailing_metadata(self.TRAILING)
            if method.endswith("/CreateContainer"):
                return cri.CreateContainerResponse(container_id="fake-container").SerializeToString()
            if method.endswith("/RunPodSandbox"):
                return cri.RunPodSandboxResponse(pod_sandbox_id="fake-sandbox").SerializeToString()
            return request  # echo
        return grpc.unary_unary_rpc_method_handler(handler)

    def _stream(self, method: str):
        def handler(request: bytes, context: grpc.ServicerContext):
            self._record(method, request, context)
            context.send_initial_metadata(self.INITIAL)
            for i in range(int(request.decode() or "3")):
                yield f"item-{i}".encode() * 100
            context.set_trailing_metadata(self.TRAILING)
        return grpc.unary_stream_rpc_method_handler(handler)

    def _events(self):
        """GetContainerEvents as containerd serves it: a stream that never ends by itself. An event every 50 ms
        (``x-quiet`` in the metadata: none, so no response headers either) until the client goes."""
        def handler(request: bytes, context: grpc.ServicerContext):
            self._record(EVENTS, request, context)
            ended = threading.Event()
            context.add_callback(lambda: self._subscription_ended(ended))
            quiet = "x-quiet" in dict(context.invocation_metadata())
            n = 0
            while not ended.is_set():
                if not quiet:
                    n += 1
                    yield cri.ContainerEventResponse(container_id=f"event-{n}", created_at=time.time_ns(),
                                                     container_event_type=cri.CONTAINER_STARTED_EVENT
                                                     ).SerializeToString()
                ended.wait(0.05)
        return grpc.unary_stream_rpc_method_handler(handler)

    def _subscription_ended(self, ended: threading.Event) -> None:
        ended.set()
        with self._lock:
            self.subscriptions_ended.append(time.monotonic())

    def start(self) -> FakeRuntime:
        outer = self

        class Generic(grpc.GenericRpcHandler):
            def service(self, details: grpc.HandlerCallDetails):
                if details.method.startswith("/test.Stream/"):
                    return outer._stream(details.method)
                if details.method == EVENTS:
                    return outer._events()
                return outer._unary(details.method)

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8),
                                  handlers=[Generic()],
                                  options=[("grpc.max_receive_message_length", -1)])
        self.server.add_insecure_port(f"unix://{self.socket_path}")
        self.server.start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(0).wait(5)
            self.server = None
