"""Connection-level HTTP/2 control frames are answered on each hop (runtimeproxy/relay.py docstring):
PINGs are acknowledged by the proxy and cross no further, connection credit is counted and passed on
with other frames instead of forwarded frame for frame, and still no sender ever waits on credit the
proxy holds or gets credit the other hop never gave. Both ends are raw HTTP/2 endpoints that honour
the connection window to the byte (tests/support/rawh2.py); the proxy is the real process."""

from __future__ import annotations

import os
import socket

import pytest

from tests.support.fakeruntime import FakeRuntime
from tests.support.hostile import frame, request_headers
from tests.support.proxy import ProxyProcess
from tests.support.rawh2 import (
    DATA, END_HEADERS, END_STREAM, HEADERS, PING, SETTINGS, WINDOW_UPDATE, ACK, RawPeer, RawRuntime, respond,
)

PATH = b"/runtime.v1.RuntimeService/ListContainers"  # relayed, not hooked
BIG_STREAM_WINDOW = (1 << 31) - 1 - 65535


@pytest.fixture()
def hop(tmp_path):
    """(client, runtime) raw peers joined through a real proxy.

    The proxy checks at start that the runtime answers gRPC, so a real gRPC server holds the runtime's
    socket path until the proxy is up; then the raw runtime takes the path over, and the connection the
    proxy opens for the raw client reaches it."""
    path = str(tmp_path / "runtime.sock")
    fake = FakeRuntime(path).start()
    proxy = ProxyProcess(str(tmp_path / "proxy.sock"), path).start()
    os.unlink(path)
    runtime = RawRuntime(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(proxy.listen)
    client = RawPeer(sock, server=False)
    try:
        server = runtime.accept(10)
        assert server.wait(lambda: server.received(SETTINGS), 5)
        assert client.wait(lambda: client.received(SETTINGS), 5)
        yield client, server
    finally:
        sock.close()
        proxy.terminate()
        runtime.close()
        fake.stop()


def _call(client: RawPeer, server: RawPeer, sid: int, body: int = 5) -> None:
    """A unary call whose answer the runtime sends at once."""
    client.send(frame(HEADERS, END_HEADERS, sid, request_headers(PATH))
                + frame(DATA, END_STREAM, sid, bytes(body)))
    assert server.wait(lambda: any(f.flags & END_STREAM for f in server.received(DATA, sid)), 5)
    respond(server, sid, 10, 5)
    assert client.wait(lambda: any(f.flags & END_STREAM for f in client.received(HEADERS, sid)), 5)


def test_kubelet_ping_is_answered_by_the_proxy_and_reaches_no_runtime(hop) -> None:
    client, server = hop
    client.send(frame(PING, 0, 0, b"kubelet!"))
    assert client.wait(lambda: client.received(PING), 5)
    [ack] = client.received(PING)
    assert ack.flags & ACK and ack.payload == b"kubelet!"
    _call(client, server, 1)  # the connection goes on
    server.poll(0.2)
    assert server.received(PING) == []


def test_runtime_ping_is_acknowledged_by_the_proxy_soon_without_kubelet(hop) -> None:
    client, server = hop
    _call(client, server, 1)
    server.send(frame(PING, 0, 0, b"runtime!"))  # grpc-go's BDP probe after a request, or a keepalive
    assert server.wait(lambda: server.received(PING), 1.0), "no PING ACK from the proxy within 1 s"
    [ack] = server.received(PING)
    assert ack.flags & ACK and ack.payload == b"runtime!"
    client.poll(0.2)
    assert client.received(PING) == []


def test_runtime_ping_ack_goes_with_kubelets_next_request(hop) -> None:
    client, server = hop
    server.send(frame(PING, 0, 0, b"12345678"))
    client.send(frame(HEADERS, END_HEADERS, 1, request_headers(PATH)) + frame(DATA, END_STREAM, 1, bytes(5)))
    assert server.wait(lambda: server.received(PING) and server.received(DATA, 1), 2)
    assert server.received(PING)[0].payload == b"12345678"


def test_connection_credit_is_passed_on_with_other_frames_and_never_invented(hop) -> None:
    client, server = hop
    for i in range(40):
        sid = 1 + 2 * i
        _call(client, server, sid)
        client.send(frame(WINDOW_UPDATE, 0, 0, (15).to_bytes(4, "big")))  # credit for the answer, as kubelet does
    client.poll(0.1)
    server.poll(0.1)
    given = 40 * 15
    got = [f.increment for f in server.received(WINDOW_UPDATE, 0)]
    # counted and carried with kubelet's requests, not one frame per frame
    assert len(got) < 40, got
    assert sum(got) <= given
    # the other way: the runtime's credit for the requests reaches kubelet, folded the same way
    for _ in range(40):
        server.send(frame(WINDOW_UPDATE, 0, 0, (5).to_bytes(4, "big")))
    _call(client, server, 201)
    assert sum(f.increment for f in client.received(WINDOW_UPDATE, 0)) <= 40 * 5 + 5


def test_a_large_request_never_waits_on_credit_the_proxy_holds(hop) -> None:
    client, server = hop
    server.send(frame(WINDOW_UPDATE, 0, 1, BIG_STREAM_WINDOW.to_bytes(4, "big")))  # not yet a stream: ignored
    client.send(frame(HEADERS, END_HEADERS, 1, request_headers(PATH)))
    assert server.wait(lambda: server.received(HEADERS, 1), 5)
    server.send(frame(WINDOW_UPDATE, 0, 1, BIG_STREAM_WINDOW.to_bytes(4, "big")))
    total = 1 << 20
    sent = 0
    # the runtime credits what it reads, as grpc-go does (a WINDOW_UPDATE per 16 KiB)
    credited = 0
    while sent < total:
        sent += client.send_data(1, min(65536, total - sent), sent + 65536 >= total, 0.2)
        server.poll(0.05)
        read = server.received_data(1)
        while read - credited >= 16384:
            server.send(frame(WINDOW_UPDATE, 0, 0, (16384).to_bytes(4, "big")))
            credited += 16384
        if sent < total:
            assert client.wait(lambda: client.window > 0, 5), f"client held at {sent} bytes"
    assert server.wait(lambda: server.received_data(1) == total, 5)


def test_a_slow_reader_holds_the_runtime_at_its_own_window(hop) -> None:
    client, server = hop
    client.send(frame(HEADERS, END_HEADERS, 1, request_headers(PATH))
                + frame(WINDOW_UPDATE, 0, 1, BIG_STREAM_WINDOW.to_bytes(4, "big"))
                + frame(DATA, END_STREAM, 1, bytes(5)))
    assert server.wait(lambda: server.received(DATA, 1), 5)
    server.send(frame(HEADERS, END_HEADERS, 1, b"\x88"))
    total = 300_000
    sent = server.send_data(1, total, True, 1.0)
    # kubelet reads nothing and credits nothing: the runtime is held at kubelet's 65535 bytes
    assert sent == 65535, sent
    client.poll(0.3)
    assert client.received_data(1) == 65535
    # kubelet catches up, crediting as it reads: the rest flows
    credited = 0
    for _ in range(200):
        read = client.received_data(1)
        if read > credited:
            client.send(frame(WINDOW_UPDATE, 0, 0, (read - credited).to_bytes(4, "big")))
            credited = read
        if sent < total:
            sent += server.send_data(1, total - sent, True, 0.05)
        client.poll(0.02)
        if client.received_data(1) == total:
            break
    assert client.received_data(1) == total
