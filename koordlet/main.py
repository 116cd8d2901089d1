"""The koordlet daemon: builds every part from the configuration and runs them in Koordinator's order (§1.2).

Start: metrics HTTP server (``/healthz`` is 503 until the start is complete) → executor → metric cache →
states informer (waits until synced, bounded; PLEG) → metrics advisor → qos manager → extra components (the
runtime hooks seam, below) → reporters. SIGTERM/SIGINT stop everything in reverse order, each part with its
share of ``-stop-timeout``; the process exits 0 after a clean stop.

Two ways to run:
- with an API server (in-cluster config or ``-kubeconfig``): node and NodeSLO watched, pods from kubelet
  ``/pods``, NodeMetric status reported, Events recorded;
- ``-local-mode``: NodeSLO from ``-node-slo-file`` (watched), pods from the CRI at ``-cri-endpoint``, the
  node's capacity from this host, NodeMetric written as YAML under ``-report-dir``.

Components: :class:`Koordlet` takes ``extra_components`` (default :func:`default_components`: the qos
manager, the runtime hooks, then the network QoS manager where ``TCNetworkQoS`` is on): factories called
with the :class:`AgentContext` (config, states, executor, cgroup layout, cache, metrics) that return an
object with ``start()`` and ``stop()``; they are started after the metrics advisor and before the
reporters, and stopped in reverse.
"""

from __future__ import annotations

import logging
import os
import resource
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import kubernetes.client
import kubernetes.config

from koordlet.gpu.reporter import DeviceReporter
from koordlet.gpu.service import GPUService

from koordlet.api.qos import KubeQoS
from koordlet.config import ConfigError, KoordletConfig, parse_config
from koordlet.executor import ResourceExecutor
from koordlet.metriccache import MetricCache
from koordlet.metrics import KoordletMetrics, MetricsServer
from koordlet.metricsadvisor import (
    CollectorRunner,
    NodePsiCollector,
    NodeResourceCollector,
    PodPsiCollector,
    PodResourceCollector,
)
from koordlet.reporters.device import GPUCollector, DeviceReportLoop
from koordlet.reporters.nodemetric import NodeMetricReporter
from koordlet.statesinformer.api import NodeInfo
from koordlet.statesinformer.cgroups import host_app_cgroup_source, pod_cgroup_source
from koordlet.statesinformer.cri import CriPodSource
from koordlet.statesinformer.informer import StatesInformer
from koordlet.statesinformer.kube import KubeStates
from koordlet.statesinformer.kubelet import KubeletPodSource, kubelet_url
from koordlet.statesinformer.nodeslo_file import NodeSLOFileWatcher
from koordlet.statesinformer.pleg import PodCgroupWatcher
from koordlet.system.cgroup import CgroupFS, detect_cgroup_driver
from koordlet.system.kubepods import KubeCgroupLayout
from koordlet.system.roots import HostDirs

logger = logging.getLogger(__name__)

STATES_SYNC_TIMEOUT_S = 60.0
_NOFILE_CEILING = 1 << 20


class Component(Protocol):
    def start(self) -> None: ...

    def stop(self) -> None: ...


@dataclass(frozen=True, slots=True)
class AgentContext:
    """What a component factory gets."""

    config: KoordletConfig
    states: StatesInformer
    executor: ResourceExecutor
    layout: KubeCgroupLayout
    cache: MetricCache
    metrics: KoordletMetrics
    api_client: Any | None


ComponentFactory = Callable[[AgentContext], Component | None]


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


def cgroup_fs_of(config: KoordletConfig) -> CgroupFS:
    """``-cgroup-root-dir`` as a CgroupFS."""
    return CgroupFS.detect(host_dirs(config).cgroup_mount_dir)


def local_node_info(node_name: str) -> NodeInfo:
    """This host as a NodeInfo (local mode): all CPUs and all memory, capacity = allocatable."""
    cpus = len(os.sched_getaffinity(0))
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    amounts = {"cpu": cpus * 1000, "memory": memory}
    return NodeInfo(name=node_name, capacity=dict(amounts), allocatable=dict(amounts))


def _api_client(config: KoordletConfig) -> kubernetes.client.ApiClient:
    if config.kubeconfig:
        client = kubernetes.config.new_client_from_config(config_file=config.kubeconfig)
    else:
        kubernetes.config.load_incluster_config()
        client = kubernetes.client.ApiClient()
    client.user_agent = "koordlet"
    return client


def _qos_manager(ctx: AgentContext) -> Component | None:
    from koordlet.eviction import Evictor
    from koordlet.qosmanager import QoSManagerConfig, new_qos_manager

    config = ctx.config
    if config.collect_res_used_interval_s < 1.0:
        logger.info("qos manager off: -collect-res-used-interval below 1 s (§4.1)")
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
        feature_gates=config.feature_gates,
    )
    return new_qos_manager(ctx.states, ctx.cache, ctx.executor, ctx.layout, evictor=evictor, config=qos_config,
                           sys_dir=host_dirs(config).sys_dir)


def _runtime_hooks(ctx: AgentContext) -> Component | None:
    from koordlet.runtimehooks import RuntimeHooks, RuntimeHooksConfig

    config = ctx.config
    hooks_config = RuntimeHooksConfig(
        socket_path=config.runtime_hooks_addr,
        host_endpoint=config.runtime_hooks_host_endpoint,
        config_dir=config.runtime_hooks_config_path,
        failure_policy=config.runtime_hooks_failure_policy,
        disabled_stages=frozenset(config.runtime_hooks_disable_stages),
        reconcile_interval_s=config.runtime_hooks_reconcile_interval_s,
        feature_gates=config.feature_gates,
        resctrl_dir=host_dirs(config).resctrl_dir,
        serve_hooks=config.runtime_hooks_network == "unix",
    )
    return RuntimeHooks(hooks_config, ctx.states, ctx.executor, ctx.layout)


def _netqos(ctx: AgentContext) -> Component | None:
    """The tc network QoS manager, only with the ``TCNetworkQoS`` gate on."""
    if not ctx.config.gate("TCNetworkQoS"):
        return None
    from koordlet.netqos.manager import NetQoSManager

    config = ctx.config
    dirs = host_dirs(config)
    return NetQoSManager(ctx.states, uplink=config.netqos_uplink, proc_dir=dirs.proc_dir,
                         sys_dir=dirs.sys_dir, registry=ctx.metrics.registry)


def default_components() -> list[ComponentFactory]:
    """Started after the states informer and metrics advisor, before the reporters, in this order
    (§1.2: qos manager, then runtime hooks; then tc network QoS when its gate is on)."""
    return [_qos_manager, _runtime_hooks, _netqos]


class Koordlet:
    """The agent. ``start()`` builds and starts; ``stop()`` stops what was started, newest first."""

    def __init__(self, config: KoordletConfig, api_client: Any | None = None,
                 extra_components: Sequence[ComponentFactory] | None = None,
                 states_sync_timeout_s: float = STATES_SYNC_TIMEOUT_S, nvml: Any | None = None) -> None:
        """``nvml``: the NVML module for the ``Accelerators`` gate (default: pynvml from nvidia-ml-py)."""
        self.config = config
        self._nvml = nvml
        self._kube: KubeStates | None = None
        self._api_client = api_client
        self._factories = list(default_components() if extra_components is None else extra_components)
        self._sync_timeout_s = states_sync_timeout_s
        self._stoppers: list[tuple[str, Callable[[float], None]]] = []
        self.started = threading.Event()
        self._abort = threading.Event()
        self.metrics = KoordletMetrics(config.node_name)
        self.cache: MetricCache | None = None
        self.states: StatesInformer | None = None
        self.reporter: NodeMetricReporter | None = None
        self.metrics_server: MetricsServer | None = None

    def request_stop(self) -> None:
        """Cut a start in progress short (a signal during the states sync wait); call :meth:`stop` after."""
        self._abort.set()

    def _started(self, name: str, stop: Callable[[float], None]) -> None:
        self._stoppers.append((name, stop))
        logger.info("started %s", name)

    def start(self) -> bool:
        """Build and start every part; False when :meth:`request_stop` cut the start short."""
        config = self.config
        if not config.local_mode and self._api_client is None:
            self._api_client = _api_client(config)
        api_client = self._api_client if not config.local_mode else None

        server = MetricsServer(self.metrics.registry, config.metrics_host, config.metrics_port,
                               healthy=self.started.is_set)
        server.start()
        self.metrics_server = server
        self._started("metrics server", lambda timeout: server.stop(timeout))

        dirs = host_dirs(config)
        cgroup_fs = cgroup_fs_of(config)
        executor = ResourceExecutor(cgroup_fs, resctrl_root=dirs.resctrl_dir,
                                    force_update_seconds=float(config.resource_force_update_seconds))
        driver = detect_cgroup_driver(cgroup_fs, config.kubelet_cgroup_root)
        layout = KubeCgroupLayout(driver, config.kubelet_cgroup_root)
        logger.info("cgroup %s, driver %s, kubelet cgroup root %s", cgroup_fs.version.name, driver.value,
                    layout.cgroup_root)

        cache = self.cache = MetricCache()
        states = self._start_states(api_client, layout, cache)
        if not self._abort.is_set():
            pleg = PodCgroupWatcher(cgroup_fs, layout, lambda pod_uid: states.request_resync(follow_up_s=1.0))
            pleg.start()
            self._started("PLEG", pleg.stop)
        if self._abort.is_set():
            return False
        self.metrics.bind(cache, states, stale_after_s=max(10.0, 3 * config.collect_res_used_interval_s),
                          psi_stale_after_s=3 * config.psi_collector_interval_s)

        node_collector = NodeResourceCollector(dirs.proc_dir, config.collect_res_used_interval_s)
        collectors: list[Any] = [
            node_collector,
            PodResourceCollector(pod_cgroup_source(states.pods, layout), cgroup_fs,
                                 config.collect_res_used_interval_s, be_cgroup_dir=layout.qos_dir(KubeQoS.BESTEFFORT),
                                 node=node_collector, collect_page_cache=config.enable_pagecache_collector,
                                 host_apps=host_app_cgroup_source(states.node_slo, layout)),
        ]
        if config.gate("PSICollector"):
            collectors.append(NodePsiCollector(dirs.proc_dir, config.psi_collector_interval_s))
            collectors.append(PodPsiCollector(pod_cgroup_source(states.pods, layout), cgroup_fs,
                                              config.psi_collector_interval_s))
        gpu_service = None
        if config.gate("Accelerators"):
            # A short NVML event wait keeps the health thread quick to stop.
            gpu_service = GPUService.start(self._nvml, sys_dir=dirs.sys_dir, poll_timeout_ms=1000)
            if gpu_service is not None:
                collectors.append(GPUCollector(gpu_service, config.collect_res_used_interval_s))
                # Registered before the metrics advisor: stopped after the collector and the report loop.
                self._started("GPU service", lambda timeout: gpu_service.stop())
        runner = CollectorRunner(cache, collectors, registry=self.metrics.registry)
        runner.start()
        self._started("metrics advisor", runner.stop)

        ctx = AgentContext(config, states, executor, layout, cache, self.metrics, api_client)
        for factory in self._factories:
            component = factory(ctx)
            if component is None:
                continue
            component.start()
            name = getattr(factory, "__name__", type(component).__name__).lstrip("_")
            self._started(name, lambda timeout, c=component: c.stop())

        if gpu_service is not None:
            self._start_device_reporter(gpu_service, api_client)
        if config.enable_node_metric_report:
            custom_api = kubernetes.client.CustomObjectsApi(api_client) if api_client is not None else None
            reporter = self.reporter = NodeMetricReporter(
                config.node_name, cache, states.pods, custom_api=custom_api,
                report_dir=config.report_dir if api_client is None else None,
                default_interval_s=config.report_interval_s, create_missing=config.create_node_metric,
                observe=self.metrics.observe_report,
                on_report=self.metrics.observe_node_metric_status if config.gate("NodeMetricPromMetrics") else None,
                host_apps=lambda: states.node_slo().host_applications,
            )
            reporter.start()
            self._started("NodeMetric reporter", reporter.stop)
        self.started.set()
        logger.info("koordlet started on node %s", config.node_name)
        return True

    def _start_device_reporter(self, service: GPUService, api_client: Any | None) -> None:
        config = self.config
        custom_api = kubernetes.client.CustomObjectsApi(api_client) if api_client is not None else None
        file_path = None if custom_api is not None else Path(config.report_dir) / f"device-{config.node_name}.yaml"
        reporter = DeviceReporter(config.node_name, custom_api=custom_api, file_path=file_path)
        kube = self._kube

        def node_uid() -> str:
            raw = kube.raw_node if kube is not None else None
            return str(((raw or {}).get("metadata") or {}).get("uid") or "")

        loop = DeviceReportLoop(service, reporter, config.node_topology_sync_interval_s, node_uid)
        loop.start()
        self._started("Device reporter", loop.stop)

    def _start_states(self, api_client: Any | None, layout: KubeCgroupLayout, cache: MetricCache) -> StatesInformer:
        config = self.config
        count = self.metrics.observe_states_error
        if api_client is None:
            source: Any = CriPodSource(config.cri_endpoint, timeout_s=config.kubelet_sync_timeout_s,
                                       runtime=config.default_runtime_type)
        else:
            def base_url() -> str | None:
                raw = self._kube.raw_node if self._kube is not None else None
                if raw is None:
                    return None
                return kubelet_url(raw, config.kubelet_preferred_address_type, config.kubelet_port,
                                   config.kubelet_insecure_tls, config.kubelet_read_only_port)

            source = KubeletPodSource(base_url, layout, timeout_s=config.kubelet_sync_timeout_s,
                                      token_file=config.kubelet_token_file, client_cert=config.kubelet_client_cert,
                                      client_key=config.kubelet_client_key,
                                      default_runtime=config.default_runtime_type,
                                      observe=self.metrics.observe_kubelet_request)
        states = self.states = StatesInformer(source, config.kubelet_sync_interval_s, cache, count_error=count)
        if api_client is None:
            states.set_node(local_node_info(config.node_name))
            watcher = NodeSLOFileWatcher(config.node_slo_file, states)
            watcher.start()
            self._started("NodeSLO file watcher", watcher.stop)
        else:
            kube = KubeStates(config.node_name, kubernetes.client.CoreV1Api(api_client),
                              kubernetes.client.CustomObjectsApi(api_client), states, count_error=count)
            self._kube = kube
            kube.start()
            self._started("node/NodeSLO watchers", kube.stop)
        if isinstance(source, CriPodSource):
            self._started("CRI pod source", lambda timeout: source.close())
        states.start()
        self._started("states informer", states.stop)
        deadline = time.monotonic() + self._sync_timeout_s
        while not states.wait_synced(0.1) and time.monotonic() < deadline and not self._abort.is_set():
            pass
        if not states.has_synced() and not self._abort.is_set():
            logger.warning("states informer not synced after %.0f s; starting the rest anyway", self._sync_timeout_s)
        return states

    def stop(self, timeout_s: float | None = None) -> None:
        budget = self.config.stop_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + budget
        self.started.clear()
        while self._stoppers:
            name, stop = self._stoppers.pop()
            remaining = max(deadline - time.monotonic(), 0.1)
            share = remaining / (len(self._stoppers) + 1)
            try:
                stop(share)
            except Exception:  # stopping must go on with the other parts
                logger.exception("stopping %s failed", name)
        logger.info("koordlet stopped")


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=os.environ.get("KOORDLET_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = parse_config(sys.argv[1:] if argv is None else argv, os.environ)
    except ConfigError as err:
        print(f"koordlet: {err}", file=sys.stderr)
        return 2
    soft = raise_nofile_limit()
    logger.info("RLIMIT_NOFILE soft limit %d", soft)
    stop_requested = threading.Event()
    agent = Koordlet(config)

    def on_signal(signum: int, _frame: object) -> None:
        logger.info("received %s, stopping", signal.Signals(signum).name)
        stop_requested.set()
        agent.request_stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        agent.start()
    except (OSError, ValueError, RuntimeError, kubernetes.config.ConfigException) as err:
        logger.error("koordlet failed to start: %s", err)
        agent.stop()
        return 1
    while not stop_requested.wait(1.0):
        pass
    agent.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
