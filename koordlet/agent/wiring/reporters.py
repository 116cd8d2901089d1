"""The reporters, the last parts to start: the Device object (GPUs, XPUs, RDMA devices), the
NodeResourceTopology (with an API server) and NodeMetric (to the API server, or as YAML under ``-report-dir``)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from koordlet.agent.context import AgentContext, Component, host_dirs
from koordlet.agent.wiring.prediction import prod_prediction
from koordlet.config import KoordletConfig
from koordlet.gpu.reporter import DeviceReporter
from koordlet.gpu.xpu import XPUInventory
from koordlet.kubeapi import CustomObjects
from koordlet.reporters.device import DeviceReportLoop
from koordlet.reporters.nodemetric import NodeMetricReporter
from koordlet.reporters.nrt import NRTReporter, NRTReportLoop
from koordlet.reporters.rdma import RDMAInventory
from koordlet.statesinformer.kube import KubeStates
from koordlet.system.sysfs import read_node_hugepages, read_node_topology

logger = logging.getLogger(__name__)


def node_uid(kube: KubeStates | None) -> Callable[[], str]:
    """The Node object's UID as the node watcher last saw it ("" before that, or without an API server): the
    owner reference of the objects the reporters write."""
    def uid() -> str:
        raw = kube.raw_node if kube is not None else None
        return str(((raw or {}).get("metadata") or {}).get("uid") or "")

    return uid


def _rdma_inventory(config: KoordletConfig) -> RDMAInventory | None:
    """The node's RDMA devices (gate ``RDMADevices``), None when the gate is off or the node has none."""
    if not config.gate("RDMADevices"):
        return None
    inventory = RDMAInventory(host_dirs(config).sys_dir)
    if not inventory.devices():
        logger.info("RDMA devices: none on this node (no network PCI function with infiniband/)")
        return None
    return inventory


def device_reporter(ctx: AgentContext) -> Component | None:
    """The Device object, with a GPU service, the XPU device-info files (gate ``Accelerators``, as Koordinator's XPU
    collector) or RDMA devices."""
    config = ctx.config
    rdma = _rdma_inventory(config)
    xpu = (XPUInventory(config.xpu_device_infos_dir, on_problem=ctx.metrics.observe_xpu_problem)
           if config.gate("Accelerators") else None)
    if ctx.gpu is None and rdma is None and xpu is None:
        return None
    api_client, kube = ctx.api_client, ctx.kube
    custom_api = CustomObjects(api_client) if api_client is not None else None
    file_path = None if custom_api is not None else Path(config.report_dir) / f"device-{config.node_name}.yaml"
    reporter = DeviceReporter(config.node_name, custom_api=custom_api, file_path=file_path)
    return DeviceReportLoop(ctx.gpu, reporter, config.node_topology_sync_interval_s, node_uid(kube), rdma=rdma,
                            xpu=xpu, xpu_only=config.xpu_enforce_collect_from_device_infos)


def nrt_reporter(ctx: AgentContext) -> Component | None:
    """The NodeResourceTopology (gate ``NodeTopologyReport``), with an API server only."""
    config, api_client, kube, states = ctx.config, ctx.api_client, ctx.kube, ctx.states
    if not config.gate("NodeTopologyReport") or api_client is None:
        return None
    sys_dir = ctx.dirs.sys_dir

    def node_annotations() -> dict[str, str]:
        node = states.node()
        return dict(node.annotations) if node is not None else {}

    per_cpu = config.gate("PerCPUMetric")
    metrics = ctx.metrics
    return NRTReportLoop(
        NRTReporter(config.node_name, CustomObjects(api_client)),
        lambda: read_node_topology(sys_dir), states.pods, ctx.cpu_manager,
        node_annotations=node_annotations, node_uid=node_uid(kube), interval_s=config.node_topology_sync_interval_s,
        min_update_interval_s=config.node_topology_min_update_interval_s,
        observe=metrics.observe_node_topology_report,
        read_hugepages=(lambda: read_node_hugepages(sys_dir)) if config.gate("HugePageReport") else None,
        observe_pools=lambda pools: metrics.observe_cpu_pools(pools.shared_cpus, pools.be_shared_cpus, per_cpu),
        checkpoint=ctx.api_checkpoint)


def nodemetric_reporter(ctx: AgentContext) -> Component | None:
    config, api_client, states, metrics = ctx.config, ctx.api_client, ctx.states, ctx.metrics
    if not config.enable_node_metric_report:
        return None
    custom_api = CustomObjects(api_client) if api_client is not None else None
    reporter = ctx.reporter = NodeMetricReporter(
        config.node_name, ctx.cache, states.pods, custom_api=custom_api,
        report_dir=config.report_dir if api_client is None else None,
        default_interval_s=config.report_interval_s, create_missing=config.create_node_metric,
        observe=metrics.observe_report,
        on_report=metrics.observe_node_metric_status if config.gate("NodeMetricPromMetrics") else None,
        host_apps=lambda: states.node_slo().host_applications,
        prod_prediction=prod_prediction(ctx),
        checkpoint=ctx.api_checkpoint if api_client is not None else None,
    )
    return reporter
