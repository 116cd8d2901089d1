"""``GET /events`` (Koordinator's handler): pages of the log newest first, each reading kept open under a page
token between its pages, bounded in number and time (see the package docstring)."""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from koordlet.audit.config import AuditConfig
from koordlet.audit.events import Event
from koordlet.audit.reader import EventFilter, EventIterator, filter_of

logger = logging.getLogger(__name__)

@dataclass(frozen=True, slots=True)
class HttpAnswer:
    status: int
    content_type: str
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)


def _error(status: int, message: str) -> HttpAnswer:
    return HttpAnswer(status, "text/plain; charset=utf-8", message.encode() + b"\n")


class _Reading:
    __slots__ = ("closed", "iterator", "lock", "refreshed_at", "token")

    def __init__(self, token: str, iterator: EventIterator, now: float) -> None:
        self.token = token
        self.iterator = iterator
        self.refreshed_at = now
        self.lock = threading.Lock()
        self.closed = False

    def close(self) -> None:
        with self.lock:
            self.closed = True
            self.iterator.close()


class EventsHandler:
    """``GET /events`` over a log dir (see the module docstring)."""

    def __init__(self, config: AuditConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self._config = config
        self._clock = clock
        self._lock = threading.Lock()
        self._readings: OrderedDict[str, _Reading] = OrderedDict()

    def __call__(self, query: Mapping[str, Sequence[str]], accept: Sequence[str]) -> HttpAnswer:
        config = self._config

        def arg(name: str) -> str:
            values = query.get(name) or ()
            return values[0] if values else ""

        size = config.default_events_limit
        if arg("size"):
            try:
                size = int(arg("size"))
            except ValueError:
                return _error(400, f"size {arg('size')!r} is not a number")
            if size > config.max_events_limit:
                return _error(400, f"size({size}) exceeds the limit({config.max_events_limit})")
            if size < 0:
                return _error(400, f"size({size}) must not be negative")
        token = arg("pageToken")
        if token:
            reading = self._find(token)
            if reading is None:
                return _error(409, f"invalid pageToken {token}")
        else:
            try:
                event_filter = filter_of(arg("pod"), arg("namespace"), arg("since"), arg("until"))
            except ValueError as err:
                return _error(400, str(err))
            reading = self._new(event_filter)
        events, at_end = self._page(reading, size)
        if events is None:
            return _error(409, f"reader {reading.token} is expired")
        next_token = "" if at_end else reading.token
        if any("application/json" in value for value in accept):
            body = json.dumps({"NextPageToken": next_token, "Events": [e.to_json() for e in events]},
                              ensure_ascii=False, separators=(",", ":")).encode()
            return HttpAnswer(200, "application/json; charset=utf-8", body)
        headers = {"Next-Page-Token": next_token} if next_token else {}
        return HttpAnswer(200, "text/plain; charset=utf-8", b"".join(e.line() for e in events), headers)

    def _page(self, reading: _Reading, size: int) -> tuple[list[Event] | None, bool]:
        events: list[Event] = []
        with reading.lock:
            if reading.closed:
                return None, False
            reading.refreshed_at = self._clock()
            while len(events) < size:
                event = reading.iterator.next()
                if event is None:
                    return events, True
                events.append(event)
        return events, False

    def _find(self, token: str) -> _Reading | None:
        self._expire()
        with self._lock:
            return self._readings.get(token)

    def _new(self, event_filter: EventFilter) -> _Reading:
        reading = _Reading(str(uuid.uuid4()), EventIterator(self._config.log_dir, event_filter), self._clock())
        with self._lock:
            self._readings[reading.token] = reading
        self._expire()
        return reading

    def _expire(self) -> None:
        """Close readings idle past the TTL, and the oldest beyond the concurrent maximum."""
        now = self._clock()
        with self._lock:
            doomed = [r for r in self._readings.values() if now - r.refreshed_at > self._config.active_reader_ttl_s]
            extra = len(self._readings) - len(doomed) - self._config.max_concurrent_readers
            doomed += [r for r in self._readings.values() if r not in doomed][: max(extra, 0)]
            for reading in doomed:
                del self._readings[reading.token]
        for reading in doomed:  # outside the handler's lock: a page may be reading it
            logger.info("audit reader %s expired", reading.token)
            reading.close()

    def close(self) -> None:
        with self._lock:
            readings = list(self._readings.values())
            self._readings.clear()
        for reading in readings:
            reading.close()
