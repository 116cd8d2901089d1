"""HTTP/2 frame relay between kubelet and the container runtime (docs/design.md §3.1).

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

A drain (SIGTERM) sends every kubelet connection GOAWAY: streams kubelet opened before it are served to the end,
streams above it are refused unprocessed. A subscription never ends by itself (CRI's GetContainerEvents, Evented
PLEG's, and the other server streams of :data:`ENDLESS_METHODS`), so right after the GOAWAY the proxy ends it:
kubelet gets gRPC UNAVAILABLE on it (trailers, or a trailers-only response when the runtime had sent no headers
yet) and subscribes again, on a new connection, to the next proxy process; the runtime gets RST_STREAM(CANCEL), and
its late frames on the stream are kept away from kubelet as a withheld stream's are. The drain then waits for the
calls that do end, never for a subscription.

Flow control on withheld streams is the proxy's: bytes kubelet sent on them are credited back to
kubelet by the proxy, and connection-level credit kubelet returns for response bytes the proxy
wrote is not passed on to the runtime, which never sent them.

How the code is laid out. :class:`KubeletSide` is the connection: it owns the withheld streams, the relayed
calls in flight and one :class:`HopFlow` per hop (the sender's window as the sender counts it, the credit held
for it, ``take``/``flush``). Each side's ``data_received`` carries what a read left over (a frame that goes
on, a header cut short) and hands the rest to a short ``_scan`` loop, which reads frame headers and calls one
handler per frame type (``_on_data``, ``_on_headers``, ``_on_ping``...; on the runtime side ``_on_stream_frame``
and ``_on_hop_frame``). :class:`RuntimeSide` asks the connection (``stream_ended``, ``allow_frame_size``,
``ack_runtime_ping``, ``write_up``) and the hops' HopFlow; it sets no field of the kubelet side. DATA goes
through its handler too: kept inline, it saved 0.9 µs of the scanners' CPU per relayed call
(bench/relay_scan.py), within the noise of the proxy's 60 to 165 µs per call (bench/proxy_ab.py: +0.9 % and
+1.7 % at 1 and 16 calls in flight), below the 2 % that would pay for a longer loop.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from time import perf_counter

from wire import cri_pb2

from . import h2
from .h2 import (
    CONTINUATION,
    DATA,
    FLAG_ACK,
    FLAG_END_HEADERS,
    FLAG_END_STREAM,
    FLAG_PADDED,
    FLAG_PRIORITY,
    HEADERS,
    PING,
    PRIORITY,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
)
from .hpack_decoder import Decoder, HPACKDecodeError

log = logging.getLogger(__name__)

# The relayed calls whose answer is a stream the runtime never ends by itself: every server-streaming method of the
# CRI services (CRI v1 has one, GetContainerEvents), and containerd's own event subscription (``ctr events``, or any
# client of containerd's API pointed at the proxy). A drain ends them at once (module docstring).
ENDLESS_METHODS = frozenset(f"/{service.full_name}/{method.name}"
                            for service in cri_pb2.DESCRIPTOR.services_by_name.values()
                            for method in service.methods if method.server_streaming
                            ) | {"/containerd.services.events.v1.Events/Subscribe"}
_DRAIN_MESSAGE = "koord-runtime-proxy is restarting: subscribe again"


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
                 observer: RelayObserver | None = None, limits: RelayLimits | None = None,
                 endless_methods: frozenset[str] = ENDLESS_METHODS) -> None:
        """``hooked_methods``: gRPC paths withheld and served by ``handler``; all else is relayed.
        ``endless_methods``: relayed server streams a drain ends at once."""
        self.backend_path = backend_path
        self.limits = limits or RelayLimits()
        self.handler = handler
        self.hooked_methods = frozenset(m.encode("ascii") for m in hooked_methods)
        self.endless_methods = frozenset(m.encode("ascii") for m in endless_methods)
        self.observer = observer or RelayObserver()
        self.connections: set[KubeletSide] = set()
        self.draining = False
        self.refused_streams = 0  # streams opened above a GOAWAY's last stream id, refused unprocessed
        self.ended_streams = 0  # endless server streams a drain ended, for the client to subscribe again

    def __call__(self) -> KubeletSide:
        return KubeletSide(self)

    def in_flight(self) -> int:
        return sum(len(c.inflight) + len(c.hooked) for c in self.connections)

    def start_drain(self) -> None:
        """Ask every kubelet connection to open no new streams: GOAWAY with the last stream it will serve (the
        highest it has seen), and streams above that refused unprocessed, for the client to retry elsewhere; end
        the endless server streams it relays (module docstring). A connection accepted from now on gets GOAWAY(0)
        at once."""
        self.draining = True
        for conn in list(self.connections):
            conn.send_goaway()
            self.ended_streams += conn.end_endless_streams()

    def close_all(self) -> None:
        for conn in list(self.connections):
            conn.close()


class HopFlow:
    """Connection-level flow control of one hop, as the proxy keeps it (module docstring).

    ``window``: what the hop's sender may still send on the connection, as the sender counts it. ``held``:
    credit for that sender the proxy has not written yet (what the other hop gave, or bytes only the proxy
    read). :meth:`take` hands all of it over as one connection WINDOW_UPDATE; :meth:`flush` does so only when
    it is :meth:`due`. Credit is only ever passed on, never invented.
    """

    __slots__ = ("window", "held")

    def __init__(self) -> None:
        self.window = _CONN_WINDOW
        self.held = 0

    def spent(self, n: int) -> None:
        """The sender used ``n`` bytes of its window (a DATA frame's payload length, padding included)."""
        self.window -= n

    def hold(self, n: int) -> None:
        """``n`` bytes more of credit for the sender, written with the proxy's next frames to it or when due."""
        self.held += n

    def due(self) -> bool:
        """The credit held is worth writing now: a quarter of the window, or the sender below half of it."""
        return self.held >= _FLUSH_CREDIT or (self.held > 0 and self.window < _LOW_WINDOW)

    def short(self) -> bool:
        """Credit is held while the sender is below half its window: it must go at once, on its own if need be."""
        return self.held > 0 and self.window < _LOW_WINDOW

    def take(self) -> bytes:
        """The connection WINDOW_UPDATE that hands the sender every credit held."""
        credit, self.held = self.held, 0
        self.window += credit
        return _CONN_CREDIT + credit.to_bytes(4, "big")

    def flush(self) -> bytes:
        """:meth:`take` when the credit is :meth:`due`, else nothing."""
        return self.take() if self.due() else b""


class FrameSizeError(ValueError):
    """A frame larger than the receiver allows (a FRAME_SIZE_ERROR, RFC 9113 section 4.2)."""


# A frame handler of the kubelet side: (flags, stream id, the read, the frame's start, its end) -> None to forward
# the frame as read, the bytes that go to the runtime in its place (b"": nothing), or _INCOMPLETE for a frame it
# takes only whole that goes on in the next read. Only DATA's handler is called before its frame is complete.
_FrameHandler = Callable[[int, int, bytes, int, int], bytes | None]
_INCOMPLETE = b"<incomplete>"


class KubeletSide(asyncio.Protocol):
    """The kubelet end of one relayed connection, and the connection's state: the streams the proxy withholds,
    the relayed calls in flight, and the flow control of both hops (``kubelet_hop``: what kubelet may send and
    the credit held for it; ``runtime_hop``: the same for the runtime)."""

    def __init__(self, relay: Relay, transport=None, *, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """``transport`` and ``loop``: a connection that exists already (asyncio hands the transport to
        :meth:`connection_made` instead). The runtime's side joins through :meth:`join`."""
        self.relay = relay
        self.transport = transport
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
        # relayed endless server streams (Relay.endless_methods) -> the runtime's response headers went to kubelet
        self.endless: dict[int, bool] = {}
        self._owed_credit = 0  # response bytes the proxy wrote to kubelet: kubelet's credit for them stays here
        self.kubelet_hop = HopFlow()
        self.runtime_hop = HopFlow()
        # Frames of the proxy's own for the runtime (PING ACKs, credit) wait here while a kubelet frame is
        # only partly forwarded, or before kubelet's preface and SETTINGS are through.
        self._up_queue: list[bytes] = []
        self._up_open = False
        self._acks_up = b""  # PING ACKs owed to the runtime, written with the next frames that way
        self._ack_timer: asyncio.TimerHandle | None = None
        self._loop = loop
        self.max_stream_id = 0
        self.call_finished = relay.observer.call_finished
        self._goaway_sent = False
        self._closed = False
        self._handshaken = False  # the preface and one complete frame arrived
        self._last_rx = 0.0  # when kubelet's last bytes arrived
        # The largest frame kubelet may send: the HTTP/2 default until the runtime's SETTINGS raise it.
        self.max_frame = relay.limits.max_frame_bytes
        self._watchdog: asyncio.TimerHandle | None = None
        # kubelet's frames the proxy looks at, by type; frames of other types pass as read
        self._handlers: dict[int, _FrameHandler] = {
            DATA: self._on_data, HEADERS: self._on_headers, CONTINUATION: self._on_headers,
            WINDOW_UPDATE: self._on_window_update, PING: self._on_ping, RST_STREAM: self._on_rst_stream,
            PRIORITY: self._on_priority,
        }

    # -- connection life -------------------------------------------------------------------------
    def connection_made(self, transport) -> None:  # uvloop transports are not asyncio.Transport
        self.transport = transport
        self.relay.connections.add(self)
        # Hold kubelet until the runtime connection exists; bytes that still arrive are buffered.
        transport.pause_reading()
        loop = self._loop = asyncio.get_running_loop()
        loop.create_task(self._connect_runtime())
        self._watchdog = loop.call_later(self.relay.limits.handshake_timeout_s, self._check_idle)
        if self.relay.draining:  # accepted while the server closes: none of its streams will be served
            self.send_goaway()

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
        self.join(up)

    def join(self, up: RuntimeSide) -> None:
        """The runtime connection exists: what kubelet sent meanwhile goes to it, and kubelet is read again."""
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
        self.endless.clear()
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
        """GOAWAY(NO_ERROR) with the highest stream kubelet opened so far: those are served to the end, and
        any stream above it is refused (``_refuse_stream``). gRPC clients retry refused streams, which the
        server never processed, on a new connection (RFC 9113 section 6.8)."""
        if not self._goaway_sent and not self._closed:
            self._goaway_sent = True
            self.write_down(h2.goaway(self.max_stream_id))

    def end_endless_streams(self) -> int:
        """After the GOAWAY of a drain: end every relayed endless server stream, kubelet's side with gRPC
        UNAVAILABLE (kubelet subscribes again, on its next connection), the runtime's with RST_STREAM(CANCEL); the
        runtime's late frames on them are kept from kubelet (``closed_hooked``). Returns how many were ended."""
        ended, self.endless = self.endless, {}
        for sid, headers_sent in ended.items():
            path, _ = self.inflight.pop(sid, (b"", 0.0))
            self._remember_closed(sid)
            self.write_down(h2.grpc_status_end(sid, h2.GRPC_UNAVAILABLE, _DRAIN_MESSAGE, headers_sent))
            self.write_up(h2.rst_stream(sid, h2.ERR_CANCEL))
            log.info("drain: ended %s on stream %d for the client to call again", path.decode("ascii", "replace"),
                     sid)
        return len(ended)

    def _refuse_stream(self, sid: int) -> int:
        """A stream kubelet opened above the GOAWAY's last stream id: it goes to the runtime only as its header
        block (the runtime's HPACK decoder must see every block) cancelled at once, like a withheld stream, and
        kubelet gets RST_STREAM(REFUSED_STREAM). Returns ``sid`` (the frame's caller adds the cancel)."""
        self._remember_closed(sid)
        self.relay.refused_streams += 1
        self.relay.observer.refused("goaway")
        self.write_down(h2.rst_stream(sid, h2.ERR_REFUSED_STREAM))
        return sid

    # -- what the runtime side tells the connection ---------------------------------------------
    def stream_ended(self, sid: int) -> None:
        """The runtime ended relayed stream ``sid``: its call's time goes to the metrics."""
        entry = self.inflight.pop(sid, None)
        if entry is not None:
            self.call_finished(entry[0], perf_counter() - entry[1])
        if self.endless:
            self.endless.pop(sid, None)

    def allow_frame_size(self, size: int) -> None:
        """The runtime's SETTINGS allow frames of ``size`` bytes: kubelet may send them."""
        if size > self.max_frame:
            self.max_frame = size

    def ack_runtime_ping(self, payload: bytes) -> None:
        """Owe the runtime a PING ACK: written with kubelet's next frames, or by a timer within _ACK_DELAY_S."""
        self._acks_up += h2.PING_ACK_HEADER + payload
        if self._ack_timer is None and self._loop is not None:
            self._ack_timer = self._loop.call_later(_ACK_DELAY_S, self._ack_due)

    def _ack_due(self) -> None:
        self._ack_timer = None
        if self._acks_up:
            self.write_up(b"")

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
        if self.kubelet_hop.held:
            frames += self.kubelet_hop.take()
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
        if self.runtime_hop.held:
            frames += self.runtime_hop.take()
        if not frames:
            return
        if self._up_open and not self._pass and not self._up_queue:
            self._send_up(frames)
        else:
            self._up_queue.append(frames)

    def credit_kubelet(self, n: int) -> None:
        """Kubelet may send ``n`` more bytes: the runtime credited them, or only the proxy read them."""
        self.kubelet_hop.hold(n)
        if self.kubelet_hop.due():
            self.write_down(b"")

    # -- kubelet -> runtime ----------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        self._last_rx = time.monotonic()
        out: list[bytes] = []
        if self._pass:
            data = self._continue_pass(data, out)
            if not data:
                return
        if self._buf:
            data = self._buf + data
            self._buf = b""
        if self._preface:
            data = self._take_preface(data)
            if data is None:
                return
        try:
            pos, fwd = self._scan(data, out)
        except FrameSizeError as err:
            self._refuse("protocol", h2.ERR_FRAME_SIZE_ERROR, str(err))
            return
        except HPACKDecodeError as err:
            # A connection whose header compression state is lost cannot be relayed any further.
            self._refuse("compression", h2.ERR_COMPRESSION_ERROR, f"malformed HPACK from kubelet: {err}")
            return
        except (ValueError, IndexError) as err:
            self._refuse("protocol", h2.ERR_PROTOCOL_ERROR, f"malformed HTTP/2 from kubelet: {err}")
            return
        if not self._handshaken and not self._preface and (pos or self._pass):
            self._handshaken = True
        self._forward(data, pos, fwd, out)

    def _continue_pass(self, data: bytes, out: list[bytes]) -> bytes:
        """The rest of a relayed DATA frame begun in an earlier read goes up as read; returns what follows it."""
        remaining = self._pass
        if len(data) <= remaining:
            self._pass = remaining - len(data)
            self._send_up(data)
            if not self._pass and self._up_queue and self._up_open:
                self._send_up(b"".join(self._up_queue))
                self._up_queue.clear()
            return b""
        self._send_up(data[:remaining])
        self._pass = 0
        if self._up_queue and self._up_open:  # a frame boundary: the proxy's frames may go now
            out.extend(self._up_queue)
            self._up_queue.clear()
        return data[remaining:]

    def _take_preface(self, data: bytes) -> bytes | None:
        """kubelet's client preface (or the part of it in this read) goes up; returns what follows it, or None
        when it is no HTTP/2 preface (the connection is refused)."""
        k = min(self._preface, len(data))
        start = len(h2.PREFACE) - self._preface
        if data[:k] != h2.PREFACE[start : start + k]:
            self._refuse("protocol", h2.ERR_PROTOCOL_ERROR, "not an HTTP/2 client preface")
            return None
        self._send_up(data[:k])
        self._preface -= k
        return data[k:]

    def _scan(self, data: bytes, out: list[bytes]) -> tuple[int, int]:
        """Walk kubelet's frames in ``data``; returns (where the frames taken end, where the bytes still to
        forward as read start). Each frame type the proxy looks at goes to its handler (``_handlers``), which
        may keep it from the runtime; the others pass as read. A frame is taken once it is complete, except
        relayed DATA, which passes as it arrives (``_on_data`` sets ``_pass`` for the rest of it)."""
        n = len(data)
        pos = fwd = 0
        handlers, max_frame = self._handlers, self.max_frame
        unpack = _FRAME_HEADER.unpack_from
        while n - pos >= 9:
            high, low, ftype, flags, sid = unpack(data, pos)
            length = (high << 8) | low
            if length > max_frame:
                raise FrameSizeError(f"a frame of {length} bytes, over the {max_frame}-byte limit")
            end = pos + 9 + length
            if end > n and ftype != DATA:
                break
            handler = handlers.get(ftype)
            replacement = handler(flags, sid & 0x7FFFFFFF, data, pos, end) if handler is not None else None
            if replacement is not None:
                if replacement is _INCOMPLETE:
                    break
                out.append(data[fwd:pos])
                if replacement:
                    out.append(replacement)
                fwd = end
            pos = end
        return min(pos, n), fwd

    def _forward(self, data: bytes, pos: int, fwd: int, out: list[bytes]) -> None:
        """After a scan: keep an incomplete frame for the next read, write what goes to the runtime (with the
        proxy's own frames when the bytes written end at a frame boundary), and credit kubelet if it runs
        short."""
        n = len(data)
        if pos < n and not self._pass:
            self._buf = data[pos:]
            n = pos
        if fwd < n:
            out.append(data[fwd:n])
        runtime_hop = self.runtime_hop
        if self._pass:  # mid-frame: the runtime's credit waits for the next frame boundary
            if runtime_hop.held and runtime_hop.due():
                self._up_queue.append(runtime_hop.take())
        elif self._up_open and not self._up_queue and not self._acks_up:  # the usual frame boundary
            if runtime_hop.held and runtime_hop.due():
                out.append(runtime_hop.take())
        else:
            self._at_frame_boundary(pos, out)
        if out:
            chunk = out[0] if len(out) == 1 else b"".join(out)
            if chunk:
                self._send_up(chunk)
        if self.kubelet_hop.held and self.kubelet_hop.short():
            self.write_down(b"")

    def _at_frame_boundary(self, pos: int, out: list[bytes]) -> None:
        """The bytes going up end at a frame boundary: the proxy's own frames for the runtime may follow (once
        kubelet's preface and first frame are through)."""
        if not self._up_open and not self._preface and pos:
            self._up_open = True  # kubelet's preface and first frame (its SETTINGS) are through
        if not self._up_open:
            return
        if self._up_queue:
            out.extend(self._up_queue)
            self._up_queue.clear()
        if self._acks_up and any(out):
            out.append(self._acks_up)
            self._acks_up = b""
        if self.runtime_hop.held and self.runtime_hop.due():
            out.append(self.runtime_hop.take())

    # -- kubelet's frames, by type (the _FrameHandler contract) -----------------------------------
    def _on_data(self, flags: int, sid: int, data: bytes, pos: int, end: int) -> bytes | None:
        """DATA of a relayed stream passes as read, also when the frame ends in a later read (``_pass``). On a
        withheld stream, or on one the proxy already answered, only the proxy reads it, once it is whole."""
        length = end - pos - 9
        if sid not in self.hooked and sid not in self.closed_hooked:
            self.kubelet_hop.spent(length)
            if end > len(data):
                self._pass = end - len(data)
            return None
        if end > len(data):
            return _INCOMPLETE
        self.kubelet_hop.spent(length)
        req = self.hooked.get(sid)
        if req is not None:
            self._withheld_data(req, flags, data[pos + 9 : end], length)
        elif length:
            self.credit_kubelet(length)  # late bytes: credit them back
        return b""

    def _on_headers(self, flags: int, sid: int, data: bytes, pos: int, end: int) -> bytes | None:
        """HEADERS or CONTINUATION: every header block is decoded (to follow kubelet's HPACK table); one that
        starts a hooked call still goes to the runtime, cancelled at once (module docstring)."""
        ftype = data[pos + 3]
        if ftype == HEADERS and flags & _WHOLE_PLAIN_BLOCK == FLAG_END_HEADERS:
            withheld = self._header_block(sid, data[pos + 9 : end], flags & FLAG_END_STREAM)
        else:
            withheld = self._header_frame(ftype, flags, sid, data[pos + 9 : end])
        return data[pos:end] + h2.rst_stream(withheld) if withheld else None

    def _on_window_update(self, flags: int, sid: int, data: bytes, pos: int, end: int) -> bytes | None:
        if sid == 0:
            # kubelet's connection credit is for this hop; the runtime gets what is owed to it
            increment = int.from_bytes(data[pos + 9 : pos + 13], "big") & 0x7FFFFFFF
            kept = min(increment, self._owed_credit)
            self._owed_credit -= kept
            self.runtime_hop.hold(increment - kept)
            return b""
        return b"" if sid in self.hooked or sid in self.closed_hooked else None

    def _on_ping(self, flags: int, sid: int, data: bytes, pos: int, end: int) -> bytes | None:
        """Answered on this hop; an ACK can only answer a PING the proxy never sent. A malformed PING goes on,
        for the runtime to refuse."""
        if sid or end - pos != 17:
            return None
        if not flags & FLAG_ACK:
            self.write_down(h2.frame(PING, FLAG_ACK, 0, data[pos + 9 : end]))
        return b""

    def _on_rst_stream(self, flags: int, sid: int, data: bytes, pos: int, end: int) -> bytes | None:
        req = self.hooked.pop(sid, None)
        if req is None and sid not in self.closed_hooked:
            self.inflight.pop(sid, None)
            self.endless.pop(sid, None)
            return None
        if req is not None:
            self._remember_closed(sid)
            if req.task is not None:
                req.task.cancel()
        return b""

    def _on_priority(self, flags: int, sid: int, data: bytes, pos: int, end: int) -> bytes | None:
        return b"" if sid in self.hooked or sid in self.closed_hooked else None

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
            if self._goaway_sent:
                return self._refuse_stream(sid)
            self.max_stream_id = sid
        if path in self.relay.hooked_methods:
            req = HookedRequest(sid, path.decode("ascii"), headers)
            self.hooked[sid] = req
            if end_stream:
                self._start_call(req)
            return sid
        self.inflight[sid] = (path, perf_counter())
        if path in self.relay.endless_methods:
            self.endless[sid] = False
        return 0

    def _withheld_data(self, req: HookedRequest, flags: int, payload: bytes, length: int) -> None:
        if flags & FLAG_PADDED:
            payload = payload[1 : len(payload) - payload[0]]
        req.body += payload
        end_stream = bool(flags & FLAG_END_STREAM)
        limit = self.relay.limits.max_message_bytes
        declared = int.from_bytes(req.body[1:5], "big") if len(req.body) >= 5 else 0
        if len(req.body) > limit + 5 or declared > limit:
            self.kubelet_hop.hold(length)  # written with the refusal
            self._too_large(req, max(declared, len(req.body) - 5))
            return
        if length:
            # The runtime never sees these bytes, so it will never credit them back: we do. The
            # connection's share goes with the answer unless kubelet runs short before; the stream's
            # now, while kubelet is still sending the body.
            if end_stream:
                self.credit_kubelet(length)
            else:
                self.kubelet_hop.hold(length)
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
        self._owed_credit += data_bytes
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


# Connection-level frames the proxy answers or counts on the runtime's hop, by type: their payload length.
_HOP_FRAME_LENGTH = {PING: 8, WINDOW_UPDATE: 4}


class RuntimeSide(asyncio.Protocol):
    """The runtime end of one relayed connection. Its state is where the runtime's byte stream is; the
    connection's (streams, calls, both hops' flow control) is the kubelet side's, which it asks."""

    def __init__(self, down: KubeletSide, transport=None) -> None:
        """``transport``: a connection that exists already (asyncio hands it to :meth:`connection_made`)."""
        self.down = down
        self.transport = transport
        self._hop = down.runtime_hop  # what the runtime may send, and the credit held for it
        self._kubelet_hop = down.kubelet_hop
        self._remaining = 0  # bytes of a frame begun in an earlier read still to come
        self._drop = False  # ... and they are kept from kubelet
        self._hdr = b""  # a frame header (or a whole per-hop frame) split across reads
        self._frames = 0  # the runtime's frames seen; none of the proxy's own go to kubelet before the first
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
            self._remaining = 0
            pos = rem
            if self._drop:
                fwd = rem
        out: list[bytes] = []
        pos, fwd = self._scan(data, pos, fwd, out)
        if pos < n and not self._remaining:  # a frame header (or a per-hop frame) cut by the end of the read
            fwd = self._keep_partial(data, pos, fwd, out)
        if fwd < n:
            out.append(data[fwd:n])
        if self._hop.held and self._hop.short():
            self.down.write_up(b"")
        if out:
            self._write_down(out[0] if len(out) == 1 else b"".join(out))

    def _scan(self, data: bytes, pos: int, fwd: int, out: list[bytes]) -> tuple[int, int]:
        """Walk the runtime's frames in ``data`` from ``pos``; returns (where the frames seen whole end, where the
        bytes still to forward as read start). Frames of relayed streams pass (their ends time the calls);
        frames of withheld streams and the per-hop PING and WINDOW_UPDATE go to their handlers; the proxy's own
        frames for kubelet go in at frame boundaries."""
        n = len(data)
        down, queue, frames = self.down, self._queue, self._frames
        unpack = _FRAME_HEADER.unpack_from
        while True:
            if queue and frames:  # a frame boundary: the proxy's own frames for kubelet go here
                out.append(data[fwd:pos])
                fwd = pos
                out.extend(queue)
                queue.clear()
            if n - pos < 9:
                break
            high, low, ftype, flags, sid = unpack(data, pos)
            length = (high << 8) | low
            frames += 1
            end = pos + 9 + length
            if sid:
                fwd = self._on_stream_frame(ftype, flags, sid & 0x7FFFFFFF, data, pos, end, fwd, out)
            elif _HOP_FRAME_LENGTH.get(ftype) == length:  # answered or counted on this hop; never forwarded
                if end > n:  # kept whole until its payload is here (below)
                    frames -= 1
                    break
                out.append(data[fwd:pos])
                fwd = end
                self._on_hop_frame(ftype, flags, data[pos + 9 : end], frames, out)
            elif ftype == SETTINGS and not flags & FLAG_ACK:
                down.allow_frame_size(_max_frame_size(data, pos + 9, length, n))
            if end > n:  # the frame goes on in the next read (a dropped frame's fwd is past n already)
                self._remaining = end - n
                self._drop = fwd == end
                break
            pos = end
        self._frames = frames
        return pos, fwd

    def _keep_partial(self, data: bytes, pos: int, fwd: int, out: list[bytes]) -> int:
        """A frame header cut by the end of the read (or a per-hop frame cut before its payload's end) is kept,
        not forwarded, until the rest arrives; returns where forwarding goes on."""
        out.append(data[fwd:pos])
        self._hdr = data[pos:]
        return len(data)

    def _on_stream_frame(self, ftype: int, flags: int, sid: int, data: bytes, pos: int, end: int, fwd: int,
                         out: list[bytes]) -> int:
        """A frame on a stream (it may be cut by the end of the read); returns where forwarding goes on. Frames
        of relayed streams pass, and their last one times the call; those of withheld streams go to
        :meth:`_on_withheld`."""
        if ftype == DATA:
            self._hop.spent(end - pos - 9)
        down = self.down
        if sid in down.hooked or sid in down.closed_hooked:
            out.append(data[fwd:pos])
            return self._on_withheld(ftype, sid, data, pos, end, out)
        if (flags & FLAG_END_STREAM and ftype <= HEADERS) or ftype == RST_STREAM:
            down.stream_ended(sid)
        elif ftype == HEADERS and sid in down.endless:  # a drain ends it with trailers now, not trailers-only
            down.endless[sid] = True
        return fwd

    def _on_withheld(self, ftype: int, sid: int, data: bytes, pos: int, end: int, out: list[bytes]) -> int:
        """A runtime frame on a stream the proxy withheld (or ended at a drain); returns where forwarding goes on.
        Header blocks must still reach kubelet's HPACK decoder: on a stream id no call uses, kubelet decodes the
        block and then ignores the frame. Anything else is dropped; dropped DATA the proxy credits back to the runtime
        (kubelet never sees those bytes, so never credits them)."""
        if ftype == HEADERS or ftype == CONTINUATION:
            out.append(data[pos : pos + 5] + _LAST_STREAM_ID)
            log.warning("runtime answered stream %d, which the proxy withheld or ended; kept away from kubelet", sid)
            return pos + 9
        if ftype == DATA:
            self._hop.hold(end - pos - 9)
        return end

    def _on_hop_frame(self, ftype: int, flags: int, payload: bytes, frames: int, out: list[bytes]) -> None:
        """The runtime's PING (acknowledged by the proxy) or connection WINDOW_UPDATE (credit for kubelet,
        written with the next frames down, or now when due and past the runtime's SETTINGS)."""
        if ftype == PING:
            if not flags & FLAG_ACK:
                self.down.ack_runtime_ping(payload)
            return
        hop = self._kubelet_hop
        hop.hold(int.from_bytes(payload, "big") & 0x7FFFFFFF)
        if frames > 1 and hop.due():
            out.append(hop.take())

    def _write_down(self, chunk: bytes) -> None:
        transport = self.down.transport
        # uvloop raises on writes to a closed transport (asyncio ignores them): kubelet may be gone.
        if chunk and transport is not None and not transport.is_closing():
            transport.write(chunk)
