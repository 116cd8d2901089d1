"""The NRI mux (wire/nrimux.py): frames written at 4096 payload bytes or less, frames of any size read,
frames for unknown connections dropped (Koordinator #2678, containerd/nri#102)."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time

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


def _messages(stream: bytes) -> list[bytes]:
    """The length-prefixed messages of one connection's byte stream."""
    out = []
    while stream:
        (length,) = struct.unpack(">I", stream[:4])
        out.append(stream[4:4 + length])
        stream = stream[4 + length:]
    return out


def _stream(data: bytes, conn_id: int = 1) -> bytes:
    frames_ = split_frames(data)
    assert {c for c, _ in frames_} == {conn_id} and max(len(p) for _, p in frames_) <= MAX_WRITE_PAYLOAD
    return b"".join(p for _, p in frames_)


def test_writes_from_many_threads_leave_whole_and_in_each_threads_order() -> None:
    """Four threads write at once, each message over several frames: no frame of one lands inside another."""
    ours, theirs = socket.socketpair()
    received = bytearray()

    def read_to_the_end() -> None:
        while chunk := theirs.recv(1 << 16):
            received.extend(chunk)

    reading = threading.Thread(target=read_to_the_end)
    reading.start()

    async def run() -> None:
        reader, writer = await asyncio.open_unix_connection(sock=ours)
        mux = Mux(reader, writer)
        send = mux.sender(1)

        def write(thread: int) -> None:
            for seq in range(200):
                body = f"{thread}:{seq}:".encode() + bytes([thread]) * (1000 + 3000 * (seq % 4))
                send(struct.pack(">I", len(body)) + body)

        writers = [threading.Thread(target=write, args=(t,)) for t in range(4)]
        for thread in writers:
            thread.start()
        while any(thread.is_alive() for thread in writers):
            await asyncio.sleep(0.01)
        mux.close()
        await mux.wait_closed()

    asyncio.run(run())
    reading.join(10)
    messages = _messages(_stream(bytes(received)))
    assert len(messages) == 800
    seen: dict[int, list[int]] = {}
    for body in messages:
        thread, seq, filler = body.split(b":", 2)
        assert filler == bytes([int(thread)]) * (1000 + 3000 * (int(seq) % 4))
        seen.setdefault(int(thread), []).append(int(seq))
    assert seen == {t: list(range(200)) for t in range(4)}


def test_a_write_never_waits_for_a_peer_that_does_not_read_and_the_loop_sends_the_rest_in_order() -> None:
    ours, theirs = socket.socketpair()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16 << 10)
    message = bytes(range(256)) * 4096  # 1 MiB: far more than the socket takes while nobody reads
    received = bytearray()

    async def run() -> float:
        reader, writer = await asyncio.open_unix_connection(sock=ours)
        mux = Mux(reader, writer)
        send = mux.sender(2)
        took = []

        def write() -> None:
            started = time.monotonic()
            for _ in range(4):
                send(message)
            took.append(time.monotonic() - started)

        writing = threading.Thread(target=write)
        writing.start()
        writing.join(5)
        theirs.setblocking(False)
        loop = asyncio.get_running_loop()
        while len(received) < 4 * len(frames(2, message)):
            received.extend(await asyncio.wait_for(loop.sock_recv(theirs, 1 << 16), 5))
        mux.close()
        return took[0]

    took = asyncio.run(run())
    assert took < 0.5, took  # four 1 MiB writes, none waiting on the peer
    assert _stream(bytes(received), 2) == message * 4


def test_after_close_writes_are_dropped_and_the_peer_sees_the_end() -> None:
    ours, theirs = socket.socketpair()

    async def run() -> None:
        reader, writer = await asyncio.open_unix_connection(sock=ours)
        mux = Mux(reader, writer)
        send = mux.sender(1)
        send(b"before")
        mux.close()
        await mux.wait_closed()
        send(b"after")

    asyncio.run(run())
    theirs.settimeout(5)
    data = b""
    while chunk := theirs.recv(1 << 16):
        data += chunk
    assert split_frames(data) == [(1, b"before")]
