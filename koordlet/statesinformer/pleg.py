"""Pod lifecycle events from the cgroup tree (Koordinator's PLEG, docs/koordinator.md §8.1).

A new pod dir under one of the QoS-level dirs of the cpu hierarchy (``kubepods/``, ``kubepods/burstable/``,
``kubepods/besteffort/`` or their systemd slices, below kubelet's ``--cgroup-root``) means kubelet just
created a pod: the informer polls its pod source at once instead of up to a sync interval later, so the
reconciler and the collectors see the pod within a fraction of a second. The dirs are watched with
watchdog (inotify), non-recursively; QoS dirs that do not exist at start are skipped (logged).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from watchdog.events import DirCreatedEvent, FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

from koordlet.api.qos import KubeQoS
from koordlet.system.cgroup import CgroupFS
from koordlet.system.kubepods import KubeCgroupLayout, pod_uid_from_dir_name
from koordlet.ticker import start_observer

logger = logging.getLogger(__name__)


class _Handler(FileSystemEventHandler):
    def __init__(self, on_pod_added: Callable[[str], None]) -> None:
        self._on_pod_added = on_pod_added

    def on_created(self, event: FileSystemEvent) -> None:
        if not isinstance(event, DirCreatedEvent):
            return
        uid = pod_uid_from_dir_name(os.path.basename(os.fsdecode(event.src_path)))
        if uid is not None:
            logger.debug("pod cgroup created: %s", uid)
            self._on_pod_added(uid)


class PodCgroupWatcher:
    """Calls ``on_pod_added(pod_uid)`` when a pod dir appears under a QoS dir."""

    def __init__(self, cgroup_fs: CgroupFS, layout: KubeCgroupLayout, on_pod_added: Callable[[str], None]) -> None:
        self._dirs = sorted({cgroup_fs.cgroup_dir("cpu", layout.qos_dir(qos)) for qos in KubeQoS})
        self._handler = _Handler(on_pod_added)
        self._observer: Observer | None = None
        self.watched: list[str] = []

    def start(self) -> None:
        observer = Observer()
        for directory in self._dirs:
            if not os.path.isdir(directory):
                logger.info("PLEG: %s does not exist; pods there are found by the periodic sync", directory)
                continue
            try:
                observer.schedule(self._handler, directory, recursive=False)
            except OSError as err:
                logger.warning("PLEG: cannot watch %s: %s", directory, err)
                continue
            self.watched.append(directory)
        start_observer(observer, "pleg")
        self._observer = observer

    def stop(self, timeout_s: float = 2.0) -> None:
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout_s)
            self._observer = None
