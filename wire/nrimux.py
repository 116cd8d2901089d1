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
"""

from __future__ import annotations

import asyncio
import logging
import struct
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


class Mux:
    """One trunk (a connected unix socket's reader and writer) and the connections opened on it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._sinks: dict[int, Sink] = {}
        self.frames_read = 0
        self.frames_dropped = 0  # for a connection id nobody opened
        self.frames_written = 0

    def open(self, conn_id: int, sink: Sink) -> None:
        if conn_id == 0:
            raise ValueError("mux connection id 0 is reserved")
        self._sinks[conn_id] = sink

    def sender(self, conn_id: int):
        """A ``send(bytes)`` for ``conn_id``: the bytes leave as frames of at most 4096 payload bytes."""
        def send(data: bytes) -> None:
            if self._writer.is_closing():
                return
            self.frames_written += (len(data) + MAX_WRITE_PAYLOAD - 1) // MAX_WRITE_PAYLOAD or 1
            self._writer.write(frames(conn_id, data))
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
        if not self._writer.is_closing():
            self._writer.close()

    async def wait_closed(self) -> None:
        try:
            await self._writer.wait_closed()
        except (ConnectionError, OSError):
            pass
