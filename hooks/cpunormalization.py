"""CPU normalization (docs/koordinator.md §3.3 CPUNormalization).

On a node whose CPUs are faster than the reference (node annotation
``node.koordinator.sh/cpu-normalization-ratio`` > 1), LS and unlabelled pods' CFS quotas are
divided by the ratio, so a "core" means the same work everywhere. Pods bound to a cpuset are left alone.
Container level only: the pod-level quota is not known at hook time."""

from __future__ import annotations

import math

from koordlet.api.annotations import parse_cpu_normalization_ratio
from koordlet.api.keys import ANNOTATION_NODE_CPU_NORMALIZATION_RATIO, ANNOTATION_RESOURCE_STATUS
from koordlet.api.qos import QoSClass
from wire.kernel_ranges import CFS_QUOTA_MIN_US

from .protocol import NO_CHANGES, Changes, ContainerContext, NodeContext
from .registry import Plugin, Stage, register


def rule(node: NodeContext) -> float | None:
    raw = node.node_annotations.get(ANNOTATION_NODE_CPU_NORMALIZATION_RATIO)
    ratio = parse_cpu_normalization_ratio(raw) if raw else None
    return ratio if ratio is not None and ratio > 1 else None


def container(ctx: ContainerContext, ratio: float | None) -> Changes:
    if ratio is None or ctx.pod.qos_label not in (QoSClass.LS, QoSClass.NONE):
        return NO_CHANGES
    if ANNOTATION_RESOURCE_STATUS in ctx.pod.annotations or ctx.resources.cfs_quota_us <= 0:
        return NO_CHANGES
    return Changes(cfs_quota_us=max(CFS_QUOTA_MIN_US, math.ceil(ctx.resources.cfs_quota_us / ratio)))


PLUGIN = register(Plugin("cpunormalization", "CPUNormalization", rule, container=container,
                         stages=frozenset({Stage.PRE_CREATE_CONTAINER, Stage.PRE_UPDATE_CONTAINER_RESOURCES})))
