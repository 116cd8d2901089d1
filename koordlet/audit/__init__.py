"""Audit events: what koordlet did to a pod or the node, and why, in a bounded log served at ``/events``
(Koordinator gates ``AuditEvents`` and ``AuditEventsHTTPHandler``; Koordinator pkg/koordlet/audit).

One event per line, the JSON of Koordinator's ``Event`` (``createdAt``, ``type`` node/pod/group/unknown,
``namespace``, ``name``, ``container``, ``reason``, ``message``); the message says what was done, to what
value and why, with the figures of the decision ("cpu.cfs_quota_us of kubepods/besteffort to 2000: BE
budget ..."). Events are written by :class:`koordlet.actuator.PlanRunner` for every write it carries out,
every resctrl action and every eviction it asks for (so a new strategy is audited by construction), by the
runtime hooks for the hook values they drop, and by the cold page collector's page-idle pass (``ColdPageMark``, at
level 5: its marks are no plan).

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

The package, one job a module: ``config.py`` (the flags), ``events.py`` (an event, its levels and times),
``writer.py`` (appending and rotating) and ``rotation.py`` (the files' names and order), ``reader.py`` (the log
back, newest first, filtered), ``pager.py`` (``/events``), ``owners.py`` (whose cgroup dir an action touched) and
``auditor.py`` (the agent's auditor, installed when the gate is on). Import from the package, as here.
"""

from koordlet.audit.auditor import Auditor, current, events_handler, install
from koordlet.audit.config import AuditConfig, AuditConfigError
from koordlet.audit.events import (
    LEVEL_EVICTION,
    LEVEL_TASKS,
    LEVEL_UPDATE,
    TYPE_GROUP,
    TYPE_NODE,
    TYPE_POD,
    TYPE_UNKNOWN,
    Event,
)
from koordlet.audit.owners import NODE, Owner, OwnerResolver, pod_owner_resolver
from koordlet.audit.pager import EventsHandler, HttpAnswer
from koordlet.audit.reader import EventFilter, EventIterator, read_events
from koordlet.audit.rotation import rotated_files
from koordlet.audit.writer import EventLog

__all__ = [
    "LEVEL_EVICTION", "LEVEL_TASKS", "LEVEL_UPDATE", "NODE", "TYPE_GROUP", "TYPE_NODE", "TYPE_POD", "TYPE_UNKNOWN",
    "AuditConfig", "AuditConfigError", "Auditor", "Event", "EventFilter", "EventIterator", "EventLog",
    "EventsHandler", "HttpAnswer", "Owner", "OwnerResolver", "current", "events_handler", "install",
    "pod_owner_resolver", "read_events", "rotated_files",
]
