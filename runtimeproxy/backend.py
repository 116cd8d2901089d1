"""The separate gRPC path to the runtime for hooked calls (and the start-up probe).

A hooked call leaves the relayed connection: its (possibly changed) request goes to the runtime
as an ordinary unary gRPC call on a channel of its own, carrying kubelet's metadata and deadline,
and the runtime's answer — message, status, initial and trailing metadata — is handed back to the
relay as it came.
"""

from __future__ import annotations

import base64
import logging

import grpc

from . import h2
from .relay import CallResult

log = logging.getLogger(__name__)

# Headers that belong to the HTTP/2 / gRPC transport, not to the call's metadata.
_TRANSPORT_HEADERS = frozenset(
    {"content-type", "te", "grpc-timeout", "user-agent", "grpc-encoding", "grpc-accept-encoding"}
)
_UNLIMITED = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]


def call_metadata(headers: list[tuple[bytes, bytes]]) -> tuple[list[tuple[str, str | bytes]], float | None]:
    """Metadata and timeout (seconds) of a call from its raw request headers."""
    metadata: list[tuple[str, str | bytes]] = []
    timeout = None
    for raw_name, value in headers:
        if raw_name.startswith(b":"):
            continue
        name = raw_name.decode("ascii", "replace")
        if name == "grpc-timeout":
            timeout = h2.parse_grpc_timeout(value.decode("ascii", "replace"))
        elif name not in _TRANSPORT_HEADERS:
            if name.endswith("-bin"):
                # base64 (padding optional), or gRPC "true binary": a 0x00 byte, then the raw value.
                raw = value[1:] if value.startswith(b"\x00") else base64.b64decode(value + b"=" * (-len(value) % 4))
                metadata.append((name, raw))
            else:
                metadata.append((name, value.decode("utf-8", "replace")))
    return metadata, timeout


class RuntimeClient:
    """Unary calls to the runtime with raw request and response bytes."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self._channel: grpc.aio.Channel | None = None
        self._methods: dict[str, grpc.aio.UnaryUnaryMultiCallable] = {}

    def _method(self, path: str) -> grpc.aio.UnaryUnaryMultiCallable:
        method = self._methods.get(path)
        if method is None:
            if self._channel is None:
                # Created lazily so that it binds to the running event loop.
                self._channel = grpc.aio.insecure_channel(f"unix://{self.endpoint}", options=_UNLIMITED)
            method = self._channel.unary_unary(path)
            self._methods[path] = method
        return method

    async def call(
        self,
        path: str,
        payload: bytes,
        metadata: list[tuple[str, str | bytes]],
        timeout: float | None,
    ) -> CallResult:
        call = self._method(path)(payload, timeout=timeout, metadata=metadata or None)
        try:
            response = await call
        except grpc.aio.AioRpcError as err:
            return CallResult(
                code=err.code().value[0],
                message=err.details() or "",
                payload=None,
                initial_metadata=tuple(err.initial_metadata() or ()),
                trailing_metadata=tuple(err.trailing_metadata() or ()),
            )
        return CallResult(
            code=h2.GRPC_OK,
            payload=response,
            initial_metadata=tuple(await call.initial_metadata() or ()),
            trailing_metadata=tuple(await call.trailing_metadata() or ()),
        )

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None


def probe_version(endpoint: str, timeout: float) -> str:
    """Call CRI Version on the runtime; returns "name version (api)" or raises ConnectionError."""
    from wire import cri_pb2

    with grpc.insecure_channel(f"unix://{endpoint}") as channel:
        method = channel.unary_unary(
            "/runtime.v1.RuntimeService/Version",
            request_serializer=cri_pb2.VersionRequest.SerializeToString,
            response_deserializer=cri_pb2.VersionResponse.FromString,
        )
        try:
            version = method(cri_pb2.VersionRequest(version="v1"), timeout=timeout)
        except grpc.RpcError as err:
            raise ConnectionError(f"{err.code().name}: {err.details()}") from err
    return f"{version.runtime_name} {version.runtime_version} (CRI {version.runtime_api_version})"
