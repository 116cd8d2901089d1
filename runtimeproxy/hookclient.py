"""Calls to hook servers (runtime.v1alpha1.RuntimeHookService) with a deadline each.

A hook server whose socket file is gone is not dialled at all: the call fails at once with that
reason, so a dead hook server costs a pod nothing but a stat(). A call that finds the server
unreachable drops the cached channel, so that the next call dials afresh instead of waiting out
gRPC's reconnect backoff: a hook server that comes back is used again on the next pod.
"""

from __future__ import annotations

import logging
import os

import grpc
from google.protobuf.message import DecodeError, Message

from .hookconfig import HookServer, HookType

log = logging.getLogger(__name__)

_CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.max_receive_message_length", 16 << 20),
]


class HookError(Exception):
    """A hook call that gave no usable answer; str() says why."""


class HookUnimplemented(HookError):
    """The hook server does not serve this hook (gRPC UNIMPLEMENTED): one that predates it, such as Koordinator's
    koordlet asked PreUpdatePodSandboxResources. Not a failure: the server has no opinion."""


class HookClient:
    def __init__(self) -> None:
        self._channels: dict[str, grpc.aio.Channel] = {}

    def _channel(self, endpoint: str) -> grpc.aio.Channel:
        channel = self._channels.get(endpoint)
        if channel is None:
            channel = grpc.aio.insecure_channel(f"unix://{endpoint}", options=_CHANNEL_OPTIONS)
            self._channels[endpoint] = channel
        return channel

    async def _forget(self, endpoint: str) -> None:
        channel = self._channels.pop(endpoint, None)
        if channel is not None:
            await channel.close()

    async def call(self, server: HookServer, hook: HookType, request: Message,
                   response_type: type[Message], timeout_s: float) -> Message:
        if not os.path.exists(server.endpoint):
            await self._forget(server.endpoint)
            raise HookError(f"socket {server.endpoint} does not exist")
        method = self._channel(server.endpoint).unary_unary(hook.rpc_path)
        try:
            raw = await method(request.SerializeToString(), timeout=timeout_s)
        except grpc.aio.AioRpcError as err:
            if err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                await self._forget(server.endpoint)
            if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise HookError(f"no answer within {timeout_s:g} s") from None
            if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                raise HookUnimplemented(f"UNIMPLEMENTED: {err.details()}") from None
            raise HookError(f"{err.code().name}: {err.details()}") from None
        try:
            return response_type.FromString(raw)
        except DecodeError as err:
            raise HookError(f"undecodable {response_type.DESCRIPTOR.name} ({len(raw)} bytes): {err}") from None

    async def close(self) -> None:
        for endpoint in list(self._channels):
            await self._forget(endpoint)
