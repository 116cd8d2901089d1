"""Block device resolution from sysfs (koordlet.system.blockdev): a fixture tree laid out as the kernel lays out
/sys/class/block (symlinks into /sys/devices, partitions under their disk, dm/name, dm/uuid, slaves), and this
machine's real /sys."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from koordlet.system.blockdev import BlockResolveError, lvm_names, read_storage_info


def _device(sys: Path, devices_path: str, number: str, *, partition: bool = False, dm: tuple[str, str] | None = None,
            slaves: tuple[str, ...] = ()) -> None:
    """One block device: its sysfs dir under devices/, and the class/block symlink to it."""
    real = sys / "devices" / devices_path
    real.mkdir(parents=True)
    (real / "dev").write_text(number + "\n")
    if partition:
        (real / "partition").write_text("1\n")
    if dm is not None:
        (real / "dm").mkdir()
        (real / "dm/name").write_text(dm[0] + "\n")
        (real / "dm/uuid").write_text(dm[1] + "\n")
    (real / "slaves").mkdir()
    for slave in slaves:
        (real / "slaves" / slave).symlink_to("../../../" + slave)
    link = sys / "class/block" / real.name
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(real, link.parent))


@pytest.fixture
def sys_tree(tmp_path: Path) -> Path:
    sys = tmp_path / "sys"
    _device(sys, "pci0000:00/0000:00:04.0/virtio1/block/vda", "254:0")
    _device(sys, "pci0000:00/0000:00:04.0/virtio1/block/vda/vda1", "254:1", partition=True)
    _device(sys, "pci0000:00/0000:00:04.0/virtio1/block/vda/vda2", "254:2", partition=True)
    _device(sys, "pci0000:00/0000:00:05.0/virtio2/block/vdb", "254:16")
    _device(sys, "pci0000:00/0000:00:06.0/virtio3/block/vdc", "254:32")
    _device(sys, "virtual/block/loop7", "7:7")
    _device(sys, "virtual/block/dm-0", "253:0", dm=("yoda--pool0-yoda--2c52", "LVM-abc"), slaves=("vda2",))
    _device(sys, "virtual/block/dm-1", "253:1", dm=("wide-lv1", "LVM-def"), slaves=("vdb", "vdc"))
    _device(sys, "virtual/block/dm-2", "253:2", dm=("cryptroot", "CRYPT-LUKS2-x"), slaves=("vdb",))
    return sys


def test_devices_resolve_to_their_whole_disk(sys_tree: Path) -> None:
    storage = read_storage_info(str(sys_tree))
    assert storage.device_number("/dev/vda") == "254:0"
    assert storage.device_number("/dev/vda1") == "254:0"  # a partition: its disk
    assert storage.device_number("vdb") == "254:16"
    assert storage.device_number("/dev/loop7") == "7:7"
    assert storage.device_number("/dev/mapper/yoda--pool0-yoda--2c52") == "253:0"  # a dm device is whole
    assert storage.devices["dm-2"].volume_group == ""  # not LVM


def test_a_volume_group_resolves_to_the_disk_under_it(sys_tree: Path) -> None:
    storage = read_storage_info(str(sys_tree))
    assert storage.volume_group_number("yoda-pool0") == "254:0"  # LV on vda2 → vda
    with pytest.raises(BlockResolveError, match="spans 2 disks"):
        storage.volume_group_number("wide")
    with pytest.raises(BlockResolveError, match="no active logical volume"):
        storage.volume_group_number("cryptroot")


@pytest.mark.parametrize("name", ["/dev/sdz", "/dev/disk/by-id/x", "", "/dev/mapper/nope", "../vda"])
def test_unknown_names_are_errors_never_guesses(sys_tree: Path, name: str) -> None:
    with pytest.raises(BlockResolveError):
        read_storage_info(str(sys_tree)).device_number(name)


def test_lvm_dm_names_split_at_the_first_single_dash() -> None:
    assert lvm_names("yoda--pool0-yoda--2c52") == ("yoda-pool0", "yoda-2c52")
    assert lvm_names("vg-lv") == ("vg", "lv")
    assert lvm_names("a--b--c-d--e") == ("a-b-c", "d-e")


def test_this_machines_sysfs_lists_its_disks() -> None:
    storage = read_storage_info("/sys")
    disks = [d for d in storage.devices.values() if d.disk == d.name]
    assert disks, "no block device at all under /sys/class/block"
    for disk in disks:
        major, minor = (Path("/sys/class/block") / disk.name / "dev").read_text().strip().split(":")
        assert storage.device_number(f"/dev/{disk.name}") == f"{major}:{minor}"
    assert read_storage_info("/nonexistent").devices == {}
