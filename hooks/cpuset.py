"""CPU sets the scheduler chose (docs/koordinator.md §3.3 CPUSetAllocator).

Container cpuset, in Koordinator's order (docs/koordinator.md §3.3):

1. a cpuset in ``scheduling.koordinator.sh/resource-status`` (LSE, LSR: the scheduler's choice) → that cpuset,
   and an unlimited CFS quota at pod and container level (bound pods must not be throttled, Koordinator #489;
   with ``-disable-unset-cpu-quota`` the quota kubelet set stays, as Koordinator's DisableUnsetCPUQuotaForCPUSetPod).
   The quota is this hook's as :func:`koordlet.api.cfsquota.quota_owner` says (every plugin that writes a quota
   asks it, so the answer does not hang on the order plugins run in);
   NUMA resources there (with CPU, or batch-cpu) → the shared pools of those NUMA nodes: the BE pools for a BE
   pod with ``BECPUManager`` on, the LS pools for any other pod (Koordinator cpuset rule.go; a BE pod without
   the gate falls through to 3);
2. QoS LS → the LS shared pool (every online CPU minus LSE/LSR-bound, kubelet-exclusive, reserved and
   SYSTEM-exclusive CPUs: ``koordlet.api.cpupools``, what the NodeResourceTopology reports);
3. kube QoS BestEffort → "" (cleared: BE containers follow the besteffort parent, whose cpuset CPU suppress
   manages — and never holds LSE or kubelet-exclusive CPUs);
4. kubelet's CPU manager policy ``static`` (or not known) → unchanged (kubelet owns those cpusets, its
   exclusive CPUs among them);
5. policy ``none`` → the LS shared pool.

Without the pools (the node's topology unknown) LS and other pods keep what kubelet gave them.
"""

from __future__ import annotations

from dataclasses import dataclass

from koordlet.api.annotations import parse_resource_status
from koordlet.api.cfsquota import QuotaGates, QuotaOwner, quota_owner
from koordlet.api.cpupools import CPUPools
from koordlet.api.cpuset import format_cpu_list, parse_cpu_list
from koordlet.api.keys import ANNOTATION_RESOURCE_STATUS, RESOURCE_BATCH_CPU, RESOURCE_CPU
from koordlet.api.pod import PodMeta
from koordlet.api.qos import KubeQoS, QoSClass

from .protocol import NO_CHANGES, Changes, ContainerContext, NodeContext, PodContext
from .registry import Plugin, Stage, register


def allocated_cpuset(pod: PodMeta) -> str:
    raw = pod.annotations.get(ANNOTATION_RESOURCE_STATUS)
    if not raw:
        return ""
    return format_cpu_list(parse_resource_status(raw).cpuset)


def _unset_quota(pod: PodMeta, share: SharePool | None, running: bool) -> int | None:
    """The quota of a pod bound to CPUs, where this hook owns it (koordlet/api/cfsquota.py: any bound pod, BE ones
    too): unlimited, or kubelet's (None) with ``-disable-unset-cpu-quota``."""
    gates = QuotaGates(cpuset=True, cpu_burst=share.cpu_burst if share is not None else False)
    if quota_owner(pod, gates, running=running) is not QuotaOwner.CPUSET:
        return None
    return None if share is not None and share.keep_quota else -1


def pod(ctx: PodContext, share: SharePool | None) -> Changes:
    return Changes(cfs_quota_us=_unset_quota(ctx.pod, share, False)) if allocated_cpuset(ctx.pod) else NO_CHANGES


def rule(node: NodeContext) -> SharePool:
    pools = node.cpu_pools
    shared = format_cpu_list(sorted(pools.shared_cpus)) if pools is not None else ""
    return SharePool(shared, node.kubelet_cpu_policy, pools, node.be_cpu_manager, node.keep_cpuset_pod_quota,
                     node.cpu_burst)


KUBELET_POLICY_NONE = "none"


@dataclass(frozen=True, slots=True)
class SharePool:
    """The LS shared pool's cpuset ("" when unknown or empty) and kubelet's CPU manager policy ("" unknown)."""

    cpus: str
    kubelet_policy: str
    pools: CPUPools | None = None  # the per-NUMA pools (NUMA-aware allocations)
    be_cpu_manager: bool = False
    keep_quota: bool = False  # -disable-unset-cpu-quota
    cpu_burst: bool = False  # gate CPUBurst, for the quota's owner


def _numa_nodes(pod: PodMeta) -> tuple[int, ...]:
    """The NUMA nodes of the pod's allocation that carry CPU (cpu or batch-cpu), in the annotation's order."""
    raw = pod.annotations.get(ANNOTATION_RESOURCE_STATUS)
    if not raw:
        return ()
    return tuple(n.node for n in parse_resource_status(raw).numa_node_resources
                 if n.resources.get(RESOURCE_CPU, 0) > 0 or n.resources.get(RESOURCE_BATCH_CPU, 0) > 0)


def _numa_cpuset(ctx: ContainerContext, share: SharePool | None) -> str | None:
    """The cpuset of a NUMA-aware allocation, None when the pod has none (or it is not this rule's)."""
    nodes = _numa_nodes(ctx.pod)
    if not nodes or share is None or share.pools is None:
        return None
    if ctx.pod.qos_label is QoSClass.BE:
        if not share.be_cpu_manager:
            return None
        pools = share.pools.be_shared
    else:
        pools = share.pools.shared
    return ",".join(pool.cpuset for node in nodes for pool in pools if pool.node == node)


def container(ctx: ContainerContext, share: SharePool | None) -> Changes:
    cpuset = allocated_cpuset(ctx.pod)
    if cpuset:
        return Changes(cpuset_cpus=cpuset, cfs_quota_us=_unset_quota(ctx.pod, share, ctx.running))
    numa = _numa_cpuset(ctx, share)
    if numa:
        return Changes(cpuset_cpus=format_cpu_list(parse_cpu_list(numa)))
    pool = share.cpus if share is not None else ""
    if ctx.pod.qos_label is QoSClass.LS and pool:
        return Changes(cpuset_cpus=pool)
    if ctx.pod.effective_kube_qos is KubeQoS.BESTEFFORT:
        return Changes(cpuset_cpus="")
    if share is None or share.kubelet_policy != KUBELET_POLICY_NONE or not pool:
        return NO_CHANGES  # static: kubelet owns these cpusets; unknown: it might
    return Changes(cpuset_cpus=pool)


PLUGIN = register(Plugin("cpuset", "CPUSetAllocator", rule, pod=pod, container=container, stages=frozenset(Stage)))
