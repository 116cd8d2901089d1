"""Reading the log back, newest first: each file's lines from its end in chunks (``pread``), the files from the
newest to the oldest, kept to the events a filter asks for (a pod, a namespace, a time range)."""

from __future__ import annotations

import errno
import logging
import os
from dataclasses import dataclass
from datetime import datetime

from koordlet.audit.events import TYPE_POD, Event, parse_time
from koordlet.audit.rotation import CURRENT_FILE, rotated_files

logger = logging.getLogger(__name__)

_CHUNK_BYTES = 64 << 10


class _ReverseLines:
    """The lines of one file from ``end`` back to its start, read in chunks with ``pread``."""

    def __init__(self, fd: int, end: int) -> None:
        self._fd = fd
        self._pos = end
        self._head = b""  # the (maybe partial) first line of the chunk read last
        self._lines: list[bytes] = []

    def next(self) -> bytes | None:
        while not self._lines:
            if self._pos == 0:
                line, self._head = self._head, b""
                return line if line.strip() else None
            start = max(self._pos - _CHUNK_BYTES, 0)
            data = os.pread(self._fd, self._pos - start, start) + self._head
            self._pos = start
            parts = data.split(b"\n")
            self._head = parts[0]
            self._lines = [part for part in parts[1:] if part.strip()]
        return self._lines.pop()


@dataclass(frozen=True, slots=True)
class EventFilter:
    """What a reading keeps: events of one pod (``namespace``/``name``) and within [since, until]."""

    namespace: str = ""
    name: str = ""
    since: datetime | None = None
    until: datetime | None = None

    def keeps(self, event: Event) -> bool:
        if self.name and (event.type != TYPE_POD or event.name != self.name):
            return False
        if self.namespace and event.namespace != self.namespace:
            return False
        if self.until is not None and event.created_at > self.until:
            return False
        return self.since is None or event.created_at >= self.since

    def older_than_wanted(self, event: Event) -> bool:
        """Past ``since``: every event after this one (older) is too."""
        return self.since is not None and event.created_at < self.since


class EventIterator:
    """The events of the log newest first, as the files were when the iterator was made: the current file is
    opened at once (it is renamed on rotation) and read back from its size then; older files are opened
    when reached (a file removed meanwhile ends the reading)."""

    def __init__(self, log_dir: str, event_filter: EventFilter = EventFilter()) -> None:
        self._filter = event_filter
        self._pending = rotated_files(log_dir)[::-1]
        self._fd: int | None = None
        self._lines: _ReverseLines | None = None
        self._done = False
        self._open(os.path.join(log_dir, CURRENT_FILE))

    def _open(self, path: str) -> bool:
        self._close_file()
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as err:
            if err.errno != errno.ENOENT:
                logger.warning("cannot read the audit file %s: %s", path, err)
            return False
        self._fd = fd
        self._lines = _ReverseLines(fd, os.fstat(fd).st_size)
        return True

    def _next_line(self) -> bytes | None:
        while True:
            line = self._lines.next() if self._lines is not None else None
            if line is not None:
                return line
            if not self._pending:
                return None
            if not self._open(self._pending.pop(0)):
                self._pending.clear()  # removed by the rotation meanwhile: older ones are gone too

    def next(self) -> Event | None:
        """The next (older) event the filter keeps; None at the end."""
        while not self._done:
            line = self._next_line()
            if line is None:
                break
            try:
                event = Event.from_json(line)
            except ValueError:
                logger.debug("skipping an audit line that is not an event: %.80r", line)
                continue
            if self._filter.older_than_wanted(event):
                break
            if self._filter.keeps(event):
                return event
        self._done = True
        self._close_file()
        return None

    def _close_file(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd, self._lines = None, None

    def close(self) -> None:
        self._done = True
        self._pending.clear()
        self._close_file()


def read_events(log_dir: str, event_filter: EventFilter = EventFilter(), limit: int | None = None) -> list[Event]:
    """Events newest first (at most ``limit``), for tools and tests."""
    iterator = EventIterator(log_dir, event_filter)
    out: list[Event] = []
    try:
        while limit is None or len(out) < limit:
            event = iterator.next()
            if event is None:
                break
            out.append(event)
    finally:
        iterator.close()
    return out


def filter_of(pod: str, namespace: str, since: str, until: str) -> EventFilter:
    """The filter of a ``/events`` query; ValueError naming the bad parameter."""
    name = pod
    if "/" in pod:
        namespace_of_pod, _, name = pod.partition("/")
        if namespace and namespace != namespace_of_pod:
            raise ValueError(f"pod {pod!r} and namespace {namespace!r} disagree")
        namespace = namespace_of_pod
    if "/" in name:
        raise ValueError(f"pod {pod!r}: expected namespace/name or a name")
    bounds: list[datetime | None] = []
    for key, text in (("since", since), ("until", until)):
        try:
            bounds.append(parse_time(text) if text else None)
        except ValueError as err:
            raise ValueError(f"{key} {text!r}: expected RFC 3339 or unix seconds") from err
    return EventFilter(namespace=namespace, name=name, since=bounds[0], until=bounds[1])
