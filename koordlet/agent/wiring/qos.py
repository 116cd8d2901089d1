"""The QoS manager: its strategies (and the out-of-tree ones), the evictor they evict through, and its
configuration from the flags."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from koordlet.agent.context import AgentContext, Component
from koordlet.agent.wiring.extensions import gates_with_extensions
from koordlet.config import KoordletConfig

if TYPE_CHECKING:
    from koordlet.statesinformer.kubeletconfig import KubeletMemoryQoSSource

logger = logging.getLogger(__name__)


def qos_manager_on(config: KoordletConfig) -> bool:
    return config.collect_res_used_interval_s >= 1.0


def kubelet_memory_qos(ctx: AgentContext) -> KubeletMemoryQoSSource:
    """What kubelet's own memory QoS writes: from ``-kubelet-config-file``, else kubelet's ``/configz`` (not in local
    mode); neither with ``-disable-query-kubelet-config`` (kubelet then taken to write nothing)."""
    from koordlet.statesinformer.kubelet import KubeletPodSource
    from koordlet.statesinformer.kubeletconfig import KubeletMemoryQoSSource

    config = ctx.config
    query = not config.disable_query_kubelet_config
    file = config.kubelet_config_file if query and config.kubelet_config_file else None
    source = ctx.pod_source
    configz = source.kubelet_config if query and file is None and isinstance(source, KubeletPodSource) else None

    def version() -> str:
        node = ctx.states.node()
        return node.kubelet_version if node is not None else ""

    return KubeletMemoryQoSSource(file, configz, version)


def qos_manager(ctx: AgentContext) -> Component | None:
    from koordlet.eviction import Evictor, zero_eviction_counts
    from koordlet.qosmanager import QoSManagerConfig, cpuevict, memoryevict, new_qos_manager

    config = ctx.config
    if not qos_manager_on(config):
        logger.info("qos manager off: -collect-res-used-interval below 1 s (docs/koordinator.md §4.1)")
        return None
    evictor = Evictor(config.node_name, api_client=ctx.api_client,
                      cri_endpoint=config.containerd_endpoint or config.cri_endpoint or None,
                      kill_by_cri=False, pods=ctx.states.pods)
    qos_config = QoSManagerConfig(
        node_name=config.node_name,
        collect_res_used_interval_s=config.collect_res_used_interval_s,
        reconcile_interval_s=float(config.reconcile_interval_seconds),
        cpu_suppress_interval_s=float(config.cpu_suppress_interval_seconds),
        cpu_evict_interval_s=float(config.cpu_evict_interval_seconds),
        memory_evict_interval_s=float(config.memory_evict_interval_seconds),
        memory_evict_cool_time_s=float(config.memory_evict_cool_time_seconds),
        cpu_evict_cool_time_s=float(config.cpu_evict_cool_time_seconds),
        fanout_interval_s=config.collect_pod_res_used_interval_s,
        feature_gates=gates_with_extensions(ctx),
    )
    manager = new_qos_manager(ctx.states, ctx.cache, ctx.executor, ctx.layout, evictor=evictor, config=qos_config,
                              sys_dir=ctx.dirs.sys_dir, cpu_manager=ctx.cpu_manager,
                              observe_storage=ctx.metrics.observe_local_storage_info,
                              extensions=ctx.extensions.strategies if ctx.extensions is not None else (),
                              publish_demand=ctx.usage_demand.set if config.collect_pod_res_used_interval_s
                              > config.collect_res_used_interval_s else None,
                              kubelet_memory_qos=kubelet_memory_qos(ctx))
    ctx.health.watch_loop("qosmanager", manager)
    ctx.qos_manager = manager
    zero_eviction_counts(config.node_name, [feature for feature in (*memoryevict.FEATURES, *cpuevict.FEATURES)
                                            if config.gate(feature)])
    return manager
