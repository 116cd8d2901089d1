"""A plain byte pipe on uvloop between two unix sockets: the floor a CRI proxy is measured against.

    python bench/bytepipe.py LISTEN_SOCKET BACKEND_SOCKET

Every accepted connection gets one backend connection and bytes are copied both ways unchanged, with
backpressure (a side that cannot keep up pauses the other's reads). Used by bench/proxy_overhead.py.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import uvloop


class _Side(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Side | None = None
        self.pending: list[bytes] = []

    def connection_made(self, transport) -> None:  # uvloop transports are not asyncio.Transport
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is None or peer.transport is None:
            self.pending.append(data)
        elif not peer.transport.is_closing():
            peer.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()

    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()


async def _serve(listen: str, backend: str) -> None:
    loop = asyncio.get_running_loop()

    def accept() -> _Side:
        front = _Side()

        async def connect() -> None:
            try:
                _, back = await loop.create_unix_connection(_Side, backend)
            except OSError:
                if front.transport is not None:
                    front.transport.close()
                return
            back.peer, front.peer = front, back
            for side, other in ((front, back), (back, front)):  # what arrived before both ends were joined
                if other.transport is not None and not other.transport.is_closing():
                    for chunk in side.pending:
                        other.transport.write(chunk)
                side.pending.clear()

        loop.create_task(connect())
        return front

    if os.path.exists(listen):
        os.unlink(listen)
    server = await loop.create_unix_server(accept, listen)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    async with server:
        await stop.wait()


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    uvloop.run(_serve(sys.argv[1], sys.argv[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
