"""The resource executor: the only code that writes kernel files (docs/design.md §4, docs/koordinator.md §10).

Every write goes through :meth:`ResourceExecutor.update`, which
1. validates the value against the resource registry (invalid → :class:`InvalidUpdateError`, never written);
2. resolves the file: the cgroup dir is taken relative to the hierarchy root of the resource's subsystem
   (a leading ``/`` is the CRI convention and means the same), ``..``/``.`` components are refused, and the
   resolved real path (symlinks followed) must stay inside that hierarchy (:class:`UnsafePathError`), so no
   annotation or pod name can make it write ``../`` anywhere; the final open uses ``O_NOFOLLOW``;
3. translates the v1 value for cgroup v2 (``cpu.max``, ``cpu.weight``, ``memory.max``…);
4. skips the write when the same content was written to that file less than ``force_update_seconds``
   (default 60, flag ``-resource-force-update-seconds``) ago, without touching the file system (with
   ``verify``, after reading the file back); a cgroup removed since is reported by the next write. Action
   files (``memory.reclaim``: each write asks the kernel to act) are written every time, outside the lock;
   the kernel doing less than asked (EAGAIN) is a :class:`PartialWriteError`, not a failure;
5. logs the write at debug level and counts every outcome in Prometheus.

A missing file in an existing dir is :class:`UnsupportedResourceError` (kernel without that feature; logged
once per resource and hierarchy); a missing dir is :class:`CgroupNotFoundError` (pod gone or not yet made).

:meth:`ResourceExecutor.leveled_update` orders parent/child writes for hierarchical files on cgroup v1,
where a child's cpuset must be a subset of its parent's and a child's CFS quota may not exceed its
parent's: first parents to children with the looser of current and wanted value (union of cpusets, larger
quota), then children to parents with the exact values (docs/koordinator.md §10, §15.7).

Node-wide kernel files (the sysctls of NodeSLO ``systemStrategy``, ``/proc/<pid>/oom_score_adj``) go through
:meth:`ResourceExecutor.write_system` with the same checks (registry range, path inside ``proc_dir``/``sys_dir``,
``O_NOFOLLOW``, the write cache). Before its first write of a sysctl the executor records what was there
(:class:`~koordlet.executor.originals.Originals`, kept in a file when one is given, so a restarted agent still
knows), and :meth:`ResourceExecutor.restore_system` writes it back.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from koordlet.executor import metrics
from koordlet.executor.originals import Originals
from koordlet.system import kernfs
from koordlet.system.cgroup import CgroupFS, CgroupVersion
from koordlet.system.resources import CgroupResource, InvalidCgroupValueError, device_of, get_resource
from koordlet.system.sysctl import (
    SCHED_FEATURES,
    InvalidSystemValueError,
    SystemResource,
    get_system_resource,
    parse_sched_features,
)

logger = logging.getLogger(__name__)

DEFAULT_FORCE_UPDATE_SECONDS = 60.0
_CACHE_MAX_ENTRIES = 16384
_RESCTRL_FILES = ("schemata", "tasks")
_RESCTRL_GROUP = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
# The files the kernel makes in a resctrl control group (its mon_data/mon_groups dirs go with an rmdir too).
RESCTRL_GROUP_FILES = frozenset({"schemata", "tasks", "cpus", "cpus_list", "mode", "size"})


class ExecutorError(Exception):
    """A resource update was not carried out."""

    status = metrics.STATUS_FAILED


class InvalidUpdateError(ExecutorError):
    """The value is invalid for the resource, or the resource cannot be written in this cgroup version."""

    status = metrics.STATUS_INVALID


class UnsafePathError(ExecutorError):
    """The target path would leave the cgroup (or resctrl) root."""

    status = metrics.STATUS_UNSAFE_PATH


class UnsupportedResourceError(ExecutorError):
    """The file does not exist on this kernel (e.g. ``cpu.bvt_warp_ns`` outside Anolis)."""

    status = metrics.STATUS_UNSUPPORTED


class CgroupNotFoundError(ExecutorError):
    """The cgroup dir does not exist."""

    status = metrics.STATUS_NOT_FOUND


class WriteFailedError(ExecutorError):
    """The kernel refused the write; ``errno`` tells why (EINVAL, EBUSY, EPERM…)."""

    def __init__(self, message: str, errno_value: int | None) -> None:
        super().__init__(message)
        self.errno = errno_value


class PartialWriteError(WriteFailedError):
    """An action file did part of what the write asked (``memory.reclaim``: less reclaimed, EAGAIN). Not a fault."""

    status = metrics.STATUS_PARTIAL


@dataclass(frozen=True, slots=True)
class ResourceUpdate:
    """Write ``value`` (v1 semantics) to ``resource`` of the cgroup ``cgroup_dir``.

    ``cgroup_dir`` is relative to the hierarchy root (``kubepods/besteffort/pod<uid>``); ``subsystem``
    overrides the resource's v1 hierarchy (e.g. ``cgroup.procs`` of the memory hierarchy).
    """

    resource: CgroupResource
    cgroup_dir: str
    value: str | int
    subsystem: str | None = None

    @classmethod
    def of(cls, resource: str, cgroup_dir: str, value: str | int, subsystem: str | None = None) -> ResourceUpdate:
        """Build from a registry name (raises ``UnknownCgroupResourceError`` for a name not in the registry)."""
        return cls(get_resource(resource), cgroup_dir, value, subsystem)

    @property
    def depth(self) -> int:
        return len([part for part in self.cgroup_dir.split("/") if part])


@dataclass(frozen=True, slots=True)
class UpdateFailure:
    update: ResourceUpdate
    error: ExecutorError


@dataclass(frozen=True, slots=True)
class BatchResult:
    """``written``: files written (a leveled update may write a file twice); ``skipped``: exact values
    not written because the cache said they are already there; ``done``: the updates whose exact value was
    written, by the exact pass or already by a leveled update's first (what the plan runner records)."""

    written: int = 0
    skipped: int = 0
    failures: tuple[UpdateFailure, ...] = ()
    done: tuple[ResourceUpdate, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.failures


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


def _inside(real_base: str, path: str) -> bool:
    real = os.path.realpath(path)
    return real == real_base or real.startswith(real_base.rstrip("/") + "/")


class ResourceExecutor:
    """Validated, cached, path-checked writes of cgroup (and resctrl) files. Thread-safe."""

    def __init__(
        self,
        cgroup_fs: CgroupFS,
        *,
        resctrl_root: str | None = None,
        force_update_seconds: float = DEFAULT_FORCE_UPDATE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        proc_dir: str | None = None,
        sys_dir: str | None = None,
        originals_file: str | None = None,
    ) -> None:
        """``proc_dir``/``sys_dir``: where procfs and sysfs are mounted (None: no system writes);
        ``originals_file``: where the values found before the first sysctl writes are kept (None: memory)."""
        self.cgroup_fs = cgroup_fs
        self.resctrl_root = resctrl_root
        self._mounts = {"proc": proc_dir, "sys": sys_dir}
        self.originals = Originals(originals_file)
        self.force_update_seconds = force_update_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[str, float]] = {}
        self._warned_unsupported: set[tuple[str, str]] = set()
        # Path checks resolve every component (realpath): their verdicts are kept as long as written values
        # are, so a reconcile pass over unchanged pods does not stat each directory of each path every time.
        self._real_roots: dict[str, str] = {}
        # (resource, cgroup dir, subsystem) → (path, when its check passed)
        self._checked_paths: dict[tuple[str, str, str | None], tuple[str, float]] = {}
        # Files read every tick (the QoS snapshot's, read(every_tick=True)) through kept descriptors.
        self._reads = kernfs.KeptReads(clock=clock)

    # ------------------------------------------------------------------------------------------- public

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
        return self._run(updates, verify)

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
        exact = self._run(list(reversed(by_depth)), verify)
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
            raise self._missing(path) from exc
        except OSError as exc:
            raise ExecutorError(f"cannot read {path}: {exc.strerror}") from exc

    def write_resctrl(self, group: str, filename: str, value: str) -> None:
        """Write ``schemata`` or ``tasks`` of resctrl group ``group`` ("" = the root group). Not cached:
        ``tasks`` writes move threads and must happen every time they are asked for."""
        resource_name = f"resctrl.{filename}"
        try:
            path = self._resctrl_path(group, filename)
            with self._lock:
                self._write_file(resource_name, path, value)
        except ExecutorError as exc:
            metrics.count_update(resource_name, exc.status)
            raise
        metrics.count_update(resource_name, metrics.STATUS_WRITTEN)

    def read_resctrl(self, group: str, filename: str) -> str:
        """Content of ``schemata`` or ``tasks`` of resctrl group ``group``; "" when the group has no such file
        yet."""
        try:
            path = self._resctrl_path(group, filename)
            return kernfs.read_raw(path)
        except (CgroupNotFoundError, FileNotFoundError):
            return ""
        except OSError as exc:
            raise ExecutorError(f"cannot read {path}: {exc.strerror}") from exc

    def _resctrl_group_path(self, group: str) -> str:
        if self.resctrl_root is None:
            raise UnsupportedResourceError("no resctrl root configured")
        if not group or not _RESCTRL_GROUP.match(group):
            raise UnsafePathError(f"unsafe resctrl group name {group!r}")
        path = os.path.join(self.resctrl_root, group)
        if not _inside(os.path.realpath(self.resctrl_root), path):
            raise UnsafePathError(f"{path} resolves outside the resctrl root {self.resctrl_root}")
        return path

    def remove_resctrl_group(self, group: str) -> bool:
        """Remove resctrl group ``group`` (an rmdir in the resctrl fs; never the root group); True when it was
        removed, False when it did not exist. Move its tasks out first (the kernel would give them to the
        root group anyway).

        On resctrl the rmdir takes the group's files with it. A plain directory standing in for resctrl (a
        test tree) is not empty: its files are removed first only when every entry is a regular file with a
        name the kernel gives a group's files (``schemata``, ``tasks``, ``cpus`` …); anything else is refused
        (:class:`UnsafePathError`) and nothing is removed."""
        path = self._resctrl_group_path(group)
        try:
            try:
                removed = kernfs.remove_dir(path)
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
                entries = kernfs.dir_entries(path)
                foreign = sorted(name for name, plain in entries if not plain or name not in RESCTRL_GROUP_FILES)
                if foreign:
                    metrics.count_update("resctrl.group", metrics.STATUS_UNSAFE_PATH)
                    raise UnsafePathError(f"not removing {path}: it holds {foreign}, not only a resctrl "
                                          "group's files") from exc
                for name, _ in entries:
                    kernfs.remove_file(os.path.join(path, name))
                removed = kernfs.remove_dir(path)
        except OSError as exc:
            metrics.count_update("resctrl.group", metrics.STATUS_FAILED)
            raise WriteFailedError(f"cannot remove resctrl group {path}: {exc.strerror}", exc.errno) from exc
        if removed:
            logger.debug("removed resctrl group %s", path)
            metrics.count_update("resctrl.group", metrics.STATUS_WRITTEN)
        return removed

    def ensure_resctrl_group(self, group: str) -> bool:
        """Create resctrl group ``group`` (a mkdir in the resctrl fs); True when it was created."""
        path = self._resctrl_group_path(group)
        try:
            if not kernfs.make_dir(path):
                return False
        except OSError as exc:
            metrics.count_update("resctrl.group", metrics.STATUS_FAILED)
            raise WriteFailedError(f"cannot create resctrl group {path}: {exc}", exc.errno) from exc
        logger.debug("created resctrl group %s", path)
        metrics.count_update("resctrl.group", metrics.STATUS_WRITTEN)
        return True

    # ------------------------------------------------------------------------------- node-wide files

    def _system_path(self, resource: SystemResource, pid: int | None) -> str:
        mount = self._mounts.get(resource.fs)
        if mount is None:
            raise UnsupportedResourceError(f"no {resource.fs} root configured for {resource.name}")
        if pid is not None and (isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0):
            raise UnsafePathError(f"{resource.name}: not a PID: {pid!r}")
        path = resource.path(mount, pid)
        real_root = self._real_roots.get(mount)
        if real_root is None:
            real_root = self._real_roots[mount] = os.path.realpath(mount)
        if not _inside(real_root, path):
            raise UnsafePathError(f"{path} resolves outside {mount}")
        return path

    def read_system(self, name: str, pid: int | None = None) -> str:
        """Current content of a node-wide kernel file (``pid``: of that process); raises ExecutorError."""
        resource = get_system_resource(name)
        path = self._system_path(resource, pid)
        try:
            return kernfs.read_text(path)
        except FileNotFoundError as exc:
            raise UnsupportedResourceError(f"{path} does not exist on this kernel") from exc
        except OSError as exc:
            raise ExecutorError(f"cannot read {path}: {exc.strerror}") from exc

    def write_system(self, name: str, value: str | int, pid: int | None = None) -> bool:
        """Write ``value`` to a node-wide kernel file: True when written, False when skipped (cached, or the file
        already holds it). A sysctl's value before koordlet's first write is recorded for
        :meth:`restore_system`; per-process files (``pid``) are not recorded. Raises ExecutorError."""
        resource = get_system_resource(name)
        try:
            try:
                text = resource.validate(value)
            except InvalidSystemValueError as exc:
                raise InvalidUpdateError(str(exc)) from exc
            path = self._system_path(resource, pid)
            with self._lock:
                written = self._write_system(resource, path, text, record=pid is None)
        except ExecutorError as exc:
            metrics.count_update(name, exc.status)
            logger.debug("update %s (pid %s) not done: %s", name, pid, exc)
            raise
        metrics.count_update(name, metrics.STATUS_WRITTEN if written else metrics.STATUS_SKIPPED)
        return written

    def _write_system(self, resource: SystemResource, path: str, text: str, record: bool) -> bool:
        """Caller holds the lock."""
        now = self._clock()
        cache_key = f"{path}\0{text.removeprefix('NO_')}" if resource.flags else path
        # A PID's file (record False): always read, PIDs are reused.
        if record and self._wrote_recently(cache_key, text, now):
            return False
        current = self._read_current(path)
        if current is None:
            if not record:
                raise CgroupNotFoundError(f"{path}: the process is gone")
            raise UnsupportedResourceError(f"{path} does not exist on this kernel")
        key, before = self._original_of(resource, current, text)
        if before is None:
            raise InvalidUpdateError(f"{resource.name}: this kernel has no feature {text.removeprefix('NO_')!r}")
        if before != text:
            if record:
                self.originals.record(key, before)
            self._write_file(resource.name, path, text)
        if record:
            self._cache[cache_key] = (text, now)
        return before != text

    @staticmethod
    def _original_of(resource: SystemResource, current: str, text: str) -> tuple[str, str | None]:
        """(record key, the file's current value in the form written) of one write."""
        if not resource.flags:
            return resource.name, current.strip()
        name = text.removeprefix("NO_")
        on = parse_sched_features(current).get(name)
        return f"{SCHED_FEATURES}:{name}", None if on is None else (name if on else f"NO_{name}")

    def restore_system(self, key: str) -> bool:
        """Write back what was there before koordlet's first write of ``key`` (a sysctl name, or
        ``sched_features:<NAME>``) and forget it; False when nothing was recorded. Raises ExecutorError."""
        original = self.originals.get(key)
        if original is None:
            return False
        name = key.partition(":")[0]
        resource = get_system_resource(name)
        path = self._system_path(resource, None)
        try:
            with self._lock:
                current = self._read_current(path)
                if current is None:
                    raise UnsupportedResourceError(f"{path} does not exist on this kernel")
                _, now_value = self._original_of(resource, current, original)
                if now_value != original:
                    self._write_file(resource.name, path, original)
                self._cache.pop(path, None)
                self._cache.pop(f"{path}\0{original.removeprefix('NO_')}", None)
        except ExecutorError as exc:
            metrics.count_update(name, exc.status)
            raise
        self.originals.forget(key)
        metrics.count_update(name, metrics.STATUS_WRITTEN)
        logger.info("restored %s to %s (its value before koordlet changed it)", key, original)
        return True

    def forget(self, cgroup_dir: str = "") -> None:
        """Drop cached writes of ``cgroup_dir`` and below in every hierarchy (all when empty), e.g. when a
        pod is gone or its cgroup was recreated, so the next update writes for sure."""
        marker = "/" + cgroup_dir.strip("/") + "/"
        with self._lock:
            if marker == "//":
                self._cache.clear()
                self._checked_paths.clear()
                self._reads.forget()
                return
            self._reads.forget(marker)
            for path in [p for p in self._cache if marker in p]:
                del self._cache[path]
            for key in [k for k, (p, _) in self._checked_paths.items() if marker in p]:
                del self._checked_paths[key]

    # ------------------------------------------------------------------------------------------ helpers

    def _run(self, updates: Sequence[ResourceUpdate], verify: bool = False) -> BatchResult:
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
            if not verify and not update.resource.per_device and self._wrote_recently(
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

    @classmethod
    def _require_file(cls, path: str) -> None:
        """Before a write: the file is there, or which of dir and file is missing. One stat when it is there."""
        if not os.path.exists(path):
            raise cls._missing(path)

    @staticmethod
    def _missing(path: str) -> ExecutorError:
        """What a missing cgroup file means: its dir is gone (pod gone or not made yet), or the kernel lacks it."""
        directory = os.path.dirname(path)
        if not os.path.isdir(directory):
            return CgroupNotFoundError(f"cgroup dir {directory} does not exist")
        return UnsupportedResourceError(f"{path} does not exist on this kernel")

    def _checked_path(self, resource: CgroupResource, cgroup_dir: str, subsystem: str | None) -> str:
        now = self._clock()
        key = (resource.name, cgroup_dir, subsystem)
        checked = self._checked_paths.get(key)
        if checked is not None and now - checked[1] < self.force_update_seconds:
            return checked[0]
        version = self.cgroup_fs.version
        file_name = resource.file_name(version)
        if file_name is None:
            raise InvalidUpdateError(f"{resource.name} has no cgroup v{int(version)} file")
        parts = _safe_parts(cgroup_dir)
        hierarchy = self.cgroup_fs.hierarchy_dir(subsystem or resource.subsystem)
        path = os.path.join(hierarchy, *parts, file_name)
        real_root = self._real_roots.get(hierarchy)
        if real_root is None:
            real_root = self._real_roots[hierarchy] = os.path.realpath(hierarchy)
        if not _inside(real_root, path):
            raise UnsafePathError(f"{path} resolves outside the cgroup hierarchy {hierarchy}")
        if len(self._checked_paths) >= _CACHE_MAX_ENTRIES:
            self._checked_paths.clear()
        self._checked_paths[key] = (path, now)
        return path

    def _resctrl_path(self, group: str, filename: str) -> str:
        if self.resctrl_root is None:
            raise UnsupportedResourceError("no resctrl root configured")
        if filename not in _RESCTRL_FILES:
            raise InvalidUpdateError(f"resctrl file must be one of {_RESCTRL_FILES}, got {filename!r}")
        if group and not _RESCTRL_GROUP.match(group):
            raise UnsafePathError(f"unsafe resctrl group name {group!r}")
        path = os.path.join(self.resctrl_root, group, filename) if group else os.path.join(self.resctrl_root, filename)
        if not _inside(os.path.realpath(self.resctrl_root), path):
            raise UnsafePathError(f"{path} resolves outside the resctrl root {self.resctrl_root}")
        if not os.path.exists(path):
            raise CgroupNotFoundError(f"{path} does not exist")
        return path

    def _write_target(self, target: _Target, v1_value: str, verify: bool = False) -> bool:
        """Translate, consult the cache (and with ``verify`` the file), write. Caller holds the lock."""
        content = v1_value
        resource = target.resource
        if self.cgroup_fs.version is CgroupVersion.V2 and resource.to_v2 is not None:
            current = self._read_current(target.path) if resource.v2_needs_current else None
            content = resource.to_file_value(v1_value, CgroupVersion.V2, current)
        now = self._clock()
        # A per-device file (blkio) holds one line per device, and on v2 io.max holds four resources: each
        # (resource, device) is cached on its own, and "verify" cannot compare a line with the whole file.
        per_device = resource.per_device
        key = f"{target.path}\0{resource.name}\0{device_of(v1_value)}" if per_device else target.path
        if (self._wrote_recently(key, content, now)
                and (not verify or (not per_device and self._read_current(target.path) == content))):
            metrics.count_update(target.resource.name, metrics.STATUS_SKIPPED)
            return False
        self._require_file(target.path)
        self._write_file(target.resource.name, target.path, content)
        self._cache.pop(key, None)
        self._cache[key] = (content, now)
        if len(self._cache) > _CACHE_MAX_ENTRIES:
            del self._cache[next(iter(self._cache))]
        metrics.count_update(target.resource.name, metrics.STATUS_WRITTEN)
        return True

    def _act(self, target: _Target) -> bool:
        """An action file (``memory.reclaim``): written every time, never cached, and outside the lock (the kernel
        may take a while, and no other write waits for it); EAGAIN is a :class:`PartialWriteError`."""
        self._require_file(target.path)
        try:
            self._write_file(target.resource.name, target.path, target.value)
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
        missing = self._missing(path)
        if isinstance(missing, CgroupNotFoundError):
            raise missing
        return False

    def _wrote_recently(self, key: str, content: str, now: float) -> bool:
        """The write cache's verdict: ``content`` went to ``key`` less than ``force_update_seconds`` ago."""
        cached = self._cache.get(key)
        return cached is not None and cached[0] == content and now - cached[1] < self.force_update_seconds

    def _write_file(self, resource_name: str, path: str, content: str) -> None:
        started = time.perf_counter()
        try:
            kernfs.write_nofollow(path, content)
        except OSError as exc:
            self._cache.pop(path, None)
            self._observe(resource_name, "failed", started)
            if exc.errno == errno.ELOOP:
                raise UnsafePathError(f"{path} is a symlink") from exc
            raise WriteFailedError(f"write {content!r} to {path}: {exc.strerror}", exc.errno) from exc
        self._observe(resource_name, "succeeded", started)
        logger.debug("wrote %r to %s", content, path)

    @staticmethod
    def _observe(resource_name: str, status: str, started: float) -> None:
        elapsed_ms = (time.perf_counter() - started) * 1000.0
        metrics.RESOURCE_UPDATE_DURATION_MS.labels(type=resource_name, status=status).observe(elapsed_ms)

    @staticmethod
    def _read_current(path: str) -> str | None:
        try:
            return kernfs.read_text(path)
        except OSError:
            return None

    def _log_unsupported(self, update: ResourceUpdate, exc: UnsupportedResourceError) -> None:
        key = (update.resource.name, update.subsystem or update.resource.subsystem)
        if key in self._warned_unsupported:
            logger.debug("%s", exc)
            return
        self._warned_unsupported.add(key)
        logger.warning("%s; skipping %s updates (logged once)", exc, update.resource.name)
