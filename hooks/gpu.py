"""GPU env injection (docs/koordinator.md §3.3 GPUEnvInject): ``NVIDIA_VISIBLE_DEVICES`` from the scheduler's
``scheduling.koordinator.sh/device-allocated`` annotation, computed by the same function the device
plugin uses (koordlet.api.device.nvidia_visible_devices), so either path gives a container the same GPUs.

With HAMi-core isolation (pod label ``koordinator.sh/gpu-isolation-provider: HAMi-core``) and a GPU share below
a whole GPU (``koordinator.sh/gpu-memory-ratio`` < 100), as Koordinator's hook: ``CUDA_DEVICE_MEMORY_LIMIT``
(the share's ``koordinator.sh/gpu-memory`` in bytes), ``CUDA_DEVICE_SM_LIMIT`` (its ``gpu-core``, where given),
``LD_PRELOAD`` of HAMi-core's library (``-hami-core-library-directory-path``), and bind mounts of that library
and of ``/tmp/vgpulock`` (HAMi-core's lock dir). Koordinator gives the mounts through NRI only; here they also
travel through the proxy.

``HamiCoreVGPUMonitor`` (:func:`monitor_container`, its own plugin): for such a container HAMi-core's shared
usage region goes to a per-container host dir that HAMi's vGPU monitor reads:
``CUDA_DEVICE_MEMORY_SHARED_CACHE=<library dir>/<pod uid>_<container>.cache`` in the container, whose
``<library dir>`` is a bind mount of the host's ``<library dir>/containers/<pod uid>_<container>`` (made by
koordlet, mode 0777).
"""

from __future__ import annotations

import posixpath
import re

from koordlet.api.annotations import parse_device_allocated
from koordlet.api.device import (
    ANNOTATION_DEVICE_ALLOCATED,
    ENV_NVIDIA_VISIBLE_DEVICES,
    LABEL_GPU_ISOLATION_PROVIDER,
    RESOURCE_GPU_CORE,
    RESOURCE_GPU_MEMORY,
    RESOURCE_GPU_MEMORY_RATIO,
    GPUAllocation,
    nvidia_visible_devices,
)
from koordlet.api.quantity import QuantityError, parse_quantity

from .protocol import NO_CHANGES, Changes, ContainerContext, Mount, NodeContext
from .registry import Plugin, Stage, register

GPU_ISOLATION_PROVIDER_HAMI_CORE = "HAMi-core"
ENV_CUDA_DEVICE_MEMORY_LIMIT = "CUDA_DEVICE_MEMORY_LIMIT"
ENV_CUDA_DEVICE_SM_LIMIT = "CUDA_DEVICE_SM_LIMIT"
ENV_CUDA_DEVICE_MEMORY_SHARED_CACHE = "CUDA_DEVICE_MEMORY_SHARED_CACHE"
ENV_LD_PRELOAD = "LD_PRELOAD"
VGPU_LOCK_DIR = "/tmp/vgpulock"
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")


def rule(node: NodeContext) -> str:
    return node.hami_core_library


def _gpus(ctx: ContainerContext) -> tuple[GPUAllocation, ...]:
    raw = ctx.pod.annotations.get(ANNOTATION_DEVICE_ALLOCATED)
    return parse_device_allocated(raw).gpus if raw else ()


def hami_core_share(ctx: ContainerContext, gpus: tuple[GPUAllocation, ...]) -> GPUAllocation | None:
    """The GPU share HAMi-core is to enforce for this container, None when it is not HAMi-core's (the pod is
    not labelled for it, or the share is a whole GPU). ValueError when the share's ratio is missing."""
    if not gpus or ctx.pod.labels.get(LABEL_GPU_ISOLATION_PROVIDER) != GPU_ISOLATION_PROVIDER_HAMI_CORE:
        return None
    share = gpus[0]  # Koordinator reads the first device's resources
    ratio = share.resources.get(RESOURCE_GPU_MEMORY_RATIO)
    if ratio is None:
        raise ValueError("gpu memory ratio not found in gpu resource")
    try:
        whole = parse_quantity(ratio) >= 100
    except QuantityError as exc:
        raise ValueError(f"bad {RESOURCE_GPU_MEMORY_RATIO} {ratio!r}: {exc}") from exc
    return None if whole else share


def _hami_core(share: GPUAllocation, library: str) -> Changes:
    memory = share.resources.get(RESOURCE_GPU_MEMORY)
    if memory is None:
        raise ValueError("gpu memory not found in gpu resource")
    try:
        envs = {ENV_CUDA_DEVICE_MEMORY_LIMIT: str(int(parse_quantity(memory)))}
        core = share.resources.get(RESOURCE_GPU_CORE)
        if core is not None:
            envs[ENV_CUDA_DEVICE_SM_LIMIT] = str(int(parse_quantity(core)))
    except QuantityError as exc:
        raise ValueError(f"bad GPU share {dict(share.resources)}: {exc}") from exc
    envs[ENV_LD_PRELOAD] = library
    return Changes(envs=envs, mounts=(Mount(library, library), Mount(VGPU_LOCK_DIR, VGPU_LOCK_DIR)))


def container(ctx: ContainerContext, library: str) -> Changes:
    gpus = _gpus(ctx)
    if not gpus:
        return NO_CHANGES
    visible = nvidia_visible_devices(gpus)
    changes = Changes(envs={ENV_NVIDIA_VISIBLE_DEVICES: visible}) if visible else NO_CHANGES
    share = hami_core_share(ctx, gpus)
    return changes.merged(_hami_core(share, library)) if share is not None else changes


def hami_cache_root(library: str) -> str:
    """The host dir under which the per-container HAMi-core cache dirs are made."""
    return posixpath.join(posixpath.dirname(library), "containers")


def monitor_container(ctx: ContainerContext, library: str) -> Changes:
    """HamiCoreVGPUMonitor: the container's HAMi-core usage region in a host dir of its own."""
    gpus = _gpus(ctx)
    if hami_core_share(ctx, gpus) is None:
        return NO_CHANGES
    if not (_SAFE_NAME.match(ctx.pod.uid) and _SAFE_NAME.match(ctx.name)):
        raise ValueError(f"pod uid {ctx.pod.uid!r} or container name {ctx.name!r} cannot name a directory")
    library_dir = posixpath.dirname(library)
    name = f"{ctx.pod.uid}_{ctx.name}"
    host_dir = posixpath.join(hami_cache_root(library), name)
    return Changes(envs={ENV_CUDA_DEVICE_MEMORY_SHARED_CACHE: f"{library_dir}/{name}.cache"},
                   mounts=(Mount(library_dir, host_dir),), host_dirs=(host_dir,))


PLUGIN = register(Plugin("gpu", "GPUEnvInject", rule, container=container,
                         stages=frozenset({Stage.PRE_CREATE_CONTAINER})))
MONITOR_PLUGIN = register(Plugin("hamicore-vgpu-monitor", "HamiCoreVGPUMonitor", rule, container=monitor_container,
                                 stages=frozenset({Stage.PRE_CREATE_CONTAINER})))
