"""Where the kernel filesystems are: the one root convention of :mod:`koordlet.system`.

Every reader and writer in ``koordlet.system`` takes the directory where its filesystem is mounted, never a
host root to which it appends ``sys`` or ``proc``. The parameter names are the same everywhere:

  ``proc_dir``          procfs            ``/proc``            (-proc-root-dir)
  ``sys_dir``           sysfs             ``/sys``             (-sys-root-dir)
  ``cgroup_mount_dir``  the cgroup mounts ``/sys/fs/cgroup``   (-cgroup-root-dir; ``cgroup_dir`` is one cgroup)
  ``resctrl_dir``       resctrl           ``/sys/fs/resctrl``  (-sys-fs-root-dir + ``resctrl``)
  ``dev_dir``           devtmpfs          ``/dev``

A fixture tree is therefore ``HostDirs.under(tmp_path)``, and a DaemonSet with the host's filesystems
mounted elsewhere is ``HostDirs.from_flags(...)`` with Koordinator's flag values. Code above ``system``
gets these directories from here (or from the caller) and hands them back to ``system`` functions; it never
spells a kernel path itself (tests/test_layering.py checks it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

PROC_DIR = "/proc"
SYS_DIR = "/sys"
CGROUP_MOUNT_DIR = "/sys/fs/cgroup"
RESCTRL_DIR = "/sys/fs/resctrl"
DEV_DIR = "/dev"


def _dir(path: str) -> str:
    """A flag value as a directory: trailing slashes dropped (``/proc/`` → ``/proc``), ``/`` kept."""
    return os.path.normpath(path) if path else path


@dataclass(frozen=True, slots=True)
class HostDirs:
    """The mount directories of the kernel filesystems koordlet reads and writes."""

    proc_dir: str = PROC_DIR
    sys_dir: str = SYS_DIR
    cgroup_mount_dir: str = CGROUP_MOUNT_DIR
    resctrl_dir: str = RESCTRL_DIR
    dev_dir: str = DEV_DIR

    @classmethod
    def from_flags(
        cls,
        *,
        proc_root_dir: str = PROC_DIR,
        sys_root_dir: str = SYS_DIR,
        sys_fs_root_dir: str = os.path.dirname(CGROUP_MOUNT_DIR),
        cgroup_root_dir: str = CGROUP_MOUNT_DIR,
        dev_dir: str = DEV_DIR,
    ) -> HostDirs:
        """From koordlet's flags (Koordinator's names): resctrl is ``<-sys-fs-root-dir>/resctrl``."""
        return cls(
            proc_dir=_dir(proc_root_dir),
            sys_dir=_dir(sys_root_dir),
            cgroup_mount_dir=_dir(cgroup_root_dir),
            resctrl_dir=os.path.join(_dir(sys_fs_root_dir), "resctrl"),
            dev_dir=_dir(dev_dir),
        )

    @classmethod
    def under(cls, root: str) -> HostDirs:
        """The standard layout below ``root`` (a fixture tree, or ``/``)."""
        return cls(*(os.path.join(root, path.lstrip("/")) for path in
                     (PROC_DIR, SYS_DIR, CGROUP_MOUNT_DIR, RESCTRL_DIR, DEV_DIR)))
