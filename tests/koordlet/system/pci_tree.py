"""A fixture sysfs PCI tree: a device under its bridge in /sys/devices and its link in /sys/bus/pci/devices."""

from __future__ import annotations

import os
from pathlib import Path


def pci_tree(root: Path, bus_id: str, numa: str, bridge: str = "0000:00:01.0") -> None:
    device_dir = root / "sys/devices/pci0000:00" / bridge / bus_id
    device_dir.mkdir(parents=True)
    (device_dir / "numa_node").write_text(numa + "\n")
    links = root / "sys/bus/pci/devices"
    links.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(device_dir, links), links / bus_id)
