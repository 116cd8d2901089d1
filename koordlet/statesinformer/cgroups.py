"""The pods of the states informer as the cgroup dirs the collectors read (koordlet.metricsadvisor.PodCgroup).

A pod's dir comes from its cgroup parent (kubelet ``/pods``: built from the layout; CRI: as the runtime was
given it); each container's dir is the layout's container dir under it. Pods whose dir cannot be built
(no cgroup parent yet, an unsafe name) are left out with a debug line: the next sync has them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from koordlet.api.pod import PodMeta
from koordlet.metricsadvisor.pods import ContainerCgroup, PodCgroup
from koordlet.system.kubepods import CgroupPathError, KubeCgroupLayout

logger = logging.getLogger(__name__)

BATCH_CPU = "kubernetes.io/batch-cpu"


def pod_cgroups(pods: Sequence[PodMeta], layout: KubeCgroupLayout) -> list[PodCgroup]:
    out = []
    for pod in pods:
        try:
            if pod.cgroup_parent:
                pod_dir = layout.dir_from_cgroup_parent(pod.cgroup_parent)
            elif pod.effective_kube_qos is not None:
                pod_dir = layout.pod_dir(pod.uid, pod.effective_kube_qos)
            else:
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


def pod_cgroup_source(pods: Callable[[], Sequence[PodMeta]], layout: KubeCgroupLayout) -> Callable[[], list[PodCgroup]]:
    """A metricsadvisor PodSource over a StatesProvider's ``pods``."""
    return lambda: pod_cgroups(pods(), layout)
