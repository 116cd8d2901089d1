"""The NRI mux (wire/nrimux.py): frames written at 4096 payload bytes or less, frames of any size read,
frames for unknown connections dropped (Koordinator #2678, containerd/nri#102)."""

from __future__ import annotations

import asyncio
import socket
import struct

from wire.nrimux import MAX_WRITE_PAYLOAD, Mux, frames

MUX = struct.Struct(">II")


def split_frames(data: bytes) -> list[tuple[int, bytes]]:
    out = []
    while data:
        conn_id, length = MUX.unpack(data[:8])
        out.append((conn_id, data[8:8 + length]))
        data = data[8 + length:]
    return out


def test_a_long_write_leaves_as_frames_of_at_most_4096_bytes_in_order() -> None:
    payload = bytes(range(256)) * 100  # 25600 bytes
    parts = split_frames(frames(2, payload))
    assert max(len(p) for _, p in parts) == MAX_WRITE_PAYLOAD == 4096
    assert {c for c, _ in parts} == {2} and b"".join(p for _, p in parts) == payload
    assert split_frames(frames(1, b"")) == [(1, b"")]


class Collect:
    def __init__(self) -> None:
        self.data = bytearray()
        self.frames = 0

    def feed(self, data: bytes) -> None:
        self.data += data

    def end_of_frame(self) -> None:
        self.frames += 1


def test_frames_of_any_size_are_read_and_unknown_connections_dropped() -> None:
    async def run() -> tuple[Collect, Mux]:
        ours, theirs = socket.socketpair()
        reader, writer = await asyncio.open_unix_connection(sock=ours)
        mux = Mux(reader, writer)
        sink = Collect()
        mux.open(1, sink)
        big = b"b" * (20 << 20)  # one 20 MiB frame: more than any mux ever split at
        theirs.sendall(MUX.pack(1, 3) + b"abc" + MUX.pack(9, 5) + b"junk!" + MUX.pack(1, len(big)))

        async def write_rest() -> None:
            await asyncio.get_running_loop().sock_sendall(theirs, big)
            theirs.close()

        theirs.setblocking(False)
        await asyncio.gather(mux.run(), write_rest())
        return sink, mux

    sink, mux = asyncio.run(run())
    assert bytes(sink.data[:3]) == b"abc" and len(sink.data) == 3 + (20 << 20) and sink.frames == 2
    assert (mux.frames_read, mux.frames_dropped) == (3, 1)
