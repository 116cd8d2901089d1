"""NodeSLO from a local YAML file, watched with watchdog (local mode: no API server).

The file holds a NodeSLO object (``apiVersion``/``kind``/``spec``) or just its ``spec``. It is read at start
and whenever it changes; the parent directory is watched, not the file, because editors and ConfigMap
volumes replace the file (rename, symlink swap) rather than write it in place. A missing file means
the defaults. Reloads wait for the file to be quiet for ``settle_s`` (an in-place write is a
truncation followed by writes; reading in between would see an empty file). A file that does not
parse or whose spec is invalid is rejected: the last good spec stays, the reason is logged and
counted (the informer's ``reject_node_slo``).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Protocol

import yaml
from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

from koordlet.api.nodeslo import NodeSLOError, NodeSLOSpec, default_node_slo_spec, parse_node_slo_spec

logger = logging.getLogger(__name__)

_MAX_FILE_BYTES = 1 << 20


class NodeSLOSink(Protocol):
    def set_node_slo(self, spec: NodeSLOSpec) -> None: ...

    def reject_node_slo(self, reason: str) -> None: ...


class NodeSLOFileError(ValueError):
    """The NodeSLO file cannot be used."""


def load_node_slo_file(path: str) -> NodeSLOSpec:
    """The merged spec of the file at ``path`` (defaults when it does not exist); raises NodeSLOFileError."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read(_MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        return default_node_slo_spec()
    except OSError as err:
        raise NodeSLOFileError(f"{path}: {err}") from err
    if len(raw) > _MAX_FILE_BYTES:
        raise NodeSLOFileError(f"{path}: larger than {_MAX_FILE_BYTES} bytes")
    try:
        document = yaml.safe_load(raw)
    except yaml.YAMLError as err:
        raise NodeSLOFileError(f"{path}: not YAML: {err}") from err
    if document is None:
        return default_node_slo_spec()
    if not isinstance(document, dict):
        raise NodeSLOFileError(f"{path}: expected a mapping, got {type(document).__name__}")
    if "kind" in document or "apiVersion" in document:
        if document.get("kind", "NodeSLO") != "NodeSLO":
            raise NodeSLOFileError(f"{path}: kind {document.get('kind')!r} is not NodeSLO")
        document = document.get("spec") or {}
    try:
        return parse_node_slo_spec(document)
    except NodeSLOError as err:
        raise NodeSLOFileError(f"{path}: {err}") from err


class _Handler(FileSystemEventHandler):
    def __init__(self, watcher: NodeSLOFileWatcher) -> None:
        self._watcher = watcher

    def on_any_event(self, event: FileSystemEvent) -> None:
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
        self.reloads = 0
        self.rejections = 0

    def reload(self) -> bool:
        """Read the file now; True when its spec was taken."""
        with self._lock:
            self.reloads += 1
            try:
                spec = load_node_slo_file(self.path)
            except NodeSLOFileError as err:
                self.rejections += 1
                self._sink.reject_node_slo(str(err))
                return False
            self._sink.set_node_slo(spec)
            return True

    def changed(self) -> None:
        """The file changed: reload once it has been quiet for ``settle_s``."""
        with self._timer_lock:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = threading.Timer(self._settle_s, self.reload)
            self._timer.daemon = True
            self._timer.start()

    def start(self) -> None:
        directory = os.path.dirname(self.path)
        os.makedirs(directory, exist_ok=True)
        observer = Observer()
        observer.schedule(_Handler(self), directory, recursive=False)
        observer.daemon = True
        observer.start()
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
