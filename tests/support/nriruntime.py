"""A stand-in for containerd's side of NRI, for the tests that must put bytes on the wire that a real runtime
never sends (garbage, oversized messages, unknown methods) or watch every frame a plugin writes.

Written apart from wire/ttrpc.py and wire/nrimux.py (plain blocking sockets, framing by hand), so the plugin's
protocol code is checked against an independent reading of the protocol; only the message classes come
from the generated stubs. One plugin connection at a time, as containerd serves it: RegisterPlugin answered
on mux connection 2, calls made on connection 1.
"""

from __future__ import annotations

import os
import queue
import socket
import struct
import threading
from dataclasses import dataclass, field

from google.protobuf.message import Message

from wire import nri_pb2 as api
from wire import ttrpc_pb2

PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"
MUX = struct.Struct(">II")
TTRPC = struct.Struct(">IIBB")


def mux_frame(conn_id: int, payload: bytes) -> bytes:
    return MUX.pack(conn_id, len(payload)) + payload


def ttrpc_message(stream_id: int, message_type: int, data: bytes, flags: int = 0) -> bytes:
    return TTRPC.pack(len(data), stream_id, message_type, flags) + data


@dataclass
class Received:
    conn_id: int
    stream_id: int
    type: int
    data: bytes


@dataclass
class RuntimeConn:
    """The runtime's end of one plugin connection; a reader thread sorts what the plugin writes."""

    sock: socket.socket
    frame_payloads: list[int] = field(default_factory=list)  # every frame's payload length, as written
    registered: queue.Queue = field(default_factory=queue.Queue)  # RegisterPluginRequest
    responses: dict[int, queue.Queue] = field(default_factory=dict)
    other: list[Received] = field(default_factory=list)
    closed: threading.Event = field(default_factory=threading.Event)
    _next_id: int = 1
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        threading.Thread(target=self._read, name="fake-nri-runtime", daemon=True).start()

    def _recv_exact(self, n: int) -> bytes:
        data = bytearray()
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("plugin closed the connection")
            data += chunk
        return bytes(data)

    def _read(self) -> None:
        buffers: dict[int, bytearray] = {}
        try:
            while True:
                conn_id, length = MUX.unpack(self._recv_exact(MUX.size))
                self.frame_payloads.append(length)
                buffer = buffers.setdefault(conn_id, bytearray())
                buffer += self._recv_exact(length)
                while len(buffer) >= TTRPC.size:
                    size, stream_id, message_type, _ = TTRPC.unpack(buffer[:TTRPC.size])
                    if len(buffer) < TTRPC.size + size:
                        break
                    data = bytes(buffer[TTRPC.size:TTRPC.size + size])
                    del buffer[:TTRPC.size + size]
                    self._sort(Received(conn_id, stream_id, message_type, data))
        except (ConnectionError, OSError):
            pass
        finally:
            self.closed.set()

    def _sort(self, item: Received) -> None:
        if item.conn_id == 2 and item.type == 1:  # the plugin calls the runtime
            request = ttrpc_pb2.Request.FromString(item.data)
            if request.method == "RegisterPlugin":
                self.registered.put(api.RegisterPluginRequest.FromString(request.payload))
                self.send(2, ttrpc_message(item.stream_id, 2, ttrpc_pb2.Response(
                    status=ttrpc_pb2.Status(), payload=api.Empty().SerializeToString()).SerializeToString()))
                return
        if item.conn_id == 1 and item.type == 2:
            self._waiting(item.stream_id).put(ttrpc_pb2.Response.FromString(item.data))
            return
        self.other.append(item)

    def _waiting(self, stream_id: int) -> queue.Queue:
        with self._lock:
            return self.responses.setdefault(stream_id, queue.Queue())

    def send(self, conn_id: int, data: bytes, frame_payload: int = 1 << 30) -> None:
        """``data`` to ``conn_id`` in frames of at most ``frame_payload`` bytes (default: one frame)."""
        out = bytearray()
        for start in range(0, max(len(data), 1), frame_payload):
            out += mux_frame(conn_id, data[start:start + frame_payload])
        with self._lock:
            self.sock.sendall(bytes(out))

    def next_stream_id(self) -> int:
        with self._lock:
            stream_id, self._next_id = self._next_id, self._next_id + 2
            return stream_id

    def request(self, method: str, payload: bytes, service: str = PLUGIN_SERVICE, timeout_s: float = 2.0,
                stream_id: int | None = None) -> int:
        """Send a call on connection 1; returns its stream id (wait for the answer with :meth:`response`)."""
        stream_id = self.next_stream_id() if stream_id is None else stream_id
        envelope = ttrpc_pb2.Request(service=service, method=method, payload=payload,
                                     timeout_nano=int(timeout_s * 1e9))
        self.send(1, ttrpc_message(stream_id, 1, envelope.SerializeToString()))
        return stream_id

    def response(self, stream_id: int, timeout_s: float = 5.0) -> ttrpc_pb2.Response:
        return self._waiting(stream_id).get(timeout=timeout_s)

    def call(self, method: str, request: Message, answer_type: type[Message], timeout_s: float = 2.0,
             wait_s: float = 5.0) -> Message:
        """A call that must succeed; returns the decoded answer."""
        response = self.response(self.request(method, request.SerializeToString(), timeout_s=timeout_s), wait_s)
        if response.status.code:
            raise AssertionError(f"{method} answered {response.status.code}: {response.status.message}")
        return answer_type.FromString(response.payload)

    def handshake(self, pods: list[api.PodSandbox] | None = None, containers: list[api.Container] | None = None,
                  chunks: int = 1, wait_s: float = 5.0, runtime: tuple[str, str] = ("fake", "0"),
                  ) -> tuple[api.ConfigureResponse, list[api.SynchronizeResponse]]:
        """What containerd does after RegisterPlugin: Configure (as ``runtime``: name, version), then Synchronize in
        ``chunks`` messages."""
        self.registered.get(timeout=wait_s)
        configured = self.call("Configure", api.ConfigureRequest(runtime_name=runtime[0], runtime_version=runtime[1],
                                                                 registration_timeout=5000, request_timeout=2000),
                               api.ConfigureResponse)
        pods, containers = pods or [], containers or []
        answers = []
        for index in range(chunks):
            more = index < chunks - 1
            request = api.SynchronizeRequest(pods=pods[index::chunks], containers=containers[index::chunks], more=more)
            answers.append(self.call("Synchronize", request, api.SynchronizeResponse))
        return configured, answers

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


class FakeRuntime:
    """Listens where a runtime's NRI socket would be; ``accept`` hands over each plugin connection."""

    def __init__(self, path: str) -> None:
        self.path = path
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(8)
        self.connections: list[RuntimeConn] = []

    def accept(self, timeout_s: float = 10.0) -> RuntimeConn:
        self.listener.settimeout(timeout_s)
        sock, _ = self.listener.accept()
        sock.settimeout(None)
        conn = RuntimeConn(sock)
        self.connections.append(conn)
        return conn

    def live(self) -> int:
        """Connections the plugin still holds open."""
        return sum(1 for conn in self.connections if not conn.closed.is_set())

    def close(self) -> None:
        for conn in self.connections:
            conn.close()
        self.listener.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
