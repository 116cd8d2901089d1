"""The metric cache and the metrics advisor: which collectors run on this node (by flag and gate), and the
kidled settings an earlier koordlet left behind, put back by a part of their own (building the collector list
writes nothing on the node)."""

from __future__ import annotations

import logging

from koordlet.agent.context import AgentContext, Component, host_dirs
from koordlet.api.qos import KubeQoS
from koordlet.executor import ResourceExecutor
from koordlet.metriccache import MetricCache
from koordlet.metricsadvisor import (
    Collector,
    CollectorRunner,
    NodePsiCollector,
    NodeResourceCollector,
    PodPsiCollector,
    PodResourceCollector,
)
from koordlet.metricsadvisor.nodeinfo import CPUNodeMap, NodeInfoCollector
from koordlet.reporters.device import GPUCollector
from koordlet.statesinformer.cgroups import close_with_pods, host_app_cgroup_source, pod_cgroup_source
from koordlet.system.sysfs import NUMAMemInfoFiles, SysfsError, read_online_cpus

logger = logging.getLogger(__name__)


def metric_cache(ctx: AgentContext) -> Component | None:
    ctx.cache = MetricCache()
    return None


def collectors(ctx: AgentContext) -> list[Collector]:
    """Every collector this node runs, built (nothing started, nothing written)."""
    config, states, layout, cgroup_fs = ctx.config, ctx.states, ctx.layout, ctx.cgroup_fs
    node_collector = NodeResourceCollector(ctx.dirs.proc_dir, config.collect_res_used_interval_s,
                                           per_cpu=config.gate("PerCPUMetric"),
                                           numa_files=NUMAMemInfoFiles(ctx.dirs.sys_dir),
                                           cpu_nodes=CPUNodeMap(ctx.cache))
    built: list[Collector] = [
        NodeInfoCollector(ctx.cache, ctx.dirs.sys_dir, ctx.config.collect_node_cpu_info_interval_s,
                          observe=ctx.metrics.observe_node_info),
        node_collector,
        PodResourceCollector(pod_cgroup_source(states.pods, layout), cgroup_fs,
                             config.collect_res_used_interval_s, be_cgroup_dir=layout.qos_dir(KubeQoS.BESTEFFORT),
                             node=node_collector, collect_page_cache=config.enable_pagecache_collector,
                             host_apps=host_app_cgroup_source(states.node_slo, layout),
                             kubepods_dir=layout.kubepods_dir(), demand=ctx.usage_demand.get,
                             fanout_interval_s=max(config.collect_pod_res_used_interval_s,
                                                   config.collect_res_used_interval_s)),
    ]
    if config.gate("PSICollector"):
        built.append(NodePsiCollector(ctx.dirs.proc_dir, config.psi_collector_interval_s))
        built.append(PodPsiCollector(pod_cgroup_source(states.pods, layout), cgroup_fs,
                                     config.psi_collector_interval_s))
    if ctx.gpu is not None:
        built.append(GPUCollector(ctx.gpu, config.collect_res_used_interval_s,
                                  pods=pod_cgroup_source(states.pods, layout), cgroup_fs=cgroup_fs))
    built += _alpha_collectors(ctx)
    return built


def _alpha_collectors(ctx: AgentContext) -> list[Collector]:
    """The collectors of the Alpha gates ``ResctrlCollector``, ``CPICollector`` and ``ColdPageCollector``."""
    config = ctx.config
    dirs = host_dirs(config)
    built: list[Collector] = []
    if config.gate("ResctrlCollector"):
        if config.enable_resctrl_collector and dirs.resctrl_dir:
            from koordlet.metricsadvisor.resctrl import ResctrlCollector

            built.append(ResctrlCollector(dirs.resctrl_dir, config.resctrl_collector_interval_s))
        else:
            logger.info("resctrl collector off: gate ResctrlCollector needs -enable-resctrl-collector too "
                        "(as in Koordinator)")
    if config.gate("ColdPageCollector"):
        from koordlet.metricsadvisor.coldpage import ColdPageCollector

        built.append(ColdPageCollector(
            pod_cgroup_source(ctx.states.pods, ctx.layout), ctx.cgroup_fs, config.coldpage_collector_interval_s,
            executor=ctx.executor, host_apps=host_app_cgroup_source(ctx.states.node_slo, ctx.layout),
            proc_dir=dirs.proc_dir, sys_dir=dirs.sys_dir))
    if config.gate("CPICollector"):
        from koordlet.metricsadvisor.cpi import CPICollector

        libpfm = config.gate("Libpfm4")
        try:
            cpus = read_online_cpus(dirs.sys_dir)
        except SysfsError as err:  # one collector off, not the agent
            logger.warning("CPI collector off: %s", err)
        else:
            built.append(CPICollector(pod_cgroup_source(ctx.states.pods, ctx.layout), ctx.cgroup_fs, cpus,
                                      config.cpi_collector_interval_s, config.collect_cpi_timewindow_s,
                                      group=libpfm, libpfm=libpfm))
    return built


class _KidledRestore:
    """Gate ``ColdPageCollector`` off: at start, the kidled settings an earlier koordlet with the gate on changed
    go back (a plan run, from the executor's record; nothing recorded, nothing written). Nothing runs after."""

    def __init__(self, executor: ResourceExecutor) -> None:
        self._executor = executor

    def start(self) -> None:
        from koordlet.metricsadvisor.coldpage import restore_kidled

        restore_kidled(self._executor, "feature gate ColdPageCollector is off")

    def stop(self, timeout_s: float) -> bool:
        return True


def kidled_restore(ctx: AgentContext) -> Component | None:
    """What an earlier koordlet changed in kidled goes back when the gate is off; with it on, the cold page
    collector starts kidled itself and puts it back when it stops."""
    if ctx.config.gate("ColdPageCollector"):
        return None
    return _KidledRestore(ctx.executor)


def metrics_advisor(ctx: AgentContext) -> Component | None:
    config = ctx.config
    ctx.metrics.bind(ctx.cache, ctx.states, stale_after_s=max(10.0, 3 * config.collect_res_used_interval_s),
                     psi_stale_after_s=3 * config.psi_collector_interval_s,
                     slow_stale_after_s=3 * max(config.cpi_collector_interval_s, config.resctrl_collector_interval_s,
                                                config.coldpage_collector_interval_s))
    runner = CollectorRunner(ctx.cache, collectors(ctx), registry=ctx.metrics.registry)
    ctx.health.watch_loop("collectors", runner)
    close_with_pods(ctx.states, ctx.layout, (runner.forget_dirs, ctx.executor.forget_reads))
    return runner
