"""The QoS manager and its strategies (docs/koordinator.md §4): suppress, burst, memory QoS, evictions, resctrl.

Every strategy has one shape (see :mod:`koordlet.qosmanager.framework`): a frozen config from the NodeSLO
and a pure ``decide(snapshot, config) -> Plan``, registered in :data:`STRATEGIES`. :func:`new_qos_manager`
wires them the way the daemon runs them: the manager ticks them and one
:class:`~koordlet.actuator.PlanRunner` carries their plans out through the executor and the evictor.

A new strategy: a module here with its ``Config`` (``from_node_slo``, ``enabled``, ``needs``), its ``decide``
and ``STRATEGY = Strategy(name, gate, Config, decide)``, added to :data:`STRATEGIES` (and its interval flag to
:func:`new_qos_manager`); ``memoryevict.py`` is the smallest to copy.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from koordlet.actuator import PlanRunner
from koordlet.api.kubeletmemqos import KubeletMemoryQoS
from koordlet.eviction import Evictor
from koordlet.executor import ResourceExecutor
from koordlet.metriccache import MetricCache
from koordlet.metricsadvisor.pods import UsageDemand
from koordlet.plan import Plan, SystemRestore
from koordlet.qosmanager import (
    blkio,
    cpuburst,
    cpuevict,
    cpusuppress,
    memoryevict,
    memoryqos,
    memoryreclaim,
    psithrottle,
    resctrl,
    sysreconcile,
)
from koordlet.qosmanager.framework import (
    DEFAULT_FEATURE_GATES,
    GATE_BE_CPU_MANAGER,
    GATE_SYSTEM_CONFIG,
    QoSManager,
    QoSManagerConfig,
    Strategy,
    resolve_feature_gates,
)
from koordlet.qosmanager.metrics import GAUGES
from koordlet.qosmanager.snapshot import Snapshot, SnapshotBuilder
from koordlet.statesinformer.api import StatesProvider
from koordlet.system.kubepods import KubeCgroupLayout
from koordlet.system.roots import SYS_DIR
from koordlet.system.sysfs import CPUInfo, SysfsError, read_cpu_topology

logger = logging.getLogger(__name__)

# Every strategy, in tick order (the manager runs them in this order when they are due together).
STRATEGIES: tuple[Strategy, ...] = (
    cpusuppress.STRATEGY,
    cpuburst.STRATEGY,
    memoryqos.STRATEGY,
    resctrl.STRATEGY,
    memoryreclaim.STRATEGY,  # before eviction: when both are due, reclaim acts first
    memoryevict.STRATEGY,
    cpuevict.STRATEGY,
    sysreconcile.STRATEGY,
    blkio.STRATEGY,
    psithrottle.STRATEGY,
)
_EVICTIONS = (memoryevict.STRATEGY.name, cpuevict.STRATEGY.name)


def _interval_s(strategy: Strategy, config: QoSManagerConfig) -> float:
    """The flag that sets each strategy's interval (docs/koordinator.md §4.1)."""
    return {
        cpusuppress.STRATEGY.name: config.cpu_suppress_interval_s,
        memoryevict.STRATEGY.name: config.memory_evict_interval_s,
        cpuevict.STRATEGY.name: config.cpu_evict_interval_s,
    }.get(strategy.name, config.reconcile_interval_s)


def new_qos_manager(
    states: StatesProvider,
    cache: MetricCache,
    executor: ResourceExecutor,
    layout: KubeCgroupLayout,
    *,
    evictor: Evictor | None = None,
    config: QoSManagerConfig | None = None,
    sys_dir: str = SYS_DIR,
    cpus: tuple[CPUInfo, ...] | None = None,
    started_at: float | None = None,
    cpu_manager: Callable[[], Any] | None = None,
    observe_storage: Callable[[bool], None] | None = None,
    extensions: tuple[Strategy, ...] = (),
    publish_demand: Callable[[UsageDemand], None] | None = None,
    kubelet_memory_qos: Callable[[], KubeletMemoryQoS] | None = None,
) -> QoSManager:
    """The manager with every strategy; eviction strategies only when an ``evictor`` is given.

    ``layout``: kubelet's cgroup driver and ``--cgroup-root``; ``cpus``: the CPU topology for the cpuset
    policy, else read from ``<sys_dir>/devices/system/cpu``; ``started_at``: the agent's wall-clock
    start (BECPUEvict rests 20 s after it; default now); ``cpu_manager``: kubelet's CPU manager state
    (statesinformer.cpumanager), for CPU suppress's static-policy rules; ``observe_storage``: told whether each
    reading of the block devices worked; ``extensions``: out-of-tree strategies (koordlet.extensions), run after
    the built-in ones behind their own gates; ``publish_demand``: told which pods' usage the strategies that are on
    read every tick (the collector's :class:`~koordlet.metricsadvisor.pods.DemandBoard`; None: every pod's);
    ``kubelet_memory_qos``: what kubelet's own memory QoS writes (memory QoS leaves those files to it).
    """
    config = config or QoSManagerConfig()
    config = replace(config, started_at=time.time() if started_at is None else started_at)
    if cpus is None:
        try:
            cpus = read_cpu_topology(sys_dir)
        except SysfsError as exc:
            logger.warning("no CPU topology (%s); the cpuset suppress policy will not pick CPUs", exc)
            cpus = ()
    builder = SnapshotBuilder(states, cache, cpus, config.collect_res_used_interval_s, reader=executor,
                              layout=layout, cpu_manager=cpu_manager, sys_dir=sys_dir, observe_storage=observe_storage,
                              kubelet_memory_qos=kubelet_memory_qos)
    strategies: list[Strategy] = []
    if config.gate(GATE_BE_CPU_MANAGER):
        # docs/koordinator.md §4.2: with the BE CPU manager, suppress stands down and keeps the BE cpusets on the
        # share pool (cpusuppress.decide_be_cpu_manager); the cpuset hook gives allocated BE pods their NUMA
        # nodes' pools.
        logger.info("feature gate %s is on: CPU suppress stands down, BE cpusets follow the BE share pool",
                    GATE_BE_CPU_MANAGER)
    for strategy in STRATEGIES:
        if strategy.name in _EVICTIONS and evictor is None:
            continue
        strategies.append(replace(strategy, interval_s=_interval_s(strategy, config)))
    strategies += [replace(strategy, interval_s=config.reconcile_interval_s) for strategy in extensions]
    if evictor is None:
        logger.info("no evictor: the eviction strategies are off")
    runner = PlanRunner(executor, evictor, GAUGES)
    _restore_system_config(config, executor, runner)
    return QoSManager(states, strategies, config, phase_source=builder.latest_collection, builder=builder,
                      runner=runner, publish_demand=publish_demand)


def _restore_system_config(config: QoSManagerConfig, executor: ResourceExecutor, runner: PlanRunner) -> None:
    """With the ``SystemConfig`` gate off, put back every sysctl an earlier koordlet changed (the executor's
    record survives restarts): switching the gate off undoes the strategy."""
    recorded = sorted(key for key in executor.originals.keys() if sysreconcile.owns(key))
    if config.gate(GATE_SYSTEM_CONFIG) or not recorded:
        return
    reason = f"feature gate {GATE_SYSTEM_CONFIG} is off"
    record = runner.run(Plan(system=tuple(SystemRestore(key, reason) for key in recorded)), sysreconcile.STRATEGY.name)
    logger.info("%s: restored %d recorded sysctl values (%d failed)", reason, record.system_written,
                len(record.system_errors))


__all__ = [
    "DEFAULT_FEATURE_GATES",
    "STRATEGIES",
    "QoSManager",
    "QoSManagerConfig",
    "Snapshot",
    "SnapshotBuilder",
    "Strategy",
    "new_qos_manager",
    "resolve_feature_gates",
]
