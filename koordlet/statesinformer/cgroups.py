"""The pods of the states informer, and NodeSLO's host applications, as the cgroup dirs the collectors read.

A pod's dir comes from its cgroup parent (kubelet ``/pods``: built from the layout; CRI: as the runtime was
given it); each container's dir is the layout's container dir under it. Pods whose dir cannot be built
(no cgroup parent yet, an unsafe name) are left out with a debug line: the next sync has them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from koordlet.api.nodeslo import (
    CGROUP_BASE_KUBEPODS,
    CGROUP_BASE_KUBEPODS_BESTEFFORT,
    CGROUP_BASE_KUBEPODS_BURSTABLE,
    HostApplication,
    NodeSLOSpec,
)
from koordlet.api.pod import DEFAULT_RUNTIME, PodMeta
from koordlet.api.qos import KubeQoS
from koordlet.metricsadvisor.pods import ContainerCgroup, HostAppCgroup, PodCgroup
from koordlet.statesinformer.api import CallbackKind, StatesProvider
from koordlet.system.cgroup import CgroupFS
from koordlet.system.cgroup_stats import CgroupStatError, read_cgroup_threads
from koordlet.system.kubepods import CgroupPathError, KubeCgroupLayout, join_dirs, pod_cgroup_dir

logger = logging.getLogger(__name__)

BATCH_CPU = "kubernetes.io/batch-cpu"


def pod_cgroups(pods: Sequence[PodMeta], layout: KubeCgroupLayout) -> list[PodCgroup]:
    out = []
    for pod in pods:
        try:
            pod_dir = pod_cgroup_dir(layout, pod)
            if pod_dir is None:
                continue
            containers = tuple(
                ContainerCgroup(c.container_id, layout.container_dir(pod_dir, c.container_id, c.runtime))
                for c in pod.containers if c.container_id and not c.is_init
            )
        except CgroupPathError as err:
            logger.debug("pod %s: no cgroup dir: %s", pod.key, err)
            continue
        batch_cpu = sum(c.requests.get(BATCH_CPU, 0) for c in pod.containers if not c.is_init)
        out.append(PodCgroup(pod.uid, pod_dir, containers, pod.qos_class.value, batch_cpu))
    return out


def pod_cgroup_source(
    pods: Callable[[], Sequence[PodMeta]], layout: KubeCgroupLayout
) -> Callable[[], tuple[PodCgroup, ...]]:
    """A metricsadvisor PodSource over a StatesProvider's ``pods``. The informer publishes a new (immutable)
    tuple of pods on every change, so the dirs are built again only when the pods it returns are not the
    very ones of the last call: collectors ask every second, pods change far less often."""
    last: list[object] = [None, ()]

    def source() -> tuple[PodCgroup, ...]:
        current = pods()
        seen, cgroups = last
        if current is not seen:
            cgroups = tuple(pod_cgroups(current, layout))
            last[:] = [current, cgroups]
        return cgroups  # type: ignore[return-value]

    return source


def close_with_pods(states: StatesProvider, layout: KubeCgroupLayout,
                    closers: Sequence[Callable[[Sequence[str]], None]]) -> None:
    """When pods (or containers) leave the states, hand their cgroup dirs to each of ``closers`` (the parts that keep
    descriptors open between ticks: the collectors, the executor's kept reads) at once, on the thread that changed
    the states. A descriptor on a removed cgroup pins its memory in the kernel; waiting for the holder's next tick or
    idle sweep (which needs a later read) left one open for good when nothing read again."""
    lock = threading.Lock()
    listed: set[str] = set()  # the pods' and their containers' cgroup dirs, as of the last change

    def changed() -> None:
        with lock:
            now = {cgroup.cgroup_dir for pod in pod_cgroups(states.pods(), layout)
                   for cgroup in (pod, *pod.containers)}
            gone = sorted(listed - now)
            listed.clear()
            listed.update(now)
        if gone:
            for close in closers:
                close(gone)

    states.register_callback(CallbackKind.ALL_PODS, "close-with-pods", changed)
    changed()


def container_task_reader(layout: KubeCgroupLayout,
                          cgroup_fs: CgroupFS) -> Callable[[PodMeta], dict[str, tuple[int, ...]]]:
    """Reads each container's and the sandbox's thread ids (v1 ``tasks`` of the cpu hierarchy, v2
    ``cgroup.threads``) for the states informer (``-enable-pod-taskids``); a container whose dir is gone is left
    out, one that cannot be read is said at debug level (the next sync reads it again)."""
    def read(pod: PodMeta) -> dict[str, tuple[int, ...]]:
        ids: dict[str, tuple[int, ...]] = {}
        try:
            pod_dir = pod_cgroup_dir(layout, pod)
        except CgroupPathError:
            return ids
        if pod_dir is None:
            return ids
        runtime = next((c.runtime for c in pod.containers), DEFAULT_RUNTIME)
        targets = [(c.container_id, c.runtime) for c in pod.containers if c.container_id and not c.is_init]
        if pod.sandbox_id:
            targets.append((pod.sandbox_id, runtime))
        for container_id, container_runtime in targets:
            try:
                rel = layout.container_dir(pod_dir, container_id, container_runtime)
                ids[container_id] = read_cgroup_threads(cgroup_fs.cgroup_dir("cpu", rel), cgroup_fs.version)
            except FileNotFoundError:
                continue
            except (OSError, CgroupPathError, CgroupStatError) as err:
                logger.debug("pod %s container %s: no task ids: %s", pod.key, container_id, err)
        return ids

    return read


_HOST_APP_BASES = {
    CGROUP_BASE_KUBEPODS: KubeQoS.GUARANTEED,
    CGROUP_BASE_KUBEPODS_BURSTABLE: KubeQoS.BURSTABLE,
    CGROUP_BASE_KUBEPODS_BESTEFFORT: KubeQoS.BESTEFFORT,
}


def host_app_dir(app: HostApplication, layout: KubeCgroupLayout) -> str | None:
    """``cgroupPath`` of a host application relative to the hierarchy root, as Koordinator resolves it:
    ``CgroupRoot`` is the hierarchy root, the ``Kubepods*`` bases the kubepods (QoS) dir of this node's
    layout; then ``parentDir`` and ``relativePath``. None without a cgroupPath or with an empty one."""
    path = app.cgroup_path
    if path is None:
        return None
    qos = _HOST_APP_BASES.get(path.base)
    base = layout.qos_dir(qos) if qos is not None else ""
    return join_dirs(base, path.parent_dir, path.relative_path) or None


def host_app_cgroups(spec: NodeSLOSpec, layout: KubeCgroupLayout) -> list[HostAppCgroup]:
    """The host applications that have a cgroup (NodeSLO validation already refused ``..`` in paths)."""
    out = []
    for app in spec.host_applications:
        rel = host_app_dir(app, layout)
        if rel is None:
            logger.debug("host application %s has no cgroupPath: not collected", app.name)
            continue
        out.append(HostAppCgroup(app.name, rel))
    return out


def host_app_cgroup_source(
    node_slo: Callable[[], NodeSLOSpec], layout: KubeCgroupLayout
) -> Callable[[], list[HostAppCgroup]]:
    """A metricsadvisor HostAppSource over a StatesProvider's ``node_slo``."""
    return lambda: host_app_cgroups(node_slo(), layout)
