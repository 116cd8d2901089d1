"""The executor's resctrl writes: a group's ``schemata`` and ``tasks`` (never cached: a ``tasks`` write moves
threads and must happen every time it is asked for), and the groups themselves (mkdir, rmdir). Every group name
passes ``wire.kernel_ranges.resctrl_group_problem`` (the rule the hook value check applies to the names plugins
answer), and every path is checked to stay inside the resctrl root.

A group koordlet makes goes into the record of what it made (:class:`~koordlet.executor.records.NodeRecords`)
before its mkdir, never after: a group made but not recorded would never be removed (the collector and the pods'
removal go by the record), and each holds one of the CPU's few CLOSIDs (16 on many) for good; once they are used
up, new pods start without their RDT class. A group whose record cannot be written is not made."""

from __future__ import annotations

import errno
import logging
import os
import threading
import time

from koordlet.executor import metrics
from koordlet.executor.errors import (
    CgroupNotFoundError,
    ExecutorError,
    InvalidUpdateError,
    UnsafePathError,
    UnsupportedResourceError,
    WriteFailedError,
)
from koordlet.executor.files import RealRoots, write_file
from koordlet.executor.originals import Originals
from koordlet.system import kernfs
from wire.kernel_ranges import resctrl_group_problem

logger = logging.getLogger(__name__)

_RESCTRL_FILES = ("schemata", "tasks")
# The files the kernel makes in a resctrl control group (its mon_data/mon_groups dirs go with an rmdir too).
RESCTRL_GROUP_FILES = frozenset({"schemata", "tasks", "cpus", "cpus_list", "mode", "size"})
_GROUP_RESOURCE = "resctrl.group"


class ResctrlGroups:
    """The resctrl writes of one executor, below ``resctrl_root`` (None: no resctrl here). Thread-safe: file
    writes hold the executor's ``lock``."""

    def __init__(self, resctrl_root: str | None, lock: threading.Lock, roots: RealRoots, record: Originals) -> None:
        """``record``: the groups koordlet made (or took for a pod it serves), each with the time recorded."""
        self.resctrl_root = resctrl_root
        self._lock = lock
        self._roots = roots
        self._record = record

    def write(self, group: str, filename: str, value: str) -> None:
        """Write ``schemata`` or ``tasks`` of resctrl group ``group`` ("" = the root group)."""
        resource_name = f"resctrl.{filename}"
        try:
            path = self._file_path(group, filename)
            with self._lock:
                write_file(resource_name, path, value)
        except ExecutorError as exc:
            metrics.count_update(resource_name, exc.status)
            raise
        metrics.count_update(resource_name, metrics.STATUS_WRITTEN)

    def read(self, group: str, filename: str) -> str:
        """Content of ``schemata`` or ``tasks`` of resctrl group ``group``; "" when the group has no such file
        yet."""
        try:
            path = self._file_path(group, filename)
            return kernfs.read_raw(path)
        except (CgroupNotFoundError, FileNotFoundError):
            return ""
        except OSError as exc:
            raise ExecutorError(f"cannot read {path}: {exc.strerror}") from exc

    def remove(self, group: str) -> bool:
        """Remove resctrl group ``group`` (an rmdir in the resctrl fs; never the root group); True when it was
        removed, False when it did not exist. Move its tasks out first (the kernel would give them to the
        root group anyway).

        On resctrl the rmdir takes the group's files with it. A plain directory standing in for resctrl (a
        test tree) is not empty: its files are removed first only when every entry is a regular file with a
        name the kernel gives a group's files (``schemata``, ``tasks``, ``cpus`` …); anything else is refused
        (:class:`UnsafePathError`) and nothing is removed."""
        path = self._group_path(group)
        try:
            try:
                removed = kernfs.remove_dir(path)
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
                entries = kernfs.dir_entries(path)
                foreign = sorted(name for name, plain in entries if not plain or name not in RESCTRL_GROUP_FILES)
                if foreign:
                    metrics.count_update(_GROUP_RESOURCE, metrics.STATUS_UNSAFE_PATH)
                    raise UnsafePathError(f"not removing {path}: it holds {foreign}, not only a resctrl "
                                          "group's files") from exc
                for name, _ in entries:
                    kernfs.remove_file(os.path.join(path, name))
                removed = kernfs.remove_dir(path)
        except OSError as exc:
            metrics.count_update(_GROUP_RESOURCE, metrics.STATUS_FAILED)
            raise WriteFailedError(f"cannot remove resctrl group {path}: {exc.strerror}", exc.errno) from exc
        if removed:
            logger.debug("removed resctrl group %s", path)
            metrics.count_update(_GROUP_RESOURCE, metrics.STATUS_WRITTEN)
        return removed

    def ensure(self, group: str, take: bool = False) -> bool:
        """Create resctrl group ``group`` (a mkdir in the resctrl fs); True when it was created. Recorded first
        (module docstring): a group this call makes, and with ``take`` (a pod's own group) also one that was
        there. Raises WriteFailedError, and makes nothing, when the record cannot be written."""
        path = self._group_path(group)
        recorded_now = self._record.get(group) is None and (take or not os.path.isdir(path))
        if recorded_now and not self._record.record(group, f"{time.time():.0f}"):
            metrics.count_update(_GROUP_RESOURCE, metrics.STATUS_FAILED)
            raise WriteFailedError(f"resctrl group {path} not made: it cannot be recorded, and a group koordlet made "
                                   "without a record would never be removed", None)
        try:
            made = kernfs.make_dir(path)
        except OSError as exc:
            if recorded_now:
                self._record.forget(group)
            metrics.count_update(_GROUP_RESOURCE, metrics.STATUS_FAILED)
            raise WriteFailedError(f"cannot create resctrl group {path}: {exc}", exc.errno) from exc
        if not made:
            if recorded_now and not take:
                self._record.forget(group)  # made meanwhile by another: not koordlet's to remove
            return False
        logger.debug("created resctrl group %s", path)
        metrics.count_update(_GROUP_RESOURCE, metrics.STATUS_WRITTEN)
        return True

    def _root(self) -> str:
        if self.resctrl_root is None:
            raise UnsupportedResourceError("no resctrl root configured")
        return self.resctrl_root

    def _group_path(self, group: str) -> str:
        root = self._root()
        _check_name(group)
        return self._roots.check(root, os.path.join(root, group), "the resctrl root")

    def _file_path(self, group: str, filename: str) -> str:
        root = self._root()
        if filename not in _RESCTRL_FILES:
            raise InvalidUpdateError(f"resctrl file must be one of {_RESCTRL_FILES}, got {filename!r}")
        if group:
            _check_name(group)
        path = self._roots.check(root, os.path.join(root, group, filename), "the resctrl root")
        if not os.path.exists(path):
            raise CgroupNotFoundError(f"{path} does not exist")
        return path


def _check_name(group: str) -> None:
    """The name rule every resctrl group koordlet touches follows (``wire.kernel_ranges``, as the hook check)."""
    problem = resctrl_group_problem(group)
    if problem is not None:
        raise UnsafePathError(f"unsafe resctrl group name {group!r}: {problem}")
