"""The node's block devices as sysfs shows them, and how a NodeSLO ``blkioQOS`` block name resolves to the
``MAJ:MIN`` the blkio files take (docs/koordinator.md §4.8; Koordinator pkg/koordlet/util storageinfo.go).

Koordinator runs ``lsblk``, ``vgs`` and ``lvs``; the same facts are in sysfs, which needs no tools in the agent's
image: ``/sys/class/block/<name>/dev`` (the number), ``.../partition`` (a partition; its disk is the parent
directory), ``.../dm/name`` and ``.../dm/uuid`` (device-mapper; ``LVM-`` for LVM), ``.../slaves/`` (what a dm
device sits on).

Resolution (:meth:`StorageInfo.resolve`), never a guess — a name that does not resolve is an error that says why:
- ``device``: ``/dev/<name>`` (or ``<name>``) or ``/dev/mapper/<dm name>``; a partition resolves to its disk (the
  throttle files take whole devices), a disk, loop or device-mapper device to itself;
- ``volumegroup``: the disk under the group's active logical volumes (their dm ``slaves``, a partition taken to
  its disk); a group over more than one disk is refused, as Koordinator refuses ``pv_count`` > 1, and a group
  with no active logical volume cannot be seen (it has no I/O to throttle either).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from koordlet.system.procfs import read_file_bytes

_NUMBER = re.compile(r"^\d+:\d+$")


class BlockResolveError(ValueError):
    """A block name does not resolve to one device on this node."""


@dataclass(frozen=True, slots=True)
class BlockDevice:
    name: str  # kernel name: sda, sda1, loop7, dm-0
    number: str  # "8:0"
    disk: str  # the whole device it belongs to (itself unless a partition)
    dm_name: str = ""  # device-mapper name (LVM: "<vg>-<lv>" with "-" doubled inside the names)
    volume_group: str = ""  # LVM volume group of a logical volume
    slaves: tuple[str, ...] = ()


def lvm_names(dm_name: str) -> tuple[str, str]:
    """(volume group, logical volume) of an LVM dm name: split at the first "-" that is not doubled."""
    index = 0
    while index < len(dm_name):
        if dm_name[index] == "-":
            if dm_name[index + 1: index + 2] == "-":
                index += 2
                continue
            return dm_name[:index].replace("--", "-"), dm_name[index + 1:].replace("--", "-")
        index += 1
    return dm_name.replace("--", "-"), ""


@dataclass(frozen=True, slots=True)
class StorageInfo:
    """Every block device of the node, by kernel name."""

    devices: Mapping[str, BlockDevice] = field(default_factory=lambda: MappingProxyType({}))

    def _by_dev_name(self, name: str) -> BlockDevice:
        path = name.removeprefix("/dev/")
        if path.startswith("mapper/"):
            dm_name = path.removeprefix("mapper/")
            for device in self.devices.values():
                if device.dm_name and device.dm_name == dm_name:
                    return device
            raise BlockResolveError(f"no device-mapper device {dm_name!r}")
        if "/" in path or not path:
            raise BlockResolveError(f"{name!r}: name a device as /dev/<name> or /dev/mapper/<name>")
        device = self.devices.get(path)
        if device is None:
            raise BlockResolveError(f"no block device {name!r} on this node")
        return device

    def device_number(self, name: str) -> str:
        """MAJ:MIN of the whole device ``name`` is (or is a partition of)."""
        device = self._by_dev_name(name)
        disk = self.devices.get(device.disk)
        if disk is None:
            raise BlockResolveError(f"{name!r}: its disk {device.disk!r} is not listed")
        return disk.number

    def volume_group_number(self, group: str) -> str:
        """MAJ:MIN of the one disk under volume group ``group``'s active logical volumes."""
        volumes = [d for d in self.devices.values() if d.volume_group == group]
        if not volumes:
            raise BlockResolveError(f"no active logical volume of volume group {group!r} (LVM not here, or the "
                                    "group has none active)")
        disks = set()
        for volume in volumes:
            for slave in volume.slaves:
                under = self.devices.get(slave)
                if under is None:
                    raise BlockResolveError(f"volume group {group!r}: {slave!r} is not listed")
                disks.add(under.disk)
        if len(disks) != 1:
            raise BlockResolveError(f"volume group {group!r} spans {len(disks)} disks ({', '.join(sorted(disks))}); "
                                    "only a group on one disk can be throttled")
        return self.devices[disks.pop()].number


def _read(path: str) -> str | None:
    try:
        return read_file_bytes(path).decode("ascii", "replace").strip()
    except OSError:
        return None


def _read_device(class_dir: str, name: str) -> BlockDevice | None:
    entry = os.path.join(class_dir, name)
    number = _read(os.path.join(entry, "dev"))
    if number is None or not _NUMBER.match(number):
        return None
    disk = name
    if os.path.exists(os.path.join(entry, "partition")):
        disk = os.path.basename(os.path.dirname(os.path.realpath(entry)))
    dm_name = _read(os.path.join(entry, "dm", "name")) or ""
    uuid = _read(os.path.join(entry, "dm", "uuid")) or ""
    group = lvm_names(dm_name)[0] if dm_name and uuid.startswith("LVM-") else ""
    try:
        slaves = tuple(sorted(os.listdir(os.path.join(entry, "slaves"))))
    except OSError:
        slaves = ()
    return BlockDevice(name, number, disk, dm_name, group, slaves)


def read_storage_info(sys_dir: str, *, strict: bool = False) -> StorageInfo:
    """The block devices under ``<sys_dir>/class/block`` (an empty StorageInfo when it cannot be listed, or
    with ``strict`` an OSError)."""
    class_dir = os.path.join(sys_dir, "class", "block")
    try:
        names = sorted(os.listdir(class_dir))
    except OSError:
        if strict:
            raise
        return StorageInfo()
    devices = {}
    for name in names:
        device = _read_device(class_dir, name)
        if device is not None:
            devices[name] = device
    return StorageInfo(MappingProxyType(devices))
