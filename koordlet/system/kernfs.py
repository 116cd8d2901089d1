"""The file operations on kernel pseudo-filesystems (cgroupfs, resctrl) the executor is built on.

The executor decides which path is safe and which value is valid; these do the syscalls, so that every
open of a kernel file happens in ``koordlet/system``. Errors are the ``OSError`` the kernel gave. Reads
are plain ``os.open``/``os.read``/``os.close``: ``open()`` in text mode costs twice as much on a small
cgroup file (15–18 µs against 7–9 µs here), and the QoS manager reads hundreds of them a second.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable

from koordlet.system.procfs import (
    SHARE_KEPT_READS,
    KeptFiles,
    descriptor_budget,
    dir_markers,
    read_file_bytes,
    under,
)


def read_text(path: str) -> str:
    """The file's content, stripped (cgroup and resctrl files end in a newline)."""
    return read_file_bytes(path).decode("ascii", "replace").strip()


class KeptReads:
    """Files read again and again, every tick, by several threads (the QoS snapshot's cgroup reads), each
    through a kept descriptor and ``pread``: about 2 µs a read instead of 7–9.

    A lock and an idle sweep around :class:`~koordlet.system.procfs.KeptFiles`, which reads what opening the
    path now would (a removed cgroup or a replaced file is reopened once; a path that is gone raises
    FileNotFoundError). A descriptor pins its cgroup in the kernel, so descriptors not read for ``idle_s``
    are closed (swept at most once per ``idle_s``), and at most ``max_open`` are kept (default: an eighth of
    the soft RLIMIT_NOFILE); beyond that, files are read with plain open/read/close. Thread-safe.
    """

    def __init__(self, idle_s: float = 5.0, max_open: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if max_open is None:
            max_open = descriptor_budget(SHARE_KEPT_READS, 128)
        self._files = KeptFiles(max_open, check_replaced=True)
        self._idle_s = idle_s
        self._clock = clock
        self._lock = threading.Lock()
        self._used: dict[str, float] = {}  # path → when it was last read
        self._swept = clock()

    def __len__(self) -> int:
        return len(self._files)

    def read_text(self, path: str) -> str:
        """The file's content, stripped, as :func:`read_text` gives it."""
        return self.read_bytes(path).decode("ascii", "replace").strip()

    def read_bytes(self, path: str) -> bytes:
        with self._lock:
            now = self._clock()
            if now - self._swept >= self._idle_s:
                self._forget([p for p, used in self._used.items() if used < now - self._idle_s])
                self._swept = now
            self._used[path] = now
            return self._files.read(path)

    def forget(self, marker: str = "") -> None:
        """Close the descriptors of paths containing ``marker`` (all when empty)."""
        with self._lock:
            self._forget([p for p in self._used if marker in p])

    def forget_under(self, cgroup_dirs: Iterable[str]) -> None:
        """Close the descriptors of files below any of ``cgroup_dirs`` (relative to their hierarchy): their pod is
        gone, and a descriptor would pin its removed cgroup until the next idle sweep, which needs a read."""
        markers = dir_markers(cgroup_dirs)
        with self._lock:
            self._forget([path for path in self._used if under(path, markers)])

    def close(self) -> None:
        self.forget()

    def _forget(self, paths: list[str]) -> None:
        self._files.forget(paths)
        for path in paths:
            del self._used[path]


def read_raw(path: str) -> str:
    """The file's content as it is (a resctrl ``tasks`` list, one ID per line)."""
    return read_file_bytes(path).decode("ascii", "replace")


def write_nofollow(path: str, content: str) -> None:
    """One write of ``content`` to an existing file, never through a symlink (``O_NOFOLLOW``: ELOOP).

    A zero-length write never reaches the kernel's handler; "\\n" is how ``echo`` clears a cpuset, so an
    empty ``content`` is written as that.
    """
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.write(fd, content.encode() or b"\n")
    finally:
        os.close(fd)


def make_dir(path: str) -> bool:
    """mkdir (a new cgroup or resctrl group); False when it exists."""
    try:
        os.mkdir(path)
    except FileExistsError:
        return False
    return True


def remove_dir(path: str) -> bool:
    """rmdir (a cgroup or a resctrl group: the kernel removes its own files with it); False when missing."""
    try:
        os.rmdir(path)
    except FileNotFoundError:
        return False
    return True


def dir_entries(path: str) -> list[tuple[str, bool]]:
    """(name, is a regular file, not a symlink) of each entry of ``path``."""
    with os.scandir(path) as entries:
        return [(entry.name, entry.is_file(follow_symlinks=False)) for entry in entries]


def remove_file(path: str) -> None:
    """unlink one file (never follows a symlink: unlink removes the link itself)."""
    os.unlink(path)
