"""The file operations on kernel pseudo-filesystems (cgroupfs, resctrl) the executor is built on.

The executor decides which path is safe and which value is valid; these do the syscalls, so that every
open of a kernel file happens in ``koordlet/system``. Errors are the ``OSError`` the kernel gave.
"""

from __future__ import annotations

import os


def read_text(path: str) -> str:
    """The file's content, stripped (cgroup and resctrl files end in a newline)."""
    with open(path, encoding="ascii", errors="replace") as f:
        return f.read().strip()


def read_raw(path: str) -> str:
    """The file's content as it is (a resctrl ``tasks`` list, one ID per line)."""
    with open(path, encoding="ascii", errors="replace") as f:
        return f.read()


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
