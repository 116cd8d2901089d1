"""CPU sets the scheduler chose (§3.3 CPUSetAllocator).

A pod whose ``scheduling.koordinator.sh/resource-status`` names a cpuset gets it on every container, and
an unlimited CFS quota at pod and container level (bound pods must not be throttled, Koordinator #489).
BestEffort containers get an empty cpuset, which clears it: they follow the besteffort parent, whose
cpuset CPU suppress manages. Share pools (from the NodeResourceTopology koordlet would report) are not
modelled: LS pods without an allocation keep what kubelet gave them.
"""

from __future__ import annotations

from koordlet.api.annotations import parse_resource_status
from koordlet.api.cpuset import format_cpu_list
from koordlet.api.keys import ANNOTATION_RESOURCE_STATUS
from koordlet.api.pod import PodMeta
from koordlet.api.qos import KubeQoS

from .protocol import NO_CHANGES, Changes, ContainerContext, NodeContext, PodContext
from .registry import Plugin, Stage, register


def rule(node: NodeContext) -> None:
    return None


def allocated_cpuset(pod: PodMeta) -> str:
    raw = pod.annotations.get(ANNOTATION_RESOURCE_STATUS)
    if not raw:
        return ""
    return format_cpu_list(parse_resource_status(raw).cpuset)


def pod(ctx: PodContext, _rule: None) -> Changes:
    return Changes(cfs_quota_us=-1) if allocated_cpuset(ctx.pod) else NO_CHANGES


def container(ctx: ContainerContext, _rule: None) -> Changes:
    cpuset = allocated_cpuset(ctx.pod)
    if cpuset:
        return Changes(cpuset_cpus=cpuset, cfs_quota_us=-1)
    if ctx.pod.effective_kube_qos is KubeQoS.BESTEFFORT:
        return Changes(cpuset_cpus="")
    return NO_CHANGES


PLUGIN = register(Plugin("cpuset", "CPUSetAllocator", rule, pod=pod, container=container, stages=frozenset(Stage)))
