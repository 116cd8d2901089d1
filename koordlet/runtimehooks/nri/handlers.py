"""koordlet's answers to NRI events: the same ``hooks/`` plugins decide as behind the proxy's hook server
(docs/koordinator.md §2.10, §3.2 "NRI" row), and every value passes ``hooks/validate.check`` on the way
(``registry.run_pod``/``run_container``); a dropped value is logged, counted and written as an Event.

| NRI event        | what koordlet does                                                                     |
|------------------|----------------------------------------------------------------------------------------|
| RunPodSandbox    | the pod-level plan (pod cgroup values, its resctrl group), carried out by the runner    |
|                  | right after the answer, so containerd does not wait for the writes                     |
| CreateContainer  | a ContainerAdjustment with what the plugins want changed (convert.py); an RDT class    |
|                  | only once its group exists (podgroups.py)                                              |
| UpdateContainer  | a ContainerUpdate that carries the container id, from the resources the call asks for  |
| RemovePodSandbox | clean-up: the pod's resctrl group (if koordlet's record has it); what is remembered     |
|                  | about the pod                                                                          |
| Synchronize      | updates for every existing container and the pod-level plan of every pod, at once      |

Pods labelled ``runtimeproxy.koordinator.sh/skip-hookserver=true`` and stages turned off with
``-runtime-hooks-disable-stages`` get no answer, as behind the proxy. CreateContainer, UpdateContainer and
Synchronize run in the NRI plugin's worker threads under the runtime's request timeout (wire/nri.py): their
decisions read cgroup files, the node's CPU pools and kubelet's checkpoint, and may post a Warning Event, none
of which may hold up the connection. What they change before answering (a HAMi host dir, Synchronize's
pod-level writes) is wrapped in ``wire.nri.changing``, so a handler that missed its deadline changes nothing
after its empty answer. Synchronize stops deciding at its deadline and leaves the rest to the reconciler. The
pod events only queue their work, so they are answered on the loop.
"""

from __future__ import annotations

import logging
import posixpath
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from hooks import registry
from hooks.gpu import hami_cache_root
from hooks.protocol import Changes, ContainerContext, NodeContext, PodContext
from hooks.registry import Trace
from koordlet.actuator import PlanRunner
from koordlet.api.pod import PodMeta
from koordlet.api.qos import skips_hooks
from koordlet.executor import ResourceExecutor
from koordlet.history.answers import POD_LEVEL, HookAnswers
from koordlet.hostdirs import with_host_dirs
from koordlet.system.cgroup import CgroupVersion
from koordlet.system.kubepods import KubeCgroupLayout, pod_cgroup_dir
from wire import nri_pb2 as api
from wire.nri import Event, changing, event_mask, runtime_sends_update_pod_sandbox

from ..apply import (
    RejectedValues,
    container_context_from_meta,
    effective_quota_reader,
    report_plugin_error,
    run_pod_level,
    with_spec,
)
from ..decisions import Decisions, create_key, pod_key, update_key
from ..podgroups import PodGroups
from ..server import Resized
from . import convert

log = logging.getLogger(__name__)

Stage = registry.Stage
# Koordinator's NRI plugin subscribes to these four (mask 0x8D); Synchronize and Configure always come.
EVENTS = (Event.RUN_POD_SANDBOX, Event.REMOVE_POD_SANDBOX, Event.CREATE_CONTAINER, Event.UPDATE_CONTAINER)
_LIVE_STATES = (api.CONTAINER_CREATED, api.CONTAINER_RUNNING, api.CONTAINER_PAUSED)


class NriHandlers:
    """The :class:`wire.nri.PluginHandlers` of koordlet."""

    events = event_mask(EVENTS)
    # Answered on the connection's loop: the pod events, whose work (cgroup and resctrl writes: 5-25 ms measured,
    # that containerd would wait for before RunPodSandbox returns) goes to one background thread, in order, after
    # the answer. The others run in the plugin's worker threads under the deadline.
    quick = frozenset({"RunPodSandbox", "RemovePodSandbox"})

    def __init__(self, plugins: Callable[[], list[registry.Plugin]], node: Callable[[], NodeContext],
                 known_pods: Callable[[], Sequence[PodMeta]], executor: ResourceExecutor,
                 layout: KubeCgroupLayout, disabled_stages: frozenset[str] = frozenset(),
                 rejects: RejectedValues | None = None, decisions: Decisions | None = None,
                 answers: HookAnswers | None = None, resized: Resized | None = None) -> None:
        """``answers``: where each plugin's answer at creation is kept for ``/debug/pods`` (when NRI decides);
        ``resized``: told when kubelet resizes a container (UpdateContainer) or a pod (UpdatePodSandbox)."""
        self._resized = resized
        self._plugins = plugins
        self._answers = answers
        self._node = node
        self._known_pods = known_pods
        self._executor = executor
        self._runner = PlanRunner(executor)
        self._layout = layout
        self._disabled = disabled_stages
        self._rejects = rejects or RejectedValues()
        self._decisions = decisions
        self._groups = PodGroups(executor, self._runner, "nri", self._rejects)
        self._host_dirs = executor.records.host_dirs
        self._cgroup_v2 = executor.cgroup_fs.version is CgroupVersion.V2
        self._pod_work = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nri-pod")  # one: pods in order
        self.runtime = ""  # "containerd 2.1.9", from Configure

    _report = staticmethod(report_plugin_error)

    # -- what the plugins see ------------------------------------------------------------------------------
    def _known(self, uid: str) -> PodMeta | None:
        return next((p for p in self._known_pods() if p.uid == uid), None)

    def _pod(self, pod: api.PodSandbox, known: PodMeta | None = None) -> PodMeta:
        return with_spec(convert.pod_from_nri(pod), known if known is not None else self._known(pod.uid))

    def _on(self, stage: Stage, pod: PodMeta) -> bool:
        return stage.value not in self._disabled and not skips_hooks(pod.labels)

    def _staged(self, stage: Stage) -> list[registry.Plugin]:
        return [p for p in self._plugins() if stage in p.stages]

    def _pod_changes(self, pod: PodMeta, plugins: list[registry.Plugin], node: NodeContext,
                     pod_dir: str | None, record: bool = False) -> Changes:
        """``record``: keep each plugin's answer for ``/debug/pods`` (the pod's creation)."""
        parent = effective_quota_reader(self._executor, posixpath.dirname(pod_dir)) if pod_dir else None
        trace = Trace() if record and self._answers is not None else None
        changes = registry.run_pod(plugins, node, PodContext(pod), self._report, self._rejects.reporter(pod), parent,
                                   trace)
        if trace is not None and self._answers is not None:
            self._answers.record(pod.uid, POD_LEVEL, Stage.PRE_RUN_POD_SANDBOX.value, "nri", trace, changes)
        return changes

    def _container_changes(self, plugins: list[registry.Plugin], node: NodeContext, context: ContainerContext,
                           pod_dir: str | None, record: bool = False) -> Changes:
        parent = effective_quota_reader(self._executor, pod_dir) if pod_dir else None
        trace = Trace() if record and self._answers is not None else None
        changes = registry.run_container(plugins, node, context, self._report,
                                         self._rejects.reporter(context.pod, context.name), parent, trace)
        if trace is not None and self._answers is not None:
            self._answers.record(context.pod.uid, context.name, Stage.PRE_CREATE_CONTAINER.value, "nri", trace,
                                 changes)
        return changes

    # -- the events ----------------------------------------------------------------------------------------
    def configure(self, request: api.ConfigureRequest) -> int:
        """Koordinator's four events, and UpdatePodSandbox (a pod-level resize) where the runtime's NRI has it
        (v0.10+, containerd 2.2+): a runtime on an older NRI refuses a registration that names it."""
        self.runtime = f"{request.runtime_name} {request.runtime_version}".strip()
        resize = runtime_sends_update_pod_sandbox(request)
        log.info("NRI: configured by %s (request timeout %s ms); pod-level resizes %s", self.runtime or "the runtime",
                 request.request_timeout or "default", "subscribed" if resize else "not sent by this runtime's NRI")
        return self.events | event_mask([Event.UPDATE_POD_SANDBOX]) if resize else self.events

    def state_change(self, event: api.StateChangeEvent) -> None:
        """Pod events are answered at once; their writes follow in the background thread."""
        if event.event == api.RUN_POD_SANDBOX:
            self._pod_work.submit(self._logged, self.run_pod_sandbox, event.pod)
        elif event.event == api.REMOVE_POD_SANDBOX:
            self._pod_work.submit(self._logged, self.remove_pod_sandbox, event.pod)

    @staticmethod
    def _logged(handle: Callable[[api.PodSandbox], None], pod: api.PodSandbox) -> None:
        try:
            handle(pod)
        except Exception:  # noqa: BLE001 - one pod's failure must not stop the pods after it
            log.exception("NRI: pod %s/%s: %s failed", pod.namespace, pod.name, handle.__name__)

    def close(self) -> None:
        self._pod_work.shutdown(wait=False, cancel_futures=True)

    def run_pod_sandbox(self, sandbox: api.PodSandbox) -> None:
        pod = self._pod(sandbox)
        if not self._on(Stage.PRE_RUN_POD_SANDBOX, pod):
            return
        pod_dir = pod_cgroup_dir(self._layout, pod)
        changes = self._decisions.take(pod_key(pod.uid)) if self._decisions is not None else None
        if changes is None:
            changes = self._pod_changes(pod, self._staged(Stage.PRE_RUN_POD_SANDBOX), self._node(), pod_dir,
                                        record=True)
        if changes and pod_dir is not None:
            run_pod_level(self._runner, pod, pod_dir, changes, "nri")

    def remove_pod_sandbox(self, sandbox: api.PodSandbox) -> None:
        """The pod's resctrl group goes with the pod (Koordinator's PreRemoveRunPodSandbox), if koordlet made it:
        by the record, not by asking the plugins again (their gates and the node's RDT may have changed)."""
        if self._decisions is not None:
            self._decisions.forget_pod(sandbox.uid)
        self._groups.remove(sandbox.uid, f"pod {sandbox.namespace}/{sandbox.name} removed (NRI RemovePodSandbox)")

    def create_container(self, request: api.CreateContainerRequest) -> api.CreateContainerResponse:
        pod = self._pod(request.pod)
        if not self._on(Stage.PRE_CREATE_CONTAINER, pod):
            return api.CreateContainerResponse()
        container = request.container
        changes = self._decisions.take(create_key(pod.uid, container.name)) if self._decisions is not None else None
        if changes is None:
            pod_dir = pod_cgroup_dir(self._layout, pod)
            changes = self._container_changes(self._staged(Stage.PRE_CREATE_CONTAINER), self._node(),
                                              convert.container_context(pod, container), pod_dir, record=True)
        if changes.host_dirs:  # HAMi-core's per-container cache dir, before the container mounts it
            root = hami_cache_root(self._node().hami_core_library)
            with changing():
                changes = with_host_dirs(changes, root, self._host_dirs, pod.uid,
                                         self._rejects.reporter(pod, container.name))
        with changing():  # runc refuses a class whose group is missing: the group is made before the answer
            changes = self._groups.checked(pod, self._node, changes)
        adjust = convert.adjustment(changes, container, self._cgroup_v2)
        return api.CreateContainerResponse(adjust=adjust) if adjust.ByteSize() else api.CreateContainerResponse()

    def update_container(self, request: api.UpdateContainerRequest) -> api.UpdateContainerResponse:
        pod = self._pod(request.pod)
        if not self._on(Stage.PRE_UPDATE_CONTAINER_RESOURCES, pod):
            return api.UpdateContainerResponse()
        container = request.container
        changes = self._decisions.take(update_key(container.id)) if self._decisions is not None else None
        if changes is None:
            pod_dir = pod_cgroup_dir(self._layout, pod)
            context = convert.container_context(pod, container, request.linux_resources)
            changes = self._container_changes(self._staged(Stage.PRE_UPDATE_CONTAINER_RESOURCES), self._node(),
                                              context, pod_dir)
        update = convert.container_update(container.id, changes, request.linux_resources, self._cgroup_v2)
        if self._resized is not None:  # containerd passes kubelet's UpdateContainerResources as it came
            self._resized(pod.uid, container.id, convert.cri_resources(request.linux_resources))
        return api.UpdateContainerResponse(update=[update] if update is not None else [])

    def update_pod_sandbox(self, request: api.UpdatePodSandboxRequest) -> api.UpdatePodSandboxResponse:
        """A pod-level resize (the runtime's UpdatePodSandboxResources, after kubelet wrote the pod dir's values):
        the pod-level answers are written again, as at RunPodSandbox, and the states and the reconciler catch up."""
        pod = self._pod(request.pod)
        if self._on(Stage.PRE_UPDATE_POD_SANDBOX_RESOURCES, pod):
            pod_dir = pod_cgroup_dir(self._layout, pod)
            changes = self._pod_changes(pod, self._staged(Stage.PRE_UPDATE_POD_SANDBOX_RESOURCES), self._node(),
                                        pod_dir)
            if changes and pod_dir is not None:
                with changing():  # kubelet has just written the dir: read it, not the write cache
                    run_pod_level(self._runner, pod, pod_dir, changes, "nri", verify=True)
        if self._resized is not None:
            self._resized(pod.uid, "", None)
        return api.UpdatePodSandboxResponse()

    def synchronize(self, pods: Sequence[api.PodSandbox], containers: Sequence[api.Container],
                    deadline: float) -> list[api.ContainerUpdate]:
        """What already runs converges at once: an update for every container whose resources differ from what
        the plugins want (decided from the pod spec where koordlet knows it, as the reconciler does, so a rule
        relative to kubelet's value is never applied twice), then the pod-level plans. Stops at ``deadline``."""
        node, plugins = self._node(), self._plugins()
        known = {p.uid: p for p in self._known_pods()}
        metas = {sandbox.id: self._pod(sandbox, known.get(sandbox.uid)) for sandbox in pods}
        updates: list[api.ContainerUpdate] = []
        for container in containers:
            if time.monotonic() > deadline:
                log.warning("NRI Synchronize: deadline reached after %d updates; the reconciler does the rest",
                            len(updates))
                return updates
            pod = metas.get(container.pod_sandbox_id)
            if pod is None or container.state not in _LIVE_STATES or skips_hooks(pod.labels):
                continue
            update = self._sync_update(pod, container, plugins, node)
            if update is not None:
                updates.append(update)
        self._sync_pods(list(metas.values()), plugins, node, deadline)
        return updates

    def _sync_update(self, pod: PodMeta, container: api.Container, plugins: list[registry.Plugin],
                     node: NodeContext) -> api.ContainerUpdate | None:
        spec = pod.container(container.name)
        context = (container_context_from_meta(pod, spec) if spec is not None
                   else ContainerContext(pod=pod, name=container.name, container_id=container.id, running=True))
        pod_dir = pod_cgroup_dir(self._layout, pod)
        changes = self._container_changes(plugins, node, context, pod_dir)
        # ignore_failure: a value the kernel refuses now (a parent's quota lowered meanwhile) is the
        # reconciler's to retry, not a reason to fail the others
        return convert.container_update(container.id, changes, container.linux.resources, self._cgroup_v2,
                                        ignore_failure=True)

    def _sync_pods(self, pods: Sequence[PodMeta], plugins: list[registry.Plugin], node: NodeContext,
                   deadline: float) -> None:
        for pod in pods:
            if time.monotonic() > deadline:
                return
            if skips_hooks(pod.labels):
                continue
            pod_dir = pod_cgroup_dir(self._layout, pod)
            if pod_dir is None:
                continue
            changes = self._pod_changes(pod, plugins, node, pod_dir)
            if changes:
                with changing():  # never after the answer went without this (wire/nri.py)
                    run_pod_level(self._runner, pod, pod_dir, changes, "nri")
