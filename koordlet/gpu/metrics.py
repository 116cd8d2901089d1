"""Per-GPU usage as metric-cache samples (koordinator.md §7.1 GPU collector, §7.2 series names).

Kinds `node_gpu_core_usage` (percent of one GPU's SMs busy, 0-100) and `node_gpu_memory_usage`
(bytes), labelled `gpu_minor` and `gpu_device_uuid`. Per-pod GPU usage (NVML process utilisation
mapped to containers by PID) needs the pod/PID index of the states informer and is not done here.
"""

from __future__ import annotations

from collections.abc import Iterable

from koordlet.gpu.nvml import GPUUsage
from koordlet.metriccache import Label, MetricCache, Sample, SeriesKey

NODE_GPU_CORE_USAGE = "node_gpu_core_usage"
NODE_GPU_MEMORY_USAGE = "node_gpu_memory_usage"


def usage_samples(usage: Iterable[GPUUsage], timestamp: float) -> list[Sample]:
    samples: list[Sample] = []
    for gpu in usage:
        labels = {Label.GPU_MINOR.value: str(gpu.minor), Label.GPU_DEVICE_UUID.value: gpu.uuid}
        samples.append(Sample(SeriesKey.of(NODE_GPU_CORE_USAGE, **labels), timestamp, float(gpu.gpu_util_percent)))
        samples.append(Sample(SeriesKey.of(NODE_GPU_MEMORY_USAGE, **labels), timestamp, float(gpu.memory_used_bytes)))
    return samples


def record_usage(cache: MetricCache, usage: Iterable[GPUUsage], timestamp: float) -> int:
    """Append one collection round to the cache; returns how many samples were accepted."""
    return cache.append_samples(usage_samples(usage, timestamp))
