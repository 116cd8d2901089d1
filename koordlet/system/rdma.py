"""RDMA devices from sysfs and their device nodes (Koordinator metricsadvisor/devices/rdma, util/system/rdma.go
and sriov.go; runtimehooks/hooks/rdma).

The kernel's layout: a network PCI function (``class`` 0x02xxxx) under ``bus/pci/devices/<bus id>`` with an RDMA
device has ``infiniband/<ibdev>`` (``mlx5_0``) and ``infiniband_verbs/uverbs<N>``; a physical function (PF)
with SR-IOV on has ``sriov_numvfs`` > 0 and a ``virtfn<i>`` link per virtual function (VF), and each VF a
``physfn`` link back. The device's NUMA node is its ``numa_node`` (-1, "the platform does not say", counts as 0
as in Koordinator) and its PCIe root complex the ``pci<domain>:<bus>`` component of its path under
``/sys/devices``. The ports' ``class/infiniband/<ibdev>/ports/<n>/state`` (``4: ACTIVE``) tell its health.

Device nodes: ``/dev/infiniband/rdma_cm`` (the connection manager every RDMA user needs) and
``/dev/infiniband/uverbs<N>`` of each function; :func:`device_node` gives a node's type and numbers for a
container runtime.
"""

from __future__ import annotations

import logging
import os
import re
import stat
from dataclasses import dataclass

from koordlet.system.roots import DEV_DIR, SYS_DIR

logger = logging.getLogger(__name__)

PCI_DEVICES = ("bus", "pci", "devices")
INFINIBAND_CLASS = ("class", "infiniband")
INFINIBAND_DEV_DIR = "infiniband"  # under /dev
RDMA_CM = "rdma_cm"
_NET_CLASS = 0x02
_PCIE_ROOT = re.compile(r"pci[0-9a-fA-F]{4}:[0-9a-fA-F]{2}")
_MLX_MINOR = re.compile(r"^mlx\d+_(\d+)$")
_TRAILING_NUMBER = re.compile(r"(\d+)$")
_VIRTFN = re.compile(r"^virtfn(\d+)$")
_STATE_ACTIVE = "ACTIVE"


@dataclass(frozen=True, slots=True)
class RDMAFunction:
    """One PCI function (PF or VF) with RDMA: its bus id, RDMA devices and uverbs device names."""

    bus_id: str
    ib_devices: tuple[str, ...]
    uverbs: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RDMADevice:
    """A physical function with RDMA (what the Device object lists), with its VFs when SR-IOV is on."""

    bus_id: str
    minor: int
    ib_devices: tuple[str, ...]
    uverbs: tuple[str, ...]
    vendor: str
    device: str
    numa_node: int
    pcie_root: str
    healthy: bool
    vfs: tuple[RDMAFunction, ...] = ()
    vf_enabled: bool = False


def _read(path: str) -> str:
    with open(path, encoding="ascii", errors="replace") as f:
        return f.read().strip()


def _entries(path: str) -> tuple[str, ...]:
    try:
        return tuple(sorted(os.listdir(path)))
    except OSError:
        return ()


def rdma_minor(ib_device: str) -> int | None:
    """The minor Koordinator gives an RDMA device: the N of ``mlx<k>_<N>``; other vendors' trailing number."""
    match = _MLX_MINOR.match(ib_device) or _TRAILING_NUMBER.search(ib_device)
    return int(match.group(1)) if match else None


def ports_active(ib_device: str, sys_dir: str = SYS_DIR) -> bool:
    """Every port of ``ib_device`` is ACTIVE (Koordinator's health); False without ports."""
    ports_dir = os.path.join(sys_dir, *INFINIBAND_CLASS, ib_device, "ports")
    ports = _entries(ports_dir)
    if not ports:
        return False
    try:
        return all(_STATE_ACTIVE in _read(os.path.join(ports_dir, port, "state")) for port in ports)
    except OSError:
        return False


def _function(pci_dir: str, bus_id: str) -> RDMAFunction:
    device_dir = os.path.join(pci_dir, bus_id)
    return RDMAFunction(bus_id, _entries(os.path.join(device_dir, "infiniband")),
                        _entries(os.path.join(device_dir, "infiniband_verbs")))


def _vfs(device_dir: str, pci_dir: str) -> tuple[RDMAFunction, ...]:
    links = []
    for name in _entries(device_dir):
        match = _VIRTFN.match(name)
        if match and os.path.islink(os.path.join(device_dir, name)):
            links.append((int(match.group(1)), os.path.basename(os.path.realpath(os.path.join(device_dir, name)))))
    return tuple(_function(pci_dir, bus_id) for _, bus_id in sorted(links))


def _is_rdma_pf(device_dir: str) -> bool:
    if os.path.exists(os.path.join(device_dir, "physfn")):
        return False  # a VF: listed under its PF
    try:
        if int(_read(os.path.join(device_dir, "class")), 16) >> 16 != _NET_CLASS:
            return False
    except (OSError, ValueError):
        return False
    return bool(_entries(os.path.join(device_dir, "infiniband")))


def _device(pci_dir: str, bus_id: str, sys_dir: str) -> RDMADevice | None:
    device_dir = os.path.join(pci_dir, bus_id)
    function = _function(pci_dir, bus_id)
    minor = rdma_minor(function.ib_devices[0])  # the PF's driver loads first: its ibdev sorts first
    if minor is None:
        logger.warning("RDMA device %s of %s has no minor number in its name; left out", function.ib_devices[0],
                       bus_id)
        return None
    try:
        numa = int(_read(os.path.join(device_dir, "numa_node")))
    except (OSError, ValueError):
        numa = -1
    try:
        vf_count = int(_read(os.path.join(device_dir, "sriov_numvfs")))
    except (OSError, ValueError):
        vf_count = 0
    root = _PCIE_ROOT.search(os.path.realpath(device_dir))
    vendor = device = ""
    try:
        vendor, device = _read(os.path.join(device_dir, "vendor")), _read(os.path.join(device_dir, "device"))
    except OSError:
        pass
    return RDMADevice(bus_id=bus_id, minor=minor, ib_devices=function.ib_devices, uverbs=function.uverbs,
                      vendor=vendor, device=device, numa_node=max(numa, 0), pcie_root=root.group(0) if root else "",
                      healthy=ports_active(function.ib_devices[0], sys_dir), vf_enabled=vf_count > 0,
                      vfs=_vfs(device_dir, pci_dir) if vf_count > 0 else ())


def read_rdma_devices(sys_dir: str = SYS_DIR) -> tuple[RDMADevice, ...]:
    """The node's RDMA physical functions, by minor; a second device with a minor already taken is left out."""
    pci_dir = os.path.join(sys_dir, *PCI_DEVICES)
    found: dict[int, RDMADevice] = {}
    for bus_id in _entries(pci_dir):
        if not _is_rdma_pf(os.path.join(pci_dir, bus_id)):
            continue
        device = _device(pci_dir, bus_id, sys_dir)
        if device is None:
            continue
        if device.minor in found:
            logger.warning("RDMA devices %s and %s share minor %d; %s left out", found[device.minor].bus_id,
                           bus_id, device.minor, bus_id)
            continue
        found[device.minor] = device
    return tuple(found[minor] for minor in sorted(found))


def uverbs_of(bus_id: str, sys_dir: str = SYS_DIR) -> str | None:
    """The uverbs device name of a PCI function (``infiniband_verbs/``), None when it has none."""
    names = _entries(os.path.join(sys_dir, *PCI_DEVICES, bus_id, "infiniband_verbs"))
    return names[0] if names else None


@dataclass(frozen=True, slots=True)
class DeviceNode:
    """A device node as a container runtime adds it: its path on the host, ``c``/``b`` and its numbers."""

    path: str
    type: str
    major: int
    minor: int


def device_node(relative: str, dev_dir: str = DEV_DIR) -> DeviceNode:
    """The node at ``<dev_dir>/<relative>`` (path given as the host's ``/dev/<relative>``); OSError, or
    ValueError when it is not a device node."""
    info = os.stat(os.path.join(dev_dir, relative))
    if stat.S_ISCHR(info.st_mode):
        kind = "c"
    elif stat.S_ISBLK(info.st_mode):
        kind = "b"
    else:
        raise ValueError(f"{relative} is not a device node")
    return DeviceNode(os.path.join(DEV_DIR, relative), kind, os.major(info.st_rdev), os.minor(info.st_rdev))


def rdma_device_nodes(sys_dir: str = SYS_DIR,
                      dev_dir: str = DEV_DIR) -> tuple[DeviceNode | None, dict[str, DeviceNode]]:
    """``rdma_cm`` (None when missing) and {PCI bus id: its uverbs node} of every RDMA function (PFs and VFs),
    what the RDMA injection hook hands a container."""
    try:
        rdma_cm: DeviceNode | None = device_node(os.path.join(INFINIBAND_DEV_DIR, RDMA_CM), dev_dir)
    except (OSError, ValueError):
        rdma_cm = None
    uverbs: dict[str, DeviceNode] = {}
    pci_dir = os.path.join(sys_dir, *PCI_DEVICES)
    for bus_id in _entries(pci_dir):
        name = uverbs_of(bus_id, sys_dir)
        if name is None:
            continue
        try:
            uverbs[bus_id] = device_node(os.path.join(INFINIBAND_DEV_DIR, name), dev_dir)
        except (OSError, ValueError) as err:
            logger.debug("no device node for %s of %s: %s", name, bus_id, err)
    return rdma_cm, uverbs
