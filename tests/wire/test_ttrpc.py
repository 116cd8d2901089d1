"""ttrpc framing, server and client (wire/ttrpc.py) against hand-built messages: any cut of the byte stream,
the Go server's error answers, oversized messages discarded and answered, garbage skipped to the next frame."""

from __future__ import annotations

import asyncio
import struct
import threading

import pytest

from wire import ttrpc_pb2
from wire.ttrpc import (
    RECEIVE_MAX,
    Client,
    Code,
    ConnectionClosed,
    Deferred,
    Message,
    MessageReader,
    Oversized,
    Server,
    TtrpcError,
)

HEADER = struct.Struct(">IIBB")


def message(stream_id: int, message_type: int, data: bytes) -> bytes:
    return HEADER.pack(len(data), stream_id, message_type, 0) + data


def request(stream_id: int, service: str, method: str, payload: bytes = b"", timeout_s: float = 0) -> bytes:
    envelope = ttrpc_pb2.Request(service=service, method=method, payload=payload, timeout_nano=int(timeout_s * 1e9))
    return message(stream_id, 1, envelope.SerializeToString())


def answers(sent: list[bytes]) -> dict[int, ttrpc_pb2.Response]:
    reader = MessageReader()
    out = {}
    for item in reader.feed(b"".join(sent)):
        assert isinstance(item, Message) and item.type == 2
        out[item.stream_id] = ttrpc_pb2.Response.FromString(item.data)
    return out


@pytest.mark.parametrize("cut", [1, 3, 10, 11, 4096])
def test_reader_reassembles_messages_from_any_cut_of_the_stream(cut: int) -> None:
    stream = message(1, 1, b"a" * 5000) + message(3, 1, b"") + message(5, 3, b"xyz")
    reader = MessageReader()
    items = []
    for start in range(0, len(stream), cut):
        items += reader.feed(stream[start:start + cut])
    assert [(m.stream_id, m.type, len(m.data)) for m in items] == [(1, 1, 5000), (3, 1, 0), (5, 3, 3)]


def test_reader_takes_messages_above_ttrpcs_4_mib_and_discards_longer_than_its_limit() -> None:
    reader = MessageReader(limit=RECEIVE_MAX)
    big = message(1, 1, b"s" * (5 << 20))  # what an NRI v0.6 runtime sends for a large Synchronize
    assert [len(m.data) for m in reader.feed(big)] == [5 << 20]
    small = MessageReader(limit=100)
    items = small.feed(message(7, 1, b"x" * 300) + message(9, 1, b"ok"))
    assert items[0] == Oversized(7, 1, 300)
    assert isinstance(items[1], Message) and items[1].data == b"ok"


def test_reader_skips_garbage_to_the_end_of_its_frame_and_reads_the_next_frame() -> None:
    reader = MessageReader()
    assert reader.feed(b"\x00\x00\x00\x05\x00\x00\x00\x01\x99\x00garbage after a bad type") == []
    assert reader.feed(b"more of the same frame") == []
    reader.end_of_frame()
    items = reader.feed(message(3, 1, b"fine"))
    assert [m.data for m in items] == [b"fine"] and reader.garbage_frames == 1


async def _serve(chunks: list[bytes], handler=None) -> dict[int, ttrpc_pb2.Response]:
    sent: list[bytes] = []

    async def echo(payload: bytes, deadline: float | None) -> bytes:
        return payload.upper()

    server = Server({"svc": {"Echo": handler or echo}}, sent.append)
    for chunk in chunks:
        server.feed(chunk)
        server.end_of_frame()
    for _ in range(20):
        await asyncio.sleep(0)
    return answers(sent)


def test_server_answers_unknown_service_and_method_unimplemented_and_keeps_serving() -> None:
    got = asyncio.run(_serve([request(1, "nope", "Echo"), request(3, "svc", "Nope"), request(5, "svc", "Echo", b"hi")]))
    assert (got[1].status.code, got[1].status.message) == (Code.UNIMPLEMENTED, "service nope")
    assert (got[3].status.code, got[3].status.message) == (Code.UNIMPLEMENTED, "method Nope")
    assert got[5].status.code == Code.OK and got[5].payload == b"HI"


def test_server_refuses_even_and_reused_stream_ids_and_undecodable_envelopes_as_go_ttrpc_does() -> None:
    got = asyncio.run(_serve([request(2, "svc", "Echo"), request(7, "svc", "Echo", b"a"), request(5, "svc", "Echo"),
                              message(9, 1, b"\xff\xff\xff"), request(11, "svc", "Echo", b"b")]))
    assert got[2].status.code == Code.INVALID_ARGUMENT
    assert got[5].status.code == Code.INVALID_ARGUMENT and "re-used" in got[5].status.message
    assert got[9].status.code == Code.INVALID_ARGUMENT
    assert got[7].payload == b"A" and got[11].payload == b"B"


def test_server_answers_an_oversized_request_resource_exhausted_and_serves_the_next() -> None:
    oversized = HEADER.pack(RECEIVE_MAX + 1, 1, 1, 0)
    filler = b"\0" * (RECEIVE_MAX + 1)
    got = asyncio.run(_serve([oversized, filler, request(3, "svc", "Echo", b"after")]))
    assert got[1].status.code == Code.RESOURCE_EXHAUSTED and str(RECEIVE_MAX) in got[1].status.message
    assert got[3].payload == b"AFTER"


def test_server_turns_handler_errors_into_statuses() -> None:
    async def failing(payload: bytes, deadline: float | None) -> bytes:
        if payload == b"status":
            raise TtrpcError(Code.FAILED_PRECONDITION, "no")
        raise RuntimeError("bug")

    got = asyncio.run(_serve([request(1, "svc", "Echo", b"status"), request(3, "svc", "Echo", b"bug")], failing))
    assert (got[1].status.code, got[1].status.message) == (Code.FAILED_PRECONDITION, "no")
    assert got[3].status.code == Code.UNKNOWN


def test_a_deferred_handler_answers_from_another_thread_in_any_order_without_a_task() -> None:
    """The second request's answer goes first, from a thread of its own; the server made no task for either."""
    sent: list[bytes] = []
    lock = threading.Lock()
    first_may_answer = threading.Event()

    def send(data: bytes) -> None:  # a deferred handler's send must allow any thread
        with lock:
            sent.append(data)

    def start(payload: bytes, deadline: float | None, reply) -> None:
        def work() -> None:
            if payload == b"first":
                first_may_answer.wait(5)
            reply(payload.upper())
            if payload == b"second":
                first_may_answer.set()
        threading.Thread(target=work).start()

    async def run() -> Server:
        server = Server({"svc": {"Echo": Deferred(start)}}, send)
        server.feed(request(1, "svc", "Echo", b"first") + request(3, "svc", "Echo", b"second"))
        assert not server._tasks
        for _ in range(500):
            if len(sent) == 2:
                break
            await asyncio.sleep(0.01)
        return server

    asyncio.run(run())
    got = [MessageReader().feed(data)[0] for data in sent]
    assert [m.stream_id for m in got] == [3, 1]
    assert [ttrpc_pb2.Response.FromString(m.data).payload for m in got] == [b"SECOND", b"FIRST"]


def test_a_deferred_handler_that_fails_to_start_is_answered_with_a_status() -> None:
    def start(payload: bytes, deadline: float | None, reply) -> None:
        if payload == b"status":
            raise TtrpcError(Code.FAILED_PRECONDITION, "no")
        if payload == b"undecodable":
            ttrpc_pb2.Request.FromString(b"\xff\xff")
        raise RuntimeError("bug")

    got = asyncio.run(_serve([request(1, "svc", "Echo", b"status"), request(3, "svc", "Echo", b"undecodable"),
                              request(5, "svc", "Echo", b"bug")], Deferred(start)))
    assert (got[1].status.code, got[1].status.message) == (Code.FAILED_PRECONDITION, "no")
    assert got[3].status.code == Code.INTERNAL and "cannot decode payload" in got[3].status.message
    assert got[5].status.code == Code.UNKNOWN and got[5].status.message == "bug"


def test_client_matches_answers_out_of_order_and_fails_waiting_calls_on_close() -> None:
    async def run() -> None:
        sent: list[bytes] = []
        client = Client(sent.append)
        first = asyncio.ensure_future(client.call("svc", "A", b"1", 5))
        second = asyncio.ensure_future(client.call("svc", "B", b"2", 5))
        await asyncio.sleep(0)
        ids = [m.stream_id for m in MessageReader().feed(b"".join(sent))]
        assert ids == [1, 3]
        client.feed(message(3, 2, ttrpc_pb2.Response(payload=b"two").SerializeToString()))
        client.feed(message(1, 2, ttrpc_pb2.Response(status=ttrpc_pb2.Status(code=5, message="gone"))
                            .SerializeToString()))
        assert await second == b"two"
        with pytest.raises(TtrpcError) as err:
            await first
        assert err.value.code == Code.NOT_FOUND
        third = asyncio.ensure_future(client.call("svc", "C", b"", 5))
        await asyncio.sleep(0)
        client.close()
        with pytest.raises(ConnectionClosed):
            await third

    asyncio.run(run())
