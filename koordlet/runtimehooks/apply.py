"""Plugin results -> plans (cgroup writes, resctrl actions) for the plan runner; and the contexts plugins
see, built from what koordlet knows."""

from __future__ import annotations

import logging
import posixpath
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace

from hooks.protocol import Changes, ContainerContext, ContainerResources, NodeContext, quota_from_milli
from hooks.registry import EXPECTED_ERRORS
from hooks.validate import Rejected
from koordlet import audit
from koordlet.actuator import PlanRunner
from koordlet.api.cfsquota import BEQuotaOwner, be_quota_owner, be_quota_suppressed
from koordlet.api.pod import ContainerMeta, PodMeta, container_limit
from koordlet.api.qos import KubeQoS, QoSClass
from koordlet.api.units import CFS_PERIOD_US, UNLIMITED
from koordlet.executor import CgroupNotFoundError, ExecutorError, ResourceExecutor
from koordlet.plan import (
    CgroupWrite,
    Plan,
    ProcessWrite,
    ResctrlAction,
    ResctrlGroup,
    ResctrlMoveTasks,
    ResctrlWrite,
    WriteStep,
)
from koordlet.system.cgroup_stats import parse_quota_us
from koordlet.system.kubepods import KubeCgroupLayout
from wire import hookapi_pb2 as hookapi

from . import metrics

log = logging.getLogger(__name__)


def report_plugin_error(plugin: str, pod: str, err: Exception) -> None:
    """The error callback of ``registry.run_pod``/``run_container``: the plugin is skipped for this pod,
    logged (with the traceback when it is a bug rather than malformed input) and counted."""
    log.warning("hook plugin %s skipped for %s: %s: %s", plugin, pod, type(err).__name__, err,
                exc_info=not isinstance(err, EXPECTED_ERRORS))
    metrics.PLUGIN_ERRORS.labels(plugin).inc()


class RejectedValues:
    """Reports values ``hooks.validate`` dropped: counted each time, logged once per (pod, container, key,
    value), and a Warning Event on the pod the first time when an API server is present (``warn``)."""

    _MEMORY = 4096  # (pod, container, key, value) already reported; oldest forgotten first

    def __init__(self, warn: Callable[[PodMeta, str, str], None] | None = None) -> None:
        self._warn = warn
        self._seen: OrderedDict[tuple[str, str, str, str], None] = OrderedDict()
        self._lock = threading.Lock()

    def reporter(self, pod: PodMeta, container: str = "") -> Callable[[list[Rejected]], None]:
        """The ``on_reject`` callback of ``registry.run_pod``/``run_container`` for this pod (and container)."""
        return lambda rejected: self.report(pod, container, rejected)

    def report(self, pod: PodMeta, container: str, rejected: list[Rejected]) -> None:
        fresh: list[Rejected] = []
        for item in rejected:
            metrics.VALUES_REJECTED.labels(item.key.partition(".")[0]).inc()
            key = (pod.uid or pod.key, container, item.key, repr(item.value)[:200])
            with self._lock:
                if key in self._seen:
                    continue
                self._seen[key] = None
                if len(self._seen) > self._MEMORY:
                    self._seen.popitem(last=False)
            fresh.append(item)
        if not fresh:
            return
        where = f"{pod.key}/{container}" if container else pod.key
        text = "; ".join(f"{item.key}={item.value!r:.80}: {item.reason}" for item in fresh)
        log.warning("hook values dropped for %s (the pod goes on as kubelet asked): %s", where, text)
        auditor = audit.current()
        if auditor is not None:
            owner = audit.Owner(audit.TYPE_POD, pod.namespace, pod.name, container)
            for item in fresh:
                auditor.log(audit.LEVEL_UPDATE, owner, "HookValueRejected",
                            f"{item.key} not set to {item.value!r:.80}: {item.reason}; the pod keeps what kubelet "
                            "asked for")
        if self._warn is not None:
            self._warn(pod, "KoordletHookValueRejected",
                       f"koordlet dropped hook values{' for container ' + container if container else ''} "
                       f"that the kernel or the node would refuse (check the pod's annotations): {text}")


def _quota_of(text: str) -> int | None:
    """A limited quota read back (``parse_quota_us``); None when unlimited, zero or unreadable."""
    try:
        value = parse_quota_us(text)
    except ValueError:
        return None
    return value if value > 0 else None


def effective_quota_reader(executor: ResourceExecutor, cgroup_dir: str, planned: int | None = None,
                           unlimited: str = "") -> Callable[[], int | None]:
    """A function giving the CPU quota that binds a child of ``cgroup_dir``: the smallest limited quota of
    ``cgroup_dir`` (``planned`` instead of its file, when a write of it is planned) and its ancestors (cgroup v1
    refuses a child quota above that with EINVAL); ``unlimited``: an ancestor (or ``cgroup_dir``) the same plan
    makes unlimited first (:func:`besteffort_unlimited_first`), not read. None: nothing above is limited. Reads
    only when called, and only up to the nearest limited quota read from a file: the kernel keeps that one within
    every limited ancestor's (v1 checks a quota against its limited ancestors when it is set), so nothing above
    binds more (a hook call on a pod with a quota reads one file, not one per level)."""

    def read() -> int | None:
        limits: list[int] = []
        directory = cgroup_dir.strip("/")
        if planned is not None and directory:
            if planned > 0:
                limits.append(planned)
            directory = posixpath.dirname(directory)
        while directory:
            if directory == unlimited.strip("/"):
                directory = posixpath.dirname(directory)
                continue
            try:
                value = _quota_of(executor.read("cpu.cfs_quota_us", directory))
            except (ExecutorError, ValueError):
                value = None
            if value is not None:
                limits.append(value)
                break
            directory = posixpath.dirname(directory)
        return min(limits) if limits else None

    return read


def besteffort_unlimited_first(layout: KubeCgroupLayout, pod_dir: str, node: NodeContext) -> str:
    """The besteffort QoS dir when it is ``pod_dir``'s parent and CPU suppress owns its quota and keeps it unlimited
    under this NodeSLO (any policy but cfsQuota, and BE PSI throttle not steering it): a BE pod's own quota is then
    planned with a −1 on that dir ahead of it (:func:`unlimited_parent_write`), so a switch away from cfsQuota gives
    the BE pods their quotas back in one reconciler pass, before suppress's next tick (koordlet/api/cfsquota.py).
    "" otherwise."""
    qos_dir = posixpath.dirname(pod_dir.rstrip("/"))
    owner = be_quota_owner(node.node_slo, suppress=node.be_cpu_suppress, psi_throttle=node.be_psi_throttle)
    if owner is BEQuotaOwner.CPU_SUPPRESS and not be_quota_suppressed(node.node_slo) and qos_dir == layout.qos_dir(
            KubeQoS.BESTEFFORT):
        return qos_dir
    return ""


def unlimited_parent_write(executor: ResourceExecutor, qos_dir: str, changes: Changes) -> CgroupWrite | None:
    """The −1 for ``qos_dir`` (:func:`besteffort_unlimited_first`) that ``changes``' limited quota needs first: only
    while that dir's quota is limited (a cfsQuota suppression left behind), so a steady pass writes nothing."""
    if not qos_dir or changes.cfs_quota_us is None or changes.cfs_quota_us <= 0:
        return None
    try:
        current = _quota_of(executor.read("cpu.cfs_quota_us", qos_dir))
    except ExecutorError:
        return None
    if current is None:
        return None
    return CgroupWrite("cpu.cfs_quota_us", qos_dir, UNLIMITED,
                       "BECPUSuppress: the besteffort quota is unlimited under this NodeSLO, ahead of a BE pod's own")


def suppressed_quota_why(pod: PodMeta, node: NodeContext, changes: Changes) -> str:
    """Why ``changes`` leave a BE pod (or its container) without a quota of its own, for the audit log and
    ``koordlet explain``: CPU suppress's cfsQuota policy limits the BE pods by the besteffort dir's quota
    (koordlet/api/cfsquota.py); "" for any other quota."""
    if changes.cfs_quota_us != UNLIMITED or pod.qos_label is not QoSClass.BE or not be_quota_suppressed(node.node_slo):
        return ""
    return ("BatchResource: no quota of its own under CPU suppress's cfsQuota policy: the besteffort dir's quota "
            "limits the BE pods")


def cgroup_writes(changes: Changes, cgroup_dir: str,
                  quota_why: str = "") -> tuple[list[CgroupWrite], list[CgroupWrite]]:
    """(leveled, plain) writes that put ``changes`` on ``cgroup_dir``: quota, memory limit and cpuset must
    respect the parent/child order on cgroup v1 (leveled); an empty cpuset is not written (it means "follow
    the parent", which a container dir already does). ``quota_why``: the quota write's reason."""
    leveled: list[CgroupWrite] = []
    plain: list[CgroupWrite] = []
    if changes.cfs_quota_us is not None:
        leveled.append(CgroupWrite("cpu.cfs_quota_us", cgroup_dir, changes.cfs_quota_us, quota_why))
    if changes.memory_limit_bytes is not None:
        leveled.append(CgroupWrite("memory.limit_in_bytes", cgroup_dir, changes.memory_limit_bytes))
    if changes.cpuset_cpus:
        leveled.append(CgroupWrite("cpuset.cpus", cgroup_dir, changes.cpuset_cpus))
    # cpu.idle before cpu.shares: the kernel refuses a weight on an idle group (EINVAL) and holds it at the
    # minimum, and turning idle off resets the weight to 1024, which the shares written after it then correct
    # (hooks/coresched.py).
    if changes.cpu_idle is not None:
        plain.append(CgroupWrite("cpu.idle", cgroup_dir, changes.cpu_idle))
    if changes.cpu_shares is not None and changes.cpu_idle != 1:
        plain.append(CgroupWrite("cpu.shares", cgroup_dir, changes.cpu_shares))
    if changes.bvt_warp_ns is not None:
        plain.append(CgroupWrite("cpu.bvt_warp_ns", cgroup_dir, changes.bvt_warp_ns))
    return leveled, plain


def process_writes(changes: Changes, container_dir: str, where: str) -> tuple[ProcessWrite, ...]:
    """What a container's processes are to get: ``oom_score_adj`` of every process of ``container_dir``."""
    if changes.oom_score_adj is None:
        return ()
    reason = f"OOMScoreAdj: the annotations of {where} ask for oom_score_adj {changes.oom_score_adj}"
    return (ProcessWrite("oom_score_adj", container_dir, changes.oom_score_adj, reason),)


def steps_of(leveled: list[CgroupWrite], plain: list[CgroupWrite]) -> tuple[WriteStep, ...]:
    steps = []
    if leveled:
        steps.append(WriteStep(tuple(leveled), leveled=True))
    if plain:
        steps.append(WriteStep(tuple(plain)))
    return tuple(steps)


def resctrl_actions(changes: Changes, pod_uid: str, task_dirs: tuple[str, ...] = (),
                    task_ids: tuple[int, ...] = ()) -> tuple[ResctrlAction, ...]:
    """The pod's resctrl group (recorded as the pod's, so it goes with the pod) with its schemata, and the processes
    of ``task_dirs`` and the threads ``task_ids`` moved in."""
    group, schemata = changes.resctrl_group, changes.resctrl_schemata
    if not (group and schemata):
        return ()
    actions: list[ResctrlAction] = [ResctrlGroup(group, pod_uid), ResctrlWrite(group, "schemata", schemata)]
    if task_dirs or task_ids:
        actions.append(ResctrlMoveTasks(group, task_dirs, source="cgroup.procs", task_ids=task_ids))
    return tuple(actions)


def pod_level_plan(changes: Changes, pod_dir: str, pod_uid: str) -> Plan:
    """What the hook server writes itself for a pod-level answer: the pod dir's values and its resctrl group."""
    return Plan(steps_of(*cgroup_writes(changes, pod_dir)), resctrl=resctrl_actions(changes, pod_uid))


def run_pod_level(runner: PlanRunner, pod: PodMeta, pod_dir: str, changes: Changes, source: str,
                  verify: bool = False) -> None:
    """Carry out a pod-level answer (pod_level_plan) at once; a pod dir not there yet is the reconciler's.
    ``verify``: read each file first, not trusting the write cache (kubelet has just written the dir: a resize)."""
    record = runner.run(pod_level_plan(changes, pod_dir, pod.uid), source, verify=verify)
    for failure in record.failures:
        if isinstance(failure.error, CgroupNotFoundError):
            log.debug("pod %s: %s not there yet; the reconciler will apply it", pod.key, pod_dir)
        else:
            log.warning("pod %s: %s", pod.key, failure.error)
    for error in record.resctrl_errors:
        log.warning("pod %s: resctrl group %s", pod.key, error)


def pod_from_sandbox_request(req: hookapi.PodSandboxHookRequest, known: PodMeta | None = None) -> PodMeta:
    pod = PodMeta(name=req.pod_meta.name, namespace=req.pod_meta.namespace, uid=req.pod_meta.uid,
                  labels=dict(req.labels), annotations=dict(req.annotations), cgroup_parent=req.cgroup_parent)
    return with_spec(pod, known)


def pod_from_container_request(req: hookapi.ContainerResourceHookRequest, known: PodMeta | None = None) -> PodMeta:
    pod = PodMeta(name=req.pod_meta.name, namespace=req.pod_meta.namespace, uid=req.pod_meta.uid,
                  labels=dict(req.pod_labels), annotations=dict(req.pod_annotations),
                  cgroup_parent=req.pod_cgroup_parent)
    return with_spec(pod, known)


def with_spec(pod: PodMeta, known: PodMeta | None) -> PodMeta:
    """A hook request has no pod spec: take requests, limits and priority from the states where known."""
    if known is None:
        return pod
    return replace(pod, containers=known.containers, priority=known.priority, kube_qos=known.kube_qos,
                   phase=known.phase, requests_known=known.requests_known)


def container_context_from_request(pod: PodMeta, req: hookapi.ContainerResourceHookRequest) -> ContainerContext:
    r = req.container_resources
    return ContainerContext(
        pod=pod, name=req.container_meta.name, container_id=req.container_meta.id,
        resources=ContainerResources(cpu_shares=r.cpu_shares, cfs_quota_us=r.cpu_quota, cpuset_cpus=r.cpuset_cpus,
                                     memory_limit_bytes=r.memory_limit_in_bytes),
        envs=dict(req.container_envs),
    )


def container_context_from_meta(pod: PodMeta, container: ContainerMeta) -> ContainerContext:
    """A running container as the reconciler sees it: the limits its cgroup really has (after an in-place resize,
    kubelet's new ones: koordlet/api/pod.py), its pod's pod-level limits where it sets none (kubelet's rule)."""
    return ContainerContext(
        pod=pod, name=container.name, container_id=container.container_id,
        resources=ContainerResources(cfs_quota_us=quota_from_milli(container_limit(pod, container, "cpu")),
                                     memory_limit_bytes=container_limit(pod, container, "memory")),
        running=True,
    )


def apply_to_resources(changes: Changes, r: hookapi.LinuxContainerResources, *, container: bool = True) -> None:
    """Plugin results onto the CRI resources of a hook answer (the one place they are copied). A pod sandbox
    answer (``container=False``) takes shares, quota and the memory limit only: no cpuset, no default period."""
    if changes.cpu_shares is not None:
        r.cpu_shares = changes.cpu_shares
    if changes.cfs_quota_us is not None:
        r.cpu_quota = changes.cfs_quota_us
        if container and changes.cfs_quota_us > 0 and r.cpu_period <= 0:
            r.cpu_period = CFS_PERIOD_US
    if container and changes.cpuset_cpus is not None:
        r.cpuset_cpus = changes.cpuset_cpus
    if changes.memory_limit_bytes is not None:
        # Koordinator answers -1 for "unlimited" (docs/koordinator.md §3.3); the proxy takes only a limit > 0
        # (docs/koordinator.md §2.7), so a -1 leaves kubelet's own value (0, unlimited, for a BE container) in
        # the CRI request.
        r.memory_limit_in_bytes = changes.memory_limit_bytes


def apply_to_container_response(changes: Changes, resp: hookapi.ContainerResourceHookResponse) -> None:
    apply_to_resources(changes, resp.container_resources)
    resp.container_envs.update(changes.envs)
    for device in changes.devices:
        resp.container_devices.add(container_path=device.path, host_path=device.path, permissions="rwm",
                                   type=device.type, major=device.major, minor=device.minor,
                                   file_mode=device.file_mode)
    for mount in changes.mounts:
        resp.container_mounts.add(container_path=mount.destination, host_path=mount.source, readonly=mount.readonly)
