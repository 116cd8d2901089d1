"""HTTP/2 frame relay between kubelet and the container runtime (reference/proxy-designs.md).

Each kubelet connection gets one runtime connection, and frames are copied both ways:

* runtime -> kubelet: forwarded as read; only the 9-byte frame headers are looked at, to know where
  frames end (the proxy may only write its own frames between two of the runtime's), to time calls,
  and to keep frames of withheld streams away from kubelet.
* kubelet -> runtime: forwarded as read, except that every request header block is HPACK-decoded
  (to read ``:path``; the decoder must see every block to follow kubelet's dynamic table). A stream
  whose method is one of the hooked lifecycle calls is *withheld*: its header block still goes to
  the runtime, unchanged, so that the runtime's HPACK decoder stays in step with kubelet's encoder,
  and is cancelled at once with RST_STREAM(CANCEL) before any DATA; grpc-go servers run a unary
  handler only after the whole request message arrived, so the runtime never acts on it. The
  request body is kept, and the call is served on a separate gRPC path (the ``handler``), whose
  answer is written back to kubelet on the original stream with header blocks that never touch
  kubelet's HPACK dynamic table (h2.grpc_response).

Connection-level control frames are answered on each hop, as an HTTP/2 intermediary may (RFC 9113
sections 6.7 and 6.9), instead of crossing the proxy:

* PING: acknowledged by the proxy on the hop it came in on, and never forwarded (so no PING ACK is
  either). kubelet's are answered at once. The runtime's (grpc-go sends one, its BDP probe, on every
  request it receives) are answered with kubelet's next frames to the runtime, or after _ACK_DELAY_S
  when none come, far inside any keepalive timeout.
* WINDOW_UPDATE on stream 0: counted, not forwarded. The proxy keeps each sender's connection window
  as that sender counts it and holds the credit the other hop gave, writing it once it reaches a
  quarter of the default window, or at once when the sender's window falls below half of it, so no
  sender ever waits on credit the proxy holds. Credit is never invented: what one hop gets is what
  the other gave, plus the bytes only the proxy read (withheld request bodies, runtime frames kept
  away from kubelet). A slow reader holds the runtime at the reader's window, as end to end.
* SETTINGS pass end to end: their parameters (HPACK table size, frame size, stream windows,
  concurrent streams) govern bytes the proxy forwards unchanged, so the endpoint that applies them
  must be the one that acknowledges them. Stream-level WINDOW_UPDATE frames pass end to end too.

A relayed unary call thus costs the proxy one read and one write each way, where a byte pipe also
carries each peer's PING, PING ACK and WINDOW_UPDATE across, mostly as packets of their own.

Flow control on withheld streams is the proxy's: bytes kubelet sent on them are credited back to
kubelet by the proxy, and connection-level credit kubelet returns for response bytes the proxy
wrote is not passed on to the runtime, which never sent them.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from time import perf_counter
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from . import h2
from .h2 import (CONTINUATION, DATA, FLAG_ACK, FLAG_END_HEADERS, FLAG_END_STREAM, FLAG_PADDED, FLAG_PRIORITY,
                 HEADERS, PING, PRIORITY, RST_STREAM, SETTINGS, WINDOW_UPDATE)
from .hpack_decoder import Decoder, HPACKDecodeError

log = logging.getLogger(__name__)


# How many finished withheld stream ids a connection remembers, so that late frames for them
# (a stream WINDOW_UPDATE, an RST) are still kept away from the runtime and from kubelet.
_CLOSED_MEMORY = 256
_MAX_DECODED_TABLE = 1 << 20
_MAX_HEADER_BLOCK = 1 << 20  # kubelet's header blocks are a few hundred bytes
_FRAME_HEADER = struct.Struct(">HBBBI")  # length (high 16 bits, low 8), type, flags, stream id
_BLOCK_CACHE = 512  # decoded header blocks a connection remembers (kubelet repeats a handful)
_CONN_WINDOW = 65535  # every connection's initial send window (RFC 9113 6.9.2; SETTINGS never change it)
# Held connection credit is written on its own (not with the next frames) once the sender's window is
# below _LOW_WINDOW or the credit held reaches _FLUSH_CREDIT.
_LOW_WINDOW = _CONN_WINDOW // 2
_FLUSH_CREDIT = _CONN_WINDOW // 4
# The runtime's PINGs are acknowledged with kubelet's next frames, or after this long at most. grpc-go
# sends one (its BDP probe) on every request it receives; its keepalive waits 20 s for an ACK by default.
# While kubelet sends, the ACK goes within microseconds; the bound only matters on an idle connection, and
# a shorter one costs the proxy a timer wake-up per period under steady load (5 ms measured 1.31x the
# byte pipe's CPU per call against 1.25x at 50 ms, bench/proxy_ab.py).
_ACK_DELAY_S = 0.05
# flags of a HEADERS frame that holds a whole header block and nothing else (END_HEADERS, no PADDED, PRIORITY)
_WHOLE_PLAIN_BLOCK = FLAG_END_HEADERS | FLAG_PADDED | FLAG_PRIORITY
_CONN_CREDIT = bytes((0, 0, 4, WINDOW_UPDATE, 0, 0, 0, 0, 0))  # a connection WINDOW_UPDATE without its increment
_LAST_STREAM_ID = h2.LAST_STREAM_ID.to_bytes(4, "big")  # the stream id withheld streams' header blocks reach kubelet on


@dataclass(frozen=True, slots=True)
class RelayLimits:
    """What one kubelet connection may cost the proxy.

    ``max_message_bytes``: the largest request message a hooked call may carry (containerd's own default
    receive limit); a body past it is refused with RESOURCE_EXHAUSTED as soon as it is seen, not after
    END_STREAM. ``max_frame_bytes``: the largest frame kubelet may send (grpc-go servers, containerd among
    them, never advertise more than the HTTP/2 default and reject larger frames). ``handshake_timeout_s``:
    a connection must send the client preface and its first frame within this. ``stall_timeout_s``: a
    frame started must be complete within this (a client that stops mid-frame holds a buffer).
    """

    max_message_bytes: int = 16 << 20
    max_frame_bytes: int = h2.MAX_FRAME
    handshake_timeout_s: float = 10.0
    stall_timeout_s: float = 30.0


@dataclass(slots=True)
class CallResult:
    """What the runtime answered to a hooked call, in gRPC terms."""

    code: int
    message: str = ""
    payload: bytes | None = None
    initial_metadata: tuple[tuple[str, str | bytes], ...] = ()
    trailing_metadata: tuple[tuple[str, str | bytes], ...] = ()


@dataclass(slots=True)
class HookedRequest:
    """A withheld request as kubelet sent it: method, decoded headers and the raw gRPC body."""

    stream_id: int
    method: str
    headers: list[tuple[bytes, bytes]]
    body: bytearray = field(default_factory=bytearray)
    task: asyncio.Task | None = None


Handler = Callable[[HookedRequest], Awaitable[CallResult]]


class RelayObserver:
    """Hooks for metrics; the default does nothing. Called on the event loop, off the copy path."""

    def call_finished(self, method: str | bytes, seconds: float) -> None:  # pragma: no cover - default
        pass

    def refused(self, reason: str) -> None:  # pragma: no cover - default
        """A call or a connection was refused for ``reason`` (too_large, protocol, compression, idle)."""


class Relay:
    """Accepts kubelet connections (as an asyncio protocol factory) and relays them."""

    def __init__(self, backend_path: str, handler: Handler, hooked_methods: frozenset[str],
                 observer: RelayObserver | None = None, limits: RelayLimits | None = None) -> None:
        """``hooked_methods``: gRPC paths withheld and served by ``handler``; all else is relayed."""
        self.backend_path = backend_path
        self.limits = limits or RelayLimits()
        self.handler = handler
        self.hooked_methods = frozenset(m.encode("ascii") for m in hooked_methods)
        self.observer = observer or RelayObserver()
        self.connections: set[KubeletSide] = set()

    def __call__(self) -> KubeletSide:
        return KubeletSide(self)

    def in_flight(self) -> int:
        return sum(len(c.inflight) + len(c.hooked) for c in self.connections)

    def start_drain(self) -> None:
        """Ask every kubelet connection to open no new streams (GOAWAY with the last stream seen)."""
        for conn in list(self.connections):
            conn.send_goaway()

    def close_all(self) -> None:
        for conn in list(self.connections):
            conn.close()


class KubeletSide(asyncio.Protocol):
    """The kubelet end of one relayed connection."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self.transport: asyncio.Transport | None = None
        self.up: RuntimeSide | None = None
        self._up_transport = None  # the runtime connection's transport once it exists (kubelet's bytes go there)
        self._pending_up: list[bytes] | None = []
        self._pending_down: list[bytes] = []
        self._preface = len(h2.PREFACE)
        self._buf = b""
        self._pass = 0
        self._decoder = Decoder(max_allowed_table_size=_MAX_DECODED_TABLE)
        # header block -> (decoder version, decoded headers): kubelet's repeated calls send the same bytes,
        # which decode to the same headers while its dynamic table is unchanged
        self._blocks: dict[bytes, tuple[int, list[tuple[bytes, bytes]], bytes | None]] = {}
        self._hblock: tuple[int, bytearray, bool] | None = None
        self.hooked: dict[int, HookedRequest] = {}
        self.closed_hooked: OrderedDict[int, None] = OrderedDict()
        self.inflight: dict[int, tuple[bytes, float]] = {}
        self.owed_credit = 0
        # Connection flow control, per hop (module docstring). ``kubelet_window``: what kubelet may still
        # send, as kubelet counts it; ``credit_down``: credit the proxy holds for kubelet. The same for the
        # runtime's sending: ``runtime_window`` and ``credit_up``.
        self.kubelet_window = _CONN_WINDOW
        self.credit_down = 0
        self.runtime_window = _CONN_WINDOW
        self.credit_up = 0
        # Frames of the proxy's own for the runtime (PING ACKs, credit) wait here while a kubelet frame is
        # only partly forwarded, or before kubelet's preface and SETTINGS are through.
        self._up_queue: list[bytes] = []
        self._up_open = False
        self._acks_up = b""  # PING ACKs owed to the runtime, written with the next frames that way
        self._ack_timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.max_stream_id = 0
        self.call_finished = relay.observer.call_finished
        self._goaway_sent = False
        self._closed = False
        self._handshaken = False  # the preface and one complete frame arrived
        self._last_rx = 0.0  # when kubelet's last bytes arrived
        # The largest frame kubelet may send: the HTTP/2 default until the runtime's SETTINGS raise it.
        self.max_frame = relay.limits.max_frame_bytes
        self._watchdog: asyncio.TimerHandle | None = None

    # -- connection life -------------------------------------------------------------------------
    def connection_made(self, transport) -> None:  # uvloop transports are not asyncio.Transport
        self.transport = transport
        self.relay.connections.add(self)
        # Hold kubelet until the runtime connection exists; bytes that still arrive are buffered.
        transport.pause_reading()
        loop = self._loop = asyncio.get_running_loop()
        loop.create_task(self._connect_runtime())
        self._watchdog = loop.call_later(self.relay.limits.handshake_timeout_s, self._check_idle)

    def _check_idle(self) -> None:
        """Close a connection that never finished its handshake, or that stopped in the middle of a frame.

        A kubelet connection that completed its handshake and sits idle between frames stays open."""
        self._watchdog = None
        if self._closed:
            return
        limits = self.relay.limits
        if not self._handshaken:
            self._refuse("idle", h2.ERR_PROTOCOL_ERROR, "no HTTP/2 preface and first frame within "
                                                        f"{limits.handshake_timeout_s:g}s")
            return
        midway = self._buf or self._pass or self._hblock is not None
        if midway and time.monotonic() - self._last_rx >= limits.stall_timeout_s:
            self._refuse("idle", h2.ERR_PROTOCOL_ERROR, f"a frame stalled for {limits.stall_timeout_s:g}s")
            return
        self._watchdog = asyncio.get_running_loop().call_later(limits.stall_timeout_s / 2, self._check_idle)

    def _refuse(self, reason: str, error_code: int, message: str) -> None:
        """Answer a connection that broke HTTP/2 (or stalled) with GOAWAY, and close it at once."""
        log.warning("closing kubelet connection: %s", message)
        self.relay.observer.refused(reason)
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(h2.goaway(self.max_stream_id, error_code, message.encode("utf-8", "replace")[:200]))
        self.close()

    async def _connect_runtime(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, up = await loop.create_unix_connection(lambda: RuntimeSide(self), self.relay.backend_path)
        except OSError as err:
            # Closing kubelet's connection makes its calls fail with UNAVAILABLE, never hang.
            log.warning("runtime %s unreachable: %s", self.relay.backend_path, err)
            self.close()
            return
        if self._closed:
            up.transport.close()
            return
        self.up = up
        self._up_transport = up.transport
        pending, self._pending_up = self._pending_up, None
        if pending:
            up.transport.write(b"".join(pending))
        for frames in self._pending_down:
            up.inject(frames)
        self._pending_down.clear()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.relay.connections.discard(self)
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if self._ack_timer is not None:
            self._ack_timer.cancel()
            self._ack_timer = None
        for req in self.hooked.values():
            if req.task is not None:
                req.task.cancel()
        self.hooked.clear()
        self.inflight.clear()
        if self.transport is not None:
            self.transport.close()
        if self.up is not None and self.up.transport is not None:
            self.up.transport.close()

    def pause_writing(self) -> None:
        if self.up is not None and self.up.transport is not None:
            self.up.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.up is not None and self.up.transport is not None:
            self.up.transport.resume_reading()

    def send_goaway(self) -> None:
        if not self._goaway_sent and not self._closed:
            self._goaway_sent = True
            self.write_down(h2.goaway(self.max_stream_id))

    # -- writing ---------------------------------------------------------------------------------
    def _send_up(self, data: bytes) -> None:
        transport = self._up_transport
        if transport is not None:
            if not transport.is_closing():
                transport.write(data)
        elif self._pending_up is not None:
            self._pending_up.append(data)

    def write_down(self, frames: bytes) -> None:
        """Write the proxy's own frames to kubelet between two of the runtime's frames, with the
        connection credit held for kubelet."""
        if self._closed:
            return
        if self.credit_down:
            frames += self.take_credit_down()
        if not frames:
            return
        if self.up is None:
            self._pending_down.append(frames)
        else:
            self.up.inject(frames)

    def write_up(self, frames: bytes) -> None:
        """Write the proxy's own frames to the runtime between two of kubelet's frames, with the connection
        credit held for the runtime. Called off kubelet's read path (from the runtime side)."""
        if self._closed:
            return
        if self._acks_up:
            frames += self._acks_up
            self._acks_up = b""
        if self.credit_up:
            frames += self.take_credit_up()
        if not frames:
            return
        if self._up_open and not self._pass and not self._up_queue:
            self._send_up(frames)
        else:
            self._up_queue.append(frames)

    def ack_runtime_ping(self, payload: bytes) -> None:
        """Owe the runtime a PING ACK: written with kubelet's next frames, or by a timer within _ACK_DELAY_S."""
        self._acks_up += h2.PING_ACK_HEADER + payload
        if self._ack_timer is None and self._loop is not None:
            self._ack_timer = self._loop.call_later(_ACK_DELAY_S, self._ack_due)

    def _ack_due(self) -> None:
        self._ack_timer = None
        if self._acks_up:
            self.write_up(b"")

    def take_credit_down(self) -> bytes:
        """The WINDOW_UPDATE that hands kubelet the connection credit held for it."""
        credit, self.credit_down = self.credit_down, 0
        self.kubelet_window += credit
        return _CONN_CREDIT + credit.to_bytes(4, "big")

    def take_credit_up(self) -> bytes:
        credit, self.credit_up = self.credit_up, 0
        self.runtime_window += credit
        return _CONN_CREDIT + credit.to_bytes(4, "big")

    def credit_kubelet(self, n: int) -> None:
        """Kubelet may send ``n`` more bytes: the runtime credited them, or only the proxy read them."""
        self.credit_down += n
        if self.credit_down >= _FLUSH_CREDIT or self.kubelet_window < _LOW_WINDOW:
            self.write_down(b"")

    # -- kubelet -> runtime ----------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        self._last_rx = time.monotonic()
        out: list[bytes] = []
        if self._pass:
            if len(data) <= self._pass:
                self._pass -= len(data)
                self._send_up(data)
                if not self._pass and self._up_queue and self._up_open:
                    self._send_up(b"".join(self._up_queue))
                    self._up_queue.clear()
                return
            self._send_up(data[: self._pass])
            data = data[self._pass :]
            self._pass = 0
            if self._up_queue and self._up_open:  # a frame boundary: the proxy's frames may go now
                out.extend(self._up_queue)
                self._up_queue.clear()
        if self._buf:
            data = self._buf + data
            self._buf = b""
        if self._preface:
            k = min(self._preface, len(data))
            start = len(h2.PREFACE) - self._preface
            if data[:k] != h2.PREFACE[start : start + k]:
                self._refuse("protocol", h2.ERR_PROTOCOL_ERROR, "not an HTTP/2 client preface")
                return
            self._send_up(data[:k])
            self._preface -= k
            data = data[k:]
        n = len(data)
        pos = fwd = 0
        hooked = self.hooked
        max_frame = self.max_frame
        window = self.kubelet_window
        try:
            unpack = _FRAME_HEADER.unpack_from
            while n - pos >= 9:
                high, low, ftype, flags, sid = unpack(data, pos)
                length = (high << 8) | low
                sid &= 0x7FFFFFFF
                if length > max_frame:
                    self._refuse("protocol", h2.ERR_FRAME_SIZE_ERROR,
                                 f"a frame of {length} bytes, over the {max_frame}-byte limit")
                    return
                end = pos + 9 + length
                if ftype == DATA:
                    if sid not in hooked and sid not in self.closed_hooked:
                        window -= length
                        if end > n:
                            self._pass = end - n
                            pos = n
                            break
                        pos = end
                        continue
                    if end > n:
                        break
                    # on a withheld stream, or one the proxy already answered: only the proxy reads it
                    out.append(data[fwd:pos])
                    fwd = end
                    self.kubelet_window = window - length
                    req = hooked.get(sid)
                    if req is not None:
                        self._withheld_data(req, flags, data[pos + 9 : end], length)
                    elif length:
                        self.credit_kubelet(length)  # late bytes: credit them back
                    window = self.kubelet_window
                    pos = end
                    continue
                if end > n:
                    break
                if ftype == HEADERS or ftype == CONTINUATION:
                    if ftype == HEADERS and flags & _WHOLE_PLAIN_BLOCK == FLAG_END_HEADERS:
                        withheld = self._header_block(sid, data[pos + 9 : end], flags & FLAG_END_STREAM)
                    else:
                        withheld = self._header_frame(ftype, flags, sid, data[pos + 9 : end])
                    pos = end
                    if withheld:
                        out.append(data[fwd:pos])
                        out.append(h2.rst_stream(withheld))
                        fwd = pos
                    continue
                if ftype == WINDOW_UPDATE:
                    if sid == 0:
                        # kubelet's connection credit is for this hop; the runtime gets what is owed to it
                        out.append(data[fwd:pos])
                        fwd = end
                        increment = int.from_bytes(data[pos + 9 : pos + 13], "big") & 0x7FFFFFFF
                        if self.owed_credit:
                            taken = min(increment, self.owed_credit)
                            self.owed_credit -= taken
                            increment -= taken
                        self.credit_up += increment
                    elif sid in hooked or sid in self.closed_hooked:
                        out.append(data[fwd:pos])
                        fwd = end
                elif ftype == PING and sid == 0 and length == 8:
                    # answered on this hop; an ACK can only answer a PING the proxy never sent
                    out.append(data[fwd:pos])
                    fwd = end
                    if not flags & FLAG_ACK:
                        self.kubelet_window = window
                        self.write_down(h2.frame(PING, FLAG_ACK, 0, data[pos + 9 : end]))
                        window = self.kubelet_window
                elif ftype == RST_STREAM:
                    req = hooked.pop(sid, None)
                    if req is not None or sid in self.closed_hooked:
                        out.append(data[fwd:pos])
                        fwd = end
                        if req is not None:
                            self._remember_closed(sid)
                            if req.task is not None:
                                req.task.cancel()
                    else:
                        self.inflight.pop(sid, None)
                elif ftype == PRIORITY and (sid in hooked or sid in self.closed_hooked):
                    out.append(data[fwd:pos])
                    fwd = end
                pos = end
        except HPACKDecodeError as err:
            # A connection whose header compression state is lost cannot be relayed any further.
            self._refuse("compression", h2.ERR_COMPRESSION_ERROR, f"malformed HPACK from kubelet: {err}")
            return
        except (ValueError, IndexError) as err:
            self._refuse("protocol", h2.ERR_PROTOCOL_ERROR, f"malformed HTTP/2 from kubelet: {err}")
            return
        self.kubelet_window = window
        if not self._handshaken and not self._preface and (pos or self._pass):
            self._handshaken = True
        if pos < n and not self._pass:
            self._buf = data[pos:]
            n = pos
        if fwd < n:
            out.append(data[fwd:n])
        if not self._pass:  # the bytes written end at a frame boundary
            if not self._up_open and not self._preface and pos:
                self._up_open = True  # kubelet's preface and first frame (its SETTINGS) are through
            if self._up_open:
                if self._up_queue:
                    out.extend(self._up_queue)
                    self._up_queue.clear()
                if self._acks_up and any(out):
                    out.append(self._acks_up)
                    self._acks_up = b""
                credit = self.credit_up
                if credit and (credit >= _FLUSH_CREDIT or self.runtime_window < _LOW_WINDOW):
                    out.append(self.take_credit_up())
        elif self.credit_up >= _FLUSH_CREDIT or (self.credit_up and self.runtime_window < _LOW_WINDOW):
            self._up_queue.append(self.take_credit_up())  # written at the next frame boundary
        if out:
            chunk = out[0] if len(out) == 1 else b"".join(out)
            if chunk:
                self._send_up(chunk)
        if self.credit_down and self.kubelet_window < _LOW_WINDOW:
            self.write_down(b"")

    def _header_frame(self, ftype: int, flags: int, sid: int, payload: bytes) -> int:
        """Feed one HEADERS/CONTINUATION frame; returns the stream id if it starts a withheld call."""
        if ftype == HEADERS:
            fragment = h2.header_block_fragment(ftype, flags, payload)
            if not flags & FLAG_END_HEADERS:
                self._hblock = (sid, bytearray(fragment), bool(flags & FLAG_END_STREAM))
                return 0
            return self._header_block(sid, fragment, bool(flags & FLAG_END_STREAM))
        if self._hblock is None or self._hblock[0] != sid:
            raise ValueError(f"CONTINUATION for stream {sid} without a HEADERS frame before it")
        self._hblock[1].extend(payload)
        if len(self._hblock[1]) > _MAX_HEADER_BLOCK:
            raise ValueError(f"a header block over {_MAX_HEADER_BLOCK} bytes")
        if not flags & FLAG_END_HEADERS:
            return 0
        sid, block, end_stream = self._hblock
        self._hblock = None
        return self._header_block(sid, bytes(block), end_stream)

    def _header_block(self, sid: int, block: bytes, end_stream: int) -> int:
        # Raw bytes: header values may not be UTF-8 (gRPC "true binary" metadata).
        decoder = self._decoder
        cached = self._blocks.get(block)
        if cached is not None and cached[0] == decoder.version:
            _, headers, path = cached
        else:
            version = decoder.version
            headers = decoder.decode(block)
            path = None
            for name, value in headers:
                if name == b":path":
                    path = value
                    break
            if decoder.version == version:  # decoding left the table as it was: the result can be reused
                if len(self._blocks) >= _BLOCK_CACHE:
                    self._blocks.clear()
                self._blocks[block] = (version, headers, path)
        if path is None:  # request trailers
            return 0
        if sid > self.max_stream_id:
            self.max_stream_id = sid
        if path in self.relay.hooked_methods:
            req = HookedRequest(sid, path.decode("ascii"), headers)
            self.hooked[sid] = req
            if end_stream:
                self._start_call(req)
            return sid
        self.inflight[sid] = (path, perf_counter())
        return 0

    def _withheld_data(self, req: HookedRequest, flags: int, payload: bytes, length: int) -> None:
        if flags & FLAG_PADDED:
            payload = payload[1 : len(payload) - payload[0]]
        req.body += payload
        end_stream = bool(flags & FLAG_END_STREAM)
        limit = self.relay.limits.max_message_bytes
        declared = int.from_bytes(req.body[1:5], "big") if len(req.body) >= 5 else 0
        if len(req.body) > limit + 5 or declared > limit:
            self.credit_down += length  # written with the refusal
            self._too_large(req, max(declared, len(req.body) - 5))
            return
        if length:
            # The runtime never sees these bytes, so it will never credit them back: we do. The
            # connection's share goes with the answer unless kubelet runs short before; the stream's
            # now, while kubelet is still sending the body.
            if end_stream:
                self.credit_kubelet(length)
            else:
                self.credit_down += length
                self.write_down(h2.window_update(req.stream_id, length))
        if end_stream:
            self._start_call(req)

    def _too_large(self, req: HookedRequest, size: int) -> None:
        """Refuse a hooked call whose request is over the message limit, without waiting for the rest."""
        limit = self.relay.limits.max_message_bytes
        self.hooked.pop(req.stream_id, None)
        self._remember_closed(req.stream_id)
        req.body = bytearray()
        if req.task is not None:
            req.task.cancel()
        self.relay.observer.refused("too_large")
        log.warning("refusing %s on stream %d: request of at least %d bytes, over the %d-byte limit",
                    req.method, req.stream_id, size, limit)
        frames, _ = h2.grpc_response(req.stream_id, h2.GRPC_RESOURCE_EXHAUSTED,
                                     f"koord-runtime-proxy: received message larger than max ({size} vs. {limit})",
                                     None)
        # the answer is complete; RST_STREAM(NO_ERROR) tells kubelet to stop sending the rest of the body
        self.write_down(frames + h2.rst_stream(req.stream_id, h2.ERR_NO_ERROR))

    def _start_call(self, req: HookedRequest) -> None:
        req.task = asyncio.get_running_loop().create_task(self._serve_call(req))

    async def _serve_call(self, req: HookedRequest) -> None:
        started = time.perf_counter()
        try:
            result = await self.relay.handler(req)
        except asyncio.CancelledError:
            return
        except Exception as err:
            log.exception("hooked call %s failed inside the proxy", req.method)
            result = CallResult(h2.GRPC_INTERNAL, f"koord-runtime-proxy: {type(err).__name__}: {err}")
        if self.hooked.pop(req.stream_id, None) is None:
            return  # kubelet reset the stream meanwhile
        self._remember_closed(req.stream_id)
        frames, data_bytes = h2.grpc_response(
            req.stream_id,
            result.code,
            result.message,
            result.payload,
            result.initial_metadata,
            result.trailing_metadata,
        )
        self.owed_credit += data_bytes
        self.write_down(frames)
        self.relay.observer.call_finished(req.method, time.perf_counter() - started)

    def _remember_closed(self, sid: int) -> None:
        self.closed_hooked[sid] = None
        if len(self.closed_hooked) > _CLOSED_MEMORY:
            self.closed_hooked.popitem(last=False)



def _max_frame_size(data: bytes, start: int, length: int, n: int) -> int:
    """SETTINGS_MAX_FRAME_SIZE in the runtime's SETTINGS frame at ``data[start:start+length]``; when the frame
    is split across reads, the protocol's largest (kubelet may then send any size the runtime allows)."""
    if start + length > n:
        return (1 << 24) - 1
    for offset in range(start, start + length - 5, 6):
        if data[offset] == 0 and data[offset + 1] == 0x5:
            return int.from_bytes(data[offset + 2 : offset + 6], "big")
    return 0


class RuntimeSide(asyncio.Protocol):
    """The runtime end of one relayed connection."""

    def __init__(self, down: KubeletSide) -> None:
        self.down = down
        self.transport: asyncio.Transport | None = None
        self._remaining = 0
        self._drop = False
        self._hdr = b""
        self._frames = 0
        self._queue: list[bytes] = []

    def connection_made(self, transport) -> None:  # uvloop transports are not asyncio.Transport
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.down.close()

    def pause_writing(self) -> None:
        if self.down.transport is not None:
            self.down.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.down.transport is not None:
            self.down.transport.resume_reading()

    def inject(self, frames: bytes) -> None:
        """Write frames to kubelet now if between two runtime frames, else at the next boundary.

        Nothing is written before the runtime's first frame (its SETTINGS preface) has passed.
        """
        transport = self.down.transport
        if transport is None or transport.is_closing():
            return
        if self._frames and not self._remaining:
            transport.write(frames)
        else:
            self._queue.append(frames)

    def data_received(self, data: bytes) -> None:
        down = self.down
        if self._hdr:
            data = self._hdr + data
            self._hdr = b""
        n = len(data)
        pos = fwd = 0
        rem = self._remaining
        if rem:  # the rest of a frame begun in an earlier read
            if rem > n:
                self._remaining = rem - n
                if not self._drop:
                    self._write_down(data)
                return
            if self._drop:
                fwd = rem
            pos = rem
            rem = 0
        drop = False
        frames = self._frames
        queue = self._queue
        hooked = down.hooked
        closed = down.closed_hooked
        unpack = _FRAME_HEADER.unpack_from
        out: list[bytes] = []
        while True:
            if queue and frames:  # a frame boundary: the proxy's own frames for kubelet go here
                out.append(data[fwd:pos])
                fwd = pos
                out.extend(queue)
                queue.clear()
            if n - pos < 9:
                if pos < n:  # a split frame header: not forwarded until complete
                    out.append(data[fwd:pos])
                    self._hdr = data[pos:]
                    fwd = n
                break
            high, low, ftype, flags, sid = unpack(data, pos)
            length = (high << 8) | low
            frames += 1
            end = pos + 9 + length
            if sid:
                sid &= 0x7FFFFFFF
                if ftype == DATA:
                    down.runtime_window -= length
                if sid in hooked or sid in closed:
                    out.append(data[fwd:pos])
                    if ftype == HEADERS or ftype == CONTINUATION:
                        # Header blocks must still reach kubelet's HPACK decoder; on a stream id no
                        # call uses, kubelet decodes the block and then ignores the frame.
                        out.append(data[pos : pos + 5] + _LAST_STREAM_ID)
                        fwd = pos + 9
                        log.warning("runtime answered withheld stream %d; kept away from kubelet", sid)
                    else:
                        drop = True
                        if ftype == DATA:
                            down.credit_up += length  # kubelet never sees these bytes, so never credits them
                        fwd = end
                elif (flags & FLAG_END_STREAM and ftype <= HEADERS) or ftype == RST_STREAM:
                    entry = down.inflight.pop(sid, None)  # a relayed call ended: its time goes to the metrics
                    if entry is not None:
                        down.call_finished(entry[0], perf_counter() - entry[1])
            elif (ftype == PING and length == 8) or (ftype == WINDOW_UPDATE and length == 4):
                # answered or counted on this hop (module docstring); never forwarded
                out.append(data[fwd:pos])
                if end > n:  # kept whole until its payload is here
                    frames -= 1
                    self._hdr = data[pos:]
                    fwd = n
                    break
                fwd = end
                if ftype == PING:
                    if not flags & FLAG_ACK:
                        down.ack_runtime_ping(data[end - 8 : end])
                else:
                    down.credit_down += int.from_bytes(data[end - 4 : end], "big") & 0x7FFFFFFF
                    if frames > 1 and (down.credit_down >= _FLUSH_CREDIT or down.kubelet_window < _LOW_WINDOW):
                        out.append(down.take_credit_down())
            elif ftype == SETTINGS and not flags & FLAG_ACK:
                down.max_frame = max(down.max_frame, _max_frame_size(data, pos + 9, length, n))
            if end > n:  # the frame goes on in the next read
                rem = end - n  # a dropped frame's fwd is past n already
                break
            pos = end
            drop = False
        self._remaining = rem
        self._drop = drop
        self._frames = frames
        if fwd < n:
            out.append(data[fwd:n])
        if down.runtime_window < _LOW_WINDOW and down.credit_up:
            down.write_up(b"")
        if out:
            self._write_down(out[0] if len(out) == 1 else b"".join(out))

    def _write_down(self, chunk: bytes) -> None:
        transport = self.down.transport
        # uvloop raises on writes to a closed transport (asyncio ignores them): kubelet may be gone.
        if chunk and transport is not None and not transport.is_closing():
            transport.write(chunk)
