"""Collectors of node, pod, container, BE and PSI metrics into the metric cache (docs/koordinator.md §7.1)."""

from koordlet.metricsadvisor.framework import Collector, CollectorRunner
from koordlet.metricsadvisor.node import NodeResourceCollector, NodeUsage
from koordlet.metricsadvisor.pods import (
    ContainerCgroup,
    PodCgroup,
    PodResourceCollector,
    PodSource,
)
from koordlet.metricsadvisor.psi import NodePsiCollector, PodPsiCollector

__all__ = [
    "Collector",
    "CollectorRunner",
    "ContainerCgroup",
    "NodePsiCollector",
    "NodeResourceCollector",
    "NodeUsage",
    "PodCgroup",
    "PodPsiCollector",
    "PodResourceCollector",
    "PodSource",
]
