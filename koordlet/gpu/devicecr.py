"""The `scheduling.koordinator.sh/v1alpha1` Device object for this node's GPUs (docs/koordinator.md §5.4).

One object per node, named after it, owned by the Node. Per GPU: type gpu, id = UUID, minor,
health, resources gpu-core 100 / gpu-memory (bytes) / gpu-memory-ratio 100, topology
{socketID -1, nodeID, pcieID, busID}, the vendor/model/driver labels, and a `Healthy` condition
whose lastTransitionTime is kept from the previous object unless the status flipped.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from koordlet.api import device as api
from koordlet.api.quantity import QuantityError, parse_quantity_milli
from koordlet.gpu.health import GPUHealth
from koordlet.gpu.nvml import GPUInventory

_BINARY_SUFFIXES = (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))
# metav1.Condition.reason must match this (CamelCase-ish, no spaces).
_CONDITION_REASON = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")


def format_bytes_quantity(value: int) -> str:
    """Bytes as Kubernetes prints a BinarySI quantity: the largest exact binary suffix ("81559Mi")."""
    if value == 0:
        return "0"
    for suffix, factor in _BINARY_SUFFIXES:
        if value % factor == 0:
            return f"{value // factor}{suffix}"
    return str(value)


def _rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _condition_reason(health: GPUHealth) -> str:
    if health.healthy:
        return "Healthy"
    reason = health.reason or "Unhealthy"
    return reason if _CONDITION_REASON.match(reason) else "Unhealthy"


def _previous_conditions(previous: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    """UUID -> the Healthy condition in the object last written, to keep its transition time."""
    found: dict[str, dict[str, Any]] = {}
    if not previous:
        return found
    for entry in (previous.get("spec") or {}).get("devices") or []:
        for condition in entry.get("conditions") or []:
            if condition.get("type") == api.DEVICE_CONDITION_HEALTHY and entry.get("id"):
                found[entry["id"]] = condition
    return found


def build_device(
    node_name: str,
    inventory: GPUInventory,
    health: Mapping[str, GPUHealth],
    node_uid: str = "",
    previous: Mapping[str, Any] | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """The Device object as a plain dict (what the API server stores and the YAML file shows)."""
    now = now or datetime.now(UTC)
    labels = api.device_gpu_labels(inventory.model, inventory.driver_version)
    old_conditions = _previous_conditions(previous)
    devices: list[dict[str, Any]] = []
    for gpu in sorted(inventory.gpus, key=lambda g: g.minor):
        state = health.get(gpu.uuid) or GPUHealth(gpu.uuid, True)
        status = "True" if state.healthy else "False"
        old = old_conditions.get(gpu.uuid)
        transition = old.get("lastTransitionTime") if old and old.get("status") == status else None
        devices.append(
            {
                "type": api.DEVICE_TYPE_GPU,
                "id": gpu.uuid,
                "minor": gpu.minor,
                "health": state.healthy,
                "labels": api.device_gpu_labels(gpu.model, inventory.driver_version),
                "resources": {
                    api.RESOURCE_GPU_CORE: str(api.GPU_FULL_CORE),
                    api.RESOURCE_GPU_MEMORY: format_bytes_quantity(gpu.memory_total_bytes),
                    api.RESOURCE_GPU_MEMORY_RATIO: str(api.GPU_FULL_MEMORY_RATIO),
                },
                "topology": {
                    # NVML gives no CPU socket; -1 is Koordinator's "unknown" (docs/koordinator.md §5.4).
                    "socketID": -1,
                    "nodeID": gpu.numa_node if gpu.numa_node is not None else -1,
                    "pcieID": gpu.pcie_switch_id,
                    "busID": gpu.pci_bus_id,
                },
                "conditions": [
                    {
                        "type": api.DEVICE_CONDITION_HEALTHY,
                        "status": status,
                        "reason": _condition_reason(state),
                        "message": state.message or ("healthy" if state.healthy else state.reason),
                        "lastTransitionTime": transition or _rfc3339(now),
                    }
                ],
            }
        )
    return device_skeleton(node_name, node_uid, devices, labels)


def device_skeleton(node_name: str, node_uid: str, devices: list[dict[str, Any]], labels: Mapping[str, str],
                    annotations: Mapping[str, str | None] | None = None) -> dict[str, Any]:
    """The node's Device object around these ``spec.devices`` entries, owned by the Node when its UID is known."""
    metadata: dict[str, Any] = {"name": node_name, "labels": dict(labels)}
    if annotations:
        metadata["annotations"] = dict(annotations)
    if node_uid:
        metadata["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid,
                                        "controller": True, "blockOwnerDeletion": True}]
    return {"apiVersion": f"{api.DEVICE_GROUP}/{api.DEVICE_VERSION}", "kind": api.DEVICE_KIND, "metadata": metadata,
            "spec": {"devices": devices}}


def _normalise(value: Any, key: str = "") -> Any:
    """Compare quantities by value ("16Gi" == "17179869184") and ignore ordering of maps."""
    if isinstance(value, Mapping):
        normalised = {k: _normalise(v, k) for k, v in value.items() if v is not None}
        if key == "resources":
            out: dict[str, Any] = {}
            for name, quantity in normalised.items():
                try:
                    out[name] = parse_quantity_milli(str(quantity))
                except QuantityError:
                    out[name] = quantity
            return out
        return normalised
    if isinstance(value, list):
        return [_normalise(item) for item in value]
    return value


def semantically_equal(existing: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """True when an update would change nothing that matters.

    What matters: spec, labels and annotations (docs/koordinator.md §5.4)."""
    old_meta = existing.get("metadata") or {}
    new_meta = desired.get("metadata") or {}
    # Labels and annotations others added to the object are theirs: only ours are compared.
    old_labels = old_meta.get("labels") or {}
    old_annotations = old_meta.get("annotations") or {}
    return (
        _normalise(existing.get("spec") or {}) == _normalise(desired.get("spec") or {})
        and all(old_labels.get(k) == v for k, v in (new_meta.get("labels") or {}).items())
        and all(old_annotations.get(k) == v for k, v in (new_meta.get("annotations") or {}).items())
    )
