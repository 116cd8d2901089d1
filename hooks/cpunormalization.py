"""CPU normalization (docs/koordinator.md §3.3 CPUNormalization).

On a node whose CPUs are faster than the reference (node annotation
``node.koordinator.sh/cpu-normalization-ratio`` > 1), LS and unlabelled pods' CFS quotas are
divided by the ratio, so a "core" means the same work everywhere. Pods bound to a cpuset are left alone.
Container level only: the pod-level quota is not known at hook time.

The quota's owner decides (koordlet/api/cfsquota.py): a container being created or updated always gets the
normalized quota; a running one only while CPU burst does not own it, since burst keeps it within its own range
above that same normalized base (Koordinator #2306: there the two undo each other)."""

from __future__ import annotations

from dataclasses import dataclass

from koordlet.api.cfsquota import QuotaGates, QuotaOwner, node_normalization_ratio, normalized_quota_us, quota_owner

from .protocol import NO_CHANGES, Changes, ContainerContext, NodeContext
from .registry import Plugin, Stage, register


@dataclass(frozen=True, slots=True)
class Rule:
    ratio: float | None
    gates: QuotaGates


def rule(node: NodeContext) -> Rule:
    return Rule(node_normalization_ratio(node.node_annotations),
                QuotaGates(cpuset=node.cpuset_allocator, cpu_burst=node.cpu_burst, normalization=True))


def container(ctx: ContainerContext, r: Rule) -> Changes:
    if r.ratio is None or ctx.resources.cfs_quota_us <= 0:
        return NO_CHANGES
    if quota_owner(ctx.pod, r.gates, running=ctx.running, ratio=r.ratio) is not QuotaOwner.NORMALIZATION:
        return NO_CHANGES
    return Changes(cfs_quota_us=normalized_quota_us(ctx.resources.cfs_quota_us, r.ratio))


PLUGIN = register(Plugin("cpunormalization", "CPUNormalization", rule, container=container,
                         stages=frozenset({Stage.PRE_CREATE_CONTAINER, Stage.PRE_UPDATE_CONTAINER_RESOURCES})))
