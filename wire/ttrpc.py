"""ttrpc, containerd's small RPC protocol, on any byte stream (containerd/ttrpc PROTOCOL.md; docs/nri-protocol.md §1).

A message is a 10-byte header (data length uint32 BE, stream id uint32 BE, type, flags) and the data: a
``ttrpc.Request`` or ``ttrpc.Response`` envelope (proto/ttrpc.proto). The caller picks odd stream ids, 1, 3,
5 ...; the answer comes back on the same id, in any order. NRI uses unary calls only, so data messages and
streams are read and ignored.

Here, without any I/O of its own (the NRI mux in wire/nrimux.py carries the bytes):

- :class:`MessageReader` cuts a byte stream into messages. It accepts messages up to :data:`RECEIVE_MAX`
  (16 MiB): ttrpc's own limit is 4 MiB, but an NRI v0.6 runtime (containerd 1.7.16-1.7.25) sends a large
  Synchronize in one unsplit message, and a plugin that refuses it is left connected with no events at all
  (containerd/nri#102, Koordinator #2678). A longer message is discarded and answered RESOURCE_EXHAUSTED, as
  ttrpc does. A header that cannot be one (an unknown message type) is garbage: the rest of the carrying mux
  frame is dropped and reading starts again at the next frame.
- :class:`Server` answers requests with registered handlers: UNIMPLEMENTED for an unknown service or method,
  INVALID_ARGUMENT for an undecodable envelope or an even / reused stream id (the Go server's checks), the
  handler's :class:`TtrpcError` as its status, and every handler in its own task, so a slow answer never holds
  up the next request. A :class:`Deferred` handler gets no task: it starts the work and returns, and the work
  answers through the reply it was given, from any thread (its ``send`` must allow that).
- :class:`Client` makes calls and matches the answers by stream id.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
import struct
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from . import ttrpc_pb2

log = logging.getLogger(__name__)

HEADER = struct.Struct(">IIBB")
HEADER_BYTES = HEADER.size
TYPE_REQUEST = 1
TYPE_RESPONSE = 2
TYPE_DATA = 3
MESSAGE_MAX = 4 << 20  # ttrpc's limit: the most a Go peer takes from us (channel.go messageLengthMax)
RECEIVE_MAX = 16 << 20  # what we take: the largest message an NRI <= v0.6 mux frame can carry


class Code(enum.IntEnum):
    """gRPC status codes, which ttrpc uses."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14


class TtrpcError(Exception):
    """A call answered with a status other than OK (or a handler's way to answer one)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{_code_name(code)}: {message}")
        self.code = code
        self.message = message


class ConnectionClosed(Exception):
    """The stream ended while calls were waiting for their answers."""


def _code_name(code: int) -> str:
    try:
        return Code(code).name
    except ValueError:
        return f"code {code}"


def encode(stream_id: int, message_type: int, data: bytes, flags: int = 0) -> bytes:
    """One message: header and data (the caller keeps ``data`` within the receiver's limit)."""
    return HEADER.pack(len(data), stream_id, message_type, flags) + data


@dataclass(frozen=True, slots=True)
class Message:
    stream_id: int
    type: int
    flags: int
    data: bytes


@dataclass(frozen=True, slots=True)
class Oversized:
    """A message longer than the reader takes; its data was discarded."""

    stream_id: int
    type: int
    length: int


class MessageReader:
    """Cuts the bytes of one stream into :class:`Message` (and :class:`Oversized`) items.

    ``feed`` takes bytes as they come and returns the items completed; ``end_of_frame`` marks the end of the
    mux frame that carried them, where reading may start again after garbage."""

    def __init__(self, limit: int = RECEIVE_MAX) -> None:
        self.limit = limit
        self._buffer = bytearray()
        self._header: tuple[int, int, int, int] | None = None  # (length, stream id, type, flags) being read
        self._discard = 0  # bytes of an oversized message still to skip
        self._garbage = False  # skipping to the end of the current frame
        self.garbage_frames = 0

    def feed(self, data: bytes) -> list[Message | Oversized]:
        if self._garbage:
            return []
        out: list[Message | Oversized] = []
        view = memoryview(data)
        while view:
            if self._discard:
                taken = min(self._discard, len(view))
                self._discard -= taken
                view = view[taken:]
                if not self._discard and self._header is not None:
                    length, stream_id, message_type, _ = self._header
                    out.append(Oversized(stream_id, message_type, length))
                    self._header = None
                continue
            if self._header is None:
                need = HEADER_BYTES - len(self._buffer)
                self._buffer += view[:need]
                view = view[need:]
                if len(self._buffer) < HEADER_BYTES:
                    break
                header = HEADER.unpack(self._buffer)
                self._buffer.clear()
                if not self._start(header):
                    return out
                continue
            length = self._header[0]
            need = length - len(self._buffer)
            self._buffer += view[:need]
            view = view[need:]
            if len(self._buffer) == length:
                _, stream_id, message_type, flags = self._header
                out.append(Message(stream_id, message_type, flags, bytes(self._buffer)))
                self._buffer.clear()
                self._header = None
        if self._header is not None and self._header[0] == 0:  # an empty message completes at its header
            _, stream_id, message_type, flags = self._header
            out.append(Message(stream_id, message_type, flags, b""))
            self._header = None
        return out

    def _start(self, header: tuple[int, int, int, int]) -> bool:
        length, _, message_type, _ = header
        if message_type not in (TYPE_REQUEST, TYPE_RESPONSE, TYPE_DATA):
            self._garbage = True
            self.garbage_frames += 1
            return False
        self._header = header
        if length > self.limit:
            self._discard = length
        return True

    def end_of_frame(self) -> None:
        """A mux frame ended: after garbage, the next frame starts a new message."""
        if self._garbage:
            self._garbage = False
            self._buffer.clear()
            self._header = None
            self._discard = 0


# A handler takes the method's serialized request and the monotonic time by which the caller wants its
# answer (None: no deadline), and returns the serialized response or raises TtrpcError.
Handler = Callable[[bytes, float | None], Awaitable[bytes]]
Send = Callable[[bytes], None]
# How a deferred handler answers, once, from any thread: the serialized response, or a TtrpcError.
Reply = Callable[[bytes | TtrpcError], None]


@dataclass(frozen=True, slots=True)
class Deferred:
    """A handler that answers later through ``reply``: ``start(payload, deadline, reply)`` returns at once (an
    exception it raises answers as a returning handler's would)."""

    start: Callable[[bytes, float | None, Reply], None]


def _deadline(timeout_nano: int) -> float | None:
    return time.monotonic() + timeout_nano / 1e9 if timeout_nano > 0 else None


class Server:
    """Serves ``services`` (service name -> method name -> handler) on one stream, answering through ``send``."""

    def __init__(self, services: Mapping[str, Mapping[str, Handler | Deferred]], send: Send,
                 response_limit: int = MESSAGE_MAX, receive_limit: int = RECEIVE_MAX) -> None:
        self._services = services
        self._send = send
        self._response_limit = response_limit
        self._reader = MessageReader(receive_limit)
        self._last_stream_id = 0
        self._tasks: set[asyncio.Task] = set()
        self.rejected = 0  # requests answered with an error status by the protocol itself

    def feed(self, data: bytes) -> None:
        for item in self._reader.feed(data):
            if isinstance(item, Oversized):
                limit = self._reader.limit
                log.warning("ttrpc: discarded a %d-byte message on stream %d (limit %d)", item.length,
                            item.stream_id, limit)
                if item.type == TYPE_REQUEST:
                    self._reject(item.stream_id, Code.RESOURCE_EXHAUSTED,
                                 f"message length {item.length} exceed maximum message size of {limit}")
            elif item.type == TYPE_REQUEST:
                self._request(item)
            # responses and data messages are not for a server: ignored, as the Go server does

    def end_of_frame(self) -> None:
        self._reader.end_of_frame()

    @property
    def garbage_frames(self) -> int:
        return self._reader.garbage_frames

    def _reject(self, stream_id: int, code: int, message: str) -> None:
        self.rejected += 1
        self._respond(stream_id, ttrpc_pb2.Response(status=ttrpc_pb2.Status(code=code, message=message)))

    def _reply(self, stream_id: int, answer: bytes | TtrpcError) -> None:
        if isinstance(answer, TtrpcError):
            self._respond(stream_id, ttrpc_pb2.Response(status=ttrpc_pb2.Status(code=answer.code,
                                                                                message=answer.message)))
        else:
            self._respond(stream_id, ttrpc_pb2.Response(status=ttrpc_pb2.Status(), payload=answer))

    def _respond(self, stream_id: int, response: ttrpc_pb2.Response) -> None:
        data = response.SerializeToString()
        if len(data) > self._response_limit:
            log.error("ttrpc: answer of %d bytes on stream %d is over the peer's limit", len(data), stream_id)
            response = ttrpc_pb2.Response(status=ttrpc_pb2.Status(
                code=Code.RESOURCE_EXHAUSTED, message=f"answer of {len(data)} bytes exceeds {self._response_limit}"))
            data = response.SerializeToString()
        self._send(encode(stream_id, TYPE_RESPONSE, data))

    def _request(self, message: Message) -> None:
        stream_id = message.stream_id
        if stream_id % 2 == 0:
            self._reject(stream_id, Code.INVALID_ARGUMENT, "StreamID must be odd for client initiated streams")
            return
        if stream_id <= self._last_stream_id:
            self._reject(stream_id, Code.INVALID_ARGUMENT, "StreamID cannot be re-used and must increment")
            return
        self._last_stream_id = stream_id
        try:
            request = ttrpc_pb2.Request.FromString(message.data)
        except DecodeError as err:
            self._reject(stream_id, Code.INVALID_ARGUMENT, f"cannot decode request: {err}")
            return
        methods = self._services.get(request.service)
        if methods is None:
            self._reject(stream_id, Code.UNIMPLEMENTED, f"service {request.service}")
            return
        handler = methods.get(request.method)
        if handler is None:
            self._reject(stream_id, Code.UNIMPLEMENTED, f"method {request.method}")
            return
        deadline = _deadline(request.timeout_nano)
        if isinstance(handler, Deferred):
            try:
                handler.start(request.payload, deadline, functools.partial(self._reply, stream_id))
            except Exception as err:  # noqa: BLE001 - answered as a returning handler's failure is
                self._failed(stream_id, err)
            return
        task = asyncio.get_running_loop().create_task(self._call(stream_id, handler, request.payload, deadline))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _call(self, stream_id: int, handler: Handler, payload: bytes, deadline: float | None) -> None:
        try:
            answer = await handler(payload, deadline)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # noqa: BLE001 - answered with a status; the stream goes on
            self._failed(stream_id, err)
            return
        self._reply(stream_id, answer)

    def _failed(self, stream_id: int, err: Exception) -> None:
        """The status a handler's exception answers: its own, INTERNAL for a payload it could not decode, UNKNOWN
        for a bug."""
        if isinstance(err, TtrpcError):
            self._reply(stream_id, err)
        elif isinstance(err, DecodeError):
            self._reply(stream_id, TtrpcError(Code.INTERNAL, f"cannot decode payload: {err}"))
        else:
            log.error("ttrpc handler on stream %d failed", stream_id, exc_info=err)
            self._reply(stream_id, TtrpcError(Code.UNKNOWN, str(err)))

    def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()


class Client:
    """Calls over one stream (ids 1, 3, 5 ...), answers matched by id; ``close`` fails the calls still waiting."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self._reader = MessageReader()
        self._next_id = 1
        self._waiting: dict[int, asyncio.Future[ttrpc_pb2.Response]] = {}
        self._closed: Exception | None = None

    async def call(self, service: str, method: str, payload: bytes, timeout_s: float) -> bytes:
        if self._closed is not None:
            raise ConnectionClosed(str(self._closed))
        stream_id = self._next_id
        self._next_id += 2
        request = ttrpc_pb2.Request(service=service, method=method, payload=payload,
                                    timeout_nano=int(timeout_s * 1e9))
        future: asyncio.Future[ttrpc_pb2.Response] = asyncio.get_running_loop().create_future()
        self._waiting[stream_id] = future
        try:
            self._send(encode(stream_id, TYPE_REQUEST, request.SerializeToString()))
            response = await asyncio.wait_for(future, timeout_s)
        finally:
            self._waiting.pop(stream_id, None)
        if response.HasField("status") and response.status.code != Code.OK:
            raise TtrpcError(response.status.code, response.status.message)
        return response.payload

    def feed(self, data: bytes) -> None:
        for item in self._reader.feed(data):
            if not isinstance(item, Message) or item.type != TYPE_RESPONSE:
                continue
            future = self._waiting.get(item.stream_id)
            if future is None or future.done():
                continue
            try:
                future.set_result(ttrpc_pb2.Response.FromString(item.data))
            except DecodeError as err:
                future.set_exception(TtrpcError(Code.INTERNAL, f"cannot decode response: {err}"))

    def end_of_frame(self) -> None:
        self._reader.end_of_frame()

    def close(self, reason: Exception | None = None) -> None:
        self._closed = reason or ConnectionClosed("connection closed")
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(ConnectionClosed(str(self._closed)))
