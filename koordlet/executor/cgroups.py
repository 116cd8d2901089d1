"""The executor's cgroup files: validated, path-checked, cached writes, the leveled (parent/child ordered) batch,
and reads through the same path checks (docs/design.md §4, docs/koordinator.md §10).

Every write goes through :meth:`CgroupFiles.update`, which
1. validates the value against the resource registry (invalid → :class:`InvalidUpdateError`, never written);
2. resolves the file: the cgroup dir is taken relative to the hierarchy root of the resource's subsystem
   (a leading ``/`` is the CRI convention and means the same), ``..``/``.`` components are refused, and the
   resolved real path (symlinks followed) must stay inside that hierarchy (:class:`UnsafePathError`), so no
   annotation or pod name can make it write ``../`` anywhere; the final open uses ``O_NOFOLLOW``;
3. translates the v1 value for cgroup v2 (``cpu.max``, ``cpu.weight``, ``memory.max``…);
4. skips the write when the same content was written to that file less than ``force_update_seconds``
   ago (:class:`~koordlet.executor.cache.WriteCache`), without touching the file system (with ``verify``,
   after reading the file back); a cgroup removed since is reported by the next write;
5. logs the write at debug level and counts every outcome in Prometheus.

A missing file in an existing dir is :class:`UnsupportedResourceError` (kernel without that feature; logged
once per resource and hierarchy); a missing dir is :class:`CgroupNotFoundError` (pod gone or not yet made).

:meth:`CgroupFiles.leveled_update` orders parent/child writes for hierarchical files on cgroup v1,
where a child's cpuset must be a subset of its parent's and a child's CFS quota may not exceed its
parent's: first parents to children with the looser of current and wanted value (union of cpusets, larger
quota), then children to parents with the exact values (docs/koordinator.md §10, §15.7).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from koordlet.executor import metrics
from koordlet.executor.cache import MAX_ENTRIES, WriteCache
from koordlet.executor.errors import (
    CgroupNotFoundError,
    ExecutorError,
    InvalidUpdateError,
    UnsafePathError,
    UnsupportedResourceError,
)
from koordlet.executor.files import RealRoots, read_current, write_file
from koordlet.executor.updates import BatchResult, ResourceUpdate, UpdateFailure
from koordlet.system import kernfs
from koordlet.system.cgroup import CgroupFS, CgroupVersion
from koordlet.system.resources import CgroupResource, InvalidCgroupValueError, device_of, get_resource

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Target:
    """A validated update with its checked file path."""

    resource: CgroupResource
    path: str
    value: str  # canonical v1 value


def _safe_parts(rel_dir: str) -> list[str]:
    if "\x00" in rel_dir:
        raise UnsafePathError(f"NUL byte in cgroup dir {rel_dir!r}")
    parts = [part for part in rel_dir.split("/") if part]
    for part in parts:
        if part in ("..", "."):
            raise UnsafePathError(f"cgroup dir {rel_dir!r} contains {part!r}")
    return parts


def _missing(path: str) -> ExecutorError:
    """What a missing cgroup file means: its dir is gone (pod gone or not made yet), or the kernel lacks it."""
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        return CgroupNotFoundError(f"cgroup dir {directory} does not exist")
    return UnsupportedResourceError(f"{path} does not exist on this kernel")


class CgroupFiles:
    """The cgroup writes and reads of one executor. Thread-safe: writes hold the executor's ``lock``."""

    def __init__(self, cgroup_fs: CgroupFS, cache: WriteCache, lock: threading.Lock, roots: RealRoots,
                 clock: Callable[[], float]) -> None:
        self.cgroup_fs = cgroup_fs
        self._cache = cache
        self._lock = lock
        self._roots = roots
        self._clock = clock
        self._warned_unsupported: set[tuple[str, str]] = set()
        # Path checks resolve every component (realpath): their verdicts are kept as long as written values
        # are, so a reconcile pass over unchanged pods does not stat each directory of each path every time.
        # (resource, cgroup dir, subsystem) → (path, when its check passed)
        self._checked_paths: dict[tuple[str, str, str | None], tuple[str, float]] = {}
        # Files read every tick (the QoS snapshot's, read(every_tick=True)) through kept descriptors.
        self._reads = kernfs.KeptReads(clock=clock)

    def update(self, update: ResourceUpdate, verify: bool = False) -> bool:
        """Carry out one update: True when written, False when skipped (cached). Raises ExecutorError.

        ``verify``: when the cache says the same value was written recently, read the file and write anyway
        if it differs (someone changed it since): what a drift-correcting caller (the reconciler) wants."""
        resource_name = update.resource.name
        try:
            target = self._target(update)
            with self._lock:
                return self._write_target(target, target.value, verify)
        except ExecutorError as exc:
            metrics.count_update(resource_name, exc.status)
            if isinstance(exc, UnsupportedResourceError):
                self._log_unsupported(update, exc)
            else:
                logger.debug("update %s of %r not done: %s", resource_name, update.cgroup_dir, exc)
            raise

    def update_batch(self, updates: Sequence[ResourceUpdate], verify: bool = False) -> BatchResult:
        """Each update in the given order; failures are collected, not raised."""
        skipped = 0
        done: list[ResourceUpdate] = []
        failures: list[UpdateFailure] = []
        for update in updates:
            try:
                if self.update(update, verify):
                    done.append(update)
                else:
                    skipped += 1
            except ExecutorError as exc:
                failures.append(UpdateFailure(update, exc))
        return BatchResult(written=len(done), skipped=skipped, failures=tuple(failures), done=tuple(done))

    def leveled_update(self, updates: Sequence[ResourceUpdate], verify: bool = False) -> BatchResult:
        """Parent/child-ordered update of hierarchical files (see the module docstring).

        On v1, pass 1 walks parents → children and writes, where the resource has a merge rule, the looser
        of the current and the wanted value if that differs from the current one; pass 2 walks children →
        parents and writes the exact values. On v2 the kernel imposes no such order (effective values are
        the intersection/minimum), so only pass 2 runs. Failures are collected, not raised.
        """
        by_depth = sorted(updates, key=lambda u: u.depth)
        loosened = 0
        if self.cgroup_fs.version is CgroupVersion.V1:
            loosened = sum(self._loosen(update, verify) for update in by_depth)
        exact = self.update_batch(list(reversed(by_depth)), verify)
        return BatchResult(written=exact.written + loosened, skipped=exact.skipped, failures=exact.failures,
                           done=exact.done)

    def read(self, resource: CgroupResource | str, cgroup_dir: str, subsystem: str | None = None, *,
             every_tick: bool = False) -> str:
        """Current content of a resource file (stripped), through the same path checks as writes.

        ``every_tick``: the caller reads this file again every tick (the QoS snapshot), so it is read through
        a kept descriptor (closed after a few seconds without a read); one-off reads open and close, so a
        short-lived pod leaves no descriptor pinning its removed cgroup behind."""
        if isinstance(resource, str):
            resource = get_resource(resource)
        path = self._checked_path(resource, cgroup_dir, subsystem)
        try:
            return self._reads.read_text(path) if every_tick else kernfs.read_text(path)
        except FileNotFoundError as exc:
            raise _missing(path) from exc
        except OSError as exc:
            raise ExecutorError(f"cannot read {path}: {exc.strerror}") from exc

    # ------------------------------------------------------------------------------------------ helpers

    def _loosen(self, update: ResourceUpdate, verify: bool = False) -> bool:
        """Pass 1 of the leveled update: True when a looser value was written.

        A value the write cache says this file was given recently needs no loosening (the merge of a value with
        itself is that value): the file is not read, as the exact pass will not read it either. With ``verify``
        (drift correction) the file is read."""
        merge = update.resource.merge
        if merge is None:
            return False
        try:
            target = self._target(update)
            if not verify and not update.resource.per_device and self._cache.wrote_recently(
                    target.path, target.value, self._clock()):
                return False
            current = kernfs.read_text(target.path)
            loosened = merge(current, target.value)
            if loosened == current:
                return False
            with self._lock:  # already compared with the file: the write cache must not skip it
                return self._write_target(target, loosened, verify=True)
        except (ExecutorError, OSError) as exc:
            # The exact pass that follows reports (and counts) whatever is really wrong with this update.
            logger.debug("leveled pre-write of %s in %r skipped: %s", update.resource.name, update.cgroup_dir, exc)
            return False

    def _target(self, update: ResourceUpdate) -> _Target:
        resource = update.resource
        try:
            value = resource.validate(update.value)
        except InvalidCgroupValueError as exc:
            raise InvalidUpdateError(str(exc)) from exc
        path = self._checked_path(resource, update.cgroup_dir, update.subsystem)
        return _Target(resource=resource, path=path, value=value)

    def _checked_path(self, resource: CgroupResource, cgroup_dir: str, subsystem: str | None) -> str:
        now = self._clock()
        key = (resource.name, cgroup_dir, subsystem)
        checked = self._checked_paths.get(key)
        if checked is not None and now - checked[1] < self._cache.force_update_seconds:
            return checked[0]
        version = self.cgroup_fs.version
        file_name = resource.file_name(version)
        if file_name is None:
            raise InvalidUpdateError(f"{resource.name} has no cgroup v{int(version)} file")
        parts = _safe_parts(cgroup_dir)
        hierarchy = self.cgroup_fs.hierarchy_dir(subsystem or resource.subsystem)
        path = self._roots.check(hierarchy, os.path.join(hierarchy, *parts, file_name), "the cgroup hierarchy")
        if len(self._checked_paths) >= MAX_ENTRIES:
            self._checked_paths.clear()
        self._checked_paths[key] = (path, now)
        return path

    def _write_target(self, target: _Target, v1_value: str, verify: bool = False) -> bool:
        """Translate, consult the cache (and with ``verify`` the file), write. Caller holds the lock."""
        content = v1_value
        resource = target.resource
        if self.cgroup_fs.version is CgroupVersion.V2 and resource.to_v2 is not None:
            current = read_current(target.path) if resource.v2_needs_current else None
            content = resource.to_file_value(v1_value, CgroupVersion.V2, current)
        now = self._clock()
        # A per-device file (blkio) holds one line per device, and on v2 io.max holds four resources: each
        # (resource, device) is cached on its own, and "verify" cannot compare a line with the whole file.
        per_device = resource.per_device
        key = f"{target.path}\0{resource.name}\0{device_of(v1_value)}" if per_device else target.path
        if (self._cache.wrote_recently(key, content, now)
                and (not verify or (not per_device and read_current(target.path) == content))):
            metrics.count_update(target.resource.name, metrics.STATUS_SKIPPED)
            return False
        if not os.path.exists(target.path):  # one stat when it is there
            raise _missing(target.path)
        try:
            write_file(target.resource.name, target.path, content)
        except ExecutorError:
            self._cache.drop(key)
            raise
        self._cache.remember(key, content, now)
        metrics.count_update(target.resource.name, metrics.STATUS_WRITTEN)
        return True

    def _log_unsupported(self, update: ResourceUpdate, exc: UnsupportedResourceError) -> None:
        key = (update.resource.name, update.subsystem or update.resource.subsystem)
        if key in self._warned_unsupported:
            logger.debug("%s", exc)
            return
        self._warned_unsupported.add(key)
        logger.warning("%s; skipping %s updates (logged once)", exc, update.resource.name)
