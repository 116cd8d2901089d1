"""NodeSLO from a local YAML file, watched with watchdog (local mode: no API server).

The file holds a NodeSLO object (``apiVersion``/``kind``/``spec``) or just its ``spec``. It is read at start
and whenever it changes; the parent directory is watched, not the file, because editors and ConfigMap
volumes replace the file (rename, symlink swap) rather than write it in place. A missing file means
the defaults. Reloads wait for the file to be quiet for ``settle_s`` (an in-place write is a
truncation followed by writes; reading in between would see an empty file). Only writes, creations,
renames and deletions count as changes (the watcher's own reads raise open/close-without-write events),
and a read whose bytes equal the last read's is not parsed or applied again.

The file is parsed by :func:`koordlet.api.safeload.load_yaml` on the watcher's thread, never on a hook
call: at most 1 MiB, no anchors or aliases, at most 64 levels deep. A file that does not parse or whose
spec is invalid is rejected in one log line, counted by reason (``koordlet_node_slo_file_rejected_total``)
and by the informer's ``reject_node_slo``; the last good spec stays.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from typing import Protocol

from prometheus_client import Counter
from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

from koordlet.api.nodeslo import NodeSLOError, NodeSLOSpec, default_node_slo_spec, parse_node_slo_spec
from koordlet.api.safeload import SafeLoadError, load_yaml
from koordlet.statesinformer.api import SOURCE_DEFAULTS, SOURCE_FILE, NodeSLOOrigin
from koordlet.ticker import start_observer

logger = logging.getLogger(__name__)

_MAX_FILE_BYTES = 1 << 20
# What the watcher reacts to: writes and renames. Opening, reading and closing without a write (the watcher's
# own reads among them) are not changes.
_CHANGE_EVENTS = frozenset({"modified", "created", "moved", "deleted", "closed"})

FILE_REJECTED = Counter("koordlet_node_slo_file_rejected", "NodeSLO files rejected (the last good spec stays), "
                        "by reason", ["reason"])


class NodeSLOSink(Protocol):
    def set_node_slo(self, spec: NodeSLOSpec, origin: NodeSLOOrigin | None = None) -> None: ...

    def reject_node_slo(self, reason: str) -> None: ...


class NodeSLOFileError(ValueError):
    """The NodeSLO file cannot be used; ``reason`` labels why (too_large, alias, too_deep, syntax, encoding,
    shape, invalid, unreadable)."""

    def __init__(self, message: str, reason: str = "invalid") -> None:
        super().__init__(message)
        self.reason = reason


def _parse(raw: bytes, path: str) -> NodeSLOSpec:
    try:
        document = load_yaml(raw, path, max_bytes=_MAX_FILE_BYTES)
    except SafeLoadError as err:
        raise NodeSLOFileError(str(err), err.reason) from None
    if document is None:
        return default_node_slo_spec()
    if not isinstance(document, dict):
        raise NodeSLOFileError(f"{path}: expected a mapping, got {type(document).__name__}", "shape")
    if "kind" in document or "apiVersion" in document:
        if document.get("kind", "NodeSLO") != "NodeSLO":
            raise NodeSLOFileError(f"{path}: kind {str(document.get('kind'))[:40]!r} is not NodeSLO", "shape")
        document = document.get("spec") or {}
    try:
        return parse_node_slo_spec(document)
    except NodeSLOError as err:
        raise NodeSLOFileError(f"{path}: {err}", "invalid") from err
    except (TypeError, ValueError, AttributeError, KeyError, OverflowError) as err:
        # a shape the spec parser did not foresee: still one rejection, never a traceback
        raise NodeSLOFileError(f"{path}: invalid NodeSLO spec: {type(err).__name__}: {str(err)[:120]}",
                               "invalid") from err


def _read(path: str) -> bytes | None:
    """The file's bytes (at most one byte past the limit, so an oversized file is seen), None when absent."""
    try:
        with open(path, "rb") as handle:
            return handle.read(_MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise NodeSLOFileError(f"{path}: {err}", "unreadable") from err


def load_node_slo_file(path: str) -> NodeSLOSpec:
    """The merged spec of the file at ``path`` (defaults when it does not exist); raises NodeSLOFileError."""
    raw = _read(path)
    return default_node_slo_spec() if raw is None else _parse(raw, path)


class _Handler(FileSystemEventHandler):
    def __init__(self, watcher: NodeSLOFileWatcher) -> None:
        self._watcher = watcher

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.event_type not in _CHANGE_EVENTS:
            return
        paths = {os.fsdecode(event.src_path), os.fsdecode(getattr(event, "dest_path", "") or "")}
        if self._watcher.path in paths or any(p and os.path.basename(p) == "..data" for p in paths):
            self._watcher.changed()


class NodeSLOFileWatcher:
    """Pushes the file's NodeSLO into ``sink`` at start and on every change."""

    def __init__(self, path: str, sink: NodeSLOSink, settle_s: float = 0.2) -> None:
        self.path = os.path.abspath(path)
        self._sink = sink
        self._settle_s = settle_s
        self._lock = threading.Lock()
        self._timer_lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._observer: Observer | None = None
        self._last: tuple[bytes | None, bool] | None = None  # (content, taken) of the last read
        self.reloads = 0  # reads whose content was new (parsed)
        self.rejections = 0

    def reload(self) -> bool:
        """Read the file now and apply it when its content changed since the last read; True when the spec
        in force is the file's (unchanged content included)."""
        with self._lock:
            try:
                raw = _read(self.path)
            except NodeSLOFileError as err:
                return self._reject(err)
            if self._last is not None and raw == self._last[0]:
                return self._last[1]  # the same bytes as last time: nothing to parse, nothing to apply
            self.reloads += 1
            try:
                spec = default_node_slo_spec() if raw is None else _parse(raw, self.path)
            except NodeSLOFileError as err:
                self._last = (raw, False)
                return self._reject(err)
            except Exception as err:  # noqa: BLE001 - a bug in parsing must not kill the watcher thread
                self._last = (raw, False)
                return self._reject(NodeSLOFileError(f"{self.path}: {type(err).__name__}: {str(err)[:120]}",
                                                     "invalid"))
            self._last = (raw, True)
            self._sink.set_node_slo(spec, self._origin(raw))
            return True

    def _origin(self, raw: bytes | None) -> NodeSLOOrigin:
        if raw is None:
            return NodeSLOOrigin(SOURCE_DEFAULTS, f"no file at {self.path}", path=self.path, at=time.time())
        return NodeSLOOrigin(SOURCE_FILE, f"sha256 {hashlib.sha256(raw).hexdigest()[:12]}", path=self.path,
                             at=time.time())

    def _reject(self, err: NodeSLOFileError) -> bool:
        FILE_REJECTED.labels(err.reason).inc()
        self._sink.reject_node_slo(str(err))
        # Counted last: whoever waits on ``rejections`` then also sees the sink's error count and log.
        self.rejections += 1
        return False

    def changed(self) -> None:
        """The file changed: reload once it has been quiet for ``settle_s``."""
        with self._timer_lock:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = threading.Timer(self._settle_s, self.reload)
            self._timer.name = "nodeslo-file-reload"
            self._timer.daemon = True
            self._timer.start()

    def start(self) -> None:
        directory = os.path.dirname(self.path)
        os.makedirs(directory, exist_ok=True)
        observer = Observer()
        observer.schedule(_Handler(self), directory, recursive=False)
        start_observer(observer, "nodeslo-file-watch")
        self._observer = observer
        self.reload()

    def stop(self, timeout_s: float = 2.0) -> None:
        with self._timer_lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout_s)
            self._observer = None
