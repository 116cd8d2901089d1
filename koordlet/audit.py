"""Audit events: what koordlet did to a pod or the node, and why, in a bounded log served at ``/events``
(Koordinator gates ``AuditEvents`` and ``AuditEventsHTTPHandler``; Koordinator pkg/koordlet/audit).

One event per line, the JSON of Koordinator's ``Event`` (``createdAt``, ``type`` node/pod/group/unknown,
``namespace``, ``name``, ``container``, ``reason``, ``message``); the message says what was done, to what
value and why, with the figures of the decision ("cpu.cfs_quota_us of kubepods/besteffort to 2000: BE
budget ..."). Events are written by :class:`koordlet.actuator.PlanRunner` for every write it carries out,
every resctrl action and every eviction it asks for (so a new strategy is audited by construction), and by
the runtime hooks for the hook values they drop.

The log (Koordinator's defaults): ``<dir>/audit.log``, rotated at 2 MiB to
``audit-<time %Y-%m-%d-%H-%M-%S>-<n>.log``, the oldest removed so that all files together stay within
``-audit-max-disk-space-mb`` (16: eight files); events above ``-audit-verbose`` (3) are not written
(levels: 0 evictions, 3 writes, 5 resctrl task moves). Unlike Koordinator, the time in a rotated file's name
is UTC, never before the newest name's (a clock set back reuses that time with a higher ``n``), and files are
ordered by (time, n): with local time, the hour repeated at a DST fall-back would name the newest file as the
oldest, and it would be the next one removed.

``GET /events`` (Koordinator's handler): newest first, ``size`` events a page (default 256, at most
``-audit-max-events-limit`` 2048, above it 400); the answer names a page token (JSON field
``NextPageToken`` with ``Accept: application/json``, else the ``Next-Page-Token`` header over one JSON
line per event) that continues the same reading where it stopped, until the end; an unknown or expired
token is 409. At most ``-audit-max-concurrent-readers`` (4) readings are kept, each for 10 minutes after
its last page. Beyond Koordinator, a reading may be filtered: ``pod`` (``namespace/name`` or a name),
``namespace``, ``since`` and ``until`` (RFC 3339 or unix seconds); a page token keeps its reading's filters.
"""

from __future__ import annotations

import errno
import glob
import json
import logging
import os
import re
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from prometheus_client import Counter

from koordlet.api.pod import PodMeta
from koordlet.system.kubepods import container_id_from_dir_name, pod_uid_from_dir_name

logger = logging.getLogger(__name__)

DEFAULT_LOG_DIR = "/var/log/koordlet"
DEFAULT_VERBOSE = 3
DEFAULT_MAX_DISK_SPACE_MB = 16
DEFAULT_MAX_CONCURRENT_READERS = 4
DEFAULT_ACTIVE_READER_TTL_S = 600.0
DEFAULT_EVENTS_LIMIT = 256
DEFAULT_MAX_EVENTS_LIMIT = 2048
MAX_FILE_SIZE_BYTES = 2 << 20  # Koordinator audit.MaxFileSize
CURRENT_FILE = "audit.log"
_ROTATED_GLOB = "audit-*.log"
_ROTATED_NAME = re.compile(r"^audit-(\d{4}-\d\d-\d\d-\d\d-\d\d-\d\d)-(\d+)\.log$")
_STAMP_FORMAT = "%Y-%m-%d-%H-%M-%S"
_CHUNK_BYTES = 64 << 10
_LOG_DIR_MODE = 0o755
_LOG_FILE_MODE = 0o640

# Verbosity of the events koordlet writes (Koordinator: evictions V(0), cgroup and resctrl updates V(3),
# resctrl task moves V(5)).
LEVEL_EVICTION = 0
LEVEL_UPDATE = 3
LEVEL_TASKS = 5

TYPE_NODE, TYPE_POD, TYPE_GROUP, TYPE_UNKNOWN = "node", "pod", "group", "unknown"

EVENTS_WRITTEN = Counter("koordlet_audit_events", "Audit events by outcome (written, dropped, failed)",
                         ["status"])


class AuditConfigError(ValueError):
    """An audit setting that cannot work (no disk space for one file, a non-positive limit)."""


@dataclass(frozen=True, slots=True)
class AuditConfig:
    """Koordinator's audit flags and defaults (``-audit-log-dir``, ``-audit-verbose``...)."""

    log_dir: str = DEFAULT_LOG_DIR
    verbose: int = DEFAULT_VERBOSE  # 0 = every level
    max_disk_space_mb: int = DEFAULT_MAX_DISK_SPACE_MB
    max_concurrent_readers: int = DEFAULT_MAX_CONCURRENT_READERS
    active_reader_ttl_s: float = DEFAULT_ACTIVE_READER_TTL_S
    default_events_limit: int = DEFAULT_EVENTS_LIMIT
    max_events_limit: int = DEFAULT_MAX_EVENTS_LIMIT
    max_file_size_bytes: int = MAX_FILE_SIZE_BYTES

    def __post_init__(self) -> None:
        if self.max_disk_space_mb * (1 << 20) < self.max_file_size_bytes:
            raise AuditConfigError(f"-audit-max-disk-space-mb {self.max_disk_space_mb} holds no "
                                   f"{self.max_file_size_bytes} byte file")
        for name in ("max_concurrent_readers", "default_events_limit", "max_events_limit"):
            if getattr(self, name) < 1:
                raise AuditConfigError(f"audit {name.replace('_', '-')} must be at least 1")

    @property
    def max_files(self) -> int:
        """Files the log may keep, the current one included (Koordinator: size MB × 1 MiB / 2 MiB)."""
        return self.max_disk_space_mb * (1 << 20) // self.max_file_size_bytes


@dataclass(frozen=True, slots=True)
class Event:
    """One audit event, Koordinator's ``audit.Event`` (its JSON field names; empty fields left out)."""

    created_at: datetime
    type: str = TYPE_UNKNOWN
    namespace: str = ""
    name: str = ""
    container: str = ""
    reason: str = ""
    message: str = ""
    level: str = ""

    def to_json(self) -> dict[str, str]:
        out = {"createdAt": self.created_at.isoformat()}
        for key, value in (("type", self.type), ("level", self.level), ("namespace", self.namespace),
                           ("name", self.name), ("container", self.container), ("reason", self.reason),
                           ("message", self.message)):
            if value:
                out[key] = value
        return out

    def line(self) -> bytes:
        return json.dumps(self.to_json(), ensure_ascii=False, separators=(",", ":")).encode() + b"\n"

    @classmethod
    def from_json(cls, raw: bytes) -> Event:
        """An event from one log line; ValueError when the line is not one."""
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise ValueError("an audit line is a JSON object")
        created = parse_time(str(data.get("createdAt", "")))
        return cls(created_at=created, **{attr: str(data.get(key) or "") for attr, key in _FIELDS})


_FIELDS = (("type", "type"), ("namespace", "namespace"), ("name", "name"), ("container", "container"),
           ("reason", "reason"), ("message", "message"), ("level", "level"))


def parse_time(text: str) -> datetime:
    """RFC 3339 (Go's time.Time JSON, nanoseconds cut to microseconds) or unix seconds; ValueError else."""
    text = text.strip()
    try:
        return datetime.fromtimestamp(float(text), UTC)
    except (ValueError, OverflowError):
        pass
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    head, dot, rest = text.partition(".")
    if dot:  # fromisoformat takes at most 6 fractional digits
        digits = len(rest) - len(rest.lstrip("0123456789"))
        text = f"{head}.{rest[:min(digits, 6)]}{rest[digits:]}"
    moment = datetime.fromisoformat(text)
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


# ------------------------------------------------------------------------------------------------ writing


class EventLog:
    """The rotated, bounded log file (Koordinator's eventWriter). Each event is one ``write`` of one line
    on an ``O_APPEND`` file: a reader never sees half an event, and nothing waits in a buffer."""

    def __init__(self, config: AuditConfig, clock: Callable[[], datetime] | None = None) -> None:
        self._config = config
        self._clock = clock or (lambda: datetime.now().astimezone())
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._size = 0
        os.makedirs(config.log_dir, mode=_LOG_DIR_MODE, exist_ok=True)
        os.chmod(config.log_dir, _LOG_DIR_MODE)

    @property
    def current_path(self) -> str:
        return os.path.join(self._config.log_dir, CURRENT_FILE)

    def wants(self, level: int) -> bool:
        verbose = self._config.verbose
        return verbose <= 0 or level <= verbose

    def log(self, level: int, event: Event) -> bool:
        """Append ``event`` when ``level`` is within the verbosity; False when it was not written."""
        if not self.wants(level):
            EVENTS_WRITTEN.labels("dropped").inc()
            return False
        line = event.line()
        with self._lock:
            try:
                if self._fd is None:
                    self._open()
                assert self._fd is not None
                os.write(self._fd, line)
                self._size += len(line)
                if self._size >= self._config.max_file_size_bytes:
                    self._rotate()
            except OSError as err:
                EVENTS_WRITTEN.labels("failed").inc()
                logger.warning("cannot write the audit log in %s: %s", self._config.log_dir, err)
                return False
        EVENTS_WRITTEN.labels("written").inc()
        return True

    def _open(self) -> None:
        fd = os.open(self.current_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, _LOG_FILE_MODE)
        self._fd, self._size = fd, os.fstat(fd).st_size

    def _rotate(self) -> None:
        """audit.log → audit-<time>-<n>.log, then the oldest files beyond the disk space go."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        directory = self._config.log_dir
        os.rename(self.current_path, os.path.join(directory, _next_rotated_name(
            rotated_files(directory), self._clock().astimezone(UTC).strftime(_STAMP_FORMAT))))
        rotated = rotated_files(directory)
        for old in rotated[: max(len(rotated) - self._config.max_files + 1, 0)]:
            try:
                os.remove(old)
            except OSError as err:
                logger.warning("cannot remove the old audit file %s: %s", old, err)
        self._open()

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


def _rotation_key(path: str) -> tuple[str, int]:
    """(UTC time, n) of a rotated file's name; a name of another shape sorts first (removed first)."""
    match = _ROTATED_NAME.match(os.path.basename(path))
    return (match[1], int(match[2])) if match else ("", -1)


def rotated_files(log_dir: str) -> list[str]:
    """The rotated files of ``log_dir``, oldest first."""
    return sorted(glob.glob(os.path.join(glob.escape(log_dir), _ROTATED_GLOB)), key=_rotation_key)


def _next_rotated_name(rotated: Sequence[str], stamp: str) -> str:
    """The name that sorts after every one of ``rotated``: ``stamp`` (UTC) with n 0, or, when the newest name's
    time is not before it, that time with the next n."""
    newest_stamp, newest_n = _rotation_key(rotated[-1]) if rotated else ("", -1)
    if stamp > newest_stamp:
        return f"audit-{stamp}-0.log"
    return f"audit-{newest_stamp}-{newest_n + 1}.log"


# ------------------------------------------------------------------------------------------------ reading


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


# --------------------------------------------------------------------------------------------- the handler


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


# ------------------------------------------------------------------------------------------- the auditor


@dataclass(frozen=True, slots=True)
class Owner:
    """Who an action concerns: a pod (and container), or the node."""

    type: str = TYPE_NODE
    namespace: str = ""
    name: str = ""
    container: str = ""


NODE = Owner()
OwnerResolver = Callable[[str], Owner]  # cgroup dir (relative to the hierarchy root) -> owner


class Auditor:
    """Writes events (:meth:`log`) and resolves whose cgroup dir a write touched (:meth:`owner_of`)."""

    def __init__(self, config: AuditConfig, clock: Callable[[], datetime] | None = None) -> None:
        self.config = config
        self._clock = clock or (lambda: datetime.now().astimezone())
        self._log = EventLog(config, self._clock)
        self._owner_of: OwnerResolver = lambda _dir: NODE
        self.handler = EventsHandler(config)

    def wants(self, level: int) -> bool:
        return self._log.wants(level)

    def set_owner_resolver(self, resolver: OwnerResolver) -> None:
        self._owner_of = resolver

    def owner_of(self, cgroup_dir: str) -> Owner:
        try:
            return self._owner_of(cgroup_dir)
        except Exception:  # noqa: BLE001 - an audit line must never fail the action it records
            logger.debug("cannot tell whose cgroup %r is", cgroup_dir, exc_info=True)
            return NODE

    def log(self, level: int, owner: Owner, reason: str, message: str) -> None:
        if not self._log.wants(level):
            return
        event = Event(self._clock(), owner.type, owner.namespace, owner.name, owner.container, reason, message)
        self._log.log(level, event)

    def close(self) -> None:
        self.handler.close()
        self._log.close()


_current: Auditor | None = None


def install(auditor: Auditor | None) -> None:
    """Make ``auditor`` the agent's (gate ``AuditEvents``); None: auditing off."""
    global _current
    _current = auditor


def current() -> Auditor | None:
    """The agent's auditor, None when auditing is off (the default)."""
    return _current


def events_handler() -> Callable[[Mapping[str, Sequence[str]], Sequence[str]], HttpAnswer]:
    """The ``/events`` handler (gate ``AuditEventsHTTPHandler``): the installed auditor's, or an empty answer
    when ``AuditEvents`` is off (as Koordinator's empty auditor answers)."""

    def handle(query: Mapping[str, Sequence[str]], accept: Sequence[str]) -> HttpAnswer:
        auditor = _current
        if auditor is None:
            return HttpAnswer(200, "text/plain; charset=utf-8", b"")
        return auditor.handler(query, accept)

    return handle


def pod_owner_resolver(pods: Callable[[], Sequence[PodMeta]]) -> OwnerResolver:
    """Whose cgroup dir: the pod whose ``pod<uid>`` (or systemd ``…-pod<uid>.slice``) dir it is or is in,
    and the container whose dir follows; the node for the QoS dirs and anything else. The uid index is
    built again only when ``pods()`` returns another list.

    Several threads resolve at once (the QoS manager's, the reconciler's, the NRI and hook server's runners): an
    index is never changed once built, and the (list, index) pair is replaced in one assignment, so a reader
    always sees a whole index of one list."""
    built: list[tuple[object, dict[str, PodMeta]]] = [(None, {})]

    def resolve(cgroup_dir: str) -> Owner:
        listed = pods()
        seen, index = built[0]
        if listed is not seen:
            index = {pod.uid: pod for pod in listed}
            built[0] = (listed, index)
        parts = [part for part in cgroup_dir.split("/") if part]
        for i, part in enumerate(parts):
            uid = pod_uid_from_dir_name(part)
            if uid is None:
                continue
            pod = index.get(uid)
            if pod is None:
                return Owner(TYPE_POD, name=f"pod{uid}")
            container = ""
            if i + 1 < len(parts):
                container_id = container_id_from_dir_name(parts[i + 1])
                container = next((c.name for c in pod.containers if c.container_id == container_id), "")
            return Owner(TYPE_POD, pod.namespace, pod.name, container)
        return NODE

    return resolve
