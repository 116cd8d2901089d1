"""What koordlet last wrote to the API server, kept across its restarts (``-api-checkpoint-file``).

A koordlet that starts again does not read first what it wrote itself a moment ago (docs/design.md §5, "One node of
thousands"). Without this, every start costs a read of the node's NodeMetric before its first status write and a
read of its NodeResourceTopology before the first comparison; when every node of a fleet restarts together (a
rolling update, a chart upgrade) those reads land together, on top of the lists every node makes to begin.

Each reporter puts the object as the API server last answered it (NodeMetric: its metadata and spec, no status;
NodeResourceTopology: the whole object), and takes it back once at start. What was taken stands in for the read:
its ``resourceVersion`` is the precondition of the next write, so an object someone changed meanwhile gets a 409
and is read again then, as after any other conflict. A record older than ``max_age_s`` (a koordlet down that long
may find a different node) or for another object is not used: that reporter reads first, as without a checkpoint.

The file is one JSON object, replaced atomically at each put; an unreadable, oversized or malformed file is logged
and ignored (the reporters read first), never fatal. Its directory must exist: the DaemonSet's default is in the
host's ``/var/run/koordlet`` (mounted at ``/host-var-run-koordlet``, beside the SystemConfig records), which
outlives the pod but not a reboot; on the host the flag is empty by default (nothing kept) unless the operator sets
it (docs/configuration.md).
"""

from __future__ import annotations

import copy
import json
import logging
import threading
from typing import Any

from koordlet.kubeclient.timing import SYSTEM_CLOCK, Clock
from wire.files import write_atomic

logger = logging.getLogger(__name__)

MAX_FILE_BYTES = 4 << 20  # an NRT with every pod's CPU allocation annotated stays far below
DEFAULT_MAX_AGE_S = 600.0  # the NRT's resync interval: an older record is read again anyway


class ApiCheckpoint:
    """The objects koordlet last wrote, by key (``"<plural>/<name>"``); thread-safe."""

    def __init__(self, path: str | None, clock: Clock = SYSTEM_CLOCK, max_age_s: float = DEFAULT_MAX_AGE_S) -> None:
        self.path = path or None
        self._clock = clock
        self._max_age_s = max_age_s
        self._lock = threading.Lock()
        self._entries: dict[str, dict[str, Any]] = self._load()
        self._failing = False

    def _load(self) -> dict[str, dict[str, Any]]:
        if self.path is None:
            return {}
        try:
            with open(self.path, "rb") as file:
                data = file.read(MAX_FILE_BYTES + 1)
        except FileNotFoundError:
            return {}
        except OSError as err:
            logger.warning("API checkpoint %s unreadable, reading every object first: %s", self.path, err)
            return {}
        try:
            if len(data) > MAX_FILE_BYTES:
                raise ValueError(f"over {MAX_FILE_BYTES} bytes")
            loaded = json.loads(data)
            if not isinstance(loaded, dict):
                raise ValueError("not a JSON object")
        except ValueError as err:
            logger.warning("API checkpoint %s ignored, reading every object first: %s", self.path, err)
            return {}
        return {key: entry for key, entry in loaded.items()
                if isinstance(key, str) and isinstance(entry, dict) and isinstance(entry.get("object"), dict)
                and isinstance(entry.get("at"), int | float) and not isinstance(entry.get("at"), bool)}

    def take(self, key: str, name: str) -> dict[str, Any] | None:
        """The object kept under ``key`` if it is ``name``'s, carries a resourceVersion and is young enough; once
        (a second take gives None)."""
        with self._lock:
            entry = self._entries.pop(key, None)
        if entry is None:
            return None
        obj = entry["object"]
        meta = obj.get("metadata")
        age = self._clock.time() - float(entry["at"])
        if (not isinstance(meta, dict) or meta.get("name") != name or not isinstance(meta.get("resourceVersion"), str)
                or not meta["resourceVersion"] or not 0.0 <= age <= self._max_age_s):
            return None
        return copy.deepcopy(obj)

    def put(self, key: str, obj: dict[str, Any]) -> None:
        """Keep ``obj`` (copied, without ``metadata.managedFields``: the server's bookkeeping, no part of a write's
        precondition) as the last write under ``key``; a failed file write is logged once, not raised."""
        kept = copy.deepcopy(obj)
        if isinstance(kept.get("metadata"), dict):
            kept["metadata"].pop("managedFields", None)
        with self._lock:
            self._entries[key] = {"at": self._clock.time(), "object": kept}
            if self.path is None:
                return
            try:
                write_atomic(self.path, json.dumps(self._entries, separators=(",", ":")), prefix=".api-checkpoint-")
            except OSError as err:
                if not self._failing:
                    logger.warning("API checkpoint %s not written (a restart reads first): %s", self.path, err)
                self._failing = True
            else:
                self._failing = False
