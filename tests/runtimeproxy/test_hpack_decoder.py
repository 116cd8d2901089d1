"""The relay's HPACK decoder decodes exactly what the reference `hpack` package decodes."""

from __future__ import annotations

import hpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtimeproxy.hpack_decoder import Decoder, HPACKDecodeError

_names = st.sampled_from([":path", ":method", ":authority", "grpc-timeout", "user-agent", "x-id", "content-type",
                          "te", "grpc-trace-bin", "x-" + "n" * 40])
_values = st.binary(min_size=0, max_size=60)
_blocks = st.lists(st.lists(st.tuples(_names, _values), min_size=1, max_size=12), min_size=1, max_size=25)


@settings(max_examples=150, deadline=None)
@given(blocks=_blocks, huffman=st.booleans(), table_size=st.sampled_from([0, 64, 256, 4096]),
       sensitive=st.booleans())
def test_decodes_like_the_reference_decoder(blocks, huffman, table_size, sensitive) -> None:
    encoder = hpack.Encoder()
    encoder.header_table_size = table_size
    reference = hpack.Decoder()
    ours = Decoder()
    for headers in blocks:
        fields = [hpack.NeverIndexedHeaderTuple(n.encode(), v) if sensitive and n == "x-id" else (n.encode(), v)
                  for n, v in headers]
        block = encoder.encode(fields, huffman=huffman)
        assert ours.decode(block) == [(bytes(n), bytes(v)) for n, v in reference.decode(block, raw=True)]


def test_follows_a_grpc_client_over_many_calls() -> None:
    encoder, ours = hpack.Encoder(), Decoder()
    for i in range(2000):
        block = encoder.encode([(":method", "POST"), (":path", f"/runtime.v1.RuntimeService/M{i % 7}"),
                                ("grpc-timeout", f"{1999999 - i}u"), ("user-agent", "grpc-go/1.59")])
        assert dict(ours.decode(block))[b":path"] == f"/runtime.v1.RuntimeService/M{i % 7}".encode()


@pytest.mark.parametrize("block", [b"\x80", b"\xff\xff\xff\xff\xff\xff\x7f", b"\xbf\x40", b"\x40\x85ab",
                                   b"\x3f\xe1\xff\xff\xff\x0f"])
def test_malformed_blocks_raise_a_decode_error(block: bytes) -> None:
    with pytest.raises(HPACKDecodeError):
        Decoder(max_allowed_table_size=4096).decode(block)


def test_the_version_changes_exactly_when_the_dynamic_table_does() -> None:
    """The relay reuses a decoded header block while the version is unchanged; it must change on every
    insertion and size update, and never on a block that only reads the tables."""
    from runtimeproxy.hpack_decoder import Decoder

    decoder = Decoder()
    indexed_insert = b"\x40\x04name\x05value"  # literal with incremental indexing: inserts (name, value)
    version = decoder.version
    assert decoder.decode(indexed_insert) == [(b"name", b"value")]
    assert decoder.version == version + 1
    version = decoder.version
    assert decoder.decode(b"\xbe\x82") == [(b"name", b"value"), (b":method", b"GET")]  # reads only
    assert decoder.version == version
    decoder.decode(b"\x20")  # dynamic table size update to 0: evicts
    assert decoder.version > version
