"""The small part of HTTP/2 (RFC 9113) and HPACK (RFC 7541) the frame relay needs.

The relay never parses what it forwards beyond the 9-byte frame headers; these helpers build the
few frames it writes itself (RST_STREAM and WINDOW_UPDATE toward the runtime, a whole gRPC
response toward kubelet for a hooked call, GOAWAY on drain). Header blocks written toward kubelet
use only the static table and "literal never indexed" fields without Huffman coding, so they never
touch kubelet's HPACK dynamic table, which stays in step with the runtime's encoder.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Iterable
from urllib.parse import quote

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

DATA = 0x0
HEADERS = 0x1
PRIORITY = 0x2
RST_STREAM = 0x3
SETTINGS = 0x4
PUSH_PROMISE = 0x5
PING = 0x6
GOAWAY = 0x7
WINDOW_UPDATE = 0x8
CONTINUATION = 0x9

FLAG_END_STREAM = 0x1
FLAG_ACK = 0x1
FLAG_END_HEADERS = 0x4
FLAG_PADDED = 0x8
FLAG_PRIORITY = 0x20

ERR_NO_ERROR = 0x0
ERR_PROTOCOL_ERROR = 0x1
ERR_FRAME_SIZE_ERROR = 0x6
ERR_REFUSED_STREAM = 0x7
ERR_COMPRESSION_ERROR = 0x9
ERR_CANCEL = 0x8

# Every peer must accept frames of 16 KiB (SETTINGS_MAX_FRAME_SIZE minimum); we never write larger.
MAX_FRAME = 16384
LAST_STREAM_ID = 0x7FFFFFFF

_HDR = struct.Struct(">I")

# HPACK static table indexes (RFC 7541 Appendix A) of the fields the relay writes.
_STATUS_200_INDEXED = b"\x88"
_CONTENT_TYPE_INDEX = 31

# gRPC status codes (grpc/doc/statuscodes.md), by name, for the responses the proxy writes.
GRPC_OK = 0
GRPC_CANCELLED = 1
GRPC_UNKNOWN = 2
GRPC_DEADLINE_EXCEEDED = 4
GRPC_RESOURCE_EXHAUSTED = 8
GRPC_INTERNAL = 13
GRPC_UNAVAILABLE = 14


def frame(ftype: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((ftype, flags)) + _HDR.pack(stream_id) + payload


PING_ACK_HEADER = bytes((0, 0, 8, PING, FLAG_ACK, 0, 0, 0, 0))  # a PING ACK frame without its 8-byte payload


def rst_stream(stream_id: int, error_code: int = ERR_CANCEL) -> bytes:
    return frame(RST_STREAM, 0, stream_id, _HDR.pack(error_code))


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream_id, _HDR.pack(increment & 0x7FFFFFFF))


def goaway(last_stream_id: int, error_code: int = ERR_NO_ERROR, debug: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, _HDR.pack(last_stream_id) + _HDR.pack(error_code) + debug)


def _hpack_int(value: int, prefix_bits: int, first: int) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _hpack_string(raw: bytes) -> bytes:
    return _hpack_int(len(raw), 7, 0x00) + raw


def _literal_never_indexed(name: bytes, value: bytes) -> bytes:
    return b"\x10" + _hpack_string(name) + _hpack_string(value)


def _encode_metadata(metadata: Iterable[tuple[str, str | bytes]]) -> bytes:
    out = bytearray()
    for key, value in metadata:
        name = key.lower().encode("ascii")
        if key.endswith("-bin"):
            raw = value if isinstance(value, bytes) else value.encode()
            encoded = base64.b64encode(raw).rstrip(b"=")
        else:
            encoded = value.encode("utf-8") if isinstance(value, str) else value
        out += _literal_never_indexed(name, encoded)
    return bytes(out)


def _response_head() -> bytes:
    return (
        _STATUS_200_INDEXED
        + _hpack_int(_CONTENT_TYPE_INDEX, 4, 0x10)
        + _hpack_string(b"application/grpc")
    )


def _status_fields(code: int, message: str) -> bytes:
    fields = _literal_never_indexed(b"grpc-status", str(code).encode())
    if message:
        # grpc-message is percent-encoded (gRPC HTTP/2 protocol spec).
        fields += _literal_never_indexed(b"grpc-message", quote(message, safe=" !#$&'()*+,/:;=?@[]~").encode())
    return fields


def _header_frames(stream_id: int, block: bytes, end_stream: bool) -> bytes:
    first_flags = FLAG_END_STREAM if end_stream else 0
    if len(block) <= MAX_FRAME:
        return frame(HEADERS, first_flags | FLAG_END_HEADERS, stream_id, block)
    parts = [block[i : i + MAX_FRAME] for i in range(0, len(block), MAX_FRAME)]
    out = [frame(HEADERS, first_flags, stream_id, parts[0])]
    for i, part in enumerate(parts[1:], start=1):
        out.append(frame(CONTINUATION, FLAG_END_HEADERS if i == len(parts) - 1 else 0, stream_id, part))
    return b"".join(out)


def grpc_response(
    stream_id: int,
    code: int,
    message: str,
    payload: bytes | None,
    initial_metadata: Iterable[tuple[str, str | bytes]] = (),
    trailing_metadata: Iterable[tuple[str, str | bytes]] = (),
) -> tuple[bytes, int]:
    """Frames of a whole unary gRPC response; returns (bytes, DATA payload bytes for flow control).

    With payload None the response is "trailers only" (one HEADERS frame), as gRPC servers send
    for errors.
    """
    if payload is None:
        block = _response_head() + _status_fields(code, message) + _encode_metadata(initial_metadata)
        block += _encode_metadata(trailing_metadata)
        return _header_frames(stream_id, block, end_stream=True), 0
    out = [_header_frames(stream_id, _response_head() + _encode_metadata(initial_metadata), end_stream=False)]
    body = b"\x00" + len(payload).to_bytes(4, "big") + payload
    for i in range(0, len(body), MAX_FRAME):
        out.append(frame(DATA, 0, stream_id, body[i : i + MAX_FRAME]))
    trailers = _status_fields(code, message) + _encode_metadata(trailing_metadata)
    out.append(_header_frames(stream_id, trailers, end_stream=True))
    return b"".join(out), len(body)


def grpc_status_end(stream_id: int, code: int, message: str, headers_sent: bool) -> bytes:
    """The HEADERS that end a gRPC response with ``code``: trailers after the response headers the client already
    has (``headers_sent``), else a trailers-only response (HTTP/2 allows no pseudo-header field in trailers)."""
    if headers_sent:
        return _header_frames(stream_id, _status_fields(code, message), end_stream=True)
    return grpc_response(stream_id, code, message, None)[0]


def parse_grpc_timeout(value: str) -> float | None:
    """grpc-timeout header ("<digits><unit>") in seconds; None when absent or malformed."""
    if not value or len(value) < 2 or not value[:-1].isdigit():
        return None
    scale = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}.get(value[-1])
    return None if scale is None else int(value[:-1]) * scale


def header_block_fragment(ftype: int, flags: int, payload: bytes | memoryview) -> bytes:
    """The header block fragment of a HEADERS or CONTINUATION payload (padding and priority removed)."""
    if ftype == CONTINUATION:
        return bytes(payload)
    start, end = 0, len(payload)
    if flags & FLAG_PADDED:
        pad = payload[0]
        start, end = 1, end - pad
    if flags & FLAG_PRIORITY:
        start += 5
    if start > end:
        raise ValueError("HEADERS padding longer than the frame")
    return bytes(payload[start:end])


def decode_grpc_message(body: bytes) -> tuple[bool, bytes]:
    """Split a length-prefixed gRPC request body into (compressed flag, message)."""
    if len(body) < 5:
        raise ValueError(f"gRPC message shorter than its 5-byte prefix ({len(body)} bytes)")
    length = int.from_bytes(body[1:5], "big")
    if length != len(body) - 5:
        raise ValueError(f"gRPC message length {length} does not match the {len(body) - 5} bytes received")
    return bool(body[0]), body[5:]
