"""The agent's lifecycle: :class:`Koordlet` builds every part in Koordinator's order and stops them in reverse,
within the stop budget.

Start: metrics HTTP server (``/healthz`` is 503 until the start is complete, then checks the parts' loops,
koordlet.health; ``/readyz`` is 200 once started and synced) → the parts of koordlet/agent/parts.py in order
(docs/koordinator.md §1.2). SIGTERM/SIGINT (koordlet/main.py) stop everything in reverse order, each part with its
share of what is left of ``-stop-timeout`` (so the whole stop stays within it).

Two ways to run:
- with an API server (in-cluster config or ``-kubeconfig``): node and NodeSLO watched, pods from kubelet
  ``/pods``, NodeMetric status and NodeResourceTopology reported, Events recorded;
- ``-local-mode``: NodeSLO from ``-node-slo-file`` (watched), pods from the CRI at ``-cri-endpoint``, the
  node's capacity from this host, NodeMetric written as YAML under ``-report-dir``.

:class:`Koordlet` takes ``extra_components`` (default :func:`~koordlet.agent.parts.default_components`: the qos
manager, the runtime hooks, then the network QoS manager where ``TCNetworkQoS`` is on): they run after the metrics
advisor and before the reporters. It is the one module of the agent that serves ``/debug`` (koordlet.debug sits
above every part it shows).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

import kubernetes.client
from kubernetes.config.incluster_config import load_incluster_config

from koordlet import audit, credentials, features
from koordlet.access import Refusals, watch_client
from koordlet.agent.context import STATES_SYNC_TIMEOUT_S, AgentContext, ComponentFactory
from koordlet.agent.parts import agent_parts, default_components
from koordlet.config import KoordletConfig
from koordlet.debug import serve_debug
from koordlet.debug.endpoints import DebugSources
from koordlet.gpu.nvml import NvmlModule
from koordlet.health import DEFAULT_GRACE_S, Health
from koordlet.history.actions import RECENT
from koordlet.metriccache import MetricCache
from koordlet.metrics import KoordletMetrics, MetricsServer
from koordlet.reporters.nodemetric import NodeMetricReporter
from koordlet.statesinformer.informer import StatesInformer

logger = logging.getLogger(__name__)


def new_api_client(config: KoordletConfig) -> kubernetes.client.ApiClient:
    """The API server's client: from ``-kubeconfig``, else the in-cluster configuration."""
    if config.kubeconfig:
        # kube_config and its auth plugins load here, for a kubeconfig file only (koordlet/__init__.py).
        from kubernetes.config.kube_config import new_client_from_config

        client = new_client_from_config(config_file=config.kubeconfig)
        credentials.attach(client, config.kubeconfig)  # a tokenFile: read at each request, renewed when due
    else:
        load_incluster_config()
        client = kubernetes.client.ApiClient()
    client.user_agent = "koordlet"
    return client


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
        self.refusals = Refusals(self.metrics.observe_access_refused)
        self.health.watch_access(self.refusals)
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
        is told from the states informer's pods once it is built (the ``audit owners`` part)."""
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
            self._api_client = new_api_client(config)
        client = self._api_client if not config.local_mode else None

        features.report(config.feature_gates, self.metrics.registry, config.node_name)  # inert gates: log, gauge
        self._start_auditor()
        server = MetricsServer(self.metrics.registry, config.metrics_host, config.metrics_port, tls=config.serving_tls)
        server.route("/healthz", lambda request: self.health.healthz(request.query))
        server.route("/readyz", lambda request: self.health.readyz(request.query))
        serve_debug(server, self._debug_sources, client, config.node_name)
        if config.gate("AuditEventsHTTPHandler"):
            server.handle("/events", audit.events_handler())
        server.start()
        self.metrics_server = server
        self._started("metrics server", server.stop)

        if client is not None:
            watch_client(client, self.refusals)
        ctx = self.ctx = AgentContext(config, self.metrics, client, self._nvml, self._sync_timeout_s,
                                      self._abort, self.health, self.refusals)
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
