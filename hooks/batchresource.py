"""Batch resources: BE pods ask for ``kubernetes.io/batch-cpu``/``batch-memory`` instead of cpu/memory,
so kubelet gives them nothing; this plugin turns those amounts into cgroup values
(docs/koordinator.md §3.3 BatchResource).

Amounts come from the pod spec (kubelet source) or, on a hook request that has no spec, from the
``node.koordinator.sh/extended-resource-spec`` annotation the scheduler's webhook writes.
Pod: shares of the summed requests; quota of the summed limits (−1 if a container has none); memory the
summed limits (−1 if one has none). Container: its own request/limit. With CPU suppress by cfsQuota on,
BE quotas are −1 (the besteffort parent limits them); with a node CPU normalization ratio > 1, quotas are
divided by it. The quota is set only where :func:`koordlet.api.cfsquota.quota_owner` names this plugin: a BE
pod bound to a cpuset is the cpuset hook's (unlimited, or kubelet's with ``-disable-unset-cpu-quota``), whatever
order the plugins run in.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from koordlet.api.annotations import parse_extended_resource_spec
from koordlet.api.cfsquota import (
    QuotaGates,
    QuotaOwner,
    be_quota_suppressed,
    node_normalization_ratio,
    normalized_quota_us,
    quota_owner,
)
from koordlet.api.keys import ANNOTATION_EXTENDED_RESOURCE_SPEC, RESOURCE_BATCH_CPU, RESOURCE_BATCH_MEMORY
from koordlet.api.pod import PodMeta
from koordlet.api.qos import QoSClass

from .protocol import (
    NO_CHANGES,
    Changes,
    ContainerContext,
    NodeContext,
    PodContext,
    memory_limit,
    quota_from_milli,
    shares_from_milli,
)
from .registry import Plugin, Stage, register


@dataclass(frozen=True, slots=True)
class Rule:
    unlimited_quota: bool  # CPU suppress works on the besteffort parent's quota
    normalization_ratio: float | None
    gates: QuotaGates = QuotaGates()  # who else may own a BE pod's quota


@dataclass(frozen=True, slots=True)
class BatchAmounts:
    cpu_request_milli: int = 0
    cpu_limit_milli: int = 0
    memory_request_bytes: int = 0
    memory_limit_bytes: int = 0


def rule(node: NodeContext) -> Rule:
    return Rule(unlimited_quota=be_quota_suppressed(node.node_slo),
                normalization_ratio=node_normalization_ratio(node.node_annotations),
                gates=QuotaGates(cpuset=node.cpuset_allocator, cpu_burst=node.cpu_burst))


# The same annotation text arrives on every hook call and reconcile pass: parse it once (results are immutable).
_parse_spec = lru_cache(maxsize=1024)(parse_extended_resource_spec)


def batch_amounts(pod: PodMeta) -> dict[str, BatchAmounts]:
    """Per container name; empty when the pod has no batch resources."""
    raw = pod.annotations.get(ANNOTATION_EXTENDED_RESOURCE_SPEC)
    if raw:
        spec = _parse_spec(raw)
        sources = {name: (c.requests, c.limits) for name, c in spec.containers.items()}
    elif not pod.requests_known:  # the CRI pod source: no batch requests or limits known, leave it alone
        return {}
    else:
        sources = {c.name: (c.requests, c.limits) for c in pod.containers if not c.is_init}
    amounts = {
        name: BatchAmounts(requests.get(RESOURCE_BATCH_CPU, 0), limits.get(RESOURCE_BATCH_CPU, 0),
                           requests.get(RESOURCE_BATCH_MEMORY, 0), limits.get(RESOURCE_BATCH_MEMORY, 0))
        for name, (requests, limits) in sources.items()
    }
    if not any(a != BatchAmounts() for a in amounts.values()):
        return {}
    return amounts


def _quota(pod: PodMeta, milli: int | None, r: Rule, running: bool) -> int | None:
    """The quota for a batch-cpu limit (None: no limit, unlimited), where this plugin owns it; None where not."""
    if quota_owner(pod, r.gates, running=running) is not QuotaOwner.BATCH:
        return None
    if r.unlimited_quota or milli is None:
        return -1
    return normalized_quota_us(quota_from_milli(milli), r.normalization_ratio)


def pod(ctx: PodContext, r: Rule) -> Changes:
    if ctx.pod.qos_label is not QoSClass.BE:
        return NO_CHANGES
    amounts = batch_amounts(ctx.pod)
    if not amounts:
        return NO_CHANGES
    values = amounts.values()
    cpu_limited = all(a.cpu_limit_milli > 0 for a in values)
    memory_limited = all(a.memory_limit_bytes > 0 for a in values)
    return Changes(
        cpu_shares=shares_from_milli(sum(a.cpu_request_milli for a in values)),
        cfs_quota_us=_quota(ctx.pod, sum(a.cpu_limit_milli for a in values) if cpu_limited else None, r, False),
        memory_limit_bytes=memory_limit(sum(a.memory_limit_bytes for a in values)) if memory_limited else -1,
    )


def container(ctx: ContainerContext, r: Rule) -> Changes:
    if ctx.pod.qos_label is not QoSClass.BE:
        return NO_CHANGES
    amounts = batch_amounts(ctx.pod)
    if not amounts:
        return NO_CHANGES
    mine = amounts.get(ctx.name, BatchAmounts())
    return Changes(
        cpu_shares=shares_from_milli(mine.cpu_request_milli),
        cfs_quota_us=_quota(ctx.pod, mine.cpu_limit_milli, r, ctx.running),
        memory_limit_bytes=memory_limit(mine.memory_limit_bytes),
    )


PLUGIN = register(Plugin("batchresource", "BatchResource", rule, pod=pod, container=container,
                         stages=frozenset(Stage)))
