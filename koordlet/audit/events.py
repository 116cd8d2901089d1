"""One audit event (Koordinator's ``audit.Event``: its JSON field names), the levels koordlet writes events at,
and the times a reading is bounded by (RFC 3339 or unix seconds)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime

# Verbosity of the events koordlet writes (Koordinator: evictions V(0), cgroup and resctrl updates V(3),
# resctrl task moves V(5)).
LEVEL_EVICTION = 0
LEVEL_UPDATE = 3
LEVEL_TASKS = 5

TYPE_NODE, TYPE_POD, TYPE_GROUP, TYPE_UNKNOWN = "node", "pod", "group", "unknown"


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
