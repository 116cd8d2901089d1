"""Raw HTTP/2 endpoints that honour connection flow control to the byte, for what gRPC libraries hide:
which control frames cross the proxy, and whether any sender is ever held on credit the proxy keeps.

``RawPeer`` is one end of a connection (client or server role). It records every frame it receives,
answers SETTINGS with an ACK (as every endpoint must), and sends DATA only within the peer's
connection window (65535 plus the WINDOW_UPDATEs received for stream 0). It never answers a PING
unless told to: a test sees exactly what arrives. ``RawRuntime`` accepts connections on a unix socket
and makes a server-role ``RawPeer`` of each one.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from tests.support.hostile import PREFACE, frame

DATA, HEADERS, SETTINGS, PING, WINDOW_UPDATE = 0x0, 0x1, 0x4, 0x6, 0x8
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
# HPACK: ":status: 200" (static index 8), then "content-type: application/grpc" as a literal without indexing
RESPONSE_HEAD = b"\x88" + b"\x0f\x10\x10application/grpc"
TRAILERS_OK = b"\x00\x0bgrpc-status\x010"


@dataclass(frozen=True)
class Frame:
    ftype: int
    flags: int
    sid: int
    payload: bytes

    @property
    def increment(self) -> int:
        return int.from_bytes(self.payload[:4], "big") & 0x7FFFFFFF


class RawPeer:
    """One end of an HTTP/2 connection over ``sock``; ``server`` expects the client preface first."""

    def __init__(self, sock: socket.socket, server: bool) -> None:
        self.sock = sock
        self.frames: list[Frame] = []
        self.window = 65535  # what this end may still send on the connection
        self.closed = False
        self._buf = b""
        self._preface = len(PREFACE) if server else 0
        self._lock = threading.Lock()
        if server:
            self.send(frame(SETTINGS, 0, 0))
        else:
            self.send(PREFACE + frame(SETTINGS, 0, 0))

    def send(self, data: bytes) -> None:
        with self._lock:
            self.sock.sendall(data)

    def poll(self, timeout_s: float) -> None:
        """Read and record what arrives within ``timeout_s`` (at least what is already there)."""
        deadline = time.monotonic() + timeout_s
        while not self.closed:
            ready, _, _ = select.select([self.sock], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                return
            try:
                chunk = self.sock.recv(1 << 16)
            except ConnectionResetError:  # the peer closed with bytes of ours unread: after its last bytes, as EOF
                chunk = b""
            if not chunk:
                self.closed = True
                return
            self._buf += chunk
            self._parse()

    def _parse(self) -> None:
        if self._preface:
            if len(self._buf) < self._preface:
                return
            assert self._buf[: self._preface] == PREFACE, self._buf[:24]
            self._buf = self._buf[self._preface :]
            self._preface = 0
        while len(self._buf) >= 9:
            length = int.from_bytes(self._buf[:3], "big")
            if len(self._buf) < 9 + length:
                return
            f = Frame(self._buf[3], self._buf[4], int.from_bytes(self._buf[5:9], "big") & 0x7FFFFFFF,
                      self._buf[9 : 9 + length])
            self._buf = self._buf[9 + length :]
            self.frames.append(f)
            if f.ftype == SETTINGS and not f.flags & ACK:
                self.send(frame(SETTINGS, ACK, 0))
            elif f.ftype == WINDOW_UPDATE and f.sid == 0:
                self.window += f.increment

    def wait(self, until: Callable[[], bool], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not until() and time.monotonic() < deadline and not self.closed:
            self.poll(0.02)
        return until()

    def received(self, ftype: int, sid: int | None = None) -> list[Frame]:
        return [f for f in self.frames if f.ftype == ftype and (sid is None or f.sid == sid)]

    def received_data(self, sid: int) -> int:
        return sum(len(f.payload) for f in self.received(DATA, sid))

    def send_data(self, sid: int, total: int, end_stream: bool, timeout_s: float) -> int:
        """Send ``total`` bytes on ``sid`` in frames of at most 16 KiB, never past the connection window
        (stream windows are raised up front by the callers). Returns how many went before ``timeout_s``."""
        sent = 0
        deadline = time.monotonic() + timeout_s
        while sent < total and time.monotonic() < deadline:
            if self.window <= 0:
                self.poll(0.02)
                continue
            n = min(16384, self.window, total - sent)
            last = sent + n == total
            self.send(frame(DATA, END_STREAM if last and end_stream else 0, sid, bytes(n)))
            self.window -= n
            sent += n
        return sent


class RawRuntime:
    """A unix-socket listener whose connections become server-role ``RawPeer`` objects."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(8)
        self.listener.settimeout(0.1)

    def accept(self, timeout_s: float) -> RawPeer:
        """The next connection that stays open (the proxy's readiness probe connects and closes at once)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            conn.setblocking(True)
            try:
                peer = RawPeer(conn, server=True)
                peer.poll(0.5)
            except OSError:  # a readiness probe: connected and closed at once
                conn.close()
                continue
            if not peer.closed:
                return peer
            conn.close()
        raise TimeoutError(f"no HTTP/2 connection on {self.path} within {timeout_s}s")

    def close(self) -> None:
        self.listener.close()


def respond(peer: RawPeer, sid: int, body: int, timeout_s: float) -> int:
    """A gRPC answer of one ``body``-byte message on ``sid``; returns the body bytes sent in time."""
    peer.send(frame(HEADERS, END_HEADERS, sid, RESPONSE_HEAD))
    sent = peer.send_data(sid, 5 + body, False, timeout_s)
    if sent == 5 + body:
        peer.send(frame(HEADERS, END_HEADERS | END_STREAM, sid, TRAILERS_OK))
    return sent
