"""The GPUs: the GPU service (NVML, inventory, health; gate ``Accelerators``) and the kubelet device plugin that
serves them. The Device object that reports them is built with the reporters (wiring/reporters.py)."""

from __future__ import annotations

import logging
import os

from koordlet.agent.context import AgentContext, Component, Running
from koordlet.gpu.metrics import gpu_devices
from koordlet.gpu.service import GPUService
from koordlet.kubeapi import CoreV1
from koordlet.metriccache import GPU_DEVICES_KV

logger = logging.getLogger(__name__)


def gpu_service(ctx: AgentContext) -> Component | None:
    """NVML, the GPU inventory and health (gate ``Accelerators``); before the metrics advisor, whose GPU
    collector reads it, so it is stopped after the collector and the Device report loop."""
    config = ctx.config
    if not config.gate("Accelerators"):
        return None
    # A short NVML event wait keeps the health thread quick to stop.
    gpu = ctx.gpu = GPUService.start(ctx.nvml, sys_dir=ctx.dirs.sys_dir, poll_timeout_ms=1000)
    if gpu is None:
        return None
    ctx.cache.set_kv(GPU_DEVICES_KV, gpu_devices(gpu.inventory))  # for NodeMetric and Prometheus
    return Running(gpu.stop)


def _can_write_in(directory: str) -> bool:
    """Whether ``directory`` (or, while it does not exist, the dir it would be made in) takes new files: access(2)
    says no for a read-only mount (EROFS) as for missing permission."""
    path = os.path.abspath(directory)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return os.access(path, os.W_OK)


def device_plugin(ctx: AgentContext) -> Component | None:
    """The kubelet device plugin for this node's GPUs (with the GPU service, so gate ``Accelerators``):
    serves in ``<-var-lib-kubelet-dir>/device-plugins/``, registers with kubelet over ``kubelet.sock`` there
    (kubelet not up yet is waited for, not an error), registers again when kubelet re-creates that socket,
    streams the GPU service's health, and answers Allocate with the scheduler's choice (node lock, docs/node-lock.md;
    an API server is needed for that). Stopped before the GPU service."""
    gpu = ctx.gpu
    if gpu is None:
        return None
    from koordlet.deviceplugin.server import gpu_device_plugin

    config = ctx.config
    if not _can_write_in(config.device_plugin_dir):
        logger.warning("GPU device plugin off: %s is not writable here (Koordinator's chart mounts /var/lib/kubelet "
                       "read-only), so no plugin socket can be made there; the GPUs are still reported in the Device "
                       "object and NodeMetric. Mount it read-write to serve nvidia.com/gpu (docs/koordinator.md)",
                       config.device_plugin_dir)
        return None
    core_api = CoreV1(ctx.api_client) if ctx.api_client is not None else None
    server = gpu_device_plugin(core_api, config.node_name, gpu, plugin_dir=config.device_plugin_dir,
                               dev_dir=ctx.dirs.dev_dir)
    server.start(require_kubelet=False)
    return Running(server.stop)
