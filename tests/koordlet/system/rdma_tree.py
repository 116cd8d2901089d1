"""A fixture sysfs and /dev of an RDMA node, laid out as the kernel and the mlx5 driver write them (no RDMA
hardware here): a dual-port Mellanox ConnectX-5 (15b3:1017) at 0000:3b:00.0/.1 under root complex pci0000:3a,
port 0 with SR-IOV on (two VFs, 15b3:1018, at 0000:3b:00.2/.3), port 1 without; a plain NIC without RDMA
(8086:1533) and an NVMe drive (class 0x010802).

- ``/sys/devices/pci0000:3a/0000:3a:00.0/<bus id>/`` holds ``class``, ``vendor``, ``device``, ``numa_node``,
  ``sriov_numvfs``/``sriov_totalvfs`` (PFs), ``virtfn<i>`` -> the VF and ``physfn`` -> the PF,
  ``infiniband/mlx5_<n>/`` and ``infiniband_verbs/uverbs<n>/``; ``/sys/bus/pci/devices/<bus id>`` links to it;
- ``/sys/class/infiniband/mlx5_<n>`` links to the device's ``infiniband/mlx5_<n>``, whose
  ``ports/1/state`` reads ``4: ACTIVE`` (``1: DOWN`` for a port without link);
- ``/dev/infiniband/rdma_cm`` (misc major 10) and ``uverbs<n>`` (major 231, minor 192 + n) are character
  device nodes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

ROOT_COMPLEX = "pci0000:3a"
BRIDGE = "0000:3a:00.0"
PF0, PF1, VF0, VF1 = "0000:3b:00.0", "0000:3b:00.1", "0000:3b:00.2", "0000:3b:00.3"
NIC, NVME = "0000:00:03.0", "0000:5e:00.0"
RDMA_CM_NUMBERS = (10, 58)
UVERBS_MAJOR = 231


@dataclass(frozen=True)
class Function:
    bus_id: str
    pci_class: str
    vendor: str
    device: str
    ibdev: str = ""  # mlx5_<n>; "" without RDMA
    uverbs: int = -1
    state: str = "4: ACTIVE"
    physfn: str = ""
    numvfs: int = -1  # -1: not an SR-IOV PF


FUNCTIONS = (
    Function(PF0, "0x020000", "0x15b3", "0x1017", "mlx5_0", 0, numvfs=2),
    Function(PF1, "0x020000", "0x15b3", "0x1017", "mlx5_1", 1, state="1: DOWN", numvfs=0),
    Function(VF0, "0x020000", "0x15b3", "0x1018", "mlx5_2", 2, physfn=PF0),
    Function(VF1, "0x020000", "0x15b3", "0x1018", "mlx5_3", 3, physfn=PF0),
    Function(NIC, "0x020000", "0x8086", "0x1533"),
    Function(NVME, "0x010802", "0x144d", "0xa808"),
)


def rdma_tree(root: Path, numa_node: int = 1, dev_nodes: bool = True) -> tuple[str, str]:
    """Write the node under ``root``; returns (sys dir, dev dir). ``dev_nodes``: make the /dev nodes (root)."""
    sys_dir, dev_dir = root / "sys", root / "dev"
    devices = sys_dir / "devices" / ROOT_COMPLEX / BRIDGE
    bus = sys_dir / "bus/pci/devices"
    ib_class = sys_dir / "class/infiniband"
    for path in (devices, bus, ib_class, dev_dir / "infiniband"):
        path.mkdir(parents=True, exist_ok=True)
    for fn in FUNCTIONS:
        device_dir = (sys_dir / "devices/pci0000:00" / fn.bus_id) if fn.bus_id in (NIC,) else devices / fn.bus_id
        device_dir.mkdir(parents=True)
        for name, value in (("class", fn.pci_class), ("vendor", fn.vendor), ("device", fn.device),
                            ("numa_node", str(numa_node))):
            (device_dir / name).write_text(value + "\n")
        if fn.numvfs >= 0:
            (device_dir / "sriov_numvfs").write_text(f"{fn.numvfs}\n")
            (device_dir / "sriov_totalvfs").write_text("8\n")
        os.symlink(os.path.relpath(device_dir, bus), bus / fn.bus_id)
        if fn.ibdev:
            ib_dir = device_dir / "infiniband" / fn.ibdev
            (ib_dir / "ports/1").mkdir(parents=True)
            (ib_dir / "ports/1/state").write_text(fn.state + "\n")
            (device_dir / "infiniband_verbs" / f"uverbs{fn.uverbs}").mkdir(parents=True)
            os.symlink(os.path.relpath(ib_dir, ib_class), ib_class / fn.ibdev)
            if dev_nodes:
                os.mknod(dev_dir / "infiniband" / f"uverbs{fn.uverbs}", 0o20666,
                         os.makedev(UVERBS_MAJOR, 192 + fn.uverbs))
    for index, vf in enumerate((VF0, VF1)):
        os.symlink(f"../{vf}", devices / PF0 / f"virtfn{index}")
        os.symlink(f"../{PF0}", devices / vf / "physfn")
    if dev_nodes:
        os.mknod(dev_dir / "infiniband/rdma_cm", 0o20666, os.makedev(*RDMA_CM_NUMBERS))
    return str(sys_dir), str(dev_dir)
