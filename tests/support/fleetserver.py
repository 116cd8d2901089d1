"""The project's API server (tests/support/apiserver.py) as a fleet of node agents meets it: thousands of clients in
one process, on virtual time, every request recorded. What the fleet bench (bench/fleet.py) runs its nodes against.

Kept apart from apiserver.py on purpose: the server's own semantics (storage, validation, resource versions,
authentication and authorization) stay there; this layer adds what a real API server's front does at scale and
what a bench must see:

- :class:`EventLoop`: virtual time. Nothing here sleeps or blocks: a watch is a :class:`WatchStream` the client
  polls, and is told (:meth:`WatchStream.wait`) when there is something to read.
- :class:`FleetServer`: every request through :meth:`FleetServer.request` is recorded (:class:`Record`: time, node,
  verb, resource, whether it was a consistent read, status, bytes in and out; the bytes of each watch event too).
  Reads: a get or list with no ``resourceVersion`` is a consistent read (etcd); with one (``0``, or a version
  with ``NotOlderThan``) the watch cache serves it. Watches are served by this layer from the server's changes:
  each resource keeps the history of the last :attr:`FleetServer.window_s` (75 s, the watch cache's
  ``eventFreshDuration``): a watch from a version replays what changed since, and one from a version older than that
  window answers a 410 ERROR event. A watch with
  ``allowWatchBookmarks`` gets a BOOKMARK every minute and 2 s before its timeout (the cacher's
  ``bookmarkFrequency`` and deadline bookmark), carrying the newest version; it ends at its ``timeoutSeconds``.
  Watches are selected by ``metadata.name`` (what node agents ask for); other selectors are refused (400).
- Faults (the scenarios of bench/fleet.py), for the nodes' requests only: :attr:`FleetServer.unavailable` (every
  request 503, as a restarting server), :attr:`FleetServer.reject_fraction` (that share of requests 429 with
  ``Retry-After``, as API Priority and Fairness under overload), :attr:`FleetServer.watch_gone` (every watch a 410,
  as a lagging watch cache), :meth:`FleetServer.cut_watches` (every open watch broken off, as a load balancer).
- :class:`InProcessApiClient`: the ``kubernetes`` library's real ``ApiClient`` (it builds the path, query, JSON
  body and headers of every request, as for a real server) whose transport is :meth:`FleetServer.request` for one
  node: what a koordlet of the fleet is handed instead of a connection.
"""

from __future__ import annotations

import copy
import enum
import heapq
import itertools
import json
import marshal
import random
import types
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

import kubernetes.client
import urllib3

from tests.support import apiserver, kube
from tests.support.apiserver import ApiServer, ApiStatusError, ResourceType, _Response, _Route, _WatchEvent

EPOCH = 1_767_225_600.0  # the wall clock's 0 of virtual time (2026-01-01)
WATCH_CACHE_WINDOW_S = 75.0
BOOKMARK_EVERY_S = 60.0
BOOKMARK_BEFORE_END_S = 2.0


# ------------------------------------------------------------------------------------------------ speed


def _tree_copy(value: Any, memo: Any = None) -> Any:
    """``copy.deepcopy`` for the JSON trees the server stores, through marshal (13× faster on a NodeMetric); any
    other value (not marshal's) goes to ``copy.deepcopy`` itself."""
    try:
        return marshal.loads(marshal.dumps(value))
    except ValueError:
        return copy.deepcopy(value, memo)


def copy_json_trees_fast() -> None:
    """Make the API server's copies of its objects (several per write, half a fleet's CPU) the fast tree copy: the
    same result on JSON values. For a bench process: every ApiServer in the process is affected."""
    fast = types.SimpleNamespace(deepcopy=_tree_copy)
    apiserver.copy = fast  # type: ignore[assignment]
    kube.copy = fast  # type: ignore[attr-defined]


# --------------------------------------------------------------------------------------------- virtual time


class Timer:
    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class EventLoop:
    """A heap of callbacks at virtual times; :meth:`run_until` runs them in order, moving :attr:`now`."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start
        self._heap: list[tuple[float, int, Timer, Callable[..., Any], tuple[Any, ...]]] = []
        self._seq = itertools.count()
        self.ran = 0

    def call_at(self, when: float, fn: Callable[..., Any], *args: Any) -> Timer:
        timer = Timer()
        heapq.heappush(self._heap, (max(when, self.now), next(self._seq), timer, fn, args))
        return timer

    def call_later(self, delay_s: float, fn: Callable[..., Any], *args: Any) -> Timer:
        return self.call_at(self.now + max(delay_s, 0.0), fn, *args)

    def run_until(self, end: float) -> None:
        heap = self._heap
        while heap and heap[0][0] <= end:
            when, _, timer, fn, args = heapq.heappop(heap)
            if timer.cancelled:
                continue
            self.now = when
            fn(*args)
            self.ran += 1
        self.now = max(self.now, end)


class VirtualClock:
    """:class:`koordlet.kubeclient.timing.Clock` on an :class:`EventLoop`."""

    def __init__(self, loop: EventLoop) -> None:
        self._loop = loop

    def monotonic(self) -> float:
        return self._loop.now

    def time(self) -> float:
        return EPOCH + self._loop.now



# --------------------------------------------------------------------------------------------------- records


@dataclass(frozen=True, slots=True)
class Record:
    at: float
    node: str
    verb: str  # the API's: get, list, watch, create, update, patch, delete
    resource: str  # plural[/subresource]
    consistent: bool  # a read from etcd (no resourceVersion)
    status: int
    bytes_in: int
    bytes_out: int


class Answer:
    """One answer as the ``kubernetes`` library's ``RESTResponse``; a watch's ``response`` is its stream."""

    def __init__(self, status: int, data: bytes, headers: dict[str, str] | None = None,
                 stream: WatchStream | None = None) -> None:
        self.status = status
        self.reason = "OK" if status < 300 else "Error"
        self.data = data
        self.headers = headers or {}
        self.response: Any = stream if stream is not None else self

    def read(self) -> bytes:
        return self.data

    def getheaders(self) -> dict[str, str]:
        return self.headers

    def getheader(self, name: str, default: str | None = None) -> str | None:
        return self.headers.get(name, default)

    def release_conn(self) -> None:
        pass


class StreamState(enum.Enum):
    OPEN = "open"
    ENDED = "ended"  # by the server, at its timeout (or after an ERROR event)
    CUT = "cut"  # broken off: the reader gets a ProtocolError
    CLOSED = "closed"  # by the client


class WatchStream:
    """One open watch, read by its client with :meth:`take` and told by :meth:`wait` when to read again."""

    def __init__(self, fleet: FleetServer, node: str, key: tuple[str, str], route: _Route,
                 query: dict[str, str]) -> None:
        self._fleet = fleet
        self.node = node
        self.key = key
        self.route = route
        self.query = query
        self.lines: deque[bytes] = deque()
        self.state = StreamState.OPEN
        self._waiter: Callable[[], None] | None = None
        self.timers: list[Timer] = []
        self.opened_at = fleet.loop.now

    # ---- the client's side

    def take(self) -> tuple[str, Any]:
        """("line", text), ("end", None), ("cut", the error) or ("wait", None): nothing yet."""
        if self.state is StreamState.CUT:
            return "cut", urllib3.exceptions.ProtocolError("Connection broken: cut by the fleet bench")
        if self.lines:
            return "line", self.lines.popleft().decode()
        if self.state is StreamState.OPEN:
            return "wait", None
        return "end", None

    def wait(self, callback: Callable[[], None]) -> None:
        self._waiter = callback

    def release_conn(self) -> None:
        self.close()

    def shutdown(self) -> None:
        self.close()

    def close(self) -> None:
        if self.state is StreamState.OPEN:
            self._fleet._closed(self)
        self.state = StreamState.CLOSED if self.state is StreamState.OPEN else self.state
        self._waiter = None

    # ---- the server's side

    def push(self, line: bytes) -> None:
        if self.state is not StreamState.OPEN:
            return
        self.lines.append(line)
        self._fleet.watch_bytes[int(self._fleet.loop.now)] += len(line)
        self._wake()

    def finish(self, state: StreamState) -> None:
        if self.state is not StreamState.OPEN:
            return
        self._fleet._closed(self)
        self.state = state
        self._wake()

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None:
            self._fleet.loop.call_later(0.0, waiter)


# ----------------------------------------------------------------------------------------------- the server


class FleetApiServer(ApiServer):
    """The project's API server, telling the fleet layer about every change it stores."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.on_change: Callable[[_WatchEvent], None] = lambda event: None
        super().__init__(*args, **kwargs)

    def _record(self, event_type: str, rtype: ResourceType, old: dict | None, new: dict) -> None:
        super()._record(event_type, rtype, old, new)
        self.on_change(self._events[-1])


def _verb(method: str, route: _Route | None, query: dict[str, str]) -> str:
    if method == "GET":
        if route is not None and route.name is None:
            return "watch" if query.get("watch", "").lower() in ("true", "1") else "list"
        return "get"
    return {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(method, method.lower())


class FleetServer:
    """Records and serves a fleet's requests against ``api`` on ``loop``'s time (see the module docstring)."""

    def __init__(self, api: FleetApiServer, loop: EventLoop, rng: random.Random | None = None,
                 window_s: float = WATCH_CACHE_WINDOW_S) -> None:
        self.api = api
        self.loop = loop
        self.window_s = window_s
        self._rng = rng or random.Random(0)
        self.records: list[Record] = []
        self.watch_bytes: defaultdict[int, int] = defaultdict(int)
        self.open_watches: defaultdict[str, int] = defaultdict(int)  # node → watches open now
        self.peak_watches: defaultdict[str, int] = defaultdict(int)
        self._watchers: defaultdict[tuple[str, str], set[WatchStream]] = defaultdict(set)
        self._history: defaultdict[str, deque[tuple[float, _WatchEvent]]] = defaultdict(deque)
        self._floor: defaultdict[str, int] = defaultdict(int)  # per resource: versions below are gone
        self.unavailable = False
        self.reject_fraction = 0.0
        self.retry_after_s = 5
        self.watch_gone = False
        api.on_change = self._changed

    # ---------------------------------------------------------------------------------------- requests

    def request(self, node: str, method: str, url: str, headers: dict[str, str], body: Any) -> Answer:
        parts = urlsplit(url)
        path = parts.path.rstrip("/") or "/"
        query = {key: values[-1] for key, values in parse_qs(parts.query, keep_blank_values=True).items()}
        raw = b"" if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        try:
            route: _Route | None = self.api._parse_route(path)
        except ApiStatusError:
            route = None
        verb = _verb(method, route, query)
        resource = path.rsplit("/", 1)[-1] if route is None else \
            route.rtype.plural + (f"/{route.subresource}" if route.subresource else "")
        version = query.get("resourceVersion")
        consistent = verb in ("get", "list") and not version
        answer = self._fault(verb) or self._serve(node, method, path, parts.query, route, query, headers, raw, verb)
        self.records.append(Record(self.loop.now, node, verb, resource, consistent, answer.status, len(raw),
                                   len(answer.data)))
        return answer

    def _fault(self, verb: str) -> Answer | None:
        if self.unavailable:
            return _status_answer(ApiStatusError(503, "the server is currently unable to handle the request",
                                                 reason="ServiceUnavailable"))
        if self.reject_fraction and self._rng.random() < self.reject_fraction:
            seconds = self.retry_after_s
            return _status_answer(ApiStatusError(429, "Too many requests, please try again later.",
                                                 reason="TooManyRequests", details={"retryAfterSeconds": seconds},
                                                 headers={"Retry-After": str(seconds)}))
        return None

    def _serve(self, node: str, method: str, path: str, raw_query: str, route: _Route | None,
               query: dict[str, str], headers: dict[str, str], raw: bytes, verb: str) -> Answer:
        target = f"{path}?{raw_query}" if raw_query else path
        content_type = headers.get("Content-Type", "application/json" if raw else "")
        result = self.api.handle(method, target, content_type, raw, headers)
        if isinstance(result, _Response):
            payload = result.body.encode() if isinstance(result.body, str) else json.dumps(result.body).encode()
            return Answer(result.code, payload, dict(result.headers))
        close = getattr(result, "close", None)  # the server authorized and checked the watch: this layer serves it
        if close is not None:
            close()
        assert route is not None and verb == "watch"
        return self._watch(node, route, query)

    # ------------------------------------------------------------------------------------------ watches

    def _watch(self, node: str, route: _Route, query: dict[str, str]) -> Answer:
        selector = query.get("fieldSelector", "")
        if not selector.startswith("metadata.name=") or "," in selector:
            return _status_answer(ApiStatusError(400, f"the fleet server watches by metadata.name only: {selector!r}"))
        name = selector.split("=", 1)[1]
        stream = WatchStream(self, node, (route.rtype.qualified, name), route, query)
        self.open_watches[node] += 1
        self.peak_watches[node] = max(self.peak_watches[node], self.open_watches[node])
        requested = query.get("resourceVersion", "")
        if self.watch_gone or (requested not in ("", "0") and int(requested) < self._gone_below(route.rtype)):
            gone = ApiStatusError(410, f"too old resource version: {requested}", reason="Expired")
            stream.push(self.api._event_line("ERROR", gone.status()))
            stream.finish(StreamState.ENDED)
            return Answer(200, b"", stream=stream)
        if requested in ("", "0"):
            current = self.api.get_object(route.rtype.qualified, name)
            if current is not None:
                stream.push(self.api._event_line("ADDED", self.api._converted(current, route.rtype)))
        else:  # what happened since that version, from the window
            for _, event in self._history[route.rtype.qualified]:
                if event.resource_version > int(requested) and _named(event) == name:
                    line = self.api._filtered(route, query, event)
                    if line is not None:
                        stream.push(line)
        self._watchers[stream.key].add(stream)
        timeout_s = float(query.get("timeoutSeconds") or 1800)
        loop = self.loop
        stream.timers.append(loop.call_later(timeout_s, stream.finish, StreamState.ENDED))
        if query.get("allowWatchBookmarks", "").lower() in ("true", "1"):
            at = BOOKMARK_EVERY_S
            while at < timeout_s - BOOKMARK_BEFORE_END_S:
                stream.timers.append(loop.call_later(at, self._bookmark, stream))
                at += BOOKMARK_EVERY_S
            stream.timers.append(loop.call_later(timeout_s - BOOKMARK_BEFORE_END_S, self._bookmark, stream))
        return Answer(200, b"", stream=stream)

    def _bookmark(self, stream: WatchStream) -> None:
        rtype = stream.route.rtype
        stream.push(self.api._event_line("BOOKMARK", {
            "kind": rtype.kind, "apiVersion": rtype.api_version,
            "metadata": {"resourceVersion": str(self.api.resource_version)}}))

    def _gone_below(self, rtype: ResourceType) -> int:
        history = self._history[rtype.qualified]
        horizon = self.loop.now - self.window_s
        while history and history[0][0] < horizon:
            self._floor[rtype.qualified] = history.popleft()[1].resource_version
        return self._floor[rtype.qualified]

    def _changed(self, event: _WatchEvent) -> None:
        qualified = event.rtype.qualified
        self._history[qualified].append((self.loop.now, event))
        for stream in list(self._watchers.get((qualified, _named(event)), ())):
            line = self.api._filtered(stream.route, stream.query, event)
            if line is not None:
                stream.push(line)

    def _closed(self, stream: WatchStream) -> None:
        for timer in stream.timers:
            timer.cancel()
        stream.timers.clear()
        watchers = self._watchers.get(stream.key)
        if watchers is not None:
            watchers.discard(stream)
        self.open_watches[stream.node] -= 1

    # -------------------------------------------------------------------------------------------- faults

    def cut_watches(self) -> int:
        """Break every open watch off, as a load balancer or a server going down does; how many."""
        streams = [stream for watchers in self._watchers.values() for stream in watchers]
        for stream in streams:
            stream.finish(StreamState.CUT)
        return len(streams)


def _named(event: _WatchEvent) -> str:
    return str((event.new.get("metadata") or {}).get("name") or "")


def _status_answer(error: ApiStatusError) -> Answer:
    return Answer(error.code, json.dumps(error.status()).encode(), dict(error.headers))


# ------------------------------------------------------------------------------------------------ the client


class InProcessApiClient(kubernetes.client.ApiClient):
    """The ``kubernetes`` library's ApiClient for node ``node``, its transport :meth:`FleetServer.request`."""

    def __init__(self, fleet: FleetServer, node: str, token: str | None = None) -> None:
        config = kubernetes.client.Configuration()
        config.host = "https://fleet.invalid"
        if token:
            config.api_key = {"authorization": f"Bearer {token}"}
        super().__init__(config)
        self.user_agent = "koordlet"
        self.fleet = fleet
        self.node = node

    def call_api(self, method: str, url: str, header_params: dict[str, str] | None = None, body: Any = None,
                 post_params: Any = None, _request_timeout: Any = None) -> Answer:
        return self.fleet.request(self.node, method, url, dict(header_params or {}), body)
