"""The koordlet daemon: builds every part from the configuration and runs them in Koordinator's order.

The order is docs/koordinator.md §1.2.

Start: metrics HTTP server (``/healthz`` is 503 until the start is complete, then checks the parts' loops,
koordlet.health; ``/readyz`` is 200 once started and synced) → executor → metric cache →
states informer (its node and NodeSLO sources first; then the NRI plugin, which needs no pod list; then the
wait until synced, bounded; PLEG) → GPU service →
GPU device plugin (with the GPU service) → metrics advisor → predict server → qos manager → runtime hooks →
network QoS → reporters. SIGTERM/SIGINT stop everything in reverse order, each part with its share of what is left of
``-stop-timeout`` (so the whole stop stays within it); the process exits 0 after a clean stop.

Two ways to run:
- with an API server (in-cluster config or ``-kubeconfig``): node and NodeSLO watched, pods from kubelet
  ``/pods``, NodeMetric status and NodeResourceTopology reported, Events recorded;
- ``-local-mode``: NodeSLO from ``-node-slo-file`` (watched), pods from the CRI at ``-cri-endpoint``, the
  node's capacity from this host, NodeMetric written as YAML under ``-report-dir``.

Parts: every part is built by a factory ``(AgentContext) -> Component | None`` (:data:`ComponentFactory`),
called in start order (:func:`agent_parts`). The :class:`AgentContext` is filled in step by step: a factory
finds there what the parts before it built and may put what it builds for the ones after it; it returns what
is to be started and stopped, or None (nothing that runs, or off on this node). :class:`Koordlet` takes
``extra_components`` (default :func:`default_components`: the qos manager, the runtime hooks, then the network
QoS manager where ``TCNetworkQoS`` is on): they run after the metrics advisor and before the reporters.
"""

from __future__ import annotations

import logging
import os
import resource
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Protocol

import kubernetes.client
from kubernetes.config.config_exception import ConfigException
from kubernetes.config.incluster_config import load_incluster_config

from koordlet import audit, features, logs
from koordlet.api.pod import PodMeta
from koordlet.api.qos import KubeQoS
from koordlet.config import ConfigError, KoordletConfig, parse_config
from koordlet.debug import serve_debug
from koordlet.debug.endpoints import DebugSources
from koordlet.events import EVENTS_FILE, PodEvents
from koordlet.executor import ResourceExecutor
from koordlet.executor.records import NodeRecords
from koordlet.gpu.metrics import gpu_devices
from koordlet.gpu.nvml import NvmlModule
from koordlet.gpu.reporter import DeviceReporter
from koordlet.gpu.service import GPUService
from koordlet.gpu.xpu import XPUInventory
from koordlet.health import DEFAULT_GRACE_S, Health
from koordlet.history.actions import RECENT
from koordlet.kubeapi import CoreV1, CustomObjects, KubeClient
from koordlet.kubeclient.budget import Budget
from koordlet.metriccache import GPU_DEVICES_KV, MetricCache
from koordlet.metrics import KoordletMetrics, MetricsServer
from koordlet.metricsadvisor import (
    Collector,
    CollectorRunner,
    NodePsiCollector,
    NodeResourceCollector,
    PodPsiCollector,
    PodResourceCollector,
)
from koordlet.metricsadvisor.nodeinfo import CPUNodeMap, NodeInfoCollector
from koordlet.prediction.predictor import ProdPrediction, predict_prod
from koordlet.prediction.server import PredictionConfig, PredictServer
from koordlet.reporters.device import DeviceReportLoop, GPUCollector
from koordlet.reporters.nodemetric import NodeMetricReporter, ProdPredict
from koordlet.reporters.nrt import NRTReporter, NRTReportLoop
from koordlet.reporters.rdma import RDMAInventory
from koordlet.statesinformer.api import CallbackKind, NodeInfo
from koordlet.statesinformer.cgroups import container_task_reader, host_app_cgroup_source, pod_cgroup_source
from koordlet.statesinformer.cpumanager import CPUManagerState, CPUManagerStateReader
from koordlet.statesinformer.cri import CriPodSource
from koordlet.statesinformer.informer import PodSource, StatesInformer
from koordlet.statesinformer.kube import KubeStates
from koordlet.statesinformer.kubelet import KubeletPodSource, kubelet_url
from koordlet.statesinformer.nodeslo_file import NodeSLOFileWatcher
from koordlet.statesinformer.pleg import PodCgroupWatcher
from koordlet.system.cgroup import CgroupFS, detect_cgroup_driver
from koordlet.system.kubepods import KubeCgroupLayout
from koordlet.system.roots import HostDirs
from koordlet.system.sysfs import (
    NUMAMemInfoFiles,
    SysfsError,
    read_node_hugepages,
    read_node_topology,
    read_online_cpus,
)

if TYPE_CHECKING:
    from koordlet.extensions import Extensions
    from koordlet.qosmanager import QoSManager
    from koordlet.runtimehooks import RuntimeHooks
    from koordlet.runtimehooks.nri import NriConfig

logger = logging.getLogger(__name__)

STATES_SYNC_TIMEOUT_S = 60.0
_NOFILE_CEILING = 1 << 20


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
    api_client: KubeClient | None = None  # None in local mode
    nvml: NvmlModule | None = None
    states_sync_timeout_s: float = STATES_SYNC_TIMEOUT_S
    abort: threading.Event = field(default_factory=threading.Event)  # a stop was asked for during the start
    health: Health = field(default_factory=lambda: Health(lambda: True))  # parts add their checks (/healthz)
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


class _Running:
    """A part that is running once built (its factory had to start it, or it has nothing to start)."""

    def __init__(self, stop: Callable[[float], bool | None]) -> None:
        self._stop = stop

    def start(self) -> None:
        pass

    def stop(self, timeout_s: float) -> bool | None:
        return self._stop(timeout_s)


def raise_nofile_limit() -> int:
    """Soft RLIMIT_NOFILE up to the hard limit (the collectors keep cgroup files open); returns the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _NOFILE_CEILING if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as err:
            logger.warning("cannot raise RLIMIT_NOFILE from %d to %d: %s", soft, target, err)
    return soft


def host_dirs(config: KoordletConfig) -> HostDirs:
    """The kernel filesystems' mount dirs from ``-proc-root-dir``, ``-sys-root-dir``, ``-sys-fs-root-dir``
    and ``-cgroup-root-dir``."""
    return HostDirs.from_flags(proc_root_dir=config.proc_root_dir, sys_root_dir=config.sys_root_dir,
                               sys_fs_root_dir=config.sys_fs_root_dir, cgroup_root_dir=config.cgroup_root_dir)


def local_node_info(node_name: str) -> NodeInfo:
    """This host as a NodeInfo (local mode): all CPUs and all memory, capacity = allocatable."""
    cpus = len(os.sched_getaffinity(0))
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    amounts = {"cpu": cpus * 1000, "memory": memory}
    return NodeInfo(name=node_name, capacity=dict(amounts), allocatable=dict(amounts))


def _api_client(config: KoordletConfig) -> kubernetes.client.ApiClient:
    if config.kubeconfig:
        # kube_config and its auth plugins load here, for a kubeconfig file only (koordlet/__init__.py).
        from kubernetes.config.kube_config import new_client_from_config

        client = new_client_from_config(config_file=config.kubeconfig)
    else:
        load_incluster_config()
        client = kubernetes.client.ApiClient()
    client.user_agent = "koordlet"
    return client


def kube_client(config: KoordletConfig, api_client: kubernetes.client.ApiClient,
                metrics: KoordletMetrics) -> KubeClient:
    """The koordlet's budget (-kube-api-qps, -kube-api-burst) and Event recorder around its ApiClient."""
    records = os.path.dirname(config.system_config_record_file) if config.system_config_record_file else ""
    return KubeClient(api_client, Budget(config.kube_api_qps, config.kube_api_burst,
                                         observe=metrics.observe_kube_api_budget),
                      events_file=os.path.join(records, EVENTS_FILE) if records else None)


def _executor(ctx: AgentContext) -> Component | None:
    """The executor, and the cgroup layout it writes in."""
    config = ctx.config
    cgroup_fs = ctx.cgroup_fs = CgroupFS.detect(ctx.dirs.cgroup_mount_dir)  # -cgroup-root-dir
    ctx.executor = ResourceExecutor(cgroup_fs, resctrl_root=ctx.dirs.resctrl_dir,
                                    force_update_seconds=float(config.resource_force_update_seconds),
                                    proc_dir=ctx.dirs.proc_dir, sys_dir=ctx.dirs.sys_dir,
                                    originals_file=config.system_config_record_file or None,
                                    records=NodeRecords.beside(config.system_config_record_file))
    driver = detect_cgroup_driver(cgroup_fs, config.kubelet_cgroup_root)
    layout = ctx.layout = KubeCgroupLayout(driver, config.kubelet_cgroup_root)
    logger.info("cgroup %s, driver %s, kubelet cgroup root %s", cgroup_fs.version.name, driver.value,
                layout.cgroup_root)
    return None


def _metric_cache(ctx: AgentContext) -> Component | None:
    ctx.cache = MetricCache()
    return None


def _extensions(ctx: AgentContext) -> Component | None:
    """Out-of-tree QoS strategies and hook plugins (entry points), named at start, switched by
    ``-qos-extension-plugins`` (koordlet/extensions.py)."""
    from koordlet.extensions import load_extensions, report

    ctx.extensions = load_extensions(ctx.config.qos_extension_plugins)
    report(ctx.extensions, ctx.metrics.registry, ctx.config.node_name, ctx.config.qos_extension_plugins)
    return None


def _gates_with_extensions(ctx: AgentContext) -> Mapping[str, bool]:
    """The feature gates with each loaded extension's switch laid over them."""
    extra = ctx.extensions.gates if ctx.extensions is not None else {}
    return MappingProxyType({**ctx.config.feature_gates, **extra})


def _states_informer_built(ctx: AgentContext) -> Component | None:
    """The pod source (the CRI in local mode, else kubelet ``/pods``) and the informer over it; the informer
    is started after its node and NodeSLO sources."""
    config = ctx.config
    if ctx.api_client is None:
        source: PodSource = CriPodSource(config.cri_endpoint, timeout_s=config.kubelet_sync_timeout_s,
                                         runtime=config.default_runtime_type)
    else:
        def base_url() -> str | None:
            raw = ctx.kube.raw_node if ctx.kube is not None else None
            if raw is None:
                return None
            return kubelet_url(raw, config.kubelet_preferred_address_type, config.kubelet_port,
                               config.kubelet_insecure_tls, config.kubelet_read_only_port)

        source = KubeletPodSource(base_url, ctx.layout, timeout_s=config.kubelet_sync_timeout_s,
                                  token_file=config.kubelet_token_file, client_cert=config.kubelet_client_cert,
                                  client_key=config.kubelet_client_key,
                                  default_runtime=config.default_runtime_type,
                                  observe=ctx.metrics.observe_kubelet_request)
    ctx.pod_source = source
    ctx.metrics.zero_states_errors((source.name, "nodeslo") if ctx.api_client is None else (source.name, "node",
                                                                                             "nodeslo"))
    ctx.states = StatesInformer(source, config.kubelet_sync_interval_s, ctx.cache,
                                count_error=ctx.metrics.observe_states_error,
                                task_reader=container_task_reader(ctx.layout, ctx.cgroup_fs)
                                if config.enable_pod_taskids else None)
    return None


def _node_sources(ctx: AgentContext) -> Component | None:
    """Local mode: this host as the node and the NodeSLO file watcher; else the node and NodeSLO watchers."""
    config, states, api_client = ctx.config, ctx.states, ctx.api_client
    if api_client is None:
        states.set_node(local_node_info(config.node_name))
        return NodeSLOFileWatcher(config.node_slo_file, states)
    kube = ctx.kube = KubeStates(config.node_name, CoreV1(api_client), CustomObjects(api_client), states,
                                 count_error=ctx.metrics.observe_states_error)
    return kube


def _cri_pod_source(ctx: AgentContext) -> Component | None:
    """The CRI connection of the pod source, closed after the informer stopped."""
    source = ctx.pod_source
    if not isinstance(source, CriPodSource):
        return None
    return _Running(lambda timeout_s: source.close())


def _states_informer(ctx: AgentContext) -> Component | None:
    states = ctx.states
    ctx.health.watch_states(states)
    # the last actions of pods that are gone are forgotten with them (/debug/pods)
    states.register_callback(CallbackKind.ALL_PODS, "debug-actions",
                             lambda: RECENT.retain(pod.uid for pod in states.pods()))
    return states


def _audit_owners(ctx: AgentContext) -> Component | None:
    """The audit log tells a pod's writes from the node's by the informer's pods."""
    auditor = audit.current()
    if auditor is not None:
        auditor.set_owner_resolver(audit.pod_owner_resolver(ctx.states.pods))
    return None


def _states_synced(ctx: AgentContext) -> Component | None:
    """Wait (bounded, cut short by a stop) until the informer has synced."""
    states, abort = ctx.states, ctx.abort
    deadline = time.monotonic() + ctx.states_sync_timeout_s
    while not states.wait_synced(0.1) and time.monotonic() < deadline and not abort.is_set():
        pass
    if not states.has_synced() and not abort.is_set():
        logger.warning("states informer not synced after %.0f s; starting the rest anyway",
                       ctx.states_sync_timeout_s)
    return None


def _pleg(ctx: AgentContext) -> Component | None:
    states = ctx.states
    return PodCgroupWatcher(ctx.cgroup_fs, ctx.layout, lambda pod_uid: states.request_resync(follow_up_s=1.0))


def _pod_resources_proxy(ctx: AgentContext) -> Component | None:
    """kubelet's pod-resources API with the scheduler's devices added (gate ``PodResourcesProxy``), at
    ``<-pod-resources-proxy-path>/kubelet.sock`` in front of ``<-var-lib-kubelet-dir>/pod-resources/kubelet.sock``."""
    config = ctx.config
    if not config.gate("PodResourcesProxy"):
        return None
    from koordlet.statesinformer.podresources import SOCKET_NAME, PodResourcesProxy, PodResourcesServer

    kubelet_socket = os.path.join(config.var_lib_kubelet_dir, "pod-resources", SOCKET_NAME)
    proxy = PodResourcesProxy(ctx.states.pods, kubelet_socket)
    return PodResourcesServer(proxy, os.path.join(config.pod_resources_proxy_path, SOCKET_NAME))


def _gpu_service(ctx: AgentContext) -> Component | None:
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
    return _Running(gpu.stop)


def _can_write_in(directory: str) -> bool:
    """Whether ``directory`` (or, while it does not exist, the dir it would be made in) takes new files: access(2)
    says no for a read-only mount (EROFS) as for missing permission."""
    path = os.path.abspath(directory)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return os.access(path, os.W_OK)


def _device_plugin(ctx: AgentContext) -> Component | None:
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
    return _Running(server.stop)


def _collectors(ctx: AgentContext) -> list[Collector]:
    config, states, layout, cgroup_fs = ctx.config, ctx.states, ctx.layout, ctx.cgroup_fs
    node_collector = NodeResourceCollector(ctx.dirs.proc_dir, config.collect_res_used_interval_s,
                                           per_cpu=config.gate("PerCPUMetric"),
                                           numa_files=NUMAMemInfoFiles(ctx.dirs.sys_dir),
                                           cpu_nodes=CPUNodeMap(ctx.cache))
    collectors: list[Collector] = [
        NodeInfoCollector(ctx.cache, ctx.dirs.sys_dir, ctx.config.collect_node_cpu_info_interval_s,
                          observe=ctx.metrics.observe_node_info),
        node_collector,
        PodResourceCollector(pod_cgroup_source(states.pods, layout), cgroup_fs,
                             config.collect_res_used_interval_s, be_cgroup_dir=layout.qos_dir(KubeQoS.BESTEFFORT),
                             node=node_collector, collect_page_cache=config.enable_pagecache_collector,
                             host_apps=host_app_cgroup_source(states.node_slo, layout),
                             kubepods_dir=layout.kubepods_dir()),
    ]
    if config.gate("PSICollector"):
        collectors.append(NodePsiCollector(ctx.dirs.proc_dir, config.psi_collector_interval_s))
        collectors.append(PodPsiCollector(pod_cgroup_source(states.pods, layout), cgroup_fs,
                                          config.psi_collector_interval_s))
    if ctx.gpu is not None:
        collectors.append(GPUCollector(ctx.gpu, config.collect_res_used_interval_s,
                                       pods=pod_cgroup_source(states.pods, layout), cgroup_fs=cgroup_fs))
    collectors += _alpha_collectors(ctx)
    return collectors


def _alpha_collectors(ctx: AgentContext) -> list[Collector]:
    """The collectors of the Alpha gates ``ResctrlCollector``, ``CPICollector`` and ``ColdPageCollector``."""
    config = ctx.config
    dirs = host_dirs(config)
    collectors: list[Collector] = []
    if config.gate("ResctrlCollector"):
        if config.enable_resctrl_collector and dirs.resctrl_dir:
            from koordlet.metricsadvisor.resctrl import ResctrlCollector

            collectors.append(ResctrlCollector(dirs.resctrl_dir, config.resctrl_collector_interval_s))
        else:
            logger.info("resctrl collector off: gate ResctrlCollector needs -enable-resctrl-collector too "
                        "(as in Koordinator)")
    from koordlet.metricsadvisor.coldpage import ColdPageCollector, restore_kidled

    if config.gate("ColdPageCollector"):
        collectors.append(ColdPageCollector(
            pod_cgroup_source(ctx.states.pods, ctx.layout), ctx.cgroup_fs, config.coldpage_collector_interval_s,
            executor=ctx.executor, host_apps=host_app_cgroup_source(ctx.states.node_slo, ctx.layout),
            proc_dir=dirs.proc_dir, sys_dir=dirs.sys_dir))
    else:  # what an earlier koordlet with the gate on changed goes back
        restore_kidled(ctx.executor, "feature gate ColdPageCollector is off")
    if config.gate("CPICollector"):
        from koordlet.metricsadvisor.cpi import CPICollector

        libpfm = config.gate("Libpfm4")
        try:
            cpus = read_online_cpus(dirs.sys_dir)
        except SysfsError as err:  # one collector off, not the agent
            logger.warning("CPI collector off: %s", err)
        else:
            collectors.append(CPICollector(pod_cgroup_source(ctx.states.pods, ctx.layout), ctx.cgroup_fs, cpus,
                                           config.cpi_collector_interval_s, config.collect_cpi_timewindow_s,
                                           group=libpfm, libpfm=libpfm))
    return collectors


def _metrics_advisor(ctx: AgentContext) -> Component | None:
    config = ctx.config
    ctx.metrics.bind(ctx.cache, ctx.states, stale_after_s=max(10.0, 3 * config.collect_res_used_interval_s),
                     psi_stale_after_s=3 * config.psi_collector_interval_s,
                     slow_stale_after_s=3 * max(config.cpi_collector_interval_s, config.resctrl_collector_interval_s,
                                                config.coldpage_collector_interval_s))
    runner = CollectorRunner(ctx.cache, _collectors(ctx), registry=ctx.metrics.registry)
    ctx.health.watch_loop("collectors", runner)
    return runner


def _qos_manager_on(config: KoordletConfig) -> bool:
    return config.collect_res_used_interval_s >= 1.0


def _qos_manager(ctx: AgentContext) -> Component | None:
    from koordlet.eviction import Evictor, zero_eviction_counts
    from koordlet.qosmanager import QoSManagerConfig, cpuevict, memoryevict, new_qos_manager

    config = ctx.config
    if not _qos_manager_on(config):
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
        feature_gates=_gates_with_extensions(ctx),
    )
    manager = new_qos_manager(ctx.states, ctx.cache, ctx.executor, ctx.layout, evictor=evictor, config=qos_config,
                              sys_dir=ctx.dirs.sys_dir, cpu_manager=ctx.cpu_manager,
                              observe_storage=ctx.metrics.observe_local_storage_info,
                              extensions=ctx.extensions.strategies if ctx.extensions is not None else ())
    ctx.health.watch_loop("qosmanager", manager)
    ctx.qos_manager = manager
    zero_eviction_counts(config.node_name, [feature for feature in (*memoryevict.FEATURES, *cpuevict.FEATURES)
                                            if config.gate(feature)])
    return manager


def _nri_config(config: KoordletConfig) -> NriConfig | None:
    """NRI mode from the ``-runtime-hooks-nri-*`` flags; None with ``-enable-nri-runtime-hook=false``."""
    from koordlet.runtimehooks.nri import NriConfig

    if not config.enable_nri_runtime_hook:
        return None
    return NriConfig(socket_path=config.nri_socket_path, plugin_name=config.runtime_hooks_nri_plugin_name,
                     plugin_index=config.runtime_hooks_nri_plugin_index,
                     connect_timeout_s=config.runtime_hooks_nri_connect_timeout_s,
                     backoff_s=config.runtime_hooks_nri_backoff_duration_s,
                     backoff_factor=config.runtime_hooks_nri_backoff_factor,
                     backoff_steps=config.runtime_hooks_nri_backoff_steps,
                     backoff_cap_s=config.runtime_hooks_nri_backoff_cap_s,
                     fail_on_error=config.runtime_hooks_plugin_failure_policy == "Fail")


def _nri_plugin(ctx: AgentContext) -> Component | None:
    """The NRI plugin, registered before the states sync wait: an NRI request carries the pod's labels and
    annotations, so it needs no pod list, and a pod created while the list is not there yet still gets its
    values. The rest of the runtime hooks start in their place (:func:`_runtime_hooks`)."""
    if not ctx.config.enable_nri_runtime_hook:
        return None
    hooks = _built_runtime_hooks(ctx)
    hooks.start_nri()
    return _Running(hooks.stop_nri)


def _runtime_hooks(ctx: AgentContext) -> Component | None:
    """The hook server (for the proxy), the NRI plugin (for containerd >= 1.7; started already by
    :func:`_nri_plugin`) and the reconciler."""
    return _built_runtime_hooks(ctx)


def _built_runtime_hooks(ctx: AgentContext) -> RuntimeHooks:
    from koordlet.runtimehooks import RuntimeHooks, RuntimeHooksConfig

    if ctx.runtime_hooks is not None:
        return ctx.runtime_hooks
    config = ctx.config
    hooks_config = RuntimeHooksConfig(
        socket_path=config.runtime_hooks_addr,
        host_endpoint=config.runtime_hooks_host_endpoint,
        config_dir=config.runtime_hooks_config_path,
        failure_policy=config.runtime_hooks_failure_policy,
        disabled_stages=frozenset(config.runtime_hooks_disable_stages),
        reconcile_interval_s=config.runtime_hooks_reconcile_interval_s,
        feature_gates=_gates_with_extensions(ctx),
        resctrl_dir=ctx.dirs.resctrl_dir,
        serve_hooks=config.runtime_hooks_network == "unix",
        sys_dir=ctx.dirs.sys_dir,
        proc_dir=ctx.dirs.proc_dir,
        dev_dir=ctx.dirs.dev_dir,
        hami_core_library=config.hami_core_library_directory_path,
        disable_unset_cpu_quota=config.disable_unset_cpu_quota,
        node_name=config.node_name,
        nri=_nri_config(config),
    )
    warn = PodEvents(config.node_name, ctx.api_client).warning if ctx.api_client is not None else None
    task_ids = ctx.states.container_task_ids if config.enable_pod_taskids else None
    hooks = ctx.runtime_hooks = RuntimeHooks(hooks_config, ctx.states, ctx.executor, ctx.layout, warn, ctx.cpu_manager,
                                             task_ids)
    ctx.health.watch_loop("reconciler", hooks.reconciler.loop)
    if hooks.nri is not None:
        from koordlet.runtimehooks.nri.plugin import socket_identity

        ctx.health.watch_nri(hooks.nri, lambda path: socket_identity(path) is not None)
    return hooks


def _netqos(ctx: AgentContext) -> Component | None:
    """The tc network QoS manager, only with the ``TCNetworkQoS`` gate on."""
    if not ctx.config.gate("TCNetworkQoS"):
        return None
    from koordlet.netqos.manager import NetQoSManager

    config = ctx.config
    dirs = ctx.dirs
    return NetQoSManager(ctx.states, uplink=config.netqos_uplink, proc_dir=dirs.proc_dir,
                         sys_dir=dirs.sys_dir, registry=ctx.metrics.registry)


def _terway_qos(ctx: AgentContext) -> Component | None:
    """Terway's QoS files (gate ``TerwayQoS``), written while NodeSLO's netQOSPolicy is terway-qos."""
    if not ctx.config.gate("TerwayQoS"):
        return None
    from koordlet.runtimehooks.terwayqos import TerwayQoSWriter

    return TerwayQoSWriter(ctx.states, ctx.layout, ctx.config.terway_qos_dir)


def _node_state_collector(ctx: AgentContext) -> Component | None:
    """The collector pass over what koordlet made on the node (koordlet.collector): at start, then every few
    minutes."""
    from hooks.gpu import hami_cache_root
    from koordlet.collector import CollectorConfig, NodeStateCollector

    config = ctx.config
    qos_manager = _qos_manager_on(config)
    collector_config = CollectorConfig(pod_groups=config.gate("Resctrl"),
                                       class_groups=qos_manager and config.gate("RdtResctrl"),
                                       blkio=qos_manager and config.gate("BlkIOReconcile"),
                                       system_config=qos_manager and config.gate("SystemConfig"),
                                       resctrl_dir=ctx.dirs.resctrl_dir,
                                       host_dir_root=hami_cache_root(config.hami_core_library_directory_path))
    return NodeStateCollector(collector_config, ctx.states, ctx.executor)


def default_components() -> list[ComponentFactory]:
    """Started after the states informer and metrics advisor, before the reporters, in this order
    (docs/koordinator.md §1.2: qos manager, then runtime hooks; then tc network QoS and Terway's QoS files
    when their gates are on)."""
    return [_qos_manager, _runtime_hooks, _netqos, _terway_qos]


def _rdma_inventory(config: KoordletConfig) -> RDMAInventory | None:
    """The node's RDMA devices (gate ``RDMADevices``), None when the gate is off or the node has none."""
    if not config.gate("RDMADevices"):
        return None
    inventory = RDMAInventory(host_dirs(config).sys_dir)
    if not inventory.devices():
        logger.info("RDMA devices: none on this node (no network PCI function with infiniband/)")
        return None
    return inventory


def _device_reporter(ctx: AgentContext) -> Component | None:
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
    return DeviceReportLoop(ctx.gpu, reporter, config.node_topology_sync_interval_s, _node_uid(kube), rdma=rdma,
                            xpu=xpu, xpu_only=config.xpu_enforce_collect_from_device_infos)


def _node_uid(kube: KubeStates | None) -> Callable[[], str]:
    """The Node object's UID as the node watcher last saw it ("" before that, or without an API server): the
    owner reference of the objects the reporters write."""
    def node_uid() -> str:
        raw = kube.raw_node if kube is not None else None
        return str(((raw or {}).get("metadata") or {}).get("uid") or "")

    return node_uid


def _kubelet_cpu_manager(config: KoordletConfig) -> Callable[[], CPUManagerState | None]:
    """kubelet's CPU manager state (``<-var-lib-kubelet-dir>/cpu_manager_state``, options and reserved CPUs from
    ``-kubelet-config-file``), read again when it changes; always None (unknown) with
    ``-disable-query-kubelet-config`` (Koordinator then reports no kubelet policy)."""
    if config.disable_query_kubelet_config:
        return lambda: None
    return CPUManagerStateReader(os.path.join(config.var_lib_kubelet_dir, "cpu_manager_state"),
                                 config.kubelet_config_file or None)


def _nrt_reporter(ctx: AgentContext) -> Component | None:
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
        node_annotations=node_annotations, node_uid=_node_uid(kube), interval_s=config.node_topology_sync_interval_s,
        min_update_interval_s=config.node_topology_min_update_interval_s,
        observe=metrics.observe_node_topology_report,
        read_hugepages=(lambda: read_node_hugepages(sys_dir)) if config.gate("HugePageReport") else None,
        observe_pools=lambda pools: metrics.observe_cpu_pools(pools.shared_cpus, pools.be_shared_cpus, per_cpu))


def prediction_config(config: KoordletConfig) -> PredictionConfig:
    return PredictionConfig(
        checkpoint_dir=config.prediction_checkpoint_filepath,
        cold_start_s=config.prediction_cold_start_duration_s,
        safety_margin_percent=config.prediction_safety_margin_percent,
        memory_half_life_s=config.prediction_memory_histogram_decay_halflife_s,
        cpu_half_life_s=config.prediction_cpu_histogram_decay_halflife_s,
        training_interval_s=config.prediction_training_interval_s,
        model_expiration_s=config.prediction_model_expiration_duration_s,
        checkpoint_interval_s=config.prediction_model_checkpoint_interval_s,
        checkpoint_max_per_step=config.prediction_model_checkpoint_max_per_step,
    )


def _predict_server(ctx: AgentContext) -> Component | None:
    """The peak predictor (Koordinator starts it after the metrics advisor, before the qos manager): histograms
    of usage, restored from and saved to checkpoints; NodeMetric's prod reclaimable and prod peak."""
    states = ctx.states
    server = ctx.predictor = PredictServer(prediction_config(ctx.config), states.pods, ctx.cache, states.has_synced)
    return server


def _prod_prediction(ctx: AgentContext) -> ProdPredict | None:
    """The prod prediction of each NodeMetric build, recorded in the prediction metrics as it is made."""
    server, states, metrics = ctx.predictor, ctx.states, ctx.metrics
    if server is None:
        return None
    config = server.config

    def predict(pods: Sequence[PodMeta], now: float) -> ProdPrediction:
        prediction = predict_prod(pods, states.node(), server.prediction, now, config.cold_start_s,
                                  config.safety_margin_percent)
        metrics.observe_prediction(prediction.by_predictor, prediction.reclaimable)
        return prediction

    return predict


def _nodemetric_reporter(ctx: AgentContext) -> Component | None:
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
        prod_prediction=_prod_prediction(ctx),
    )
    return reporter


def _component_part(factory: ComponentFactory) -> Part:
    return Part(getattr(factory, "__name__", type(factory).__name__).lstrip("_"), factory)


def agent_parts(components: Sequence[ComponentFactory]) -> list[Part]:
    """Every part in start order (docs/koordinator.md §1.2).

    ``components`` go between the metrics advisor and the reporters."""
    return [
        Part("executor", _executor),
        Part("metric cache", _metric_cache),
        Part("extensions", _extensions),
        Part("pod source", _states_informer_built),
        Part("node and NodeSLO sources", _node_sources),
        Part("CRI pod source", _cri_pod_source),
        Part("states informer", _states_informer),
        Part("audit owners", _audit_owners),
        *([Part("NRI plugin", _nri_plugin)] if _runtime_hooks in components else []),
        Part("states sync", _states_synced),
        Part("PLEG", _pleg),
        Part("pod resources proxy", _pod_resources_proxy),
        Part("GPU service", _gpu_service),
        Part("device plugin", _device_plugin),
        Part("metrics advisor", _metrics_advisor),
        Part("predict server", _predict_server),
        *(_component_part(factory) for factory in components),
        Part("node state collector", _node_state_collector),
        Part("Device reporter", _device_reporter),
        Part("NodeResourceTopology reporter", _nrt_reporter),
        Part("NodeMetric reporter", _nodemetric_reporter),
    ]


class Koordlet:
    """The agent. ``start()`` builds and starts; ``stop()`` stops what was started, newest first."""

    def __init__(self, config: KoordletConfig, api_client: kubernetes.client.ApiClient | None = None,
                 extra_components: Sequence[ComponentFactory] | None = None,
                 states_sync_timeout_s: float = STATES_SYNC_TIMEOUT_S, nvml: NvmlModule | None = None,
                 health_grace_s: float = DEFAULT_GRACE_S) -> None:
        """``nvml``: the NVML module for the ``Accelerators`` gate (default: pynvml from nvidia-ml-py);
        ``health_grace_s``: what the health checks allow beyond a part's own interval (koordlet.health)."""
        self.config = config
        self._nvml = nvml
        self._api_client = api_client
        self._parts = agent_parts(default_components() if extra_components is None else extra_components)
        self._sync_timeout_s = states_sync_timeout_s
        self._stoppers: list[tuple[str, Callable[[float], bool | None]]] = []
        self.started = threading.Event()
        self._abort = threading.Event()
        self.metrics = KoordletMetrics(config.node_name)
        self.health = Health(self.started.is_set, health_grace_s)
        self.ctx: AgentContext | None = None
        self.metrics_server: MetricsServer | None = None

    @property
    def cache(self) -> MetricCache | None:
        return getattr(self.ctx, "cache", None)

    @property
    def states(self) -> StatesInformer | None:
        return getattr(self.ctx, "states", None)

    @property
    def reporter(self) -> NodeMetricReporter | None:
        return self.ctx.reporter if self.ctx is not None else None

    def _debug_sources(self) -> DebugSources | None:
        """What ``/debug/*`` reads, once the states informer and the executor are built (None before)."""
        ctx = self.ctx
        states, executor = getattr(ctx, "states", None), getattr(ctx, "executor", None)
        if ctx is None or states is None or executor is None:
            return None
        return DebugSources(self.config.node_name, states, executor, ctx.layout, RECENT, ctx.runtime_hooks,
                            ctx.qos_manager)

    def request_stop(self) -> None:
        """Cut a start in progress short (a signal during the states sync wait); call :meth:`stop` after."""
        self._abort.set()

    def _start_auditor(self) -> None:
        """The audit log (gate ``AuditEvents``), installed for every plan runner; whose cgroup a write touched
        is told from the states informer's pods once it is built (:func:`_audit_owners`)."""
        config = self.config
        if not config.gate("AuditEvents"):
            return
        auditor = audit.Auditor(audit.AuditConfig(
            log_dir=config.audit_log_dir, verbose=config.audit_verbose,
            max_disk_space_mb=config.audit_max_disk_space_mb,
            max_concurrent_readers=config.audit_max_concurrent_readers,
            max_events_limit=config.audit_max_events_limit))
        audit.install(auditor)

        def stop(_timeout_s: float) -> None:
            if audit.current() is auditor:
                audit.install(None)
            auditor.close()

        self._started("audit log", stop)

    def _started(self, name: str, stop: Callable[[float], bool | None]) -> None:
        self._stoppers.append((name, stop))
        logger.info("started %s", name)

    def start(self) -> bool:
        """Build and start every part; False when :meth:`request_stop` cut the start short."""
        config = self.config
        if not config.local_mode and self._api_client is None:
            self._api_client = _api_client(config)
        api_client = kube_client(config, self._api_client, self.metrics) if not config.local_mode else None

        features.report(config.feature_gates, self.metrics.registry, config.node_name)  # inert gates: log, gauge
        self._start_auditor()
        server = MetricsServer(self.metrics.registry, config.metrics_host, config.metrics_port, tls=config.serving_tls)
        server.route("/healthz", lambda request: self.health.healthz(request.query))
        server.route("/readyz", lambda request: self.health.readyz(request.query))
        serve_debug(server, self._debug_sources, api_client, config.node_name)
        if config.gate("AuditEventsHTTPHandler"):
            server.handle("/events", audit.events_handler())
        server.start()
        self.metrics_server = server
        self._started("metrics server", server.stop)

        ctx = self.ctx = AgentContext(config, self.metrics, api_client, self._nvml, self._sync_timeout_s,
                                      self._abort, self.health)
        for part in self._parts:
            component = part.build(ctx)
            if component is not None:
                component.start()
                self._started(part.name, component.stop)
            if self._abort.is_set():
                return False
        self.started.set()
        logger.info("koordlet started on node %s", config.node_name)
        return True

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop the parts newest first within ``timeout_s`` (default ``-stop-timeout``): each gets an equal
        share of what is left, so time one part does not use goes to the parts after it, and the shares
        never add up to more than the whole."""
        budget = self.config.stop_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + budget
        self.started.clear()
        while self._stoppers:
            name, stop = self._stoppers.pop()
            remaining = max(deadline - time.monotonic(), 0.0)
            share = remaining / (len(self._stoppers) + 1)
            try:
                stop(share)
            except Exception:  # stopping must go on with the other parts
                logger.exception("stopping %s failed", name)
        logger.info("koordlet stopped")


def log_command_line_notes(config: KoordletConfig) -> None:
    """One line naming the flags given that Koordinator's koordlet has and koordlet-py does not act on
    (koordlet/compatflags.py), and one for arguments Go's flag rules leave unread."""
    if config.unused_flags:
        logger.info("accepted but not used by koordlet-py (docs/configuration.md): %s",
                    ", ".join(f"-{name}" for name in config.unused_flags))
    if config.ignored_args:
        logger.warning("%r is not a flag, so it and what follows are ignored, as Go's flag package does: %s",
                       config.ignored_args[0], " ".join(config.ignored_args))


def main(argv: Sequence[str] | None = None, nvml: NvmlModule | None = None) -> int:
    """The daemon; ``nvml``: the NVML module (default pynvml; the demo passes the tests' fake NVML). ``koordlet
    explain <namespace>/<name>`` asks a running koordlet why a pod has what it has (koordlet.debug.explain)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["explain"]:
        from koordlet.debug.explain import main as explain

        return explain(args[1:])
    try:
        config = parse_config(args, os.environ)
    except ConfigError as err:
        print(f"koordlet: {err}", file=sys.stderr)
        return 2
    logs.setup(config.logging)
    log_command_line_notes(config)
    soft = raise_nofile_limit()
    logger.info("RLIMIT_NOFILE soft limit %d", soft)
    stop_requested = threading.Event()
    agent = Koordlet(config, nvml=nvml)

    def on_signal(signum: int, _frame: object) -> None:
        logger.info("received %s, stopping", signal.Signals(signum).name)
        stop_requested.set()
        agent.request_stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        agent.start()
    except (OSError, ValueError, RuntimeError, ConfigException) as err:
        logger.error("koordlet failed to start: %s", err)
        agent.stop()
        return 1
    while not stop_requested.wait(1.0):
        pass
    agent.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
