"""Where the cgroup hierarchies are: version (v1/v2) and kubelet cgroup driver detection (docs/koordinator.md §8.2).

Every function takes the cgroup mount dir ``cgroup_mount_dir`` (default ``/sys/fs/cgroup``;
:mod:`koordlet.system.roots`) so tests point it at a fixture tree. Version detection looks that dir up in
``<proc_dir>/self/mountinfo`` rather than calling statfs: it gives the same answer for the live system (the
filesystem type of the mount), works for a fixture tree, and needs no ctypes. The agent reads its own
``/proc/self/mountinfo`` (the default ``proc_dir``), not ``-proc-root-dir``'s: the mount dir is a path in
the agent's own mount namespace.
"""

from __future__ import annotations

import enum
import logging
import os
from dataclasses import dataclass

from koordlet.system.roots import CGROUP_MOUNT_DIR, PROC_DIR

logger = logging.getLogger(__name__)

MOUNTINFO = "self/mountinfo"


class CgroupVersion(enum.IntEnum):
    V1 = 1
    V2 = 2


class CgroupDriver(enum.StrEnum):
    CGROUPFS = "cgroupfs"
    SYSTEMD = "systemd"


@dataclass(frozen=True, slots=True)
class MountInfo:
    mount_point: str
    fs_type: str
    super_options: str


def _unescape_mount_field(text: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \040, \011, \012, \134.
    if "\\" not in text:
        return text
    out: list[str] = []
    index = 0
    while index < len(text):
        chunk = text[index : index + 4]
        if len(chunk) == 4 and chunk[0] == "\\" and all(c in "01234567" for c in chunk[1:]):
            out.append(chr(int(chunk[1:], 8)))
            index += 4
        else:
            out.append(text[index])
            index += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[MountInfo]:
    """Mounts of a ``/proc/<pid>/mountinfo`` text; malformed lines are skipped."""
    mounts: list[MountInfo] = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 10 or "-" not in fields[6:]:
            continue
        separator = fields.index("-", 6)
        if separator + 3 > len(fields):
            continue
        mounts.append(
            MountInfo(
                mount_point=_unescape_mount_field(fields[4]),
                fs_type=fields[separator + 1],
                super_options=fields[separator + 3] if separator + 3 < len(fields) else "",
            )
        )
    return mounts


def detect_cgroup_version(cgroup_mount_dir: str = CGROUP_MOUNT_DIR, proc_dir: str = PROC_DIR) -> CgroupVersion:
    """V2 when ``cgroup_mount_dir`` is a cgroup2 filesystem in ``<proc_dir>/self/mountinfo``, else V1.

    A missing mountinfo (a bare fixture tree) counts as V1. The last mount on a mount point wins, as in
    the kernel's view of overmounts.
    """
    target = os.path.normpath("/" + cgroup_mount_dir.strip("/"))
    try:
        with open(os.path.join(proc_dir, MOUNTINFO), encoding="utf-8", errors="replace") as f:
            mounts = parse_mountinfo(f.read())
    except FileNotFoundError:
        logger.debug("no mountinfo under %s; assuming cgroup v1", proc_dir)
        return CgroupVersion.V1
    fs_type = ""
    for mount_entry in mounts:
        if mount_entry.mount_point == target:
            fs_type = mount_entry.fs_type
    return CgroupVersion.V2 if fs_type == "cgroup2" else CgroupVersion.V1


@dataclass(frozen=True, slots=True)
class CgroupFS:
    """The cgroup hierarchies of a host: ``<mount_dir>/<subsystem>/`` on v1, ``<mount_dir>/`` on v2.

    ``mount_dir`` is the cgroup mount dir (``cgroup_mount_dir`` elsewhere). Cgroup dirs handed to
    :meth:`cgroup_dir` are relative to a hierarchy root (a leading ``/`` is allowed, as in CRI cgroup
    parents); they are not checked here — the executor checks every path it writes.
    """

    mount_dir: str = CGROUP_MOUNT_DIR
    version: CgroupVersion = CgroupVersion.V1

    @classmethod
    def detect(cls, cgroup_mount_dir: str = CGROUP_MOUNT_DIR, proc_dir: str = PROC_DIR) -> CgroupFS:
        return cls(mount_dir=cgroup_mount_dir, version=detect_cgroup_version(cgroup_mount_dir, proc_dir))

    def hierarchy_dir(self, subsystem: str) -> str:
        """Root of the hierarchy holding ``subsystem`` (v2: the unified root for every subsystem)."""
        if self.version is CgroupVersion.V2:
            return self.mount_dir
        return os.path.join(self.mount_dir, subsystem)

    def cgroup_dir(self, subsystem: str, rel_dir: str) -> str:
        """Absolute path of cgroup ``rel_dir`` in the hierarchy of ``subsystem``."""
        rel = rel_dir.strip("/")
        base = self.hierarchy_dir(subsystem)
        return os.path.join(base, rel) if rel else base


def host_cgroup_dir(subsystem: str, rel_dir: str) -> str:
    """A cgroup v1 dir as a process on the host names it (``/sys/fs/cgroup/<subsystem>/<rel>``), for files
    another host daemon reads (Terway's pod.json), whatever mount dir koordlet itself reads through."""
    return os.path.join(CGROUP_MOUNT_DIR, subsystem, rel_dir.strip("/"))


def detect_cgroup_driver(cgroup_fs: CgroupFS, cgroup_root: str = "/") -> CgroupDriver:
    """systemd when ``kubepods.slice`` exists under the cpu hierarchy (+ kubelet ``--cgroup-root``),
    cgroupfs when ``kubepods`` does, else cgroupfs (docs/koordinator.md §8.2).

    Koordinator also asks the kubelet process (``--cgroup-driver`` / its config file) when neither dir
    exists yet; we do not, because the dir appears as soon as kubelet starts and the reconciler re-detects.
    """
    base = cgroup_fs.cgroup_dir("cpu", cgroup_root)
    if os.path.isdir(os.path.join(base, "kubepods.slice")):
        return CgroupDriver.SYSTEMD
    if not os.path.isdir(os.path.join(base, "kubepods")):
        logger.debug("no kubepods dir under %s; assuming the cgroupfs driver", base)
    return CgroupDriver.CGROUPFS
