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
   after reading the file back); a cgroup removed since is reported by the next write. A write the kernel
   answers by changing another file of the dir forgets that file's entry (:data:`KERNEL_RESETS`: ``cpu.idle``
   sets the group's weight), so the next write of it is made. Action files
   (``memory.reclaim``: each write asks the kernel to act) are written every time, outside the lock; the kernel
   doing less than asked (EAGAIN) is a :class:`PartialWriteError`, not a failure;
5. logs the write at debug level and counts every outcome in Prometheus.

A missing file in an existing dir is :class:`UnsupportedResourceError` (kernel without that feature; logged
once per resource and hierarchy); a missing dir is :class:`CgroupNotFoundError` (pod gone or not yet made).

:meth:`CgroupFiles.leveled_update` orders parent/child writes for hierarchical files on cgroup v1,
where a child's cpuset must be a subset of its parent's and a child's CFS quota may not exceed its
parent's: first parents to children with the looser of current and wanted value (union of cpusets, larger
quota), then children to parents with the exact values (docs/koordinator.md §10, §15.7).
"""

from __future__ import annotations

import errno
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
    PartialWriteError,
    UnsafePathError,
    UnsupportedResourceError,
    WriteFailedError,
)
from koordlet.executor.files import RealRoots, read_current, write_file
from koordlet.executor.updates import BatchResult, ResourceUpdate, UpdateFailure
from koordlet.system import kernfs
from koordlet.system.cgroup import CgroupFS, CgroupVersion
from koordlet.system.resources import (
    CgroupResource,
    InvalidCgroupValueError,
    WeightFormula,
    device_of,
    get_resource,
)

logger = logging.getLogger(__name__)

# Files whose write makes the kernel change other files of the same dir, which the write cache must then forget:
# cpu.idle sets the group's weight (the scheduler's sched_group_set_idle: 1 → the idle weight, and writes of the
# weight are refused while idle; 0 → 1024's, cpu.shares 1024 on v1, cpu.weight 100 on v2), so a weight cached
# before would be skipped, and the group left at 1024's, for up to force_update_seconds.
KERNEL_RESETS: dict[str, tuple[str, ...]] = {"cpu.idle": ("cpu.shares",)}


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
        # The runtime's cpu.shares → cpu.weight formula (v2): replaced whole by the one thread that learns it (the
        # reconciler's, koordlet/runtimehooks/weightformula.py), read at each write.
        self.weight_formula = WeightFormula.LINEAR
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
            if update.resource.action:
                return self._act(target)
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
        loosened: list[ResourceUpdate] = []
        reached: list[ResourceUpdate] = []  # pass 1 wrote the exact value (a loosening: -1, a union): done there
        if self.cgroup_fs.version is CgroupVersion.V1:
            for update in by_depth:
                wrote = self._loosen(update, verify)
                if wrote is not None:
                    (reached if wrote else loosened).append(update)
        exact = self.update_batch(list(reversed(by_depth)), verify)
        # those the exact pass then skipped (in place): what a caller records as done, like an exact write
        first = tuple(u for u in reached if u not in exact.done and all(f.update is not u for f in exact.failures))
        return BatchResult(written=exact.written + len(loosened) + len(reached), skipped=exact.skipped - len(first),
                           failures=exact.failures, done=first + exact.done)

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

    def forget_reads(self, cgroup_dirs: Sequence[str]) -> None:
        """Close the kept descriptors of files below ``cgroup_dirs`` (a pod's dir, when the pod leaves the states):
        one would pin the removed cgroup until the idle sweep, which only a later read runs."""
        self._reads.forget_under(cgroup_dirs)

    # ------------------------------------------------------------------------------------------ helpers

    def _loosen(self, update: ResourceUpdate, verify: bool = False) -> bool | None:
        """Pass 1 of the leveled update: None when nothing was written, else whether the value written is the wanted
        one (a loosening: the exact pass then finds it in place).

        A value the write cache says this file was given recently needs no loosening (the merge of a value with
        itself is that value): the file is not read, as the exact pass will not read it either. With ``verify``
        (drift correction) the file is read."""
        merge = update.resource.merge
        if merge is None:
            return None
        try:
            target = self._target(update)
            if not verify and not update.resource.per_device and self._cache.wrote_recently(
                    target.path, target.value, self._clock()):
                return None
            current = kernfs.read_text(target.path)
            loosened = merge(current, target.value)
            if loosened == current:
                return None
            with self._lock:  # already compared with the file: the write cache must not skip it
                return loosened == target.value if self._write_target(target, loosened, verify=True) else None
        except (ExecutorError, OSError) as exc:
            # The exact pass that follows reports (and counts) whatever is really wrong with this update.
            logger.debug("leveled pre-write of %s in %r skipped: %s", update.resource.name, update.cgroup_dir, exc)
            return None

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
        if self.cgroup_fs.version is CgroupVersion.V2 and (resource.to_v2 is not None or resource.shares_to_weight):
            current = read_current(target.path) if resource.v2_needs_current else None
            content = resource.to_file_value(v1_value, CgroupVersion.V2, current, self.weight_formula)
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
        for name in KERNEL_RESETS.get(resource.name, ()):
            file_name = get_resource(name).file_name(self.cgroup_fs.version)
            if file_name is not None:  # the same subsystem, so the same dir
                self._cache.drop(os.path.join(os.path.dirname(target.path), file_name))
        metrics.count_update(target.resource.name, metrics.STATUS_WRITTEN)
        return True

    def _act(self, target: _Target) -> bool:
        """An action file (``memory.reclaim``): written every time, never cached, and outside the lock (the kernel
        may take a while, and no other write waits for it); EAGAIN is a :class:`PartialWriteError`."""
        if not os.path.exists(target.path):
            raise _missing(target.path)
        try:
            write_file(target.resource.name, target.path, target.value)
        except WriteFailedError as exc:
            if exc.errno == errno.EAGAIN:
                raise PartialWriteError(str(exc), exc.errno) from exc
            raise
        metrics.count_update(target.resource.name, metrics.STATUS_WRITTEN)
        return True

    def has(self, resource: CgroupResource | str, cgroup_dir: str) -> bool:
        """Whether this kernel has ``resource`` in the dir ``cgroup_dir`` (a probe that needs no read, so it works for
        write-only files). Raises CgroupNotFoundError when the dir is missing, InvalidUpdateError when this cgroup
        version has no such file."""
        if isinstance(resource, str):
            resource = get_resource(resource)
        path = self._checked_path(resource, cgroup_dir, None)
        if os.path.exists(path):
            return True
        missing = _missing(path)
        if isinstance(missing, CgroupNotFoundError):
            raise missing
        return False

    def _log_unsupported(self, update: ResourceUpdate, exc: UnsupportedResourceError) -> None:
        key = (update.resource.name, update.subsystem or update.resource.subsystem)
        if key in self._warned_unsupported:
            logger.debug("%s", exc)
            return
        self._warned_unsupported.add(key)
        logger.warning("%s; skipping %s updates (logged once)", exc, update.resource.name)
