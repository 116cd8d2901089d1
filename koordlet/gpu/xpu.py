"""XPU devices (NPUs, MLUs, other accelerators) in the Device object, from the device-info files a device daemon
writes in ``-xpu-device-infos-dir`` (gate ``Accelerators``; Koordinator metricsadvisor/devices/xpu and statesinformer
states_device_linux.go buildXPUDevice; the file format: koordlet/api/xpu.py).

Precedence, as Koordinator's: when the files name any device, the Device object carries those (and its RDMA
devices), never the GPUs NVML finds; with ``-xpu-enforce-collect-from-device-infos`` it never carries NVML's GPUs,
files or not. Each XPU entry: ``type`` gpu, ``id`` the uuid, ``minor``, ``health`` (the file's ``status.healthy``,
true without a status), ``resources`` ``koordinator.sh/gpu-memory-ratio: 100`` plus the file's (``gpu-core`` and
``gpu-memory`` get the ``koordinator.sh/`` prefix), ``topology`` ``{socketID: -1, nodeID (-1 unknown), pcieID,
busID}`` when the file has one, and a ``Healthy`` condition when it has a status. The object's labels
``node.koordinator.sh/gpu-vendor`` and ``gpu-model`` are the first device's, with
``node.koordinator.sh/gpu-partition-policy`` (Honor with ``mustHonorPartition``, else Prefer) when it has P2P
links; the P2P links become the ``scheduling.koordinator.sh/gpu-partitions`` annotation (minors grouped per link,
keyed by group size, allocationScore 1).

Beyond Koordinator: a bad file or entry costs only itself. A file that cannot be read or parsed keeps the devices
it last gave (the daemon rewrites it atomically, so a half file is a bug, not an update); an entry that breaks the
schema, a quantity that does not parse, a second device with a uuid or minor already taken are refused, each
said once with the file and the field (log and ``on_problem``), while the rest are reported. Hidden files (the
daemon's temporary ``.<name>`` files) and subdirectories are not read. A file that is removed takes its devices
with it (the daemon removes its file when it stops).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from koordlet.api import device as api
from koordlet.api.quantity import QuantityError, parse_quantity
from koordlet.api.xpu import MAX_FILE_BYTES, XPUDevice, XPUSchemaError, parse_xpu_device_infos
from koordlet.gpu.devicecr import _CONDITION_REASON, _previous_conditions, _rfc3339, device_skeleton

logger = logging.getLogger(__name__)

DEFAULT_INFOS_DIR = "/var/run/koordlet/xpu-device-infos/"
LABEL_GPU_PARTITION_POLICY = "node.koordinator.sh/gpu-partition-policy"
ANNOTATION_GPU_PARTITIONS = "scheduling.koordinator.sh/gpu-partitions"
PARTITION_POLICY_HONOR, PARTITION_POLICY_PREFER = "Honor", "Prefer"
_SHORT_RESOURCES = ("gpu-core", "gpu-memory")  # written without the domain by some daemons

ProblemReporter = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class _FileState:
    stamp: tuple[int, int, int]  # (mtime ns, size, inode): rewritten files get a new inode or mtime
    devices: tuple[XPUDevice, ...]


class XPUInventory:
    """The devices of every device-info file in ``infos_dir``, read again only when a file changed."""

    def __init__(self, infos_dir: str = DEFAULT_INFOS_DIR, on_problem: ProblemReporter | None = None) -> None:
        self.infos_dir = infos_dir
        self._on_problem = on_problem
        self._files: dict[str, _FileState] = {}
        self._dir_missing_said = False
        self._said: set[str] = set()  # problems said since the files last changed

    def problem(self, message: str) -> None:
        """Log and report ``message`` once until a file changes (each report loop meets it again)."""
        if message in self._said:
            return
        self._said.add(message)
        logger.warning("XPU device infos: %s", message)
        if self._on_problem is not None:
            self._on_problem(message)

    def devices(self) -> tuple[XPUDevice, ...]:
        """Every file's devices, by file name then file order; a uuid or minor seen before is refused."""
        try:
            entries = sorted(os.scandir(self.infos_dir), key=lambda e: e.name)
        except FileNotFoundError:
            if not self._dir_missing_said:
                logger.info("XPU device infos: no dir %s (no device daemon on this node)", self.infos_dir)
                self._dir_missing_said = True
            self._files.clear()
            return ()
        except OSError as exc:
            self.problem(f"cannot list {self.infos_dir}: {exc}; keeping the devices read before")
            return self._merged()
        self._dir_missing_said = False
        seen = set()
        for entry in entries:
            if entry.name.startswith(".") or not entry.is_file(follow_symlinks=False):
                continue
            seen.add(entry.name)
            self._refresh(entry)
        for gone in set(self._files) - seen:
            logger.info("XPU device infos: %s removed; its %d device(s) go", gone, len(self._files[gone].devices))
            del self._files[gone]
        return self._merged()

    def _refresh(self, entry: os.DirEntry[str]) -> None:
        try:
            stat = entry.stat(follow_symlinks=False)
        except OSError:
            return  # removed since it was listed
        stamp = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
        old = self._files.get(entry.name)
        if old is not None and old.stamp == stamp:
            return
        kept = old.devices if old is not None else ()
        self._said.clear()
        try:
            with open(entry.path, "rb") as f:
                data = f.read(MAX_FILE_BYTES + 1)
            devices, problems = parse_xpu_device_infos(data, entry.path)
        except (OSError, XPUSchemaError) as exc:
            self.problem(f"{exc}; keeping the {len(kept)} device(s) it gave before")
            self._files[entry.name] = _FileState(stamp, kept)
            return
        for problem in problems:
            self.problem(f"{problem}; entry refused")
        self._files[entry.name] = _FileState(stamp, devices)
        logger.info("XPU device infos: %s gives %d device(s)", entry.path, len(devices))

    def _merged(self) -> tuple[XPUDevice, ...]:
        out: list[XPUDevice] = []
        uuids: set[str] = set()
        minors: set[int] = set()
        for name in sorted(self._files):
            for device in self._files[name].devices:
                if device.uuid in uuids or device.minor in minors:
                    taken = "uuid " + device.uuid if device.uuid in uuids else f"minor {device.minor}"
                    self.problem(f"{name}: {taken} is named by an earlier device; entry refused")
                    continue
                uuids.add(device.uuid)
                minors.add(device.minor)
                out.append(device)
        return tuple(out)


def _resources(device: XPUDevice, on_problem: ProblemReporter) -> dict[str, str]:
    resources = {api.RESOURCE_GPU_MEMORY_RATIO: str(api.GPU_FULL_MEMORY_RATIO)}
    for name, quantity in sorted(device.resources.items()):
        try:
            parse_quantity(quantity)
        except QuantityError as exc:
            on_problem(f"device {device.uuid}: resource {name}: {exc}; left out")
            continue
        resources["koordinator.sh/" + name if name in _SHORT_RESOURCES else name] = quantity
    return resources


def _condition(device: XPUDevice, old: Mapping[str, Any] | None, now: datetime) -> dict[str, Any] | None:
    status = device.status
    if status is None:
        return None
    if status.healthy:
        state, reason, message = "True", "DeviceHealthy", "device is healthy"
    else:
        state, message = "False", status.err_message or "device is unhealthy"
        reason = status.err_code or "Unknown"
        if not _CONDITION_REASON.match(reason):  # the API server would refuse the whole object
            reason, message = "Unknown", f"{status.err_code}: {message}"
    transition = old.get("lastTransitionTime") if old and old.get("status") == state else None
    return {"type": api.DEVICE_CONDITION_HEALTHY, "status": state, "reason": reason, "message": message[:32768],
            "lastTransitionTime": transition or _rfc3339(now)}


def xpu_entries(devices: Sequence[XPUDevice], previous: Mapping[str, Any] | None = None, now: datetime | None = None,
                on_problem: ProblemReporter = lambda message: None) -> list[dict[str, Any]]:
    """The Device object's ``spec.devices`` entries of these XPUs, sorted by uuid (Koordinator's order)."""
    now = now or datetime.now(UTC)
    old_conditions = _previous_conditions(previous)
    entries = []
    for device in sorted(devices, key=lambda d: d.uuid):
        entry: dict[str, Any] = {
            "type": api.DEVICE_TYPE_GPU, "id": device.uuid, "minor": device.minor,
            "health": device.status.healthy if device.status is not None else True,
            "resources": _resources(device, on_problem),
        }
        if device.topology is not None:
            entry["topology"] = {"socketID": -1,
                                 "nodeID": int(device.topology.node_id) if device.topology.node_id else -1,
                                 "pcieID": device.topology.pcie_id, "busID": device.topology.bus_id}
        condition = _condition(device, old_conditions.get(device.uuid), now)
        if condition is not None:
            entry["conditions"] = [condition]
        entries.append(entry)
    return entries


def xpu_labels(devices: Sequence[XPUDevice]) -> dict[str, str]:
    """Vendor and model of the first device, and the partition policy when it has P2P links."""
    if not devices:
        return {}
    first = devices[0]
    labels = {api.LABEL_DEVICE_GPU_MODEL: api.label_value(first.model),
              api.LABEL_DEVICE_GPU_VENDOR: api.label_value(first.vendor)}
    if first.topology is not None and first.topology.p2p_links:
        labels[LABEL_GPU_PARTITION_POLICY] = (PARTITION_POLICY_HONOR if first.topology.must_honor_partition
                                              else PARTITION_POLICY_PREFER)
    return labels


def partition_table(devices: Sequence[XPUDevice], on_problem: ProblemReporter = lambda message: None,
                    ) -> dict[int, list[dict[str, Any]]]:
    """Group size → ``[{minors, gpuLinkType, allocationScore: 1}]``: each P2P link's peers with the device itself,
    each group once (Koordinator getPartitionTableFromXPUDevices)."""
    table: dict[int, list[dict[str, Any]]] = {}
    seen: set[tuple[int, ...]] = set()
    for device in devices:
        for link in device.topology.p2p_links if device.topology is not None else ():
            if not link.peer_minors or not link.type:
                on_problem(f"device {device.uuid}: P2P link without peers or type; left out")
                continue
            minors = {device.minor}
            for text in link.peer_minors.split(","):
                if text.strip().isdigit():
                    minors.add(int(text))
                else:
                    on_problem(f"device {device.uuid}: P2P peer minor {text!r} is not a number; left out")
            group = tuple(sorted(minors))
            if group in seen:
                continue
            seen.add(group)
            table.setdefault(len(group), []).append({"minors": list(group), "gpuLinkType": link.type,
                                                     "allocationScore": 1})
    return table


def without_xpu_metadata(device: dict[str, Any]) -> dict[str, Any]:
    """``device`` (a Device object without XPUs) taking off the partition label and annotation an XPU report left:
    Koordinator writes the object's labels and annotations whole, so they go when the XPUs go."""
    metadata = device["metadata"]
    metadata["labels"] = {LABEL_GPU_PARTITION_POLICY: None, **(metadata.get("labels") or {})}
    metadata["annotations"] = {ANNOTATION_GPU_PARTITIONS: None, **(metadata.get("annotations") or {})}
    return device


def xpu_device_object(node_name: str, node_uid: str, devices: Sequence[XPUDevice],
                      previous: Mapping[str, Any] | None = None, now: datetime | None = None,
                      on_problem: ProblemReporter = lambda message: None) -> dict[str, Any]:
    """The node's Device object with these XPUs: entries, labels and the partition annotation (None when there is
    no partition: an earlier one is taken off)."""
    table = partition_table(devices, on_problem)
    partitions = json.dumps({str(size): groups for size, groups in sorted(table.items())}, separators=(",", ":"),
                            sort_keys=True) if table else None
    return device_skeleton(node_name, node_uid, xpu_entries(devices, previous, now, on_problem), xpu_labels(devices),
                           {ANNOTATION_GPU_PARTITIONS: partitions})
