"""What koordlet made or changed on the node beyond a pod's own cgroup values, kept so that it can be collected or
put back, also by the agent that starts after a crash (ARCHITECTURE.md, "What koordlet makes on the node").

- ``resctrl_groups``: the resctrl control groups koordlet made (a class group LSR/LS/BE when its mkdir created it;
  a pod's ``koordlet-<pod uid>`` group whenever koordlet made it or took it for a pod it serves), each with the
  wall-clock time it was recorded. Removed groups are forgotten. The collector removes only groups in this record
  (:mod:`koordlet.collector`), so a group of another tool, even one named ``koordlet-*``, is never touched.
- ``host_dirs``: the host directories koordlet made for a container's mounts (HAMi-core's cache dirs), each with
  its pod's uid and the time (``"<uid> <unix time>"``), so they go when the pod goes (:mod:`koordlet.hostdirs`).
- ``device_lines``: for each per-device blkio line koordlet wrote (``resource``, cgroup dir, ``MAJ:MIN``), what that
  device's line held before koordlet's first write (``""``: the file had no line for the device), so the line can
  be put back when no block configures it any more or the gate goes off (:mod:`koordlet.executor.lines`).

All three are :class:`~koordlet.executor.originals.Originals` records: bounded, written atomically, a file that
cannot be read back set aside. They live beside the sysctl record (``-system-config-record-file``, on tmpfs under
``/var/run/koordlet`` by default): resctrl groups and cgroup files end with a reboot, and so does the record.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from koordlet.executor.originals import Originals
from koordlet.plan import LineKey

RESCTRL_GROUPS_FILE = "resctrl-groups.json"
DEVICE_LINES_FILE = "blkio-originals.json"
HOST_DIRS_FILE = "host-dirs.json"
MAX_RESCTRL_GROUPS = 1024  # far above the CLOSIDs a CPU has (16 on many), which bound the groups
MAX_DEVICE_LINES = 4096  # 5 files × devices × (the besteffort dir, the root, annotated pods and their containers)
MAX_HOST_DIRS = 4096  # one per container with a HAMi-core GPU share


def _resctrl_groups(path: str | None) -> Originals:
    return Originals(path, kind="koordlet-resctrl-groups", label="resctrl group record", max_entries=MAX_RESCTRL_GROUPS)


def _device_lines(path: str | None) -> Originals:
    return Originals(path, kind="koordlet-blkio-originals", label="blkio line record", max_entries=MAX_DEVICE_LINES)


def _host_dirs(path: str | None) -> Originals:
    return Originals(path, kind="koordlet-host-dirs", label="host dir record", max_entries=MAX_HOST_DIRS)


@dataclass(frozen=True, slots=True)
class NodeRecords:
    """The records of one agent (in memory only unless built by :meth:`beside`)."""

    resctrl_groups: Originals = field(default_factory=lambda: _resctrl_groups(None))
    device_lines: Originals = field(default_factory=lambda: _device_lines(None))
    host_dirs: Originals = field(default_factory=lambda: _host_dirs(None))

    @classmethod
    def beside(cls, record_file: str | None) -> NodeRecords:
        """Records kept in files in the directory of ``record_file`` (the sysctl record); in memory without one."""
        if not record_file:
            return cls()
        directory = os.path.dirname(record_file) or "."
        return cls(_resctrl_groups(os.path.join(directory, RESCTRL_GROUPS_FILE)),
                   _device_lines(os.path.join(directory, DEVICE_LINES_FILE)),
                   _host_dirs(os.path.join(directory, HOST_DIRS_FILE)))


def recorded_lines(records: NodeRecords) -> dict[LineKey, str]:
    """The recorded lines: key → the line before koordlet's first write ("" = none)."""
    lines = {}
    for text, original in records.device_lines.items().items():
        key = LineKey.parse(text)
        if key is not None:
            lines[key] = original
    return lines
