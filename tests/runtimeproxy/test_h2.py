"""The frames the proxy writes itself decode as a real HTTP/2 peer would decode them."""

from __future__ import annotations

import hpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtimeproxy import h2


def _frames(data: bytes) -> list[tuple[int, int, int, bytes]]:
    out, pos = [], 0
    while pos < len(data):
        length = int.from_bytes(data[pos : pos + 3], "big")
        out.append((data[pos + 3], data[pos + 4], int.from_bytes(data[pos + 5 : pos + 9], "big"),
                    data[pos + 9 : pos + 9 + length]))
        pos += 9 + length
    assert pos == len(data)
    return out


def test_unary_response_is_headers_data_trailers_and_leaves_the_hpack_table_empty() -> None:
    data, data_bytes = h2.grpc_response(5, 0, "", b"hello", (("x-a", "1"),), (("x-t-bin", b"\x00\x01"),))
    frames = _frames(data)
    assert [f[0] for f in frames] == [h2.HEADERS, h2.DATA, h2.HEADERS]
    assert all(f[2] == 5 for f in frames)
    assert frames[2][1] == h2.FLAG_END_STREAM | h2.FLAG_END_HEADERS
    assert frames[1][3] == b"\x00\x00\x00\x00\x05hello" and data_bytes == 10
    decoder = hpack.Decoder()
    assert decoder.decode(frames[0][3]) == [(":status", "200"), ("content-type", "application/grpc"), ("x-a", "1")]
    assert decoder.decode(frames[2][3]) == [("grpc-status", "0"), ("x-t-bin", "AAE")]
    assert len(decoder.header_table.dynamic_entries) == 0  # kubelet's table is untouched


def test_error_response_is_trailers_only_with_percent_encoded_message() -> None:
    data, data_bytes = h2.grpc_response(3, 5, "not found: ü 100%", None)
    [(ftype, flags, sid, block)] = _frames(data)
    assert (ftype, flags, sid, data_bytes) == (h2.HEADERS, h2.FLAG_END_STREAM | h2.FLAG_END_HEADERS, 3, 0)
    fields = dict(hpack.Decoder().decode(block))
    assert fields["grpc-status"] == "5"
    assert fields["grpc-message"] == "not found: %C3%BC 100%25"


def test_large_header_blocks_are_split_into_continuations() -> None:
    metadata = [(f"x-k{i}", "v" * 1000) for i in range(40)]
    data, _ = h2.grpc_response(1, 0, "", b"", metadata)
    frames = _frames(data)
    assert frames[0][0] == h2.HEADERS and frames[0][1] == 0 and frames[1][0] == h2.CONTINUATION
    block = b""
    for ftype, flags, _, payload in frames:
        if ftype in (h2.HEADERS, h2.CONTINUATION):
            block += payload
            assert len(payload) <= h2.MAX_FRAME
            if flags & h2.FLAG_END_HEADERS:
                break
    assert dict(hpack.Decoder().decode(block))["x-k39"] == "v" * 1000


@given(st.integers(min_value=0, max_value=2**31), st.sampled_from(["H", "M", "S", "m", "u", "n"]))
def test_grpc_timeout_parses_every_unit(value: int, unit: str) -> None:
    scale = {"H": 3600, "M": 60, "S": 1, "m": 1e-3, "u": 1e-6, "n": 1e-9}[unit]
    assert h2.parse_grpc_timeout(f"{value}{unit}") == pytest.approx(value * scale)


@pytest.mark.parametrize("bad", ["", "S", "10", "1x", "-1S", "1.5S"])
def test_malformed_grpc_timeout_is_none(bad: str) -> None:
    assert h2.parse_grpc_timeout(bad) is None


def test_grpc_message_prefix_is_checked() -> None:
    assert h2.decode_grpc_message(b"\x00\x00\x00\x00\x02ab") == (False, b"ab")
    with pytest.raises(ValueError, match="does not match"):
        h2.decode_grpc_message(b"\x00\x00\x00\x00\x05ab")
    with pytest.raises(ValueError, match="shorter"):
        h2.decode_grpc_message(b"\x00\x00")


def test_padding_and_priority_are_removed_from_header_fragments() -> None:
    payload = bytes([3]) + b"\x00\x00\x00\x01\x10" + b"BLOCK" + b"\x00" * 3
    assert h2.header_block_fragment(h2.HEADERS, h2.FLAG_PADDED | h2.FLAG_PRIORITY, payload) == b"BLOCK"
    with pytest.raises(ValueError):
        h2.header_block_fragment(h2.HEADERS, h2.FLAG_PADDED, bytes([9]) + b"ab")
