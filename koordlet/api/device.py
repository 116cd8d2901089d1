"""GPU / device names of the Koordinator API and the parser of the device-allocated annotation.

Resource names, labels and annotations: docs/koordinator.md §5.4 and §12, docs/koordinator.md §5.4.
The scheduler writes `scheduling.koordinator.sh/device-allocated` on the pod; two consumers read it
and must agree on what a container sees:
- the GPU runtime hook (GPUEnvInject, docs/koordinator.md §3.3) sets `NVIDIA_VISIBLE_DEVICES`;
- our kubelet device plugin (docs/node-lock.md) answers Allocate with the same variable.
Both call `nvidia_visible_devices()` below, so the value is computed in exactly one place.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from koordlet.api.safeload import SafeLoadError, load_json

# Extended resources (docs/koordinator.md §12).
RESOURCE_NVIDIA_GPU = "nvidia.com/gpu"
RESOURCE_KOORD_GPU = "koordinator.sh/gpu"
RESOURCE_GPU_CORE = "koordinator.sh/gpu-core"
RESOURCE_GPU_MEMORY = "koordinator.sh/gpu-memory"
RESOURCE_GPU_MEMORY_RATIO = "koordinator.sh/gpu-memory-ratio"
RESOURCE_GPU_SHARED = "koordinator.sh/gpu.shared"
# Full capacity of one GPU in the koordinator protocol (docs/koordinator.md §5.4: "the total is abstracted to 100").
GPU_FULL_CORE = 100
GPU_FULL_MEMORY_RATIO = 100

# Pod keys.
ANNOTATION_DEVICE_ALLOCATED = "scheduling.koordinator.sh/device-allocated"
LABEL_GPU_ISOLATION_PROVIDER = "koordinator.sh/gpu-isolation-provider"
# Ours: written by the device plugin when kubelet's Allocate handed a container its devices.
# JSON object {"<container name>": [minor, ...]}; a pod is "bound" once every GPU container is in it.
ANNOTATION_DEVICE_BOUND = "koordlet.koordinator.sh/device-bound"
# Written by Koordinator's scheduler-side device plugin adapters at Bind: unix nanoseconds
# (docs/node-interfaces.md §6.4); orders the pods an owner-less (bare timestamp) node lock may be for.
ANNOTATION_BIND_TIMESTAMP = "scheduling.koordinator.sh/bind-timestamp"

# Node lock (docs/node-lock.md, docs/node-interfaces.md §6.4). HAMi and Koordinator's scheduler-side device
# plugin adapter both use this key with the value "<RFC3339>,<namespace>,<pod>", so a scheduler of either
# kind and our device plugin serialise on the same annotation.
ANNOTATION_NODE_LOCK = "hami.io/mutex.lock"

# Device CR (docs/koordinator.md §5.1, §5.4).
DEVICE_GROUP = "scheduling.koordinator.sh"
DEVICE_VERSION = "v1alpha1"
DEVICE_PLURAL = "devices"
DEVICE_KIND = "Device"
DEVICE_TYPE_GPU = "gpu"
DEVICE_TYPE_RDMA = "rdma"
DEVICE_CONDITION_HEALTHY = "Healthy"
RESOURCE_RDMA = "koordinator.sh/rdma"
RDMA_FULL = 100  # an RDMA device's koordinator.sh/rdma capacity (Koordinator statesinformer buildRDMADevice)

# Labels on the Device object and on each GPU entry (docs/koordinator.md §5.4).
LABEL_DEVICE_GPU_VENDOR = "node.koordinator.sh/gpu-vendor"
LABEL_DEVICE_GPU_MODEL = "node.koordinator.sh/gpu-model"
LABEL_DEVICE_GPU_DRIVER_VERSION = "node.koordinator.sh/gpu-driver-version"
GPU_VENDOR_NVIDIA = "nvidia"
# Labels on the Node (docs/koordinator.md §5.4: "kubernetes.io/gpu-driver: 460.91.03",
# "kubernetes.io/gpu-model: Tesla-T4").
LABEL_NODE_GPU_MODEL = "kubernetes.io/gpu-model"
LABEL_NODE_GPU_DRIVER = "kubernetes.io/gpu-driver"

# Environment the container runtime's NVIDIA hook reads.
ENV_NVIDIA_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"

_LABEL_VALUE_BAD_CHARS = re.compile(r"[^A-Za-z0-9_.-]+")


class DeviceAnnotationError(ValueError):
    """A device annotation is not valid JSON or does not have the shape the scheduler writes."""


@dataclass(frozen=True, slots=True)
class GPUAllocation:
    """One GPU the scheduler gave a pod: its minor number and the share of it."""

    minor: int
    resources: Mapping[str, str] = field(default_factory=dict)
    uuid: str = ""


@dataclass(frozen=True, slots=True)
class VirtualFunction:
    """A VF of an allocated device (``extension.vfs[]``): its minor (-1 unknown) and PCI bus id."""

    minor: int
    bus_id: str


@dataclass(frozen=True, slots=True)
class RDMAAllocation:
    """One RDMA device the scheduler gave a pod: the PF (minor, PCI bus id ``id``) and the VFs of it, if any."""

    minor: int
    bus_id: str
    resources: Mapping[str, str] = field(default_factory=dict)
    vfs: tuple[VirtualFunction, ...] = ()


@dataclass(frozen=True, slots=True)
class DeviceAllocated:
    """The parsed `scheduling.koordinator.sh/device-allocated` annotation (GPU part)."""

    gpus: tuple[GPUAllocation, ...]


# A PCI function address as sysfs names it: domain:bus:device.function (0000:3b:00.2).
_PCI_BUS_ID = re.compile(r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")


def _bus_id(raw: object, where: str) -> str:
    if not isinstance(raw, str) or not _PCI_BUS_ID.match(raw):
        raise DeviceAnnotationError(f"{where}: not a PCI bus id (dddd:bb:dd.f): {raw!r}")
    return raw.lower()


def _resources(entry: Mapping[str, object], where: str) -> dict[str, str]:
    resources = entry.get("resources", {})
    if resources is None:
        resources = {}
    if not isinstance(resources, dict):
        raise DeviceAnnotationError(f"{where}: resources must be an object")
    return {str(k): str(v) for k, v in resources.items()}


def _rdma_entries(data: Mapping[str, object]) -> tuple[RDMAAllocation, ...]:
    raw = data.get(DEVICE_TYPE_RDMA) or []
    if not isinstance(raw, list):
        raise DeviceAnnotationError(f"{ANNOTATION_DEVICE_ALLOCATED}: 'rdma' must be a list")
    out: list[RDMAAllocation] = []
    for index, entry in enumerate(raw):
        where = f"{ANNOTATION_DEVICE_ALLOCATED}: rdma[{index}]"
        if not isinstance(entry, dict):
            raise DeviceAnnotationError(f"{where}: expected an object")
        minor = _parse_minor(entry.get("minor"), where)
        extension = entry.get("extension") or {}
        if not isinstance(extension, dict):
            raise DeviceAnnotationError(f"{where}: extension must be an object")
        raw_vfs = extension.get("vfs") or []
        if not isinstance(raw_vfs, list):
            raise DeviceAnnotationError(f"{where}: extension.vfs must be a list")
        vfs = []
        for vf_index, vf in enumerate(raw_vfs):
            vf_where = f"{where}.extension.vfs[{vf_index}]"
            if not isinstance(vf, dict):
                raise DeviceAnnotationError(f"{vf_where}: expected an object")
            vf_minor = vf.get("minor", -1)
            if isinstance(vf_minor, bool) or not isinstance(vf_minor, int):
                raise DeviceAnnotationError(f"{vf_where}: minor must be an integer, got {vf_minor!r}")
            vfs.append(VirtualFunction(vf_minor, _bus_id(vf.get("busID"), vf_where)))
        bus_id = _bus_id(entry["id"], where) if entry.get("id") else ""
        out.append(RDMAAllocation(minor, bus_id, _resources(entry, where), tuple(vfs)))
    return tuple(out)


def _parse_minor(raw: object, where: str) -> int:
    # bool is an int subclass in Python; "minor": true must not become GPU 1.
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise DeviceAnnotationError(f"{where}: minor must be an integer, got {raw!r}")
    if raw < 0:
        raise DeviceAnnotationError(f"{where}: minor must be >= 0, got {raw}")
    return raw


def _load_allocated(value: str) -> dict:
    try:
        data = load_json(value, ANNOTATION_DEVICE_ALLOCATED, max_bytes=256 << 10, max_depth=16)
    except SafeLoadError as exc:
        raise DeviceAnnotationError(str(exc)) from exc
    if not isinstance(data, dict):
        raise DeviceAnnotationError(f"{ANNOTATION_DEVICE_ALLOCATED}: expected a JSON object")
    return data


def parse_device_allocated(value: str) -> DeviceAllocated:
    """Parse the annotation value's gpu entries; entries of other device types (rdma: :func:`parse_rdma_allocated`,
    fpga) are ignored.

    Raises DeviceAnnotationError naming the annotation and what is wrong.
    """
    data = _load_allocated(value)
    raw_gpus = data.get(DEVICE_TYPE_GPU, [])
    if raw_gpus is None:
        raw_gpus = []
    if not isinstance(raw_gpus, list):
        raise DeviceAnnotationError(f"{ANNOTATION_DEVICE_ALLOCATED}: 'gpu' must be a list")
    gpus: list[GPUAllocation] = []
    seen: set[int] = set()
    for index, entry in enumerate(raw_gpus):
        where = f"{ANNOTATION_DEVICE_ALLOCATED}: gpu[{index}]"
        if not isinstance(entry, dict):
            raise DeviceAnnotationError(f"{where}: expected an object")
        minor = _parse_minor(entry.get("minor"), where)
        if minor in seen:
            raise DeviceAnnotationError(f"{where}: minor {minor} listed twice")
        seen.add(minor)
        resources = _resources(entry, where)
        uuid = entry.get("id") or ""
        if not isinstance(uuid, str):
            raise DeviceAnnotationError(f"{where}: id must be a string")
        gpus.append(GPUAllocation(minor=minor, resources=resources, uuid=uuid))
    return DeviceAllocated(gpus=tuple(gpus))


def parse_rdma_allocated(value: str) -> tuple[RDMAAllocation, ...]:
    """The rdma entries of the annotation (an entry's ``id`` is the PF's PCI bus id, ``extension.vfs`` its VFs);
    apart from the GPU part, so a malformed RDMA entry never costs a pod its GPUs. DeviceAnnotationError."""
    return _rdma_entries(_load_allocated(value))


def nvidia_visible_devices(gpus: Sequence[GPUAllocation]) -> str:
    """Value of NVIDIA_VISIBLE_DEVICES for these GPUs: the minors, comma-joined, in scheduler order.

    The one computation shared by the GPU env hook (docs/koordinator.md §3.3 GPUEnvInject) and the
    device plugin's Allocate (docs/node-lock.md), so a container sees the same GPUs whichever path ran.
    """
    return ",".join(str(gpu.minor) for gpu in gpus)


def parse_device_bound(value: str) -> dict[str, tuple[int, ...]]:
    """Parse ANNOTATION_DEVICE_BOUND: container name -> minors handed to it by the device plugin."""
    try:
        data = load_json(value, ANNOTATION_DEVICE_BOUND, max_bytes=256 << 10, max_depth=16)
    except SafeLoadError as exc:
        raise DeviceAnnotationError(str(exc)) from exc
    if not isinstance(data, dict):
        raise DeviceAnnotationError(f"{ANNOTATION_DEVICE_BOUND}: expected a JSON object")
    bound: dict[str, tuple[int, ...]] = {}
    for container, minors in data.items():
        where = f"{ANNOTATION_DEVICE_BOUND}: {container}"
        if not isinstance(minors, list):
            raise DeviceAnnotationError(f"{where}: expected a list of minors")
        bound[str(container)] = tuple(_parse_minor(minor, where) for minor in minors)
    return bound


def format_device_bound(bound: Mapping[str, Sequence[int]]) -> str:
    return json.dumps({name: list(minors) for name, minors in sorted(bound.items())}, separators=(",", ":"))


def label_value(text: str) -> str:
    """A Kubernetes label value from free text, at most 63 chars.

    "Tesla T4" -> "Tesla-T4" (docs/koordinator.md §5.4)."""
    cleaned = _LABEL_VALUE_BAD_CHARS.sub("-", text.strip())
    return cleaned[:63].strip("-_.")


def node_gpu_labels(model: str, driver_version: str) -> dict[str, str]:
    """The GPU labels a node carries (docs/koordinator.md §5.4)."""
    return {LABEL_NODE_GPU_MODEL: label_value(model), LABEL_NODE_GPU_DRIVER: label_value(driver_version)}


def device_gpu_labels(model: str, driver_version: str) -> dict[str, str]:
    """The GPU labels of the Device object and of each of its GPU entries (docs/koordinator.md §5.4)."""
    return {
        LABEL_DEVICE_GPU_VENDOR: GPU_VENDOR_NVIDIA,
        LABEL_DEVICE_GPU_MODEL: label_value(model),
        LABEL_DEVICE_GPU_DRIVER_VERSION: label_value(driver_version),
    }
