"""Per-GPU usage as metric-cache samples.

GPU collector: docs/koordinator.md §7.1; series names: docs/koordinator.md §7.2.

Kinds `node_gpu_core_usage` (percent of one GPU's SMs busy, 0-100) and `node_gpu_memory_usage`
(bytes), labelled `gpu_minor` and `gpu_device_uuid`. Pod and container kinds `pod_gpu_core_usage`,
`pod_gpu_memory_usage` (labels `pod_uid`, `gpu_minor`, `gpu_device_uuid`) and `container_gpu_core_usage`,
`container_gpu_memory_usage` (`container_id` instead of `pod_uid`): NVML's per-process usage summed over
the PIDs of each container's cgroup, and over its containers for the pod (Koordinator's
`getPodOrContainerTotalGPUUsageOfPIDs`). Only pods and containers with a process on a GPU get series.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from koordlet.gpu.nvml import GPUInventory, GPUUsage, ProcessGPUUsage
from koordlet.metriccache import GPUDevice, Label, MetricKind, Sample, SeriesKey

NODE_GPU_CORE_USAGE = "node_gpu_core_usage"
NODE_GPU_MEMORY_USAGE = "node_gpu_memory_usage"


@dataclass(frozen=True, slots=True)
class PodPIDs:
    """The PIDs of each container of one pod, as read from their cgroups."""

    pod_uid: str
    containers: Mapping[str, Sequence[int]]  # container ID -> PIDs in its cgroup


def gpu_devices(inventory: GPUInventory) -> tuple[GPUDevice, ...]:
    """The inventory as the metric cache keeps it (KV ``gpu_devices``)."""
    return tuple(GPUDevice(gpu.uuid, gpu.minor, gpu.memory_total_bytes) for gpu in inventory.gpus)


def _sum_by_gpu(processes: Mapping[int, Sequence[ProcessGPUUsage]], pids: Iterable[int]
                ) -> dict[tuple[int, str], tuple[float, float]]:
    totals: dict[tuple[int, str], tuple[float, float]] = {}
    for pid in set(pids):
        for usage in processes.get(pid, ()):
            core, memory = totals.get((usage.minor, usage.uuid), (0.0, 0.0))
            totals[(usage.minor, usage.uuid)] = (core + usage.sm_util_percent, memory + usage.memory_used_bytes)
    return totals


def process_samples(usage: Iterable[ProcessGPUUsage], pods: Iterable[PodPIDs], timestamp: float) -> list[Sample]:
    """Pod and container GPU samples: each process's usage goes to the container whose cgroup holds its PID."""
    by_pid: dict[int, list[ProcessGPUUsage]] = {}
    for process in usage:
        by_pid.setdefault(process.pid, []).append(process)
    samples: list[Sample] = []
    if not by_pid:
        return samples
    for pod in pods:
        levels = [(MetricKind.CONTAINER_GPU_CORE_USAGE, MetricKind.CONTAINER_GPU_MEMORY_USAGE,
                   {Label.CONTAINER_ID.value: container_id}, pids) for container_id, pids in pod.containers.items()]
        levels.append((MetricKind.POD_GPU_CORE_USAGE, MetricKind.POD_GPU_MEMORY_USAGE,
                       {Label.POD_UID.value: pod.pod_uid}, [p for pids in pod.containers.values() for p in pids]))
        for core_kind, memory_kind, owner, pids in levels:
            for (minor, uuid), (core, memory) in sorted(_sum_by_gpu(by_pid, pids).items()):
                labels = {**owner, Label.GPU_MINOR.value: str(minor), Label.GPU_DEVICE_UUID.value: uuid}
                samples.append(Sample(SeriesKey.of(core_kind, **labels), timestamp, core))
                samples.append(Sample(SeriesKey.of(memory_kind, **labels), timestamp, memory))
    return samples


def usage_samples(usage: Iterable[GPUUsage], timestamp: float) -> list[Sample]:
    samples: list[Sample] = []
    for gpu in usage:
        labels = {Label.GPU_MINOR.value: str(gpu.minor), Label.GPU_DEVICE_UUID.value: gpu.uuid}
        samples.append(Sample(SeriesKey.of(NODE_GPU_CORE_USAGE, **labels), timestamp, float(gpu.gpu_util_percent)))
        samples.append(Sample(SeriesKey.of(NODE_GPU_MEMORY_USAGE, **labels), timestamp, float(gpu.memory_used_bytes)))
    return samples

