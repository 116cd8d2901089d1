"""The QoS manager and its strategies (koordinator.md §4): suppress, burst, memory QoS, evictions, resctrl.

:func:`new_qos_manager` wires the strategies the way the daemon runs them; each strategy module can also
be used on its own (``decide`` functions are pure).
"""

from __future__ import annotations

import logging
import time

from koordlet.eviction import Evictor
from koordlet.executor import ResourceExecutor
from koordlet.metriccache import MetricCache
from koordlet.qosmanager.cpuburst import CPUBurst
from koordlet.qosmanager.cpuevict import BECPUEvict
from koordlet.qosmanager.cpusuppress import CPUSuppress
from koordlet.qosmanager.framework import (
    DEFAULT_FEATURE_GATES,
    GATE_BE_CPU_MANAGER,
    QoSManager,
    QoSManagerConfig,
    Strategy,
    resolve_feature_gates,
)
from koordlet.qosmanager.memoryevict import BEMemoryEvict
from koordlet.qosmanager.memoryqos import MemoryQoS
from koordlet.qosmanager.resctrl import ResctrlReconcile
from koordlet.qosmanager.snapshot import Snapshot, SnapshotBuilder
from koordlet.statesinformer.api import StatesProvider
from koordlet.system.kubepods import KubeCgroupLayout
from koordlet.system.roots import SYS_DIR
from koordlet.system.sysfs import CPUInfo, SysfsError, read_cpu_topology

logger = logging.getLogger(__name__)


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
) -> QoSManager:
    """The manager with every strategy; eviction strategies only when an ``evictor`` is given.

    ``layout``: kubelet's cgroup driver and ``--cgroup-root``; ``cpus``: the CPU topology for the cpuset
    policy, else read from ``<sys_dir>/devices/system/cpu``; ``started_at``: the agent's wall-clock
    start (BECPUEvict rests 20 s after it; default now).
    """
    config = config or QoSManagerConfig()
    if cpus is None:
        try:
            cpus = read_cpu_topology(sys_dir)
        except SysfsError as exc:
            logger.warning("no CPU topology (%s); the cpuset suppress policy will not pick CPUs", exc)
            cpus = ()
    builder = SnapshotBuilder(states, cache, cpus, config.collect_res_used_interval_s)
    strategies: list[Strategy] = []
    if config.gate(GATE_BE_CPU_MANAGER):
        # §4.2: with the BE CPU manager, BE pods get their cpusets from it and suppress stays off.
        logger.info("feature gate %s is on: CPU suppress is off", GATE_BE_CPU_MANAGER)
    else:
        strategies.append(CPUSuppress(builder, executor, layout, config.cpu_suppress_interval_s, config.node_name))
    strategies += [
        CPUBurst(builder, executor, layout, config.reconcile_interval_s, config.node_name),
        MemoryQoS(builder, executor, layout, config.reconcile_interval_s),
        ResctrlReconcile(builder, executor, layout, config.reconcile_interval_s),
    ]
    if evictor is not None:
        strategies.append(BEMemoryEvict(builder, evictor, config.memory_evict_interval_s,
                                        config.memory_evict_cool_time_s))
        strategies.append(BECPUEvict(builder, evictor, config.cpu_evict_interval_s, config.cpu_evict_cool_time_s,
                                     started_at=time.time() if started_at is None else started_at))
    else:
        logger.info("no evictor: the eviction strategies are off")
    return QoSManager(states, strategies, config, phase_source=builder.latest_collection)


__all__ = [
    "DEFAULT_FEATURE_GATES",
    "BECPUEvict",
    "BEMemoryEvict",
    "CPUBurst",
    "CPUSuppress",
    "MemoryQoS",
    "QoSManager",
    "QoSManagerConfig",
    "ResctrlReconcile",
    "Snapshot",
    "SnapshotBuilder",
    "Strategy",
    "new_qos_manager",
    "resolve_feature_gates",
]
