"""RDMA devices in the Device object (gate ``RDMADevices``; Koordinator metricsadvisor/devices/rdma and
statesinformer buildRDMADevice).

One ``rdma`` entry per physical function with RDMA, by minor: ``id`` and ``topology.busID`` its PCI bus id,
``minor`` the N of its ``mlx5_N``, ``health`` every port ACTIVE, ``resources`` ``koordinator.sh/rdma: 100``,
``topology`` ``{socketID: -1, nodeID, pcieID: the PCIe root complex}``, and with SR-IOV on one ``vfGroups`` entry
listing its VFs (``minor`` -1, ``busID``), as the scheduler allocates them.

The PCI inventory is read again at most every :data:`INVENTORY_REFRESH_S` (a function's presence changes
with hotplug or SR-IOV reconfiguration only); the ports' health at every report.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from koordlet.api import device as api
from koordlet.gpu.devicecr import device_skeleton
from koordlet.system.rdma import RDMADevice, ports_active, read_rdma_devices
from koordlet.system.roots import SYS_DIR

logger = logging.getLogger(__name__)

INVENTORY_REFRESH_S = 60.0


def rdma_entries(devices: tuple[RDMADevice, ...]) -> list[dict[str, Any]]:
    """The Device object's ``spec.devices`` entries of these RDMA devices (Koordinator's layout)."""
    entries = []
    for device in sorted(devices, key=lambda d: d.minor):
        entry: dict[str, Any] = {
            "type": api.DEVICE_TYPE_RDMA,
            "id": device.bus_id,
            "minor": device.minor,
            "health": device.healthy,
            "resources": {api.RESOURCE_RDMA: str(api.RDMA_FULL)},
            "topology": {"socketID": -1, "nodeID": device.numa_node, "pcieID": device.pcie_root,
                         "busID": device.bus_id},
        }
        if device.vf_enabled:
            entry["vfGroups"] = [{"vfs": [{"minor": -1, "busID": vf.bus_id}
                                          for vf in sorted(device.vfs, key=lambda v: v.bus_id)]}]
        entries.append(entry)
    return entries


class RDMAInventory:
    """The node's RDMA devices for the Device report: the PCI walk cached, the health fresh."""

    def __init__(self, sys_dir: str = SYS_DIR, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._sys_dir = sys_dir
        self._monotonic = monotonic
        self._devices: tuple[RDMADevice, ...] = ()
        self._read_at = float("-inf")

    def devices(self) -> tuple[RDMADevice, ...]:
        now = self._monotonic()
        if now - self._read_at >= INVENTORY_REFRESH_S:
            devices = read_rdma_devices(self._sys_dir)
            if devices != self._devices:
                logger.info("RDMA devices: %s", ", ".join(f"{d.ib_devices[0]} ({d.bus_id}, {len(d.vfs)} VFs)"
                                                          for d in devices) or "none")
            self._devices, self._read_at = devices, now
            return devices
        return tuple(replace(d, healthy=ports_active(d.ib_devices[0], self._sys_dir)) for d in self._devices)

    def entries(self) -> list[dict[str, Any]]:
        return rdma_entries(self.devices())


def device_object(node_name: str, node_uid: str, entries: list[dict[str, Any]],
                  gpu_object: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The node's Device object: the GPU one (when there are GPUs) with these entries added, else one with
    these entries only."""
    if gpu_object is not None:
        desired = dict(gpu_object)
        desired["spec"] = {"devices": [*gpu_object["spec"]["devices"], *entries]}
        return desired
    return device_skeleton(node_name, node_uid, entries, {})
