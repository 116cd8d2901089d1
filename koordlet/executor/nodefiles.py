"""The executor's node-wide kernel files: the sysctls of NodeSLO ``systemStrategy``, kidled's settings, and the
per-process ``/proc/<pid>/oom_score_adj`` (koordlet/system/sysctl.py names them).

Each write has the checks of a cgroup write (the registry's range, the path inside ``proc_dir``/``sys_dir``,
``O_NOFOLLOW``, the write cache). Before its first write of a node-wide file the executor records what was
there (:class:`~koordlet.executor.originals.Originals`, kept in a file when one is given, so a restarted agent
still knows; a file whose value cannot be recorded is not written), and :meth:`NodeFiles.restore` writes it
back.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping

from koordlet.executor import metrics
from koordlet.executor.cache import WriteCache
from koordlet.executor.errors import (
    CgroupNotFoundError,
    ExecutorError,
    InvalidUpdateError,
    UnsafePathError,
    UnsupportedResourceError,
    WriteFailedError,
)
from koordlet.executor.files import RealRoots, read_current, write_file
from koordlet.executor.originals import Originals
from koordlet.system import kernfs
from koordlet.system.sysctl import (
    SCHED_FEATURES,
    InvalidSystemValueError,
    SystemResource,
    get_system_resource,
    parse_sched_features,
)

logger = logging.getLogger(__name__)


class NodeFiles:
    """The node-wide writes of one executor, below its ``proc``/``sys`` mount dirs (None: no such writes).
    Thread-safe: writes hold the executor's ``lock``."""

    def __init__(self, mounts: Mapping[str, str | None], originals: Originals, cache: WriteCache,
                 lock: threading.Lock, roots: RealRoots, clock: Callable[[], float]) -> None:
        self._mounts = mounts
        self.originals = originals
        self._cache = cache
        self._lock = lock
        self._roots = roots
        self._clock = clock

    def read(self, name: str, pid: int | None = None) -> str:
        """Current content of a node-wide kernel file (``pid``: of that process); raises ExecutorError."""
        resource = get_system_resource(name)
        path = self._path(resource, pid)
        try:
            return kernfs.read_text(path)
        except FileNotFoundError as exc:
            raise UnsupportedResourceError(f"{path} does not exist on this kernel") from exc
        except OSError as exc:
            raise ExecutorError(f"cannot read {path}: {exc.strerror}") from exc

    def write(self, name: str, value: str | int, pid: int | None = None) -> bool:
        """Write ``value`` to a node-wide kernel file: True when written, False when skipped (cached, or the file
        already holds it). A sysctl's value before koordlet's first write is recorded for :meth:`restore`;
        per-process files (``pid``) are not recorded. Raises ExecutorError."""
        resource = get_system_resource(name)
        try:
            try:
                text = resource.validate(value)
            except InvalidSystemValueError as exc:
                raise InvalidUpdateError(str(exc)) from exc
            path = self._path(resource, pid)
            with self._lock:
                written = self._write(resource, path, text, record=pid is None)
        except ExecutorError as exc:
            metrics.count_update(name, exc.status)
            logger.debug("update %s (pid %s) not done: %s", name, pid, exc)
            raise
        metrics.count_update(name, metrics.STATUS_WRITTEN if written else metrics.STATUS_SKIPPED)
        return written

    def restore(self, key: str) -> bool:
        """Write back what was there before koordlet's first write of ``key`` (a sysctl name, or
        ``sched_features:<NAME>``) and forget it; False when nothing was recorded. Raises ExecutorError."""
        original = self.originals.get(key)
        if original is None:
            return False
        name = key.partition(":")[0]
        resource = get_system_resource(name)
        path = self._path(resource, None)
        try:
            with self._lock:
                current = read_current(path)
                if current is None:
                    raise UnsupportedResourceError(f"{path} does not exist on this kernel")
                _, now_value = self._original_of(resource, current, original)
                self._cache.drop(path)
                self._cache.drop(f"{path}\0{original.removeprefix('NO_')}")
                if now_value != original:
                    write_file(resource.name, path, original)
        except ExecutorError as exc:
            metrics.count_update(name, exc.status)
            raise
        self.originals.forget(key)
        metrics.count_update(name, metrics.STATUS_WRITTEN)
        logger.info("restored %s to %s (its value before koordlet changed it)", key, original)
        return True

    def _path(self, resource: SystemResource, pid: int | None) -> str:
        mount = self._mounts.get(resource.fs)
        if mount is None:
            raise UnsupportedResourceError(f"no {resource.fs} root configured for {resource.name}")
        if pid is not None and (isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0):
            raise UnsafePathError(f"{resource.name}: not a PID: {pid!r}")
        return self._roots.check(mount, resource.path(mount, pid), "the mount dir")

    def _write(self, resource: SystemResource, path: str, text: str, record: bool) -> bool:
        """Caller holds the lock."""
        now = self._clock()
        cache_key = f"{path}\0{text.removeprefix('NO_')}" if resource.flags else path
        # A PID's file (record False): always read, PIDs are reused.
        if record and self._cache.wrote_recently(cache_key, text, now):
            return False
        current = read_current(path)
        if current is None:
            if not record:
                raise CgroupNotFoundError(f"{path}: the process is gone")
            raise UnsupportedResourceError(f"{path} does not exist on this kernel")
        key, before = self._original_of(resource, current, text)
        if before is None:
            raise InvalidUpdateError(f"{resource.name}: this kernel has no feature {text.removeprefix('NO_')!r}")
        if before != text:
            if record and not self.originals.record(key, before):
                raise WriteFailedError(f"{path}: its value before koordlet's first write ({before!r}) cannot be "
                                       "recorded, so it is not changed", None)
            try:
                write_file(resource.name, path, text)
            except ExecutorError:
                self._cache.drop(cache_key)
                raise
        if record:
            self._cache.remember(cache_key, text, now)
        return before != text

    @staticmethod
    def _original_of(resource: SystemResource, current: str, text: str) -> tuple[str, str | None]:
        """(record key, the file's current value in the form written) of one write."""
        if not resource.flags:
            return resource.name, current.strip()
        name = text.removeprefix("NO_")
        on = parse_sched_features(current).get(name)
        return f"{SCHED_FEATURES}:{name}", None if on is None else (name if on else f"NO_{name}")
