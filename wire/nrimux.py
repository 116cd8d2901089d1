"""NRI's connection mux: several byte streams over one unix socket (containerd/nri pkg/net/multiplex;
docs/nri-protocol.md §2.1).

A frame is ``[connection id: uint32 BE][payload length: uint32 BE][payload]``. Connection 1 carries the ttrpc
service the plugin serves (containerd calls it), connection 2 the one containerd serves (the plugin calls
it); id 0 is reserved. Each connection is a byte stream: a ttrpc message may span frames and a frame may hold
the end of one message and the start of the next.

Two rules here that Koordinator's Go plugin broke for its users (Koordinator #2678, containerd/nri#102):

- frames are **written** with at most :data:`MAX_WRITE_PAYLOAD` (4096) payload bytes. The Go mux hands one
  whole frame to each read and fails with ENOMEM when the reader's buffer is smaller than the frame; Go ttrpc
  reads through a 4096-byte bufio.Reader, so no frame longer than that may ever reach it;
- frames of **any** length are read: the payload goes to the connection's reader in pieces of at most
  :data:`READ_CHUNK` bytes, so a large frame costs no more memory than the message it carries (which the
  ttrpc reader bounds). Frames for a connection nobody opened are read and dropped.

Reading is the loop's; writing is any thread's (:class:`TrunkWriter`): an NRI worker thread sends its answer
itself, without waking the loop, and each write (one message's frames) goes out whole, in the order written.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import struct
import threading
from typing import Protocol

log = logging.getLogger(__name__)

FRAME_HEADER = struct.Struct(">II")
PLUGIN_CONN = 1  # the plugin's ttrpc server (nri.pkg.api.v1alpha1.Plugin)
RUNTIME_CONN = 2  # the runtime's ttrpc server (nri.pkg.api.v1alpha1.Runtime)
MAX_WRITE_PAYLOAD = 4096
READ_CHUNK = 64 << 10


class Sink(Protocol):
    """Where a connection's bytes go (a ttrpc Server or Client)."""

    def feed(self, data: bytes) -> None: ...

    def end_of_frame(self) -> None: ...


def frames(conn_id: int, data: bytes, max_payload: int = MAX_WRITE_PAYLOAD) -> bytes:
    """``data`` for ``conn_id`` as frames of at most ``max_payload`` payload bytes, joined for one write."""
    if len(data) <= max_payload:
        return FRAME_HEADER.pack(conn_id, len(data)) + data
    view = memoryview(data)
    parts = []
    for start in range(0, len(data), max_payload):
        piece = view[start:start + max_payload]
        parts.append(FRAME_HEADER.pack(conn_id, len(piece)))
        parts.append(piece)
    return b"".join(parts)


class TrunkWriter:
    """Writes to the trunk from any thread: each write is sent at once, under one lock, on a descriptor of its
    own (a dup of the trunk's, so closing it is ours to time, never a descriptor number reused meanwhile).
    What a full socket buffer leaves over waits in a backlog that the loop sends when the socket can take it;
    later writes queue behind it, so the bytes of two writes never mix. The socket is non-blocking (the loop's
    own setting, shared by the dup): a write never waits on the peer."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._loop = asyncio.get_running_loop()
        self._sock = socket.socket(fileno=os.dup(writer.get_extra_info("socket").fileno()))
        self._sock.setblocking(False)
        self._lock = threading.Lock()
        self._backlog = bytearray()  # written but not yet sent (the socket buffer was full)
        self._watching = False  # the loop waits for the socket to take the backlog
        self._closed = False

    def write(self, data: bytes) -> None:
        with self._lock:
            if self._closed:
                return
            if not self._backlog:
                try:
                    sent = self._sock.send(data)
                except (BlockingIOError, InterruptedError):
                    sent = 0
                except OSError as err:  # the peer is gone: the reading side sees it and closes the mux
                    log.debug("mux: write failed (%s); dropping what is written from now on", err)
                    self._close()
                    return
                if sent == len(data):
                    return
                data = memoryview(data)[sent:]
            self._backlog += data
            if self._watching:
                return
            self._watching = True
        try:
            self._loop.call_soon_threadsafe(self._watch)
        except RuntimeError:  # the loop has ended: nothing reads this connection any more
            pass

    def _watch(self) -> None:
        with self._lock:
            if not self._closed:
                self._loop.add_writer(self._sock.fileno(), self._flush)

    def _flush(self) -> None:
        with self._lock:
            if self._closed:
                return
            try:
                sent = self._sock.send(self._backlog)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:
                log.debug("mux: write failed (%s); dropping what is written from now on", err)
                self._close()
                return
            del self._backlog[:sent]
            if not self._backlog:
                self._loop.remove_writer(self._sock.fileno())
                self._watching = False

    def _close(self) -> None:
        # Off the loop's thread this runs only from a send with an empty backlog, so never while the loop watches
        # the socket (watching <=> a backlog, under the lock): the selector is only ever touched by the loop.
        if self._watching:
            self._loop.remove_writer(self._sock.fileno())
            self._watching = False
        self._closed = True
        self._backlog.clear()
        self._sock.close()

    def close(self) -> bytes:
        """On the loop's thread: nothing is sent from here after this. Returns what the backlog still held."""
        with self._lock:
            if self._closed:
                return b""
            rest = bytes(self._backlog)
            self._close()
            return rest


class Mux:
    """One trunk (a connected unix socket's reader and writer) and the connections opened on it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._out = TrunkWriter(writer)
        self._sinks: dict[int, Sink] = {}
        self.frames_read = 0
        self.frames_dropped = 0  # for a connection id nobody opened

    def open(self, conn_id: int, sink: Sink) -> None:
        if conn_id == 0:
            raise ValueError("mux connection id 0 is reserved")
        self._sinks[conn_id] = sink

    def sender(self, conn_id: int):
        """A ``send(bytes)`` for ``conn_id``, for any thread: the bytes leave as frames of at most 4096 payload
        bytes, all of one send together."""
        write = self._out.write

        def send(data: bytes) -> None:
            write(frames(conn_id, data))
        return send

    async def run(self) -> None:
        """Read frames until the trunk ends (returns) or fails (raises); hands each payload to its connection."""
        read = self._reader.readexactly
        while True:
            try:
                header = await read(FRAME_HEADER.size)
            except asyncio.IncompleteReadError as err:
                if err.partial:
                    raise ConnectionError(f"trunk closed inside a frame header ({len(err.partial)} bytes)") from err
                return
            conn_id, length = FRAME_HEADER.unpack(header)
            self.frames_read += 1
            sink = self._sinks.get(conn_id)
            if sink is None:
                self.frames_dropped += 1
                log.debug("mux: dropped a %d-byte frame for connection %d", length, conn_id)
            remaining = length
            while remaining:
                piece = await read(min(remaining, READ_CHUNK))
                remaining -= len(piece)
                if sink is not None:
                    sink.feed(piece)
            if sink is not None:
                sink.end_of_frame()

    def close(self) -> None:
        rest = self._out.close()
        if not self._writer.is_closing():
            self._writer.write(rest)  # the transport sends it before it closes, as it would its own buffer
            self._writer.close()

    async def wait_closed(self) -> None:
        try:
            await self._writer.wait_closed()
        except (ConnectionError, OSError):
            pass
