"""The agent's auditor: writes events (through the log writer) and answers ``/events`` (through the pager);
installed once when gate ``AuditEvents`` is on."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime

from koordlet.audit.config import AuditConfig
from koordlet.audit.events import Event
from koordlet.audit.owners import NODE, Owner, OwnerResolver
from koordlet.audit.pager import EventsHandler, HttpAnswer
from koordlet.audit.writer import EventLog

logger = logging.getLogger(__name__)

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
