"""A drain never waits for a stream that never ends by itself.

kubelet's Evented PLEG holds one ``GetContainerEvents`` stream open for its whole life. A stopping proxy sends
GOAWAY, then ends that stream at once: kubelet gets gRPC UNAVAILABLE (trailers after the response headers it
has, or a trailers-only response when the runtime had sent none yet) and subscribes again on its next connection,
the runtime gets RST_STREAM(CANCEL). The drain then waits for the calls that do end, not for ``--drain-timeout``.
The runtime here is tests/support/fakeruntime.py (an event every 50 ms, as long as the client stays); the same
against real containerd through socket activation is in test_socket_activation.py.
"""

from __future__ import annotations

import socket
import threading
import time

import grpc
import pytest

from runtimeproxy.h2 import header_block_fragment
from runtimeproxy.hpack_decoder import Decoder
from runtimeproxy.relay import ENDLESS_METHODS
from tests.support.cri import CriClient
from tests.support.fakeruntime import EVENTS, FakeRuntime
from tests.support.hostile import frame, request_headers
from tests.support.proxy import ProxyProcess
from tests.support.rawh2 import DATA, END_HEADERS, END_STREAM, HEADERS, RawPeer
from tests.support.subscriber import EventSubscriber

GOAWAY, RST_STREAM = 0x7, 0x3
DRAIN_TIMEOUT_S = 20.0  # what a drain that waited for the subscription would take
VERSION = "/runtime.v1.RuntimeService/Version"


def test_the_endless_methods_are_the_server_streams_of_the_cri_and_containerds_event_subscription() -> None:
    assert ENDLESS_METHODS == frozenset({EVENTS, "/containerd.services.events.v1.Events/Subscribe"})


@pytest.mark.parametrize("quiet", [False, True], ids=["events-flowing", "no-event-yet"])
def test_a_drain_ends_a_subscription_at_once_with_unavailable_and_cancels_it_at_the_runtime(
        fake_runtime: FakeRuntime, tmp_path, quiet: bool) -> None:
    proxy = ProxyProcess(str(tmp_path / "p.sock"), fake_runtime.socket_path,
                         "--drain-timeout", str(DRAIN_TIMEOUT_S)).start()
    client = CriClient(proxy.listen)
    subscriber = EventSubscriber(client, metadata=(("x-quiet", "1"),) if quiet else ()).start()
    slow: dict[str, object] = {}

    def slow_call() -> None:  # a call that does end: the drain still waits for it
        try:
            slow["answer"] = client.channel.unary_unary(VERSION)(b"slow", metadata=(("x-sleep", "1.0"),), timeout=20)
        except grpc.RpcError as err:
            slow["answer"] = err.code()

    caller = threading.Thread(target=slow_call)
    try:
        if quiet:
            assert _wait(lambda: any(r.method == EVENTS for r in fake_runtime.received), 10)
        else:
            assert subscriber.wait(lambda s: s.events_on(1) >= 3, 10)
        caller.start()
        assert _wait(lambda: any(r.payload == b"slow" for r in fake_runtime.received), 10)
        started = time.monotonic()
        assert proxy.terminate(timeout_s=DRAIN_TIMEOUT_S + 10) == 0
        stopped_s = time.monotonic() - started
        assert subscriber.wait(lambda s: s.ends, 5)
        caller.join(10)
    finally:
        subscriber.stop()
        client.close()
    end = subscriber.ends[0]
    assert (end.code, end.details) == ("UNAVAILABLE", "koord-runtime-proxy is restarting: subscribe again")
    assert end.at - started < 2.0, "the subscription ended at the drain's start, not at its timeout"
    assert slow["answer"] == b"slow", "a call that ends by itself is still served to its end"
    assert 1.0 <= stopped_s < 5.0, f"the drain took {stopped_s:.1f} s: it waited for the subscription"
    assert _wait(lambda: fake_runtime.subscriptions_ended, 5), "the runtime never saw the subscription end"
    assert fake_runtime.subscriptions_ended[0] - started < 3.0
    assert "0 stream(s) opened after GOAWAY refused for the client to retry, 1 endless stream(s) ended" in proxy.log()


def _wait(predicate, timeout_s: float) -> bool:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _fields(decoder: Decoder, block: bytes) -> dict[bytes, bytes]:
    return dict(decoder.decode(header_block_fragment(HEADERS, 0, block)))


@pytest.mark.parametrize("quiet", [False, True], ids=["after-headers", "before-headers"])
def test_the_end_follows_the_goaway_as_trailers_or_a_trailers_only_response(
        fake_runtime: FakeRuntime, tmp_path, quiet: bool) -> None:
    """On the wire, what kubelet's grpc-go reads: GOAWAY, then on the subscription's stream one HEADERS frame with
    END_STREAM and grpc-status 14; with no ``:status`` when the response headers came before (pseudo-header fields
    are not allowed in trailers), with ``:status: 200`` and the gRPC content-type when they did not."""
    proxy = ProxyProcess(str(tmp_path / "p.sock"), fake_runtime.socket_path,
                         "--drain-timeout", str(DRAIN_TIMEOUT_S)).start()
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(proxy.listen)
    peer = RawPeer(sock, server=False)
    extra = ((b"x-quiet", b"1"),) if quiet else ()
    try:
        peer.send(frame(HEADERS, END_HEADERS, 1, request_headers(EVENTS.encode(), *extra))
                  + frame(DATA, END_STREAM, 1, b"\0\0\0\0\0"))
        if quiet:
            assert _wait(lambda: any(r.method == EVENTS for r in fake_runtime.received), 10)
        else:
            assert peer.wait(lambda: len(peer.received(DATA, 1)) >= 2, 10)
        started = time.monotonic()
        proxy.proc.send_signal(15)
        assert peer.wait(lambda: any(f.flags & END_STREAM for f in peer.received(HEADERS, 1)), 5)
        assert time.monotonic() - started < 2.0
        assert proxy.proc.wait(10) == 0
    finally:
        sock.close()
        proxy.kill()
    # every header block in order, through one decoder: kubelet's HPACK table stays in step
    decoder = Decoder()
    frames = [f for f in peer.frames if f.ftype in (HEADERS, GOAWAY, DATA)]
    blocks = [(f, _fields(decoder, f.payload)) for f in frames if f.ftype == HEADERS]
    last = blocks[-1]
    assert last[0].sid == 1 and last[0].flags & END_STREAM
    assert last[1][b"grpc-status"] == b"14"
    assert last[1][b"grpc-message"] == b"koord-runtime-proxy is restarting: subscribe again"
    if quiet:
        assert len(blocks) == 1
        assert last[1][b":status"] == b"200" and last[1][b"content-type"] == b"application/grpc"
    else:
        assert len(blocks) == 2 and blocks[0][1][b":status"] == b"200"
        assert b":status" not in last[1]
    goaway_at = next(i for i, f in enumerate(frames) if f.ftype == GOAWAY)
    assert goaway_at < frames.index(last[0]), "GOAWAY comes first: the client opens nothing more on this connection"
    assert not [f for f in frames[frames.index(last[0]) + 1:] if f.sid == 1], "nothing follows the end on stream 1"
