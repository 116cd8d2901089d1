"""koordlet's runtime.v1alpha1.RuntimeHookService: what the proxy asks on the pod lifecycle calls.

Every answer starts as an echo of the request and is then changed by the plugins, so it always carries
the full desired state (docs/koordinator.md §2.3). Pod-level settings cannot travel in a CRI request:
the server writes them to the pod cgroup itself through the executor (docs/koordinator.md §3.2, "Proxy"
row) where the dir exists already, and the reconciler does where it did not yet. PostStopPodSandbox removes the
pod's resctrl group if koordlet made it (podgroups.py); the proxy calls it while the ``Resctrl`` gate is on.
"""

from __future__ import annotations

import logging
import posixpath
import time
from collections.abc import Callable
from concurrent import futures

import grpc

from hooks import registry
from hooks.gpu import hami_cache_root
from hooks.protocol import Changes, NodeContext, PodContext
from hooks.registry import Trace
from koordlet.actuator import PlanRunner
from koordlet.api.pod import PodMeta
from koordlet.api.qos import QoSClass
from koordlet.executor import ResourceExecutor
from koordlet.history.answers import POD_LEVEL, HookAnswers
from koordlet.hostdirs import with_host_dirs
from koordlet.statesinformer.enacted import LinuxResources
from koordlet.system.kubepods import KubeCgroupLayout, pod_cgroup_dir
from wire import hookapi_pb2 as hookapi
from wire import hookapi_pb2_grpc as hookapi_grpc
from wire.sockets import chmod_socket, prepare_socket

from . import metrics
from .apply import (
    RejectedValues,
    apply_to_container_response,
    apply_to_resources,
    container_context_from_request,
    effective_quota_reader,
    pod_from_container_request,
    pod_from_sandbox_request,
    report_plugin_error,
    run_pod_level,
)
from .decisions import Decisions, create_key, pod_key, update_key
from .podgroups import PodGroups

log = logging.getLogger(__name__)

Resized = Callable[[str, str, LinuxResources | None], None]  # (pod UID, container id or "", what kubelet set)

# Updates are not a pod's or container's creation: /debug/pods keeps what was answered then.
_NOT_RECORDED = frozenset({registry.Stage.PRE_UPDATE_CONTAINER_RESOURCES,
                           registry.Stage.PRE_UPDATE_POD_SANDBOX_RESOURCES})


class HookService(hookapi_grpc.RuntimeHookServiceServicer):
    def __init__(self, plugins: Callable[[], list[registry.Plugin]], node: Callable[[], NodeContext],
                 known_pod: Callable[[str], PodMeta | None], executor: ResourceExecutor,
                 layout: KubeCgroupLayout, disabled_stages: frozenset[str] = frozenset(),
                 rejects: RejectedValues | None = None, decisions: Decisions | None = None,
                 answers: HookAnswers | None = None, resized: Resized | None = None) -> None:
        """``decisions``: where answers are remembered for the NRI plugin (both front doors on); ``answers``: where
        each plugin's answer at creation is kept for ``/debug/pods``; ``resized``: told when kubelet resizes a pod
        (UpdatePodSandboxResources) or a container (UpdateContainerResources, with what it set), so the states and
        the reconciler catch up at once (RuntimeHooks.resized)."""
        self._resized = resized
        self._plugins = plugins
        self._answers = answers
        self._decisions = decisions
        self._executor = executor
        self._rejects = rejects or RejectedValues()
        self._node = node
        self._known_pod = known_pod
        self._runner = PlanRunner(executor)
        self._groups = PodGroups(executor, self._runner, "hookserver", self._rejects)
        self._host_dirs = executor.records.host_dirs
        self._layout = layout
        self._disabled = disabled_stages

    _report = staticmethod(report_plugin_error)

    def _timed(self, hook: str, stage: str, fn, request, echo):
        started = time.perf_counter()
        status = "succeeded"
        try:
            return fn(request)
        except Exception:  # noqa: BLE001 - a bug here must not fail a pod: answer the echo instead
            status = "failed"
            log.exception("%s failed; answering with the request unchanged", hook)
            return echo(request)
        finally:
            elapsed_ms = (time.perf_counter() - started) * 1000
            metrics.HOOK_DURATION_MS.labels(metrics.node(), hook, stage, status).observe(elapsed_ms)

    # -- pod -------------------------------------------------------------------------------------
    def _pre_run_pod_sandbox(self, req: hookapi.PodSandboxHookRequest,
                             stage: registry.Stage = registry.Stage.PRE_RUN_POD_SANDBOX,
                             ) -> hookapi.PodSandboxHookResponse:
        resp = hookapi.PodSandboxHookResponse(labels=req.labels, annotations=req.annotations,
                                              cgroup_parent=req.cgroup_parent, resources=req.resources)
        if stage.value in self._disabled:
            self._note(req.pod_meta.uid, POD_LEVEL, stage, None, None)
            return resp
        pod = pod_from_sandbox_request(req, self._known_pod(req.pod_meta.uid))
        plugins = [p for p in self._plugins() if stage in p.stages]
        pod_dir = pod_cgroup_dir(self._layout, pod)
        parent = effective_quota_reader(self._executor, posixpath.dirname(pod_dir)) if pod_dir else None
        trace = Trace() if self._answers is not None else None
        changes = registry.run_pod(plugins, self._node(), PodContext(pod), self._report,
                                   self._rejects.reporter(pod), parent, trace)
        self._note(pod.uid, POD_LEVEL, stage, trace, changes)
        if self._decisions is not None and stage is registry.Stage.PRE_RUN_POD_SANDBOX:
            self._decisions.remember(pod_key(pod.uid), changes)
        if not changes:
            return resp
        apply_to_resources(changes, resp.resources, container=False)
        if pod_dir is not None:
            run_pod_level(self._runner, pod, pod_dir, changes, "hookserver",
                          verify=stage is registry.Stage.PRE_UPDATE_POD_SANDBOX_RESOURCES)
        return resp

    def _pre_update_pod_sandbox_resources(self, req: hookapi.PodSandboxHookRequest) -> hookapi.PodSandboxHookResponse:
        """A pod-level resize: kubelet has written the pod dir's new values (cri-api: it calls
        UpdatePodSandboxResources after that), undoing koordlet's pod-level ones (a bound pod's unlimited quota, a
        BE pod's batch values): they are answered and written again at once, as at RunPodSandbox; then the states
        and the reconciler catch up with the new amounts (memory QoS, burst, the containers' values)."""
        try:
            return self._pre_run_pod_sandbox(req, registry.Stage.PRE_UPDATE_POD_SANDBOX_RESOURCES)
        finally:
            if self._resized is not None:
                self._resized(req.pod_meta.uid, "", None)

    def PreUpdatePodSandboxResourcesHook(self, request, context):  # noqa: N802
        return self._timed("PreUpdatePodSandboxResources", "pre", self._pre_update_pod_sandbox_resources, request,
                           self._pod_echo)

    def _note(self, pod_uid: str, container: str, stage: registry.Stage, trace: Trace | None,
              changes: Changes | None) -> None:
        if self._answers is not None and stage not in _NOT_RECORDED:
            note = "" if changes is not None else f"stage {stage.value} off (-runtime-hooks-disable-stages)"
            self._answers.record(pod_uid, container, stage.value, "hookserver", trace, changes, note)

    @staticmethod
    def _pod_echo(request: hookapi.PodSandboxHookRequest) -> hookapi.PodSandboxHookResponse:
        return hookapi.PodSandboxHookResponse(labels=request.labels, annotations=request.annotations,
                                              cgroup_parent=request.cgroup_parent, resources=request.resources)

    def PreRunPodSandboxHook(self, request, context):  # noqa: N802 - gRPC method name
        return self._timed("PreRunPodSandbox", "pre", self._pre_run_pod_sandbox, request, self._pod_echo)

    def _post_stop_pod_sandbox(self, req: hookapi.PodSandboxHookRequest) -> hookapi.PodSandboxHookResponse:
        meta = req.pod_meta
        self._groups.remove(meta.uid, f"pod {meta.namespace}/{meta.name} stopped (PostStopPodSandbox)")
        return self._pod_echo(req)

    def PostStopPodSandboxHook(self, request, context):  # noqa: N802
        return self._timed("PostStopPodSandbox", "post", self._post_stop_pod_sandbox, request, self._pod_echo)

    # -- containers --------------------------------------------------------------------------------
    @staticmethod
    def _container_echo(req: hookapi.ContainerResourceHookRequest) -> hookapi.ContainerResourceHookResponse:
        return hookapi.ContainerResourceHookResponse(
            container_annotations=req.container_annotations, container_resources=req.container_resources,
            pod_cgroup_parent=req.pod_cgroup_parent, container_envs=req.container_envs)

    def _container(self, stage: registry.Stage, req: hookapi.ContainerResourceHookRequest):
        resp = self._container_echo(req)
        if stage.value in self._disabled:
            self._note(req.pod_meta.uid, req.container_meta.name, stage, None, None)
            return resp
        pod = pod_from_container_request(req, self._known_pod(req.pod_meta.uid))
        plugins = [p for p in self._plugins() if stage in p.stages]
        context = container_context_from_request(pod, req)
        pod_dir = pod_cgroup_dir(self._layout, pod, req.pod_cgroup_parent)
        node = self._node()
        trace = Trace() if self._answers is not None else None
        changes = registry.run_container(plugins, node, context, self._report,
                                         self._rejects.reporter(pod, context.name),
                                         effective_quota_reader(self._executor, pod_dir) if pod_dir else None, trace)
        self._note(pod.uid, context.name, stage, trace, changes)
        changes = with_host_dirs(changes, hami_cache_root(node.hami_core_library), self._host_dirs, pod.uid,
                                 self._rejects.reporter(pod, context.name))
        if self._decisions is not None:
            key = create_key(pod.uid, context.name) if stage is registry.Stage.PRE_CREATE_CONTAINER else \
                update_key(req.container_meta.id)
            self._decisions.remember(key, changes)
        apply_to_container_response(changes, resp)
        if stage is registry.Stage.PRE_UPDATE_CONTAINER_RESOURCES and self._resized is not None:
            # the proxy's request holds kubelet's update over the container's creation values, the hooks' answers
            # then included: for a BE pod those are batch values, not kubelet's, so only the resync is asked for
            enacted = req.container_resources if pod.qos_class is not QoSClass.BE else None
            self._resized(pod.uid, req.container_meta.id, enacted)
        return resp

    def PreCreateContainerHook(self, request, context):  # noqa: N802
        return self._timed("PreCreateContainer", "pre",
                           lambda r: self._container(registry.Stage.PRE_CREATE_CONTAINER, r), request,
                           self._container_echo)

    def PreUpdateContainerResourcesHook(self, request, context):  # noqa: N802
        return self._timed("PreUpdateContainerResources", "pre",
                           lambda r: self._container(registry.Stage.PRE_UPDATE_CONTAINER_RESOURCES, r), request,
                           self._container_echo)

    def _echo(self, request, context):
        return self._container_echo(request)

    PreStartContainerHook = _echo
    PostStartContainerHook = _echo
    PostStopContainerHook = _echo


def serve(service: HookService, socket_path: str, workers: int = 4) -> grpc.Server:
    """Start the gRPC server on a unix socket (0660); refuses a live socket, removes a stale one."""
    prepare_socket(socket_path)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="runtime-hook"))
    hookapi_grpc.add_RuntimeHookServiceServicer_to_server(service, server)
    server.add_insecure_port(f"unix://{socket_path}")
    server.start()
    chmod_socket(socket_path)
    return server
