"""The node-state collector (koordlet/collector.py): what koordlet made on the node, taken away when nothing asks
for it any more; which kinds it looks after follows the gates (and whether the QoS manager runs)."""

from __future__ import annotations

from koordlet.agent.context import AgentContext, Component
from koordlet.agent.wiring.qos import qos_manager_on


def node_state_collector(ctx: AgentContext) -> Component | None:
    """The collector pass over what koordlet made on the node (koordlet.collector): at start, then every few
    minutes."""
    from hooks.gpu import hami_cache_root
    from koordlet.collector import CollectorConfig, NodeStateCollector

    config = ctx.config
    qos_manager = qos_manager_on(config)
    collector_config = CollectorConfig(pod_groups=config.gate("Resctrl"),
                                       class_groups=qos_manager and config.gate("RdtResctrl"),
                                       blkio=qos_manager and config.gate("BlkIOReconcile"),
                                       psi_throttle=qos_manager and config.gate("BEPSIThrottle"),
                                       system_config=qos_manager and config.gate("SystemConfig"),
                                       resctrl_dir=ctx.dirs.resctrl_dir,
                                       host_dir_root=hami_cache_root(config.hami_core_library_directory_path))
    return NodeStateCollector(collector_config, ctx.states, ctx.executor)
