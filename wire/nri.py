"""The plugin side of NRI (containerd's Node Resource Interface) in asyncio: one connection to the runtime's
NRI socket, registration, and the Plugin service answered by a handler object (what containerd/nri's
``pkg/stub`` is for a Go plugin; docs/nri-protocol.md §2-§4).

    conn = await PluginConnection.open(socket_path, handlers, executor)
    await conn.register("koordlet_nri", "00", timeout_s=5)
    await conn.synchronized(timeout_s=6)   # Configure and the (possibly split) Synchronize answered
    await conn.run()                       # until the runtime closes it (or conn.close())

The handler methods are plain functions run in ``executor`` threads, each under a deadline a little ahead of
the runtime's request timeout (2 s unless Configure says otherwise): the runtime drops a plugin that answers
late, so a handler that overruns gets the empty answer (no change) instead, as does one that raises. With
``fail_on_error`` those two cases answer an error instead, which fails the CRI call (a Fail policy). The loop
only reads frames, decodes the request and hands it to a worker: a handler that reads cgroup files, makes host
dirs or waits on a lock never holds up the other requests of the connection. The worker sends its answer
itself (the mux takes writes from any thread), so a call costs one hop between threads, not a round trip
through the loop and its futures; and one timer per connection, set for the earliest give-up time of the calls
in the workers, watches the deadlines, instead of a timer per call.

A late handler is made harmless rather than stopped (a Python thread cannot be): each change it makes to the
node before answering is wrapped in :func:`changing`, and once its call is given up a change not yet begun
raises :class:`Late`, while one under way is waited for (up to the runtime's deadline) before the empty answer
goes. So nothing a handler does lands after its answer. Work queued behind busy workers that has not started
by then never starts. Each call has one answer, taken under its lock by whoever comes first: the worker with
the handler's answer while the call is on time, or the empty answer once it is late.

Events the handlers name in ``quick`` run on the connection's own loop instead: only for handlers that hand
their work to a queue and return (no file, no lock held by slow work), which spares each such call the hop to
a worker thread.

Split syncs (NRI v0.7+, ``more=true``): every chunk but the last is answered at once with ``more=true`` and no
updates, as the runtime requires; the handler sees all pods and containers together when the last chunk
comes, within what is left of the one request timeout that covers them all. Its updates are cut to what
fits in one ttrpc message (the runtime's reader takes 4 MiB); the rest are left to the caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import heapq
import itertools
import logging
import socket
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from google.protobuf.message import Message

from . import nri_pb2 as api
from .nrimux import PLUGIN_CONN, RUNTIME_CONN, Mux
from .ttrpc import MESSAGE_MAX, RECEIVE_MAX, Client, Code, Deferred, Reply, Server, TtrpcError

log = logging.getLogger(__name__)
M = TypeVar("M", bound=Message)

PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"
DEFAULT_REQUEST_TIMEOUT_S = 2.0  # the runtime's plugin_request_timeout when Configure does not say
DEFAULT_REGISTRATION_TIMEOUT_S = 5.0
_ANSWER_MARGIN_S = 0.1  # answer at least this much (or a tenth of the time left) ahead of the deadline
_SEND_MARGIN_S = 0.02  # a change under way at the time-out is waited for until this long before the deadline
_TIMER_SLACK_S = 0.001  # a call this close to its give-up time when the timer fires is given up with it
_RESPONSE_ROOM = MESSAGE_MAX - (64 << 10)  # a Synchronize answer stays this far within the 4 MiB
_EMPTY = api.Empty()
_MORE = api.SynchronizeResponse(more=True).SerializeToString()
_SYNC_EMPTY = api.SynchronizeResponse()  # the no-change answer to the last chunk (its identity: not the handler's)


class Event(enum.IntEnum):
    RUN_POD_SANDBOX = api.RUN_POD_SANDBOX
    STOP_POD_SANDBOX = api.STOP_POD_SANDBOX
    REMOVE_POD_SANDBOX = api.REMOVE_POD_SANDBOX
    CREATE_CONTAINER = api.CREATE_CONTAINER
    POST_CREATE_CONTAINER = api.POST_CREATE_CONTAINER
    START_CONTAINER = api.START_CONTAINER
    POST_START_CONTAINER = api.POST_START_CONTAINER
    UPDATE_CONTAINER = api.UPDATE_CONTAINER
    POST_UPDATE_CONTAINER = api.POST_UPDATE_CONTAINER
    STOP_CONTAINER = api.STOP_CONTAINER
    REMOVE_CONTAINER = api.REMOVE_CONTAINER
    UPDATE_POD_SANDBOX = api.UPDATE_POD_SANDBOX  # NRI v0.10+ (runtime_nri_version)
    POST_UPDATE_POD_SANDBOX = api.POST_UPDATE_POD_SANDBOX

    @property
    def title(self) -> str:
        """``RunPodSandbox``, ``CreateContainer`` ...: the name NRI's event mask parser and logs use."""
        return "".join(part.capitalize() for part in self.name.split("_"))


def event_mask(events: Sequence[Event]) -> int:
    """The ConfigureResponse mask: bit ``1 << (event - 1)`` per event (containerd/nri pkg/api/event.go)."""
    mask = 0
    for event in events:
        mask |= 1 << (event - 1)
    return mask


_NRI_WITH_UPDATE_POD_SANDBOX = (0, 10, 0)
# the first containerd on NRI v0.10 (containerd/nri pkg/api/version.go, InferVersionFromRuntime: 2.1.x speaks v0.8.0)
_CONTAINERD_WITH_UPDATE_POD_SANDBOX = (2, 2, 0)


def _version(text: str) -> tuple[int, ...] | None:
    """``v2.1.9``, ``2.1.9+unknown``, ``1.7.24~ds1`` → (2, 1, 9); None when it does not start with a number."""
    parts: list[int] = []
    for piece in text.strip().removeprefix("v").split("."):
        digits = piece[:len(piece) - len(piece.lstrip("0123456789"))]
        if not digits:
            break
        parts.append(int(digits))
        if digits != piece:
            break
    return tuple(parts) or None


def runtime_sends_update_pod_sandbox(request: api.ConfigureRequest) -> bool:
    """Whether the runtime's NRI has UpdatePodSandbox (v0.10+): Configure's ``NRI_version`` where it sends one
    (v0.12+), else inferred from containerd's own version as NRI's stub infers it; an unknown runtime: no (a mask
    bit its NRI does not know fails the registration)."""
    if request.NRI_version:
        version = _version(request.NRI_version)
        return version is not None and version >= _NRI_WITH_UPDATE_POD_SANDBOX
    if request.runtime_name == "containerd":
        version = _version(request.runtime_version)
        return version is not None and version >= _CONTAINERD_WITH_UPDATE_POD_SANDBOX
    return False


class PluginHandlers(Protocol):
    """What a plugin answers; each method runs in an executor thread (``quick`` ones on the loop) and wraps the
    changes it makes before answering in :func:`changing`."""

    events: int  # the event mask answered to Configure
    quick: frozenset[str]  # events ("RunPodSandbox", ...) whose handlers only queue work: answered on the loop

    def configure(self, request: api.ConfigureRequest) -> int:
        """Take the runtime's Configure; the event mask to subscribe with (``events``, less what the runtime's NRI
        version lacks)."""
        ...

    def update_pod_sandbox(self, request: api.UpdatePodSandboxRequest) -> api.UpdatePodSandboxResponse: ...

    def synchronize(self, pods: Sequence[api.PodSandbox], containers: Sequence[api.Container],
                    deadline: float) -> list[api.ContainerUpdate]: ...

    def create_container(self, request: api.CreateContainerRequest) -> api.CreateContainerResponse: ...

    def update_container(self, request: api.UpdateContainerRequest) -> api.UpdateContainerResponse: ...

    def state_change(self, event: api.StateChangeEvent) -> None: ...


class Late(Exception):
    """The call was answered without this handler's result: it must not change anything any more."""


class _Call:
    """One request handled in a worker thread: its one answer (the handler's, or the empty one once it is late)
    and the changes its handler makes to the node (see the module docstring). Thread-safe: the worker answers
    and changes, the loop gives up; ``_lock`` is held only to flip the flags, never across a change or a send.
    Used as the context manager :func:`changing` returns."""

    __slots__ = ("kind", "reply", "started", "limit", "give_up_at", "late", "answered", "_changing", "_settled",
                 "_lock")

    def __init__(self, kind: _Kind, reply: Reply, started: float, limit: float, give_up_at: float) -> None:
        self.kind = kind
        self.reply = reply
        self.started = started
        self.limit = limit  # when the runtime stops waiting (monotonic)
        self.give_up_at = give_up_at  # when the empty answer goes instead
        self.late = False  # given up: no change may start
        self.answered = False  # the one answer is taken (sent, being sent, or dropped with the connection)
        self._changing = 0
        self._settled: Callable[[], None] | None = None
        self._lock = threading.Lock()

    def __enter__(self) -> None:
        with self._lock:
            if self.late:
                raise Late("the call was answered without this change")
            self._changing += 1

    def __exit__(self, *exc_info: object) -> None:
        with self._lock:
            self._changing -= 1
            settled = None
            if self._changing == 0:
                settled, self._settled = self._settled, None
        if settled is not None:
            settled()

    def take(self, on_time: bool = False) -> bool:
        """Take the one answer: False when it is taken already (or, ``on_time``, when the call is late)."""
        with self._lock:
            if self.answered or (on_time and self.late):
                return False
            self.answered = True
            return True

    def give_up(self, settled: Callable[[], None]) -> bool:
        """Mark the call late: True when a change is under way (and unanswered), in which case ``settled`` is
        called from the changing thread when the last one ends."""
        with self._lock:
            self.late = True
            if self._changing and not self.answered:
                self._settled = settled
                return True
            return False

    def abandon(self) -> None:
        """No answer goes (the connection is closing) and no change starts."""
        with self._lock:
            self.late = self.answered = True
            self._settled = None


_current = threading.local()  # .call: the _Call whose handler runs in this thread
_UNGUARDED = contextlib.nullcontext()


def changing() -> contextlib.AbstractContextManager[None]:
    """Wrap a change to the node a handler makes before answering: raises :class:`Late` when the call's answer
    has gone without it. Outside a connection's worker (a quick handler, a direct call) it guards nothing."""
    call: _Call | None = getattr(_current, "call", None)
    return call if call is not None else _UNGUARDED  # type: ignore[return-value]


# (event name, result, seconds): result is "changed" / "unchanged" (an answer that did / did not change
# anything), "ok" (an event with nothing to answer), "timeout" or "error".
Observer = Callable[[str, str, float], None]


@dataclass(slots=True)
class SyncStats:
    """The last Synchronize: what the runtime sent, in how many messages, and what went back."""

    pods: int = 0
    containers: int = 0
    messages: int = 0
    request_bytes: int = 0
    updates: int = 0
    updates_left_out: int = 0  # did not fit in the answer


@dataclass(slots=True)
class _SyncChunks:
    started: float
    pods: list[api.PodSandbox] = field(default_factory=list)
    containers: list[api.Container] = field(default_factory=list)
    messages: int = 0
    request_bytes: int = 0
    updates_left_out: int = 0


@dataclass(frozen=True, slots=True)
class _Kind:
    """What answering one kind of request takes: the event's name (logs, the observer), the no-change answer,
    whether an answer can change anything (else it is observed "ok"), and what comes with an answer (called just
    before it goes, from the thread sending it, so whoever sees the answer sees this done)."""

    event: str
    empty: Message
    changes: bool = True
    answered: Callable[[Message], None] | None = None


def fit_updates(updates: Sequence[api.ContainerUpdate], room: int = _RESPONSE_ROOM) -> int:
    """How many of ``updates`` (in order) fit in a SynchronizeResponse of at most ``room`` bytes."""
    used = 0
    for count, update in enumerate(updates):
        used += update.ByteSize() + 6  # tag and length of the repeated field's entry
        if used > room:
            return count
    return len(updates)


class PluginConnection:
    """One connection to the runtime: the mux, our Plugin server on connection 1, the Runtime client on 2."""

    def __init__(self, mux: Mux, handlers: PluginHandlers, executor: Executor, *, fail_on_error: bool = False,
                 observe: Observer | None = None, receive_limit: int = RECEIVE_MAX) -> None:
        """``receive_limit``: the longest message taken (default 16 MiB; a Go plugin takes ttrpc's 4 MiB)."""
        self._mux = mux
        self._handlers = handlers
        self._executor = executor
        self._fail = fail_on_error
        self._observe = observe or (lambda event, result, seconds: None)
        self._quick = getattr(handlers, "quick", frozenset())
        self._loop = asyncio.get_running_loop()
        self.request_timeout_s = DEFAULT_REQUEST_TIMEOUT_S
        self.registration_timeout_s = DEFAULT_REGISTRATION_TIMEOUT_S
        self.configure_request: api.ConfigureRequest | None = None
        self.sync = SyncStats()
        self._chunks: _SyncChunks | None = None
        self._synchronized = asyncio.Event()
        self._closed = asyncio.Event()
        self._watched: list[tuple[float, int, _Call]] = []  # heap: (give-up time, arrival, call) in the workers
        self._arrivals = itertools.count()
        self._sweep: asyncio.TimerHandle | None = None
        self._sweep_at = 0.0
        self._kinds = {
            "CreateContainer": _Kind("CreateContainer", api.CreateContainerResponse()),
            "UpdateContainer": _Kind("UpdateContainer", api.UpdateContainerResponse()),
            "UpdatePodSandbox": _Kind("UpdatePodSandbox", api.UpdatePodSandboxResponse(), changes=False),
        }
        self._state_kinds: dict[int, _Kind] = {}  # by StateChangeEvent.event
        methods = {
            "Configure": self._configure,
            "Synchronize": Deferred(self._synchronize),
            "Shutdown": self._shutdown,
            "CreateContainer": Deferred(self._create_container),
            "UpdateContainer": Deferred(self._update_container),
            "StopContainer": self._stop_container,
            "StateChange": Deferred(self._state_change),
            "UpdatePodSandbox": Deferred(self._update_pod_sandbox),
        }
        self.server = Server({PLUGIN_SERVICE: methods}, mux.sender(PLUGIN_CONN), receive_limit=receive_limit)
        self.client = Client(mux.sender(RUNTIME_CONN))
        mux.open(PLUGIN_CONN, self.server)
        mux.open(RUNTIME_CONN, self.client)
        self._reading = self._loop.create_task(self._read())

    @classmethod
    async def open(cls, socket_path: str, handlers: PluginHandlers, executor: Executor, timeout_s: float,
                   **options: object) -> PluginConnection:
        """Connect to the runtime's NRI socket (raises OSError when nobody listens there)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await asyncio.wait_for(asyncio.get_running_loop().sock_connect(sock, socket_path), timeout_s)
            reader, writer = await asyncio.open_unix_connection(sock=sock)
        except BaseException:
            sock.close()
            raise
        return cls(Mux(reader, writer), handlers, executor, **options)  # type: ignore[arg-type]

    @property
    def mux(self) -> Mux:
        return self._mux

    # -- the connection ------------------------------------------------------------------------------------
    async def register(self, name: str, index: str, timeout_s: float = DEFAULT_REGISTRATION_TIMEOUT_S) -> None:
        """RegisterPlugin (raises TtrpcError when the runtime refuses, ConnectionClosed when it hangs up)."""
        request = api.RegisterPluginRequest(plugin_name=name, plugin_idx=index)
        await self.client.call(RUNTIME_SERVICE, "RegisterPlugin", request.SerializeToString(), timeout_s)

    async def synchronized(self, timeout_s: float) -> bool:
        """Wait until the last Synchronize chunk was answered (the runtime then sends events); False on
        timeout or when the connection closed first."""
        waiters = [asyncio.ensure_future(self._synchronized.wait()), asyncio.ensure_future(self._closed.wait())]
        try:
            await asyncio.wait(waiters, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
        return self._synchronized.is_set() and not self._closed.is_set()

    async def _read(self) -> None:
        try:
            await self._mux.run()
        finally:
            self._shut()

    async def run(self) -> None:
        """Serve until the runtime closes the connection (returns) or the trunk breaks (raises)."""
        await asyncio.shield(self._reading)

    def _shut(self) -> None:
        self._closed.set()
        for _, _, call in self._watched:  # the connection is gone: no answer goes, and no change starts now
            call.abandon()
        self._watched.clear()
        if self._sweep is not None:
            self._sweep.cancel()
        self.server.close()
        self.client.close()
        self._mux.close()

    def close(self) -> None:
        self._shut()
        self._reading.cancel()

    async def wait_closed(self) -> None:
        await self._mux.wait_closed()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    # -- deadlines -----------------------------------------------------------------------------------------
    def _limit(self, deadline: float | None, started: float) -> float:
        """When the runtime stops waiting (monotonic): the caller's deadline, and the request timeout from
        ``started``."""
        limit = started + self.request_timeout_s
        return min(limit, deadline) if deadline is not None else limit

    @staticmethod
    def _budget(limit: float) -> float:
        """Seconds a handler may take before ``limit``, less a margin so the answer is there in time."""
        remaining = limit - time.monotonic()
        return max(0.0, remaining - max(_ANSWER_MARGIN_S, remaining / 10))

    def _dispatch(self, kind: _Kind, reply: Reply, started: float, limit: float,
                  decide: Callable[[], Message]) -> None:
        """Answer through ``reply`` what ``decide()`` returns, from a worker thread (on the loop for a quick event),
        or ``kind.empty`` when it fails or has not returned before its budget ends (the module docstring).
        ``started``: the request's arrival, from which the answer is observed."""
        if kind.event in self._quick:
            try:
                answer = decide()
            except Exception as err:  # noqa: BLE001 - a handler bug must not fail a pod (unless the policy is Fail)
                self._failed(kind, reply, started, err)
                return
            self._answer(kind, reply, started, answer)
            return
        call = _Call(kind, reply, started, limit, time.monotonic() + self._budget(limit))
        self._watch(call)
        try:
            self._executor.submit(self._work, call, decide)
        except BaseException:
            call.abandon()  # answered by the server, as a failed start
            raise

    def _work(self, call: _Call, decide: Callable[[], Message]) -> None:
        """In a worker thread: decide, and answer unless the call was given up meanwhile."""
        if call.late:  # waited in the queue past its time: never starts
            return
        _current.call = call
        try:
            answer = decide()
        except Exception as err:  # noqa: BLE001 - a handler bug must not fail a pod (unless the policy is Fail)
            if call.take(on_time=True):
                self._failed(call.kind, call.reply, call.started, err)
            return
        finally:
            _current.call = None
        if call.take(on_time=True):
            self._answer(call.kind, call.reply, call.started, answer)

    def _answer(self, kind: _Kind, reply: Reply, started: float, answer: Message) -> None:
        data = answer.SerializeToString()
        self._observe(kind.event, ("changed" if data else "unchanged") if kind.changes else "ok",
                      time.monotonic() - started)
        if kind.answered is not None:
            kind.answered(answer)
        reply(data)

    def _no_change(self, kind: _Kind, reply: Reply) -> None:
        if kind.answered is not None:
            kind.answered(kind.empty)
        reply(kind.empty.SerializeToString())

    def _failed(self, kind: _Kind, reply: Reply, started: float, err: Exception) -> None:
        self._observe(kind.event, "error", time.monotonic() - started)
        log.error("NRI %s failed; answering %s", kind.event, "an error (Fail policy)" if self._fail else
                  "with no change", exc_info=err)
        if self._fail:
            reply(TtrpcError(Code.UNKNOWN, f"{kind.event}: {err}"))
        else:
            self._no_change(kind, reply)

    def _late(self, call: _Call) -> None:
        """The answer for a call past its budget (from the loop, or from the worker whose change just ended)."""
        kind, budget_s = call.kind, call.give_up_at - call.started
        self._observe(kind.event, "timeout", time.monotonic() - call.started)
        log.warning("NRI %s: no answer within %.2f s; answering %s", kind.event, budget_s,
                    "an error (Fail policy)" if self._fail else "with no change")
        if self._fail:
            call.reply(TtrpcError(Code.DEADLINE_EXCEEDED, f"{kind.event}: no answer within {budget_s:.2f} s"))
        else:
            self._no_change(kind, call.reply)

    # -- the calls in the workers, watched by one timer ------------------------------------------------------
    def _watch(self, call: _Call) -> None:
        """Give ``call`` up at its time. One timer serves the connection, set for the earliest give-up time
        (the heap's top); calls answered meanwhile leave the heap as they come to its top."""
        watched = self._watched
        while watched and watched[0][2].answered:
            heapq.heappop(watched)
        heapq.heappush(watched, (call.give_up_at, next(self._arrivals), call))
        if self._sweep is None or call.give_up_at < self._sweep_at:
            self._arm(call.give_up_at)

    def _arm(self, at: float) -> None:
        if self._sweep is not None:
            self._sweep.cancel()
        self._sweep_at = at
        self._sweep = self._loop.call_later(max(at - time.monotonic(), 0.0), self._give_up_due)

    def _give_up_due(self) -> None:
        self._sweep = None
        watched, now = self._watched, time.monotonic()
        while watched:
            give_up_at, _, call = watched[0]
            if not call.answered and give_up_at > now + _TIMER_SLACK_S:
                self._arm(give_up_at)
                return
            heapq.heappop(watched)
            if not call.answered:
                self._give_up(call)

    def _give_up(self, call: _Call) -> None:
        """Mark the call late; answer it now, or when the change under way ends but no later than just before the
        runtime's deadline."""
        if call.give_up(functools.partial(self._settled, call)):
            self._loop.call_later(max(call.limit - _SEND_MARGIN_S - time.monotonic(), 0.0), self._overdue, call)
        elif call.take():
            self._late(call)

    def _settled(self, call: _Call) -> None:
        if call.take():
            self._late(call)

    def _overdue(self, call: _Call) -> None:
        if call.take():
            log.error("NRI %s: a late handler's change is still under way at the runtime's deadline", call.kind.event)
            self._late(call)

    # -- the Plugin service --------------------------------------------------------------------------------
    async def _configure(self, payload: bytes, deadline: float | None) -> bytes:
        request = api.ConfigureRequest.FromString(payload)
        self.configure_request = request
        if request.request_timeout > 0:
            self.request_timeout_s = request.request_timeout / 1000
        if request.registration_timeout > 0:
            self.registration_timeout_s = request.registration_timeout / 1000
        return api.ConfigureResponse(events=self._handlers.configure(request)).SerializeToString()

    def _synchronize(self, payload: bytes, deadline: float | None, reply: Reply) -> None:
        started = time.monotonic()
        request = api.SynchronizeRequest.FromString(payload)
        chunks = self._chunks or _SyncChunks(started=started)
        chunks.pods.extend(request.pods)
        chunks.containers.extend(request.containers)
        chunks.messages += 1
        chunks.request_bytes += len(payload)
        if request.more:
            self._chunks = chunks
            reply(_MORE)
            return
        self._chunks = None
        limit = self._limit(deadline, chunks.started)
        until = time.monotonic() + self._budget(limit)
        kind = _Kind("Synchronize", _SYNC_EMPTY, answered=functools.partial(self._synced, chunks))
        self._dispatch(kind, reply, started, limit, functools.partial(self._sync_answer, chunks, until))

    def _sync_answer(self, chunks: _SyncChunks, until: float) -> api.SynchronizeResponse:
        updates = self._handlers.synchronize(chunks.pods, chunks.containers, until)
        kept = fit_updates(updates)
        if kept < len(updates):
            chunks.updates_left_out = len(updates) - kept
            log.warning("NRI Synchronize: %d of %d container updates do not fit in one answer; left out",
                        len(updates) - kept, len(updates))
        return api.SynchronizeResponse(update=updates[:kept])

    def _synced(self, chunks: _SyncChunks, answer: api.SynchronizeResponse) -> None:
        """With the last chunk's answer (from the thread sending it): the runtime sends events once it has it."""
        self.sync = SyncStats(len(chunks.pods), len(chunks.containers), chunks.messages, chunks.request_bytes,
                              len(answer.update), chunks.updates_left_out if answer is not _SYNC_EMPTY else 0)
        with contextlib.suppress(RuntimeError):  # the loop has ended
            self._loop.call_soon_threadsafe(self._synchronized.set)

    def _container_event(self, event: str, payload: bytes, deadline: float | None, reply: Reply,
                         request_type: type[M], handler: Callable[[M], Message]) -> None:
        started = time.monotonic()
        request = request_type.FromString(payload)
        self._dispatch(self._kinds[event], reply, started, self._limit(deadline, started),
                       functools.partial(handler, request))

    def _create_container(self, payload: bytes, deadline: float | None, reply: Reply) -> None:
        self._container_event("CreateContainer", payload, deadline, reply, api.CreateContainerRequest,
                              self._handlers.create_container)

    def _update_container(self, payload: bytes, deadline: float | None, reply: Reply) -> None:
        self._container_event("UpdateContainer", payload, deadline, reply, api.UpdateContainerRequest,
                              self._handlers.update_container)

    def _update_pod_sandbox(self, payload: bytes, deadline: float | None, reply: Reply) -> None:
        self._container_event("UpdatePodSandbox", payload, deadline, reply, api.UpdatePodSandboxRequest,
                              self._handlers.update_pod_sandbox)

    async def _stop_container(self, payload: bytes, deadline: float | None) -> bytes:
        return api.StopContainerResponse().SerializeToString()  # not subscribed: nothing to say

    def _state_change(self, payload: bytes, deadline: float | None, reply: Reply) -> None:
        started = time.monotonic()
        event = api.StateChangeEvent.FromString(payload)
        kind = self._state_kinds.get(event.event)
        if kind is None:
            try:
                kind = self._state_kinds[event.event] = _Kind(Event(event.event).title, _EMPTY, changes=False)
            except ValueError:  # an event of a later NRI: answered, not remembered
                kind = _Kind(f"Event{event.event}", _EMPTY, changes=False)
        self._dispatch(kind, reply, started, self._limit(deadline, started),
                       functools.partial(self._state_changed, event))

    def _state_changed(self, event: api.StateChangeEvent) -> api.Empty:
        self._handlers.state_change(event)
        return _EMPTY

    async def _shutdown(self, payload: bytes, deadline: float | None) -> bytes:
        log.info("NRI runtime asked the plugin to shut down")
        return b""
