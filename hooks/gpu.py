"""GPU env injection (§3.3 GPUEnvInject): ``NVIDIA_VISIBLE_DEVICES`` from the scheduler's
``scheduling.koordinator.sh/device-allocated`` annotation, computed by the same function the device
plugin uses (koordlet.api.device.nvidia_visible_devices), so either path gives a container the same GPUs."""

from __future__ import annotations

from koordlet.api.annotations import parse_device_allocated
from koordlet.api.device import ANNOTATION_DEVICE_ALLOCATED, ENV_NVIDIA_VISIBLE_DEVICES, nvidia_visible_devices

from .protocol import NO_CHANGES, Changes, ContainerContext, NodeContext
from .registry import Plugin, Stage, register


def rule(node: NodeContext) -> None:
    return None


def container(ctx: ContainerContext, _rule: None) -> Changes:
    raw = ctx.pod.annotations.get(ANNOTATION_DEVICE_ALLOCATED)
    if not raw:
        return NO_CHANGES
    visible = nvidia_visible_devices(parse_device_allocated(raw).gpus)
    return Changes(envs={ENV_NVIDIA_VISIBLE_DEVICES: visible}) if visible else NO_CHANGES


PLUGIN = register(Plugin("gpu", "GPUEnvInject", rule, container=container,
                         stages=frozenset({Stage.PRE_CREATE_CONTAINER})))
