"""The relay's frame scanners give the same result wherever the kernel splits the byte stream.

A socket read may end anywhere: inside a frame header, inside a payload, inside a PING the proxy
answers itself, inside a frame of a withheld stream. Each scanner (runtime -> kubelet and kubelet ->
runtime) is fed one recorded-shape stream whole and then cut at every byte offset, and at random
cuts into many reads; what it forwards, the PING ACKs and credit it owes, and the calls it times must
not depend on where the cuts fall. The scanners are the real relay classes; only the transports are
recorders (the end-to-end behaviour over real sockets is in test_per_hop.py and test_transparency.py).
"""

from __future__ import annotations

import asyncio
import random
from time import perf_counter

import pytest

from runtimeproxy import h2
from runtimeproxy.relay import HookedRequest, KubeletSide, Relay, RelayObserver, RuntimeSide
from tests.support.hostile import request_headers

RELAYED = b"/runtime.v1.RuntimeService/ListContainers"
HOOKED = "/runtime.v1.RuntimeService/CreateContainer"


class Recorder:
    """A transport that keeps what is written to it."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.chunks.append(bytes(data))

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass

    @property
    def data(self) -> bytes:
        return b"".join(self.chunks)


class Calls(RelayObserver):
    def __init__(self) -> None:
        self.finished: list[bytes] = []

    def call_finished(self, method, seconds: float) -> None:
        assert seconds >= 0
        self.finished.append(method)


def _split(data: bytes) -> tuple[bytes, list[bytes], int]:
    """(frames other than the proxy's own, PING ACK payloads, connection credit) of what one hop received."""
    kept, acks, credit = [], [], 0
    pos = 0
    while pos < len(data):
        length = int.from_bytes(data[pos : pos + 3], "big")
        ftype, flags, sid = data[pos + 3], data[pos + 4], int.from_bytes(data[pos + 5 : pos + 9], "big")
        frame = data[pos : pos + 9 + length]
        assert len(frame) == 9 + length, "a frame cut short"
        if ftype == h2.PING and flags & h2.FLAG_ACK:
            acks.append(frame[9:])
        elif ftype == h2.WINDOW_UPDATE and sid == 0:
            credit += int.from_bytes(frame[9:], "big")
        else:
            kept.append(frame)
        pos += 9 + length
    return b"".join(kept), acks, credit


def _joined(loop: asyncio.AbstractEventLoop) -> tuple[KubeletSide, RuntimeSide, Calls]:
    """One relayed connection past its set-up: kubelet's preface and SETTINGS through, runtime joined."""
    calls = Calls()
    relay = Relay("/nonexistent", lambda req: None, frozenset({HOOKED}), calls)
    down = KubeletSide(relay, Recorder(), loop=loop)
    up = RuntimeSide(down, Recorder())
    down.join(up)
    down.data_received(h2.PREFACE + h2.frame(h2.SETTINGS, 0, 0))
    up.transport.chunks.clear()
    return down, up, calls


def _runtime_stream() -> bytes:
    """What a runtime sends: SETTINGS, answers to relayed streams 1 and 5 (one DATA frame larger than a
    read), its BDP PING and connection credit between them, and an answer on withheld stream 3."""
    out = [h2.frame(h2.SETTINGS, 0, 0, bytes((0, 5, 0, 0, 0x40, 0))), h2.frame(h2.SETTINGS, h2.FLAG_ACK, 0)]
    for sid, size in ((1, 300), (5, 40000)):
        out.append(h2.frame(h2.HEADERS, h2.FLAG_END_HEADERS, sid, b"\x88"))
        body = bytes((i * 7 + sid) & 0xFF for i in range(size))
        for start in range(0, size, 16384):
            out.append(h2.frame(h2.DATA, 0, sid, body[start : start + 16384]))
        out.append(h2.window_update(0, 1000 + sid))
        out.append(h2.frame(h2.PING, 0, 0, bytes([sid] * 8)))
        out.append(h2.frame(h2.PING, h2.FLAG_ACK, 0, bytes(8)))
        out.append(h2.frame(h2.HEADERS, h2.FLAG_END_HEADERS | h2.FLAG_END_STREAM, sid, b"\x40\x0bgrpc-status\x010"))
        if sid == 1:  # the runtime answering the withheld stream: header block kept, DATA dropped
            out.append(h2.frame(h2.HEADERS, h2.FLAG_END_HEADERS, 3, b"\x88"))
            out.append(h2.frame(h2.DATA, 0, 3, bytes(5000)))
            out.append(h2.frame(h2.RST_STREAM, 0, 3, bytes(4)))
    return b"".join(out)


def _feed_runtime(cuts: list[int], stream: bytes) -> tuple:
    """(to kubelet, PING ACKs and credit the runtime got or is owed, credit owed to kubelet, calls timed)"""
    loop = asyncio.new_event_loop()
    try:
        down, up, calls = _joined(loop)
        now = perf_counter()
        down.inflight[1] = (RELAYED, now)
        down.inflight[5] = (RELAYED, now)
        down.hooked[3] = HookedRequest(3, HOOKED, [])
        start = 0
        for cut in [*cuts, len(stream)]:
            if cut > start:
                up.data_received(stream[start:cut])
                start = cut
        to_kubelet, kubelet_acks, kubelet_credit = _split(down.transport.data)
        assert not kubelet_acks
        _, acks, credit = _split(up.transport.data + down._acks_up)
        return (to_kubelet, acks, credit + down.runtime_hop.held, kubelet_credit + down.kubelet_hop.held,
                calls.finished)
    finally:
        loop.close()


def test_runtime_stream_cut_at_every_byte_gives_the_same_result() -> None:
    stream = _runtime_stream()
    whole = _feed_runtime([], stream)
    forwarded, acks, credit_up, credit_down, finished = whole
    # the withheld stream's DATA and RST never reach kubelet; its header block does, on an unused stream id
    assert finished == [RELAYED, RELAYED]
    assert acks == [bytes([1] * 8), bytes([5] * 8)]  # the runtime's PINGs answered by the proxy, ACKs dropped
    assert credit_down == 1001 + 1005
    assert credit_up == 5000  # the dropped DATA is credited back to the runtime by the proxy
    assert h2.frame(h2.HEADERS, h2.FLAG_END_HEADERS, h2.LAST_STREAM_ID, b"\x88") in forwarded
    assert bytes((0, 0x13, 0x88, h2.DATA)) not in forwarded and bytes(5000) not in forwarded
    assert bytes([1] * 8) not in forwarded and bytes([5] * 8) not in forwarded
    for cut in range(1, len(stream)):
        assert _feed_runtime([cut], stream) == whole, f"cut at byte {cut}"


@pytest.mark.parametrize("seed", range(40))
def test_runtime_stream_in_many_small_reads_gives_the_same_result(seed: int) -> None:
    stream = _runtime_stream()
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(stream)), rng.randint(5, 200)))
    assert _feed_runtime(cuts, stream) == _feed_runtime([], stream)


def _kubelet_stream() -> bytes:
    """What kubelet sends after its preface: relayed calls with credit and a PING between them, and a
    hooked call whose request the proxy keeps."""
    out = []
    for sid in (1, 5, 9):
        out.append(h2.frame(h2.HEADERS, h2.FLAG_END_HEADERS, sid, request_headers(RELAYED)))
        out.append(h2.window_update(0, 100 + sid))
        out.append(h2.frame(h2.DATA, h2.FLAG_END_STREAM, sid, b"\x00\x00\x00\x00\x03abc"))
        out.append(h2.window_update(sid, 7))
        out.append(h2.frame(h2.PING, 0, 0, bytes([sid] * 8)))
    out.append(h2.frame(h2.HEADERS, h2.FLAG_END_HEADERS, 3, request_headers(HOOKED.encode())))
    out.append(h2.frame(h2.DATA, 0, 3, b"\x00\x00\x00\x00\x06"))
    out.append(h2.frame(h2.DATA, 0, 3, b"xyz"))
    out.append(h2.frame(h2.DATA, 0, 3, b"123"))
    out.append(h2.frame(h2.HEADERS, h2.FLAG_END_HEADERS, 11, request_headers(RELAYED)))
    out.append(h2.frame(h2.DATA, 0, 11, bytes(16000)))  # a big relayed body: its frames pass straight through
    out.append(h2.frame(h2.DATA, h2.FLAG_END_STREAM, 11, bytes(16000)))
    return b"".join(out)


def _feed_kubelet(cuts: list[int], stream: bytes) -> tuple:
    """(to the runtime, to kubelet, PING ACKs kubelet got, credit for the runtime, the kept hooked body,
    relayed calls in flight)"""
    loop = asyncio.new_event_loop()
    try:
        down, up, _ = _joined(loop)
        up.data_received(h2.frame(h2.SETTINGS, 0, 0))  # passed: the proxy's frames to kubelet go at once
        down.transport.chunks.clear()
        start = 0
        for cut in [*cuts, len(stream)]:
            if cut > start:
                down.data_received(stream[start:cut])
                start = cut
        to_runtime, runtime_acks, runtime_credit = _split(up.transport.data)
        assert not runtime_acks
        to_kubelet, acks, kubelet_credit = _split(down.transport.data)
        req = down.hooked.get(3)
        return (to_runtime, to_kubelet, acks, runtime_credit + down.runtime_hop.held,
                kubelet_credit + down.kubelet_hop.held, bytes(req.body) if req else b"", sorted(down.inflight))
    finally:
        loop.close()


def test_kubelet_stream_cut_at_every_byte_gives_the_same_result() -> None:
    stream = _kubelet_stream()
    whole = _feed_kubelet([], stream)
    to_runtime, to_kubelet, acks, credit_up, credit_down, body, inflight = whole
    assert body == b"\x00\x00\x00\x00\x06xyz123"  # the hooked request, kept by the proxy
    assert inflight == [1, 5, 9, 11]
    assert credit_up == 101 + 105 + 109  # kubelet's connection credit, held for the runtime
    assert credit_down == 11  # the withheld body's bytes, credited back to kubelet by the proxy
    assert acks == [bytes([1] * 8), bytes([5] * 8), bytes([9] * 8)]  # kubelet's PINGs, answered on its hop
    assert bytes([1] * 8) not in to_runtime
    assert b"xyz" not in to_runtime and to_runtime.count(bytes(16000)) == 2
    assert h2.rst_stream(3) in to_runtime
    for cut in range(1, len(stream)):
        assert _feed_kubelet([cut], stream) == whole, f"cut at byte {cut}"


@pytest.mark.parametrize("seed", range(40))
def test_kubelet_stream_in_many_small_reads_gives_the_same_result(seed: int) -> None:
    stream = _kubelet_stream()
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(stream)), rng.randint(5, 200)))
    assert _feed_kubelet(cuts, stream) == _feed_kubelet([], stream)
