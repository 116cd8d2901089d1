"""List + watch of one named object, as client-go's reflector does it (kubernetes/client-go tools/cache/reflector.go).

- **List** once, at ``resourceVersion=0``: the API server answers from its watch cache, not from etcd (a list with no
  version is a consistent read, and 5,000 nodes doing that at every resync is an etcd load of its own). After a
  410 the list asks for the last version seen (``resourceVersionMatch=NotOlderThan``, still the cache), and only if
  that is gone too, for the newest (a consistent read, as client-go).
- **Watch** from the last version, with ``allowWatchBookmarks``: the server's BOOKMARK events move the version on
  while the object does not change, so a watch resumed minutes later is still inside the watch cache's window.
  Each watch asks for a random timeout between 5 and 10 minutes (client-go's ``minWatchTimeout`` and twice it), so
  watches that start together do not end together.
- A watch that **ends** at its timeout is resumed at once from the last version: one request, no list. One that
  fails (broken off, a 5xx, an undecodable line) is resumed after a backoff (:mod:`.backoff`); only a 410 (the
  version left the watch cache) lists again. The backoff is reset only when a watch has lived
  :data:`HEALTHY_WATCH_S`, so watches cut every few seconds keep backing off.
- Every request draws on the koordlet's budget (:mod:`.budget`) as an essential one: under pushback the watchers
  are what comes back first, one request per slot; a broken-off watch tells the budget.

The list-watch loop is a generator (:meth:`Reflector.run`): where it would block, it yields what it waits for,
:class:`Sleep` or :class:`NextLine` of the open watch, and is sent back the line. :class:`ReflectorThread` runs it
on a thread of its own, blocking on each (the koordlet); the fleet bench (bench/fleet.py) runs thousands of them on
one event loop in virtual time. The object goes to ``on_object`` (None: there is none), the consumer; the reflector
keeps nothing but the version.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from koordlet.api.safeload import load_json
from koordlet.kubeapi import MAX_API_BYTES, retry_after_s
from koordlet.kubeclient.backoff import Backoff
from koordlet.kubeclient.budget import Budget, Throttled
from koordlet.kubeclient.timing import SYSTEM_CLOCK, Clock
from koordlet.ticker import join_thread

logger = logging.getLogger(__name__)

WATCH_TIMEOUT_S = (300.0, 600.0)  # client-go: minWatchTimeout 5 min, the timeout random in [min, 2 × min]
HEALTHY_WATCH_S = 60.0  # a watch that lived this long resets the backoff
SHORT_WATCH_S = 1.0  # a watch that ends sooner with no event failed (client-go's "very short watch")
LIST_TIMEOUT = (5.0, 30.0)  # (connect, read) of a list
WATCH_READ_SLACK_S = 30.0  # the read timeout of a watch: its server timeout plus this

Object = dict[str, Any]
ListCall = Callable[..., Any]
# What the list-watch loop can meet and still go on: the API's answers and a broken or unreachable server.
RECOVERABLE = (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError)
BROKEN = (urllib3.exceptions.HTTPError, OSError)


@dataclass(frozen=True, slots=True)
class Sleep:
    """Wait this long (a stop ends the wait)."""

    seconds: float


@dataclass(frozen=True, slots=True)
class NextLine:
    """Read the next line of the open watch ``response``: send back the line, None when the server ended the
    stream, or throw what broke it."""

    response: Any


Step = Sleep | NextLine


class WatchError(RuntimeError):
    """The watch stream reported an error (an ERROR event other than 410, an undecodable line)."""


class Expired(WatchError):
    """The watch's version left the watch cache (410 Gone / Expired): list again."""


class Reflector:
    """List + watch of the object named ``name`` through ``list_call`` (``CoreV1.list_node``, a custom object's
    list), handing each state to ``on_object``."""

    def __init__(self, what: str, list_call: ListCall, name: str, on_object: Callable[[Object | None], None],
                 budget: Budget, *, clock: Clock = SYSTEM_CLOCK, rng: random.Random | None = None,
                 backoff: Backoff | None = None, watch_timeout_s: tuple[float, float] = WATCH_TIMEOUT_S,
                 count_error: Callable[[str], None] | None = None) -> None:
        self.what = what
        self._list_call = list_call
        self._selector = f"metadata.name={name}"
        self._on_object = on_object
        self._budget = budget
        self._clock = clock
        self._rng = rng or random.Random()
        self.backoff = backoff or Backoff(rng=self._rng)
        self._watch_timeout_s = watch_timeout_s
        self._count_error = count_error or (lambda what: None)
        self.synced = threading.Event()
        self.resource_version = ""  # the last version seen: listed, an event's or a bookmark's
        self.watching = False  # a watch is open
        self.lists = 0
        self.watches = 0
        self.failures = 0
        self._failing = False

    # ----------------------------------------------------------------------------------------- the loop

    def run(self) -> Generator[Step, Any, None]:
        """The list-watch loop, forever (until the generator is closed)."""
        relist: str | None = "0"  # the version to list at; None: no list needed, resume the watch
        while True:
            if relist is not None:
                yield from self._relist(relist)
            relist = yield from self._watch()

    def _relist(self, version: str) -> Generator[Step, Any, None]:
        """List until a list succeeds: at ``version`` ("0": the watch cache; a version: not older than it), and
        when that version is gone too, the newest (client-go's order)."""
        while True:
            try:
                self._list(version)
                return
            except Throttled as held:
                yield Sleep(held.retry_in_s)
            except RECOVERABLE as err:
                if _is_gone(err) and version not in ("", "0"):
                    version = ""  # the last version is gone too: the newest, from etcd (client-go)
                yield Sleep(self._failed("list", err))

    def _watch(self) -> Generator[Step, Any, str | None]:
        """One watch from the last version, read to its end; the version to list at next (None: resume)."""
        try:
            response = self._open_watch()
        except Throttled as held:
            yield Sleep(held.retry_in_s)
            return None
        except RECOVERABLE as err:
            yield Sleep(self._failed("watch", err))
            return (self.resource_version or "0") if _is_gone(err) else None
        opened = self._clock.monotonic()
        self._recovered()
        self.watching = True
        try:
            events, failure = yield from self._read(response)
        finally:
            self.watching = False
            _release(response)
        lived = self._clock.monotonic() - opened
        if lived >= HEALTHY_WATCH_S:
            self.backoff.reset()
        if failure is None and (lived >= SHORT_WATCH_S or events):
            return None  # resume from the last version at once: one request, no list
        yield Sleep(self._failed("watch", failure or WatchError("watch ended at once with no event")))
        return (self.resource_version or "0") if isinstance(failure, Expired) else None

    def _read(self, response: Any) -> Generator[Step, Any, tuple[int, BaseException | None]]:
        """The events of an open watch until it ends: (how many, what ended it; None: the server's timeout)."""
        events = 0
        while True:
            try:
                line = yield NextLine(response)
            except BROKEN as err:
                self._budget.stream_broken()
                return events, err
            if line is None:
                return events, None
            if not line:
                continue
            events += 1
            try:
                self._apply(line)
            except (WatchError, ValueError) as err:
                return events, err

    # ---------------------------------------------------------------------------------------- requests

    def _list(self, resource_version: str) -> None:
        match = "NotOlderThan" if resource_version not in ("", "0") else None
        document = self._list_call(field_selector=self._selector, resource_version=resource_version,
                                   resource_version_match=match, _request_timeout=LIST_TIMEOUT)
        if not isinstance(document, dict):
            raise ValueError(f"{self.what} list answer is not an object")
        self.lists += 1
        items = document.get("items") or []
        self.resource_version = str((document.get("metadata") or {}).get("resourceVersion") or "")
        self._on_object(items[0] if items else None)
        self.synced.set()

    def _open_watch(self) -> Any:
        low, high = self._watch_timeout_s
        timeout_s = int(self._rng.uniform(low, high))
        response = self._list_call(
            field_selector=self._selector, watch=True, resource_version=self.resource_version,
            allow_watch_bookmarks=True, timeout_seconds=max(timeout_s, 1), _preload_content=False,
            _request_timeout=(LIST_TIMEOUT[0], timeout_s + WATCH_READ_SLACK_S))
        self.watches += 1
        return response

    def _apply(self, line: str | bytes) -> None:
        try:
            event = load_json(line, "watch event", max_bytes=MAX_API_BYTES)
        except ValueError as err:
            raise WatchError(f"undecodable watch line: {line[:200]!r}") from err
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410 or obj.get("reason") in ("Expired", "Gone"):
                raise Expired(f"watch from {self.resource_version}: {obj.get('message')}")
            raise WatchError(f"watch error: {obj.get('code')} {obj.get('message')}")
        version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        if kind != "BOOKMARK":
            self._on_object(None if kind == "DELETED" else obj)
        if version:
            self.resource_version = version

    # --------------------------------------------------------------------------------------- bookkeeping

    def _failed(self, doing: str, err: BaseException) -> float:
        self.failures += 1
        self._count_error(self.what)
        delay = self.backoff.delay(retry_after_s(err))
        text = str(err).splitlines()[0] if str(err) else type(err).__name__
        if not self._failing:
            logger.warning("%s %s failed, retrying in %.1f s: %s", self.what, doing, delay, text)
        else:
            logger.debug("%s %s failed again, retrying in %.1f s: %s", self.what, doing, delay, text)
        self._failing = True
        return delay

    def _recovered(self) -> None:
        if self._failing:
            logger.info("%s watch open again from version %s", self.what, self.resource_version)
        self._failing = False


def _is_gone(err: BaseException) -> bool:
    return isinstance(err, Expired) or (isinstance(err, ApiException) and err.status == 410)


def _release(response: Any) -> None:
    for method in ("release_conn", "close"):
        release = getattr(response, method, None)
        if release is not None:
            try:
                release()
            except (OSError, urllib3.exceptions.HTTPError) as err:
                logger.debug("releasing a watch response: %s", err)
            return


class ReflectorThread:
    """Runs a :class:`Reflector`'s loop on a thread named ``name``, blocking on each step; :meth:`stop` shuts the
    open watch's socket down, so it never waits for the server's timeout."""

    def __init__(self, reflector: Reflector, name: str) -> None:
        self.reflector = reflector
        self._name = name
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._response: Any = None

    @property
    def synced(self) -> threading.Event:
        return self.reflector.synced

    @property
    def what(self) -> str:
        return self.reflector.what

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError(f"{self._name} already started")
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        steps = self.reflector.run()
        reply: Any = None
        error: BaseException | None = None
        lines: Iterator[str] | None = None
        try:
            while not self._stop.is_set():
                step = steps.throw(error) if error is not None else steps.send(reply)
                reply, error = None, None
                if isinstance(step, Sleep):
                    self._stop.wait(step.seconds)
                    continue
                if step.response is not self._response:
                    with self._lock:
                        self._response = step.response
                    lines = iter_resp_lines(step.response)
                    if self._stop.is_set():
                        break
                try:
                    assert lines is not None
                    reply = next(lines, None)
                except BROKEN as err:
                    if self._stop.is_set():
                        break
                    error = err
        finally:
            steps.close()
            with self._lock:
                self._response = None

    def stop(self, timeout_s: float = 2.0) -> bool:
        self._stop.set()
        with self._lock:
            response = self._response
        if response is not None:
            try:
                response.shutdown()  # wakes the blocked read at once
            except (OSError, AttributeError) as err:
                logger.debug("%s watch shutdown: %s", self._name, err)
        thread, self._thread = self._thread, None
        return join_thread(thread, self._name, timeout_s)
