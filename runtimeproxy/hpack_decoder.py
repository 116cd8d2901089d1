"""A lean HPACK decoder (RFC 7541) for the relay's one job: follow kubelet's dynamic table and
read the request headers of every stream, on every call, at a few microseconds a block.

The general-purpose `hpack` package costs ~30 µs a gRPC request block here (per-field objects,
validation, debug logging); this one decodes into plain (name, value) byte tuples, caches Huffman
strings (gRPC clients repeat the same few values), and never validates what it does not need.
Its results are checked against `hpack` in tests/runtimeproxy/test_hpack_decoder.py.
"""

from __future__ import annotations

from collections import deque

from hpack.huffman_table import decode_huffman
from hpack.table import HeaderTable

_STATIC: tuple[tuple[bytes, bytes], ...] = tuple(HeaderTable.STATIC_TABLE)
_STATIC_LEN = len(_STATIC)  # 61
_ENTRY_OVERHEAD = 32  # RFC 7541 section 4.1
_HUFFMAN_CACHE_MAX = 4096


class HPACKDecodeError(ValueError):
    """The header block is not valid HPACK; the connection's compression state is lost."""


class Decoder:
    def __init__(self, max_table_size: int = 4096, max_allowed_table_size: int = 1 << 20) -> None:
        self._entries: deque[tuple[bytes, bytes]] = deque()
        self._size = 0
        self._max_size = max_table_size
        self.max_allowed_table_size = max_allowed_table_size
        # Changes whenever the dynamic table does: a header block decoded under one version decodes to
        # the same headers under it again (what the relay's cache of decoded blocks relies on).
        self.version = 0
        self._huffman: dict[bytes, bytes] = {}

    def _entry(self, index: int) -> tuple[bytes, bytes]:
        if 0 < index <= _STATIC_LEN:
            return _STATIC[index - 1]
        try:
            return self._entries[index - _STATIC_LEN - 1]
        except IndexError:
            raise HPACKDecodeError(f"header index {index} is not in the table") from None

    def _add(self, name: bytes, value: bytes) -> None:
        self.version += 1
        size = len(name) + len(value) + _ENTRY_OVERHEAD
        if size > self._max_size:
            self._entries.clear()
            self._size = 0
            return
        self._entries.appendleft((name, value))
        self._size += size
        while self._size > self._max_size:
            old_name, old_value = self._entries.pop()
            self._size -= len(old_name) + len(old_value) + _ENTRY_OVERHEAD

    def _resize(self, new_size: int) -> None:
        if new_size > self.max_allowed_table_size:
            raise HPACKDecodeError(f"table size {new_size} above the allowed {self.max_allowed_table_size}")
        self.version += 1
        self._max_size = new_size
        while self._size > new_size:
            old_name, old_value = self._entries.pop()
            self._size -= len(old_name) + len(old_value) + _ENTRY_OVERHEAD

    @staticmethod
    def _integer(data: bytes, pos: int, prefix_bits: int) -> tuple[int, int]:
        mask = (1 << prefix_bits) - 1
        value = data[pos] & mask
        pos += 1
        if value < mask:
            return value, pos
        shift = 0
        while True:
            if pos >= len(data):
                raise HPACKDecodeError("integer runs past the end of the block")
            byte = data[pos]
            pos += 1
            value += (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value, pos
            if shift > 28:
                raise HPACKDecodeError("integer too large")

    def _string(self, data: bytes, pos: int) -> tuple[bytes, int]:
        huffman = data[pos] & 0x80
        length, pos = self._integer(data, pos, 7)
        end = pos + length
        if end > len(data):
            raise HPACKDecodeError("string runs past the end of the block")
        raw = data[pos:end]
        if not huffman:
            return raw, end
        decoded = self._huffman.get(raw)
        if decoded is None:
            try:
                decoded = decode_huffman(raw)
            except Exception as err:  # hpack raises its own error type for bad codes
                raise HPACKDecodeError(f"bad Huffman string: {err}") from err
            if len(self._huffman) >= _HUFFMAN_CACHE_MAX:
                self._huffman.clear()
            self._huffman[raw] = decoded
        return decoded, end

    def decode(self, data: bytes) -> list[tuple[bytes, bytes]]:
        headers: list[tuple[bytes, bytes]] = []
        pos = 0
        n = len(data)
        while pos < n:
            first = data[pos]
            if first & 0x80:  # indexed header field
                index, pos = self._integer(data, pos, 7)
                if index == 0:
                    raise HPACKDecodeError("header index 0")
                headers.append(self._entry(index))
                continue
            if first & 0x40:  # literal with incremental indexing
                index, pos = self._integer(data, pos, 6)
                indexing = True
            elif first & 0x20:  # dynamic table size update
                new_size, pos = self._integer(data, pos, 5)
                self._resize(new_size)
                continue
            else:  # literal without indexing / never indexed
                index, pos = self._integer(data, pos, 4)
                indexing = False
            if index:
                name = self._entry(index)[0]
            else:
                name, pos = self._string(data, pos)
            value, pos = self._string(data, pos)
            headers.append((name, value))
            if indexing:
                self._add(name, value)
        return headers
