"""What every part of the agent is built on: the :class:`AgentContext` its factories fill in start order, the
:class:`Component` they return, and the :class:`Part` that names one step of the start.

A factory ``(AgentContext) -> Component | None`` (:data:`ComponentFactory`) finds in the context what the parts
before it built and may put there what it builds for the ones after it; it returns what is to be started and
stopped, or None (nothing that runs, or off on this node). Building writes nothing on the node: what a part
changes, it changes in its ``start``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from koordlet.access import Refusals
from koordlet.config import KoordletConfig
from koordlet.executor import ResourceExecutor
from koordlet.gpu.nvml import NvmlModule
from koordlet.gpu.service import GPUService
from koordlet.health import Health
from koordlet.kubeapi import KubeClient
from koordlet.kubeclient.checkpoint import ApiCheckpoint
from koordlet.metriccache import MetricCache
from koordlet.metrics import KoordletMetrics
from koordlet.metricsadvisor.pods import DemandBoard
from koordlet.prediction.server import PredictServer
from koordlet.reporters.nodemetric import NodeMetricReporter
from koordlet.statesinformer.cpumanager import CPUManagerState, CPUManagerStateReader
from koordlet.statesinformer.informer import PodSource, StatesInformer
from koordlet.statesinformer.kube import KubeStates
from koordlet.system.cgroup import CgroupFS
from koordlet.system.kubepods import KubeCgroupLayout
from koordlet.system.roots import HostDirs

if TYPE_CHECKING:
    from koordlet.extensions import Extensions
    from koordlet.qosmanager import QoSManager
    from koordlet.runtimehooks import RuntimeHooks

STATES_SYNC_TIMEOUT_S = 60.0


class Component(Protocol):
    def start(self) -> None: ...

    def stop(self, timeout_s: float) -> bool | None:
        """Stop within ``timeout_s``; False (or None) when something was left running."""
        ...


@dataclass(slots=True)
class AgentContext:
    """What the part factories build on, filled in start order. The fields below the line are set by the
    part that builds them; reading one before that part ran raises AttributeError."""

    config: KoordletConfig
    metrics: KoordletMetrics
    api_client: KubeClient | None = None  # None in local mode: the koordlet's client, budget and Event recorder
    nvml: NvmlModule | None = None
    states_sync_timeout_s: float = STATES_SYNC_TIMEOUT_S
    abort: threading.Event = field(default_factory=threading.Event)  # a stop was asked for during the start
    health: Health = field(default_factory=lambda: Health(lambda: True))  # parts add their checks (/healthz)
    refusals: Refusals = field(default_factory=Refusals)  # 401s and 403s of the API server and kubelet
    usage_demand: DemandBoard = field(default_factory=DemandBoard)  # the pods read every collection (QoS → collector)
    # ---- built by the parts
    cgroup_fs: CgroupFS = field(init=False)
    executor: ResourceExecutor = field(init=False)
    layout: KubeCgroupLayout = field(init=False)
    cache: MetricCache = field(init=False)
    pod_source: PodSource = field(init=False)
    states: StatesInformer = field(init=False)
    kube: KubeStates | None = field(default=None, init=False)  # the node and NodeSLO watchers (API server)
    gpu: GPUService | None = field(default=None, init=False)  # gate Accelerators, with a GPU
    reporter: NodeMetricReporter | None = field(default=None, init=False)
    runtime_hooks: RuntimeHooks | None = field(default=None, init=False)
    qos_manager: QoSManager | None = field(default=None, init=False)
    predictor: PredictServer | None = field(default=None, init=False)
    extensions: Extensions | None = field(default=None, init=False)  # out-of-tree strategies and hook plugins
    _cpu_manager: Callable[[], CPUManagerState | None] | None = field(default=None, init=False)
    _dirs: HostDirs | None = field(default=None, init=False)
    _api_checkpoint: ApiCheckpoint | None = field(default=None, init=False)

    @property
    def api_checkpoint(self) -> ApiCheckpoint:
        """The objects last written to the API server, one file the NodeMetric and NRT reporters share
        (``-api-checkpoint-file``)."""
        if self._api_checkpoint is None:
            self._api_checkpoint = ApiCheckpoint(self.config.api_checkpoint_file)
        return self._api_checkpoint

    @property
    def dirs(self) -> HostDirs:
        """The kernel filesystems' mount dirs (:func:`host_dirs` of the config), worked out once."""
        if self._dirs is None:
            self._dirs = host_dirs(self.config)
        return self._dirs

    @property
    def cpu_manager(self) -> Callable[[], CPUManagerState | None]:
        """kubelet's CPU manager state, one reader shared by the cpuset hook, CPU suppress and the NRT."""
        if self._cpu_manager is None:
            self._cpu_manager = _kubelet_cpu_manager(self.config)
        return self._cpu_manager


ComponentFactory = Callable[[AgentContext], Component | None]


@dataclass(frozen=True, slots=True)
class Part:
    """A named step of the start: what ``build`` returns is started, logged as ``name``, stopped in reverse."""

    name: str
    build: ComponentFactory


class Running:
    """A part that is running once built (its factory had to start it, or it has nothing to start)."""

    def __init__(self, stop: Callable[[float], bool | None]) -> None:
        self._stop = stop

    def start(self) -> None:
        pass

    def stop(self, timeout_s: float) -> bool | None:
        return self._stop(timeout_s)


def host_dirs(config: KoordletConfig) -> HostDirs:
    """The kernel filesystems' mount dirs from ``-proc-root-dir``, ``-sys-root-dir``, ``-sys-fs-root-dir``
    and ``-cgroup-root-dir``."""
    return HostDirs.from_flags(proc_root_dir=config.proc_root_dir, sys_root_dir=config.sys_root_dir,
                               sys_fs_root_dir=config.sys_fs_root_dir, cgroup_root_dir=config.cgroup_root_dir)


def _kubelet_cpu_manager(config: KoordletConfig) -> Callable[[], CPUManagerState | None]:
    """kubelet's CPU manager state (``<-var-lib-kubelet-dir>/cpu_manager_state``, options and reserved CPUs from
    ``-kubelet-config-file``), read again when it changes; always None (unknown) with
    ``-disable-query-kubelet-config`` (Koordinator then reports no kubelet policy)."""
    if config.disable_query_kubelet_config:
        return lambda: None
    return CPUManagerStateReader(os.path.join(config.var_lib_kubelet_dir, "cpu_manager_state"),
                                 config.kubelet_config_file or None)
