"""The states informer and what feeds it: the pod source (the CRI in local mode, else kubelet ``/pods``), the node
and NodeSLO sources (the API server's watchers, or this host and the NodeSLO file), the bounded wait until it has
synced, the PLEG, and kubelet's pod-resources API with the scheduler's devices added."""

from __future__ import annotations

import logging
import os
import time

from koordlet import audit, credentials
from koordlet.agent.context import AgentContext, Component, Running
from koordlet.history.actions import RECENT
from koordlet.kubeapi import CoreV1, CustomObjects
from koordlet.statesinformer.api import CallbackKind, NodeInfo
from koordlet.statesinformer.cgroups import container_task_reader
from koordlet.statesinformer.cri import CriPodSource
from koordlet.statesinformer.informer import PodSource, StatesInformer
from koordlet.statesinformer.kube import KubeStates
from koordlet.statesinformer.kubelet import KubeletPodSource, kubelet_url
from koordlet.statesinformer.nodeslo_file import NodeSLOFileWatcher
from koordlet.statesinformer.pleg import PodCgroupWatcher

logger = logging.getLogger(__name__)


def local_node_info(node_name: str) -> NodeInfo:
    """This host as a NodeInfo (local mode): all CPUs and all memory, capacity = allocatable."""
    cpus = len(os.sched_getaffinity(0))
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    amounts = {"cpu": cpus * 1000, "memory": memory}
    return NodeInfo(name=node_name, capacity=dict(amounts), allocatable=dict(amounts))


def states_informer_built(ctx: AgentContext) -> Component | None:
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
                                  observe=ctx.metrics.observe_kubelet_request, refusals=ctx.refusals,
                                  token=credentials.token_source(ctx.api_client, config.kubelet_token_file))
    ctx.pod_source = source
    ctx.metrics.zero_states_errors((source.name, "nodeslo") if ctx.api_client is None else (source.name, "node",
                                                                                             "nodeslo"))
    ctx.states = StatesInformer(source, config.kubelet_sync_interval_s, ctx.cache,
                                count_error=ctx.metrics.observe_states_error,
                                task_reader=container_task_reader(ctx.layout, ctx.cgroup_fs)
                                if config.enable_pod_taskids else None)
    return None


def node_sources(ctx: AgentContext) -> Component | None:
    """Local mode: this host as the node and the NodeSLO file watcher; else the node and NodeSLO watchers."""
    config, states, api_client = ctx.config, ctx.states, ctx.api_client
    if api_client is None:
        states.set_node(local_node_info(config.node_name))
        return NodeSLOFileWatcher(config.node_slo_file, states)
    kube = ctx.kube = KubeStates(config.node_name, CoreV1(api_client), CustomObjects(api_client), states,
                                 count_error=ctx.metrics.observe_states_error)
    return kube


def cri_pod_source(ctx: AgentContext) -> Component | None:
    """The CRI connection of the pod source, closed after the informer stopped."""
    source = ctx.pod_source
    if not isinstance(source, CriPodSource):
        return None
    return Running(lambda timeout_s: source.close())


def states_informer(ctx: AgentContext) -> Component | None:
    states = ctx.states
    ctx.health.watch_states(states)
    # the last actions of pods that are gone are forgotten with them (/debug/pods)
    states.register_callback(CallbackKind.ALL_PODS, "debug-actions",
                             lambda: RECENT.retain(pod.uid for pod in states.pods()))
    return states


def audit_owners(ctx: AgentContext) -> Component | None:
    """The audit log tells a pod's writes from the node's by the informer's pods."""
    auditor = audit.current()
    if auditor is not None:
        auditor.set_owner_resolver(audit.pod_owner_resolver(ctx.states.pods))
    return None


def states_synced(ctx: AgentContext) -> Component | None:
    """Wait (bounded, cut short by a stop, or by a refusal the states cannot sync for: waiting changes no RBAC) until
    the informer has synced."""
    states, abort = ctx.states, ctx.abort
    deadline = time.monotonic() + ctx.states_sync_timeout_s
    while not states.wait_synced(0.1) and time.monotonic() < deadline and not abort.is_set() \
            and not ctx.refusals.blocking_states():
        pass
    if not states.has_synced() and not abort.is_set():
        logger.warning("states informer not synced%s; starting the rest anyway", " (refused, see above)"
                       if ctx.refusals.blocking_states() else f" after {ctx.states_sync_timeout_s:.0f} s")
    return None


def pleg(ctx: AgentContext) -> Component | None:
    states = ctx.states
    return PodCgroupWatcher(ctx.cgroup_fs, ctx.layout, lambda pod_uid: states.request_resync(follow_up_s=1.0))


def pod_resources_proxy(ctx: AgentContext) -> Component | None:
    """kubelet's pod-resources API with the scheduler's devices added (gate ``PodResourcesProxy``), at
    ``<-pod-resources-proxy-path>/kubelet.sock`` in front of ``<-var-lib-kubelet-dir>/pod-resources/kubelet.sock``."""
    config = ctx.config
    if not config.gate("PodResourcesProxy"):
        return None
    from koordlet.statesinformer.podresources import SOCKET_NAME, PodResourcesProxy, PodResourcesServer

    kubelet_socket = os.path.join(config.var_lib_kubelet_dir, "pod-resources", SOCKET_NAME)
    proxy = PodResourcesProxy(ctx.states.pods, kubelet_socket)
    return PodResourcesServer(proxy, os.path.join(config.pod_resources_proxy_path, SOCKET_NAME))
