"""The device-info files a device daemon writes for NPUs, MLUs and other accelerators (Koordinator's XPU devices).

Facts (Koordinator v1.8.0: pkg/koordlet/util/device.go ``XPUDeviceInfo``, pkg/device-daemon printer/writer.go,
cmd/koord-device-daemon ``-prints-output-file``): koord-device-daemon writes one file (default
``/var/run/koordlet/xpu-device-infos/ic-device``) holding a JSON array, written atomically (a temporary
``.<name>…`` file in the same dir, then renamed). Each entry::

    {"vendor": "huawei", "model": "Ascend-910B", "uuid": "…", "minor": "0",
     "resources": {"koordinator.sh/gpu-memory": "32Gi", "huawei.com/npu-core": "32", …},
     "topology": {"p2pLinks": [{"peerMinor": "1,2,3", "type": "HCCS"}], "mustHonorPartition": false,
                  "socketID": "0", "nodeID": "0", "pcieID": "0000:00:08.0", "busID": "0000:00:08.0"},
     "status": {"healthy": true, "errCode": "…", "errMessage": "…"}}

``minor``, ``socketID`` and ``nodeID`` are strings; ``resources``, ``topology`` and ``status`` may be absent.

Parsing is per entry: an entry that breaks the schema is refused with a message naming the file, the entry and
the field, and the other entries of the file stand (Koordinator drops every device of the node on one bad file).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from koordlet.api.safeload import SafeLoadError, load_json

MAX_FILE_BYTES = 1 << 20  # a node's device list; a daemon's file is a few KiB per device


class XPUSchemaError(ValueError):
    """An entry of a device-info file does not follow the schema."""


@dataclass(frozen=True, slots=True)
class P2PLink:
    peer_minors: str  # "1,2,3": the minors this device shares a link of ``type`` with
    type: str  # NVLink, HCCS, …


@dataclass(frozen=True, slots=True)
class XPUTopology:
    p2p_links: tuple[P2PLink, ...] = ()
    must_honor_partition: bool = False
    socket_id: str = ""
    node_id: str = ""
    pcie_id: str = ""
    bus_id: str = ""


@dataclass(frozen=True, slots=True)
class XPUStatus:
    healthy: bool
    err_code: str = ""
    err_message: str = ""


@dataclass(frozen=True, slots=True)
class XPUDevice:
    vendor: str
    model: str
    uuid: str
    minor: int
    resources: Mapping[str, str] = field(default_factory=dict)
    topology: XPUTopology | None = None
    status: XPUStatus | None = None


def _string(entry: Mapping[str, Any], key: str, where: str, required: bool = False) -> str:
    value = entry.get(key)
    if value is None or value == "":
        if required:
            raise XPUSchemaError(f"{where}: {key} is missing")
        return ""
    if not isinstance(value, str):
        raise XPUSchemaError(f"{where}: {key} must be a string, got {type(value).__name__}")
    return value


def _object(entry: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any] | None:
    value = entry.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise XPUSchemaError(f"{where}: {key} must be an object, got {type(value).__name__}")
    return value


def _minor(entry: Mapping[str, Any], where: str) -> int:
    text = _string(entry, "minor", where, required=True)
    if not text.isascii() or not text.isdigit() or int(text) > 2**31 - 1:
        raise XPUSchemaError(f"{where}: minor must be a decimal int32 string, got {text!r}")
    return int(text)


def _topology(entry: Mapping[str, Any], where: str) -> XPUTopology | None:
    raw = _object(entry, "topology", where)
    if raw is None:
        return None
    where = f"{where}.topology"
    links_raw = raw.get("p2pLinks") or []
    if not isinstance(links_raw, list):
        raise XPUSchemaError(f"{where}: p2pLinks must be a list")
    links = []
    for index, link in enumerate(links_raw):
        if not isinstance(link, dict):
            raise XPUSchemaError(f"{where}.p2pLinks[{index}]: expected an object")
        links.append(P2PLink(_string(link, "peerMinor", f"{where}.p2pLinks[{index}]"),
                             _string(link, "type", f"{where}.p2pLinks[{index}]")))
    honor = raw.get("mustHonorPartition", False)
    if not isinstance(honor, bool):
        raise XPUSchemaError(f"{where}: mustHonorPartition must be a boolean")
    node_id = _string(raw, "nodeID", where)
    if node_id and not (node_id.lstrip("-").isdigit() and node_id.isascii()):
        raise XPUSchemaError(f"{where}: nodeID must be a decimal string, got {node_id!r}")
    return XPUTopology(tuple(links), honor, _string(raw, "socketID", where), node_id, _string(raw, "pcieID", where),
                       _string(raw, "busID", where))


def _status(entry: Mapping[str, Any], where: str) -> XPUStatus | None:
    raw = _object(entry, "status", where)
    if raw is None:
        return None
    healthy = raw.get("healthy", False)
    if not isinstance(healthy, bool):
        raise XPUSchemaError(f"{where}.status: healthy must be a boolean")
    return XPUStatus(healthy, _string(raw, "errCode", f"{where}.status"), _string(raw, "errMessage", f"{where}.status"))


def _resources(entry: Mapping[str, Any], where: str) -> dict[str, str]:
    raw = _object(entry, "resources", where) or {}
    out = {}
    for name, value in raw.items():
        if not isinstance(value, str):
            raise XPUSchemaError(f"{where}.resources[{name!r}] must be a quantity string, got {value!r}")
        out[str(name)] = value
    return out


def parse_xpu_device(entry: object, where: str) -> XPUDevice:
    """One entry of a device-info file; raises XPUSchemaError naming ``where`` and the field."""
    if not isinstance(entry, dict):
        raise XPUSchemaError(f"{where}: expected an object, got {type(entry).__name__}")
    return XPUDevice(vendor=_string(entry, "vendor", where), model=_string(entry, "model", where),
                     uuid=_string(entry, "uuid", where, required=True), minor=_minor(entry, where),
                     resources=_resources(entry, where), topology=_topology(entry, where),
                     status=_status(entry, where))


def parse_xpu_device_infos(data: bytes, source: str) -> tuple[tuple[XPUDevice, ...], tuple[str, ...]]:
    """The devices of one device-info file and the problems of the entries refused; a file that is not a JSON
    array (or too large, or nested too deep) raises XPUSchemaError."""
    try:
        value = load_json(data, source, max_bytes=MAX_FILE_BYTES)
    except SafeLoadError as exc:
        raise XPUSchemaError(str(exc)) from None
    if value is None:
        return (), ()  # Go's json encoder writes a nil list as null
    if not isinstance(value, list):
        raise XPUSchemaError(f"{source}: expected a JSON array of device infos, got {type(value).__name__}")
    devices, problems = [], []
    for index, entry in enumerate(value):
        try:
            devices.append(parse_xpu_device(entry, f"{source}[{index}]"))
        except XPUSchemaError as exc:
            problems.append(str(exc))
    return tuple(devices), tuple(problems)
