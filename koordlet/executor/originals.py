"""What a node-wide kernel file held before koordlet's first write to it, so that it can be put back; the same
small persisted record keeps the other things koordlet makes on the node (:mod:`koordlet.executor.records`).

NodeSLO ``systemStrategy`` changes sysctls the node's operator owns (``vm.min_free_kbytes`` …). Koordinator
leaves its last value behind when the strategy or its gate is switched off; koordlet-py records each file's
value right before its first write and writes it back then (``ResourceExecutor.restore_system``).

The record is kept in a small JSON file when one is given (``-system-config-record-file``, on tmpfs under
``/var/run/koordlet`` by default: sysctls go back to the boot defaults on a reboot, and so does the record), so
a restarted agent still restores what the one before it changed. Written atomically, bounded (at most
:data:`MAX_ENTRIES` keys of :data:`MAX_VALUE_CHARS` characters). A file that cannot be read back (corrupt, or
not ours) is logged, set aside as ``<file>.corrupt-<time>``, and replaced: never fatal.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time

from wire.files import write_atomic

logger = logging.getLogger(__name__)

MAX_ENTRIES = 256
MAX_VALUE_CHARS = 4096
_KIND = "koordlet-system-originals"
_VERSION = 1


class Originals:
    """key → the value found before the first write (thread-safe); persisted to ``path`` when given.

    ``kind`` tells one record file from another (a file of another kind is set aside, never read as this one),
    ``label`` names the record in logs, ``max_entries`` bounds it."""

    def __init__(self, path: str | None = None, *, kind: str = _KIND, label: str = "system config record",
                 max_entries: int = MAX_ENTRIES) -> None:
        self._path = path
        self._kind = kind
        self._label = label
        self._max_entries = max_entries
        self._lock = threading.Lock()
        self._values: dict[str, str] = self._load() if path else {}

    @property
    def path(self) -> str | None:
        return self._path

    def _load(self) -> dict[str, str]:
        assert self._path is not None
        try:
            with open(self._path, encoding="utf-8") as file:
                text = file.read(self._max_entries * (MAX_VALUE_CHARS + 256) + 1024)
        except FileNotFoundError:
            return {}
        except OSError as err:
            logger.warning("cannot read the %s %s: %s; starting without it", self._label, self._path, err)
            return {}
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or data.get("kind") != self._kind or data.get("version") != _VERSION:
                raise ValueError(f"not a koordlet {self._label}")
            values = data.get("originals")
            if not isinstance(values, dict) or len(values) > self._max_entries or not all(
                    isinstance(k, str) and isinstance(v, str) and len(v) <= MAX_VALUE_CHARS for k, v in values.items()):
                raise ValueError("malformed originals")
        except ValueError as err:
            aside = f"{self._path}.corrupt-{int(time.time())}"
            logger.error("%s %s is unreadable (%s): set aside as %s", self._label, self._path, err, aside)
            try:
                os.replace(self._path, aside)
            except OSError as move_err:
                logger.error("cannot set %s aside: %s", self._path, move_err)
            return {}
        if values:
            logger.info("%s: koordlet changed %s before this start", self._label, ", ".join(sorted(values)))
        return dict(values)

    def _save(self) -> bool:
        if self._path is None:
            return True
        text = json.dumps({"kind": self._kind, "version": _VERSION, "originals": self._values}, sort_keys=True)
        try:
            os.makedirs(os.path.dirname(self._path) or ".", exist_ok=True)
            write_atomic(self._path, text, mode=0o600)
        except OSError as err:
            logger.error("cannot write the %s %s: %s", self._label, self._path, err)
            return False
        return True

    def record(self, key: str, value: str) -> bool:
        """Keep ``value`` as ``key``'s original unless one is kept already (only the first write counts). False
        when it could not be kept (the record full, the value too long, the file not written): the caller must
        not change the file then, or what was there could never be put back."""
        with self._lock:
            if key in self._values:
                return True
            if len(self._values) >= self._max_entries or len(value) > MAX_VALUE_CHARS:
                logger.error("%s full or value too long: %s not recorded", self._label, key)
                return False
            self._values[key] = value
            if not self._save():
                del self._values[key]  # not kept: the next write tries again
                return False
            return True

    def get(self, key: str) -> str | None:
        with self._lock:
            return self._values.get(key)

    def forget(self, key: str) -> None:
        with self._lock:
            if self._values.pop(key, None) is not None:
                self._save()

    def keys(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._values)

    def items(self) -> dict[str, str]:
        with self._lock:
            return dict(self._values)
