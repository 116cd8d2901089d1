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
only reads frames, decodes and answers: a handler that reads cgroup files, makes host dirs or waits on a lock
never holds up the other requests of the connection.

A late handler is made harmless rather than stopped (a Python thread cannot be): each change it makes to the
node before answering is wrapped in :func:`changing`, and once its call is given up a change not yet begun
raises :class:`Late`, while one under way is waited for (up to the runtime's deadline) before the empty answer
goes. So nothing a handler does lands after its answer. Work queued behind busy workers that has not started
by then never starts.

Events the handlers name in ``quick`` run on the connection's own loop instead: only for handlers that hand
their work to a queue and return (no file, no lock held by slow work), which spares each such call the hop to
a worker thread and back.

Split syncs (NRI v0.7+, ``more=true``): every chunk but the last is answered at once with ``more=true`` and no
updates, as the runtime requires; the handler sees all pods and containers together when the last chunk
comes, within what is left of the one request timeout that covers them all. Its updates are cut to what
fits in one ttrpc message (the runtime's reader takes 4 MiB); the rest are left to the caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from google.protobuf.message import Message

from . import nri_pb2 as api
from .nrimux import PLUGIN_CONN, RUNTIME_CONN, Mux
from .ttrpc import MESSAGE_MAX, RECEIVE_MAX, Client, Code, Server, TtrpcError

log = logging.getLogger(__name__)
T = TypeVar("T")
M = TypeVar("M", bound=Message)
N = TypeVar("N", bound=Message)

PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"
DEFAULT_REQUEST_TIMEOUT_S = 2.0  # the runtime's plugin_request_timeout when Configure does not say
DEFAULT_REGISTRATION_TIMEOUT_S = 5.0
_ANSWER_MARGIN_S = 0.1  # answer at least this much (or a tenth of the time left) ahead of the deadline
_SEND_MARGIN_S = 0.02  # a change under way at the time-out is waited for until this long before the deadline
_RESPONSE_ROOM = MESSAGE_MAX - (64 << 10)  # a Synchronize answer stays this far within the 4 MiB
_TIMED_OUT = object()  # what the budget's timer settles a call with


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


class PluginHandlers(Protocol):
    """What a plugin answers; each method runs in an executor thread (``quick`` ones on the loop) and wraps the
    changes it makes before answering in :func:`changing`."""

    events: int  # the event mask answered to Configure
    quick: frozenset[str]  # events ("RunPodSandbox", ...) whose handlers only queue work: answered on the loop

    def configure(self, request: api.ConfigureRequest) -> None: ...

    def synchronize(self, pods: Sequence[api.PodSandbox], containers: Sequence[api.Container],
                    deadline: float) -> list[api.ContainerUpdate]: ...

    def create_container(self, request: api.CreateContainerRequest) -> api.CreateContainerResponse: ...

    def update_container(self, request: api.UpdateContainerRequest) -> api.UpdateContainerResponse: ...

    def state_change(self, event: api.StateChangeEvent) -> None: ...


class Late(Exception):
    """The call was answered without this handler's result: it must not change anything any more."""


class CallGuard:
    """The changes one handler call makes to the node, and whether its answer has been given up (see the module
    docstring). Thread-safe: the handler's worker thread changes, the connection's loop gives up."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # held only to flip the counters, never across a change
        self._late = False
        self._changing = 0
        self._settled: Callable[[], None] | None = None

    @property
    def late(self) -> bool:
        return self._late

    @contextlib.contextmanager
    def changing(self) -> Iterator[None]:
        with self._lock:
            if self._late:
                raise Late("the call was answered without this change")
            self._changing += 1
        try:
            yield
        finally:
            with self._lock:
                self._changing -= 1
                settled = self._settled if self._changing == 0 else None
            if settled is not None:
                settled()

    def give_up(self, settled: Callable[[], None]) -> bool:
        """Mark the call late: True when no change is under way; otherwise ``settled`` is called (from the
        changing thread) when the last one ends."""
        with self._lock:
            self._late = True
            if self._changing == 0:
                return True
            self._settled = settled
            return False


_call = threading.local()  # .guard: the CallGuard of the handler call running in this thread


def changing() -> contextlib.AbstractContextManager[None]:
    """Wrap a change to the node a handler makes before answering: raises :class:`Late` when the call's answer
    has gone without it. Outside a connection's worker (a quick handler, a direct call) it guards nothing."""
    guard: CallGuard | None = getattr(_call, "guard", None)
    return guard.changing() if guard is not None else contextlib.nullcontext()


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
        self.request_timeout_s = DEFAULT_REQUEST_TIMEOUT_S
        self.registration_timeout_s = DEFAULT_REGISTRATION_TIMEOUT_S
        self.configure_request: api.ConfigureRequest | None = None
        self.sync = SyncStats()
        self._chunks: _SyncChunks | None = None
        self._synchronized = asyncio.Event()
        self._closed = asyncio.Event()
        methods = {
            "Configure": self._configure,
            "Synchronize": self._synchronize,
            "Shutdown": self._shutdown,
            "CreateContainer": self._create_container,
            "UpdateContainer": self._update_container,
            "StopContainer": self._stop_container,
            "StateChange": self._state_change,
        }
        self.server = Server({PLUGIN_SERVICE: methods}, mux.sender(PLUGIN_CONN), receive_limit=receive_limit)
        self.client = Client(mux.sender(RUNTIME_CONN))
        mux.open(PLUGIN_CONN, self.server)
        mux.open(RUNTIME_CONN, self.client)
        self._reading = asyncio.get_running_loop().create_task(self._read())

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

    async def _in_worker(self, call: Callable[[], T], limit: float) -> T:
        """``call`` in an executor thread under a :class:`CallGuard`; TimeoutError when it has not answered
        within the budget, and then nothing it changes lands after the answer (the module docstring)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[tuple[bool, object]] = loop.create_future()
        guard = CallGuard()

        def settle(outcome: tuple[bool, object]) -> None:
            if not done.done():
                done.set_result(outcome)

        def work() -> None:
            if guard.late:  # waited in the queue past its time: never starts
                return
            _call.guard = guard
            try:
                outcome: tuple[bool, object] = (True, call())
            except BaseException as err:  # noqa: BLE001 - handed to the loop, which answers for it
                outcome = (False, err)
            finally:
                _call.guard = None
            with contextlib.suppress(RuntimeError):  # the loop has ended: nobody waits for this answer
                loop.call_soon_threadsafe(settle, outcome)

        self._executor.submit(work)
        timer = loop.call_later(self._budget(limit), settle, (False, _TIMED_OUT))
        try:
            ok, value = await done
        except asyncio.CancelledError:  # the connection closed: no answer goes, and no change after this
            guard.give_up(lambda: None)
            raise
        finally:
            timer.cancel()
        if value is _TIMED_OUT:
            await self._give_up(guard, limit)
            raise TimeoutError
        if not ok:
            raise value  # type: ignore[misc]
        return value  # type: ignore[return-value]

    @staticmethod
    async def _give_up(guard: CallGuard, limit: float) -> None:
        """Mark the call late, and wait (on the loop, without blocking it) for a change under way to end."""
        loop = asyncio.get_running_loop()
        settled: asyncio.Future[None] = loop.create_future()

        def wake() -> None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(lambda: settled.done() or settled.set_result(None))

        if guard.give_up(wake):
            return
        try:
            await asyncio.wait_for(settled, max(limit - _SEND_MARGIN_S - time.monotonic(), 0.0))
        except TimeoutError:
            log.error("NRI: a late handler's change is still under way at the runtime's deadline")

    async def _run_handler(self, event: str, call: Callable[[], T], limit: float, empty: T, started: float,
                           changed: Callable[[T], bool] | None = None) -> T:
        """``call`` in a worker thread, answered before ``limit`` (on the loop for a quick event); observed from
        ``started`` (the request's arrival, before its decoding) to the answer."""
        budget_s = self._budget(limit)
        try:
            answer = call() if event in self._quick else await self._in_worker(call, limit)
        except TimeoutError:
            self._observe(event, "timeout", time.monotonic() - started)
            log.warning("NRI %s: no answer within %.2f s; answering %s", event, budget_s,
                        "an error (Fail policy)" if self._fail else "with no change")
            if self._fail:
                raise TtrpcError(Code.DEADLINE_EXCEEDED, f"{event}: no answer within {budget_s:.2f} s") from None
            return empty
        except Exception as err:  # noqa: BLE001 - a handler bug must not fail a pod (unless the policy is Fail)
            self._observe(event, "error", time.monotonic() - started)
            log.exception("NRI %s failed; answering %s", event, "an error (Fail policy)" if self._fail else
                          "with no change")
            if self._fail:
                raise TtrpcError(Code.UNKNOWN, f"{event}: {err}") from err
            return empty
        result = "ok" if changed is None else ("changed" if changed(answer) else "unchanged")
        self._observe(event, result, time.monotonic() - started)
        return answer

    # -- the Plugin service --------------------------------------------------------------------------------
    async def _configure(self, payload: bytes, deadline: float | None) -> bytes:
        request = api.ConfigureRequest.FromString(payload)
        self.configure_request = request
        if request.request_timeout > 0:
            self.request_timeout_s = request.request_timeout / 1000
        if request.registration_timeout > 0:
            self.registration_timeout_s = request.registration_timeout / 1000
        self._handlers.configure(request)
        return api.ConfigureResponse(events=self._handlers.events).SerializeToString()

    async def _synchronize(self, payload: bytes, deadline: float | None) -> bytes:
        started = time.monotonic()
        request = api.SynchronizeRequest.FromString(payload)
        chunks = self._chunks or _SyncChunks(started=time.monotonic())
        chunks.pods.extend(request.pods)
        chunks.containers.extend(request.containers)
        chunks.messages += 1
        chunks.request_bytes += len(payload)
        if request.more:
            self._chunks = chunks
            return api.SynchronizeResponse(more=True).SerializeToString()
        self._chunks = None
        limit = self._limit(deadline, chunks.started)
        until = time.monotonic() + self._budget(limit)
        updates = await self._run_handler(
            "Synchronize", lambda: self._handlers.synchronize(chunks.pods, chunks.containers, until), limit, [],
            started, changed=bool)
        kept = fit_updates(updates)
        self.sync = SyncStats(len(chunks.pods), len(chunks.containers), chunks.messages, chunks.request_bytes,
                              kept, len(updates) - kept)
        if kept < len(updates):
            log.warning("NRI Synchronize: %d of %d container updates do not fit in one answer; left out",
                        len(updates) - kept, len(updates))
        answer = api.SynchronizeResponse(update=updates[:kept]).SerializeToString()
        asyncio.get_running_loop().call_soon(self._synchronized.set)
        return answer

    async def _answer(self, event: str, payload: bytes, deadline: float | None, request_type: type[M],
                      handler: Callable[[M], N], empty: N) -> bytes:
        """A container event: its answer, or ``empty`` (no change) when the handler fails or is late."""
        started = time.monotonic()
        request = request_type.FromString(payload)
        answer = await self._run_handler(event, lambda: handler(request), self._limit(deadline, started), empty,
                                         started, changed=lambda r: r.ByteSize() > 0)
        return answer.SerializeToString()

    async def _create_container(self, payload: bytes, deadline: float | None) -> bytes:
        return await self._answer("CreateContainer", payload, deadline, api.CreateContainerRequest,
                                  self._handlers.create_container, api.CreateContainerResponse())

    async def _update_container(self, payload: bytes, deadline: float | None) -> bytes:
        return await self._answer("UpdateContainer", payload, deadline, api.UpdateContainerRequest,
                                  self._handlers.update_container, api.UpdateContainerResponse())

    async def _stop_container(self, payload: bytes, deadline: float | None) -> bytes:
        return api.StopContainerResponse().SerializeToString()  # not subscribed: nothing to say

    async def _state_change(self, payload: bytes, deadline: float | None) -> bytes:
        started = time.monotonic()
        event = api.StateChangeEvent.FromString(payload)
        try:
            name = Event(event.event).title
        except ValueError:
            name = f"Event{event.event}"
        await self._run_handler(name, lambda: self._handlers.state_change(event), self._limit(deadline, started),
                                None, started)
        return b""

    async def _shutdown(self, payload: bytes, deadline: float | None) -> bytes:
        log.info("NRI runtime asked the plugin to shut down")
        return b""
