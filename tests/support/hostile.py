"""Hostile HTTP/2 clients against a running koord-runtime-proxy, with the proxy's memory and a well-behaved
client's latency measured while each one runs (tests/runtimeproxy/test_hostile_clients.py, bench/hostile_clients.py).

Each attack returns an :class:`Outcome`: what the proxy did (``resource_exhausted``, ``closed``, ``goaway``,
``open``, ``answered``), how long it took, the proxy's peak RSS growth over its RSS before the attack, and
the bystander's worst latency and failures meanwhile.
"""

from __future__ import annotations

import gzip
import os
import random
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from runtimeproxy.hpack_decoder import Decoder
from tests.support.cri import CriClient
from wire import cri_pb2 as cri

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
RUN_POD = b"/runtime.v1.RuntimeService/RunPodSandbox"
MAX_FRAME = 16384


def frame(ftype: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([ftype, flags]) + struct.pack(">I", sid) + payload


def _hpack_int(value: int, bits: int, first: int = 0) -> bytes:
    top = (1 << bits) - 1
    if value < top:
        return bytes([first | value])
    out = bytearray([first | top])
    value -= top
    while value >= 128:
        out.append((value & 127) | 128)
        value >>= 7
    out.append(value)
    return bytes(out)


def header_block(headers: list[tuple[bytes, bytes]]) -> bytes:
    """Literal header fields without indexing, no Huffman: valid HPACK any decoder accepts."""
    out = bytearray()
    for name, value in headers:
        out += b"\x00" + _hpack_int(len(name), 7) + name + _hpack_int(len(value), 7) + value
    return bytes(out)


def request_headers(path: bytes, *extra: tuple[bytes, bytes]) -> bytes:
    return header_block([(b":method", b"POST"), (b":scheme", b"http"), (b":path", path),
                         (b":authority", b"localhost"), (b"content-type", b"application/grpc"),
                         (b"te", b"trailers"), *extra])


def rss_kib(pid: int, field_name: str = "VmRSS") -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field_name + ":"))


@dataclass
class Bystander:
    """A well-behaved client calling Version through the proxy every 50 ms while an attack runs."""

    socket_path: str
    worst_s: float = 0.0
    calls: int = 0
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Bystander:
        client = CriClient(self.socket_path)
        client.runtime.Version(cri.VersionRequest(), timeout=10)

        def run() -> None:
            try:
                while not self._stop.wait(0.05):
                    started = time.perf_counter()
                    try:
                        client.runtime.Version(cri.VersionRequest(), timeout=5)
                    except Exception as err:  # noqa: BLE001 - every failure is a finding
                        self.failures.append(f"{type(err).__name__}: {str(err)[:100]}")
                    self.calls += 1
                    self.worst_s = max(self.worst_s, time.perf_counter() - started)
            finally:
                client.close()

        self._thread = threading.Thread(target=run, name="bystander", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)


@dataclass
class Outcome:
    case: str
    result: str
    seconds: float
    rss_peak_mib: float
    bystander_worst_ms: float = 0.0
    bystander_calls: int = 0
    bystander_failures: int = 0

    def line(self) -> str:
        return (f"{self.case:28s} {self.result:20s} {self.seconds:7.2f} s  peak RSS +{self.rss_peak_mib:6.1f} MiB  "
                f"bystander: {self.bystander_calls} calls, worst {self.bystander_worst_ms:.0f} ms, "
                f"{self.bystander_failures} failed")


class _Conn:
    """A raw client connection: writes frames, reads and decodes what comes back."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.buf = b""
        self.closed = False
        self.send_failed = False
        self.goaway: int | None = None
        self.statuses: dict[int, bytes] = {}
        self._decoder = Decoder()

    def send(self, data: bytes) -> bool:
        if self.send_failed:
            return False
        try:
            self.sock.sendall(data)
            return True
        except OSError:
            self.send_failed = True  # what the proxy wrote before closing may still be read
            self.poll(0.5)
            return False

    def poll(self, timeout_s: float = 0.0) -> None:
        """Read what is there (waiting up to ``timeout_s`` for the first bytes) and parse whole frames."""
        deadline = time.monotonic() + timeout_s
        while not self.closed:
            left = max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self.sock], [], [], left)
            if not ready:
                return
            try:
                chunk = self.sock.recv(1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                self.closed = True
                return
            self.buf += chunk
            self._parse()
            deadline = time.monotonic()  # keep reading only what is already there

    def _parse(self) -> None:
        while len(self.buf) >= 9:
            length = int.from_bytes(self.buf[:3], "big")
            if len(self.buf) < 9 + length:
                return
            ftype, flags = self.buf[3], self.buf[4]
            sid = int.from_bytes(self.buf[5:9], "big") & 0x7FFFFFFF
            payload = self.buf[9 : 9 + length]
            self.buf = self.buf[9 + length :]
            if ftype == 0x7:
                self.goaway = int.from_bytes(payload[4:8], "big")
            elif ftype == 0x1 and sid:
                try:
                    block = payload if not flags & 0x8 else payload[1 : len(payload) - payload[0]]
                    headers = self._decoder.decode(block)
                except Exception:  # noqa: BLE001 - the response's own header blocks; not under test
                    continue
                for name, value in headers:
                    if name == b"grpc-status":
                        self.statuses[sid] = value

    def wait(self, until: Callable[[], bool], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if until():
                return True
            self.poll(0.05)
        return until()

    def close(self) -> None:
        self.sock.close()


def _handshake(conn: _Conn) -> None:
    conn.send(PREFACE + frame(0x4, 0, 0))


def big_hooked_body(conn: _Conn, total: int = 100 << 20, declared: int | None = None) -> str:
    """A hooked call whose body keeps coming without END_STREAM (``declared``: the gRPC length prefix)."""
    _handshake(conn)
    conn.send(frame(0x1, 0x4, 1, request_headers(RUN_POD)))
    prefix = b"\x00" + struct.pack(">I", declared if declared is not None else 1024)
    chunk = b"\x00" * (MAX_FRAME - 16)
    sent = 0
    first = True
    while sent < total and not conn.closed and not conn.send_failed and 1 not in conn.statuses:
        payload = prefix + chunk[len(prefix):] if first else chunk
        first = False
        if not conn.send(frame(0x0, 0, 1, payload)):
            break
        sent += len(payload)
        if sent % (1 << 20) < len(payload):
            conn.poll()
    conn.wait(lambda: 1 in conn.statuses or conn.closed, 10)
    status = conn.statuses.get(1)
    if status == b"8":
        return f"resource_exhausted@{sent >> 20}MiB"
    return f"status {status!r} after {sent >> 20}MiB" if status else f"no answer after {sent >> 20}MiB"


def gzip_bomb(conn: _Conn, inflated: int = 64 << 20) -> str:
    """A hooked call whose one message is ``inflated`` bytes of zeros, sent gzip-compressed (~64 KiB)."""
    packed = gzip.compress(b"\x00" * inflated, compresslevel=9)
    _handshake(conn)
    conn.send(frame(0x1, 0x4, 1, request_headers(RUN_POD, (b"grpc-encoding", b"gzip"))))
    body = b"\x01" + struct.pack(">I", len(packed)) + packed
    for offset in range(0, len(body), MAX_FRAME):
        piece = body[offset : offset + MAX_FRAME]
        conn.send(frame(0x0, 0x1 if offset + MAX_FRAME >= len(body) else 0, 1, piece))
    conn.wait(lambda: 1 in conn.statuses or conn.closed, 30)
    status = conn.statuses.get(1)
    return "resource_exhausted" if status == b"8" else f"status {status!r}" if status else "no answer"


def _closed_outcome(conn: _Conn, timeout_s: float) -> str:
    conn.wait(lambda: conn.closed, timeout_s)
    if not conn.closed:
        return "open"
    return f"goaway({conn.goaway})+closed" if conn.goaway is not None else "closed"


def random_after_preface(conn: _Conn, size: int = 1 << 20) -> str:
    rng = random.Random(7)
    conn.send(PREFACE + rng.randbytes(size))
    return _closed_outcome(conn, 5)


def bad_preface(conn: _Conn) -> str:
    conn.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"x" * 64)
    return _closed_outcome(conn, 5)


def bad_hpack(conn: _Conn) -> str:
    _handshake(conn)
    conn.send(frame(0x1, 0x5, 1, b"\xff\xff\xff\xff\xff\xff\x7f"))  # an index far past any table
    return _closed_outcome(conn, 5)


def endless_continuation(conn: _Conn, total: int = 64 << 20) -> str:
    """A header block that never ends: HEADERS without END_HEADERS, then CONTINUATION frames."""
    _handshake(conn)
    conn.send(frame(0x1, 0x0, 1, request_headers(RUN_POD)))
    sent = 0
    while sent < total and not conn.closed and not conn.send_failed:
        if not conn.send(frame(0x9, 0x0, 1, b"\x00\x01a\x01b" * 3000)):
            break
        sent += 15000
        if sent % (1 << 20) < 15000:
            conn.poll()
    return _closed_outcome(conn, 5)


def silent(conn: _Conn, timeout_s: float) -> str:
    """Connects and sends nothing."""
    return _closed_outcome(conn, timeout_s)


def stalled_mid_frame(conn: _Conn, timeout_s: float) -> str:
    _handshake(conn)
    conn.send(frame(0x1, 0x4, 1, request_headers(b"/runtime.v1.RuntimeService/Version"))[:20])
    return _closed_outcome(conn, timeout_s)


def handshaken_then_idle(conn: _Conn, seconds: float) -> str:
    """A client that completed its handshake and then idles must stay connected."""
    _handshake(conn)
    return _closed_outcome(conn, seconds)


def attack(case: str, socket_path: str, pid: int, run: Callable[[_Conn], str]) -> Outcome:
    """Run one attack with a bystander; the proxy's peak RSS is its VmHWM after resetting it."""
    with open(f"/proc/{pid}/clear_refs", "w", encoding="ascii") as clear:
        clear.write("5")  # reset VmHWM to the current RSS
    before = rss_kib(pid)
    with Bystander(socket_path) as bystander:
        conn = _Conn(socket_path)
        started = time.monotonic()
        try:
            result = run(conn)
        finally:
            elapsed = time.monotonic() - started
            conn.close()
        time.sleep(0.2)
    peak = rss_kib(pid, "VmHWM")
    return Outcome(case, result, elapsed, (peak - before) / 1024, bystander.worst_s * 1000, bystander.calls,
                   len(bystander.failures))


CASES: dict[str, Callable[[_Conn], str]] = {
    "hooked_body_100MiB": big_hooked_body,
    "hooked_body_declared_100MiB": lambda conn: big_hooked_body(conn, declared=100 << 20),
    "gzip_64MiB_as_64KiB": gzip_bomb,
    "random_after_preface": random_after_preface,
    "bad_preface": bad_preface,
    "bad_hpack": bad_hpack,
    "endless_continuation": endless_continuation,
}


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False
