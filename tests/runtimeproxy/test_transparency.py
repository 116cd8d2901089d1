"""What the relay must pass through untouched: metadata, trailers, status codes, deadlines, streams,
unknown fields, and byte streams split anywhere. The backend is a recording gRPC server."""

from __future__ import annotations

import asyncio
import socket
import threading

import grpc
import pytest

from tests.support.fakeruntime import FakeRuntime
from tests.support.proxy import ProxyProcess
from wire import cri_pb2 as cri

RELAYED = "/runtime.v1.RuntimeService/Version"
HOOKED = "/runtime.v1.RuntimeService/CreateContainer"
METADATA = (("x-request-id", "abc-123"), ("x-trace-bin", b"\x01\x02\xfe"))


def _call(sock: str, path: str, payload: bytes, **kw):
    with grpc.insecure_channel(f"unix://{sock}") as ch:
        response, call = ch.unary_unary(path).with_call(payload, **kw)
        return response, dict(call.initial_metadata()), dict(call.trailing_metadata())


@pytest.mark.parametrize("path", [RELAYED, HOOKED])
def test_metadata_and_trailers_pass_both_ways(fake_runtime: FakeRuntime, fake_proxy: ProxyProcess, path: str) -> None:
    payload = cri.CreateContainerRequest(pod_sandbox_id="p").SerializeToString() if path == HOOKED else b"\x0a\x02v1"
    response, initial, trailing = _call(fake_proxy.listen, path, payload, metadata=METADATA, timeout=30)
    assert initial["x-initial"] == "from-runtime"
    assert trailing["x-trailer"] == "bye" and trailing["x-blob-bin"] == b"\x00\xffbin"
    got = [r for r in fake_runtime.received if r.method == path][-1]  # the start-up probe calls Version too
    assert got.metadata["x-request-id"] == "abc-123"
    assert got.metadata["x-trace-bin"] == b"\x01\x02\xfe"
    assert got.time_remaining is not None and 20 < got.time_remaining <= 31  # deadline passed on (grpc rounds it up)
    if path == RELAYED:
        assert response == payload
    else:
        assert cri.CreateContainerResponse.FromString(response).container_id == "fake-container"


@pytest.mark.parametrize("path", [RELAYED, HOOKED])
@pytest.mark.parametrize("code", ["NOT_FOUND", "RESOURCE_EXHAUSTED", "UNAVAILABLE", "INTERNAL"])
def test_status_code_message_and_trailers_of_errors_pass_unchanged(
    fake_runtime: FakeRuntime, fake_proxy: ProxyProcess, path: str, code: str
) -> None:
    direct_err = via_err = None
    for sock in (fake_runtime.socket_path, fake_proxy.listen):
        with pytest.raises(grpc.RpcError) as err:
            _call(sock, path, b"", metadata=(("x-fail", code),), timeout=10)
        if sock == fake_runtime.socket_path:
            direct_err = err.value
        else:
            via_err = err.value
    assert via_err.code() == direct_err.code() == grpc.StatusCode[code]
    assert via_err.details() == direct_err.details() == "told to fail: ünïcode % message"
    assert dict(via_err.trailing_metadata()) == dict(direct_err.trailing_metadata())


def test_server_streaming_rpc_is_streamed(fake_proxy: ProxyProcess) -> None:
    with grpc.insecure_channel(f"unix://{fake_proxy.listen}") as ch:
        stream = ch.unary_stream("/test.Stream/Items")(b"50", timeout=30)
        items = list(stream)
        assert items == [f"item-{i}".encode() * 100 for i in range(50)]
        assert dict(stream.trailing_metadata())["x-trailer"] == "bye"


def test_hooked_request_reaches_runtime_with_unknown_fields_intact(
    fake_runtime: FakeRuntime, fake_proxy: ProxyProcess
) -> None:
    known = cri.CreateContainerRequest(
        pod_sandbox_id="sb", config=cri.ContainerConfig(metadata=cri.ContainerMetadata(name="c"))).SerializeToString()
    payload = known + bytes([0x98, 0x06, 0x07])  # field 99, varint 7: in no CRI version
    _call(fake_proxy.listen, HOOKED, payload, timeout=10)
    [got] = [r for r in fake_runtime.received if r.method == HOOKED]
    assert got.payload == payload


def test_decoy_header_block_never_reaches_a_handler(fake_runtime: FakeRuntime, fake_proxy: ProxyProcess) -> None:
    # The withheld stream's header block goes to the runtime and is cancelled at once: the runtime
    # must see the call exactly once (from the proxy's own channel), never an empty request.
    for _ in range(3):
        _call(fake_proxy.listen, HOOKED, cri.CreateContainerRequest(pod_sandbox_id="x").SerializeToString(), timeout=10)
    calls = [r for r in fake_runtime.received if r.method == HOOKED]
    assert len(calls) == 3 and all(r.payload for r in calls)


def test_large_messages_both_ways(fake_proxy: ProxyProcess) -> None:
    big = bytes(range(256)) * 8192  # 2 MiB: many DATA frames, flow control windows refilled
    response, _, _ = _call(fake_proxy.listen, RELAYED, big, timeout=30)
    assert response == big


class _Chopper:
    """A unix-socket relay that forwards bytes in tiny pieces, to split HTTP/2 frames anywhere."""

    def __init__(self, listen: str, target: str, piece: int) -> None:
        self.listen, self.target, self.piece = listen, target, piece
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                for i in range(0, len(data), self.piece):
                    writer.write(data[i : i + self.piece])
                    await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_unix_connection(self.target)
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    def __enter__(self) -> _Chopper:
        self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(
            asyncio.start_unix_server(self._handle, self.listen), self.loop).result(5)
        return self

    def __exit__(self, *exc: object) -> None:
        async def close() -> None:
            self.server.close()
            pipes = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in pipes:
                task.cancel()
            await asyncio.gather(*pipes, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(close(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.mark.parametrize("piece", [1, 7, 4096])
def test_frames_split_anywhere_on_both_sides(fake_runtime: FakeRuntime, tmp_path, piece: int) -> None:
    runtime_side = str(tmp_path / "chop-runtime.sock")
    with _Chopper(runtime_side, fake_runtime.socket_path, piece):
        with ProxyProcess(str(tmp_path / "p.sock"), runtime_side) as proxy:
            with _Chopper(str(tmp_path / "chop-kubelet.sock"), proxy.listen, piece) as front:
                payload = cri.CreateContainerRequest(pod_sandbox_id="s" * 300).SerializeToString()
                for _ in range(3):
                    response, initial, trailing = _call(front.listen, HOOKED, payload, metadata=METADATA, timeout=20)
                    assert cri.CreateContainerResponse.FromString(response).container_id == "fake-container"
                    assert trailing["x-trailer"] == "bye"
                    echoed, _, _ = _call(front.listen, RELAYED, b"x" * 20000, timeout=20)
                    assert echoed == b"x" * 20000


def test_garbage_from_kubelet_closes_only_that_connection(fake_proxy: ProxyProcess) -> None:
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(fake_proxy.listen)
        s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x05\x01\x05\x00\x00\x00\x01" + b"\xff" * 5)
        s.settimeout(5)
        try:
            while s.recv(4096):
                pass
        except (TimeoutError, ConnectionError):
            pass
    response, _, _ = _call(fake_proxy.listen, RELAYED, b"still fine", timeout=10)
    assert response == b"still fine"
