"""Memory QoS (``CgroupReconcile``): memory.min/low/high per pod and container, kubeQoS sums, and the Anolis
watermark/priority files where the kernel has them (koordinator.md §4.6).

Per pod: the class config from the merged NodeSLO, then the pod annotation ``koordinator.sh/memoryQOS``.
  memRequest = Σ container memory requests (BE: batch-memory)
  pod        memory.min = req × minLimitPercent/100, memory.low = req × lowLimitPercent/100 (≥ min)
  container  the same from its own request; memory.high = "max" when throttlingPercent = 0, else
             floor((req + (limit − req) × pct/100) / page) × page (≥ min), limit = its memory limit
             (BE: batch-memory) or the node's allocatable memory
  kubeQoS    min/low = Σ of its pods; the kubepods dir (Guaranteed) the sum over all three;
             priority/use_priority_oom/oom.group from the class of the QoS dir
min/low/high go through the executor's leveled update (parents raised first, exact values children
first). Files the kernel lacks are dropped once, at the first tick, with one log line; a kernel without
any of them (plain cgroup v1) makes the strategy a no-op.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

from koordlet.api.annotations import AnnotationError, parse_memory_qos
from koordlet.api.keys import ANNOTATION_MEMORY_QOS, RESOURCE_BATCH_MEMORY, RESOURCE_MEMORY
from koordlet.api.nodeslo import MemoryQOS, NodeSLOSpec, recommended_memory_qos
from koordlet.api.pod import PodMeta
from koordlet.api.qos import KubeQoS, QoSClass
from koordlet.executor import ExecutorError, ResourceExecutor, UnsupportedResourceError
from koordlet.qosmanager.framework import GATE_CGROUP_RECONCILE, CgroupWrite, WriteStep, apply_steps
from koordlet.qosmanager.snapshot import (
    Snapshot,
    SnapshotBuilder,
    container_cgroup_dir,
    container_resource,
    is_be,
    pod_cgroup_dir,
    pod_kube_qos,
    pod_memory_request_bytes,
)
from koordlet.system.kubepods import KubeCgroupLayout

logger = logging.getLogger(__name__)

UNLIMITED = -1
HIERARCHICAL_RESOURCES = ("memory.min", "memory.low", "memory.high")
ANOLIS_RESOURCES = (
    "memory.wmark_ratio",
    "memory.wmark_scale_factor",
    "memory.wmark_min_adj",
    "memory.priority",
    "memory.use_priority_oom",
    "memory.oom.group",
)
ALL_RESOURCES = HIERARCHICAL_RESOURCES + ANOLIS_RESOURCES
_QOS_DIR_CLASS = {KubeQoS.GUARANTEED: QoSClass.LSR, KubeQoS.BURSTABLE: QoSClass.LS, KubeQoS.BESTEFFORT: QoSClass.BE}


@dataclass(frozen=True, slots=True)
class MemoryValues:
    """What one cgroup dir gets. ``high`` None: not written at this level."""

    cgroup_dir: str
    min_bytes: int
    low_bytes: int
    high_bytes: int | None = None
    qos: MemoryQOS | None = None  # source of the Anolis values; None: not written


def pod_memory_qos(pod: PodMeta, spec: NodeSLOSpec) -> MemoryQOS:
    """Class config (LSE uses LSR's), then the pod annotation (§4.6)."""
    qos = pod.qos_class
    class_config = spec.resource_qos_strategy.for_class(qos).memory_qos
    raw = pod.annotations.get(ANNOTATION_MEMORY_QOS)
    if not raw:
        return class_config
    try:
        return parse_memory_qos(raw).resolve(class_config, recommended_memory_qos(qos))
    except AnnotationError as exc:
        logger.debug("ignoring memoryQOS annotation of %s: %s", pod.key, exc)
        return class_config


def min_low(request_bytes: int, config: MemoryQOS) -> tuple[int, int]:
    min_bytes = request_bytes * config.min_limit_percent // 100
    low_bytes = max(request_bytes * config.low_limit_percent // 100, min_bytes)
    return min_bytes, low_bytes


def memory_high(request_bytes: int, limit_bytes: int, min_bytes: int, config: MemoryQOS, page_size: int) -> int:
    """-1 ("max") when throttlingPercent is 0; else the page-aligned throttling point, at least min."""
    if config.throttling_percent == 0:
        return UNLIMITED
    high = request_bytes + (limit_bytes - request_bytes) * config.throttling_percent // 100
    high = high // page_size * page_size
    return max(high, min_bytes)


def decide_values(snapshot: Snapshot, layout: KubeCgroupLayout, page_size: int) -> tuple[MemoryValues, ...]:
    """Values for the kubeQoS dirs, then every pod and its containers."""
    spec = snapshot.node_slo
    allocatable = int(snapshot.node.allocatable.get(RESOURCE_MEMORY, 0))
    sums: dict[KubeQoS, tuple[int, int]] = dict.fromkeys(KubeQoS, (0, 0))
    pod_values: list[MemoryValues] = []
    for pod in snapshot.pods:
        pod_dir = pod_cgroup_dir(layout, pod)
        if pod_dir is None:
            continue
        config = pod_memory_qos(pod, spec)
        pod_min, pod_low = min_low(pod_memory_request_bytes(pod), config)
        kube_qos = pod_kube_qos(pod)
        qos_min, qos_low = sums[kube_qos]
        sums[kube_qos] = (qos_min + pod_min, qos_low + pod_low)
        pod_values.append(MemoryValues(pod_dir, pod_min, pod_low, None, config))
        resource = RESOURCE_BATCH_MEMORY if is_be(pod) else RESOURCE_MEMORY
        for container in pod.containers:
            container_dir = container_cgroup_dir(layout, pod_dir, container)
            if container_dir is None or container.is_init:
                continue
            request = container_resource(container, resource)
            limit = container_resource(container, resource, limits=True) or allocatable
            c_min, c_low = min_low(request, config)
            high = memory_high(request, limit, c_min, config, page_size)
            pod_values.append(MemoryValues(container_dir, c_min, c_low, high, config))
    qos_values = []
    for kube_qos in (KubeQoS.BURSTABLE, KubeQoS.BESTEFFORT):
        qos_min, qos_low = sums[kube_qos]
        qos_config = spec.resource_qos_strategy.for_class(_QOS_DIR_CLASS[kube_qos]).memory_qos
        qos_values.append(MemoryValues(layout.qos_dir(kube_qos), qos_min, qos_low, None, qos_config))
    total_min = sum(v[0] for v in sums.values())
    total_low = sum(v[1] for v in sums.values())
    guaranteed = spec.resource_qos_strategy.for_class(QoSClass.LSR).memory_qos
    qos_values.insert(0, MemoryValues(layout.qos_dir(KubeQoS.GUARANTEED), total_min, total_low, None, guaranteed))
    return tuple(qos_values + pod_values)


def _anolis_writes(values: MemoryValues) -> list[CgroupWrite]:
    config = values.qos
    if config is None:
        return []
    d = values.cgroup_dir
    return [
        CgroupWrite("memory.wmark_ratio", d, config.wmark_ratio),
        CgroupWrite("memory.wmark_scale_factor", d, config.wmark_scale_permill),
        CgroupWrite("memory.wmark_min_adj", d, config.wmark_min_adj),
        CgroupWrite("memory.priority", d, config.priority),
        CgroupWrite("memory.use_priority_oom", d, config.priority_enable),
        CgroupWrite("memory.oom.group", d, config.oom_kill_group),
    ]


def decide(
    snapshot: Snapshot, layout: KubeCgroupLayout, page_size: int, supported: frozenset[str] = frozenset(ALL_RESOURCES)
) -> tuple[WriteStep, ...]:
    """The writes of one tick, restricted to the ``supported`` files."""
    values = decide_values(snapshot, layout, page_size)
    leveled: list[CgroupWrite] = []
    plain: list[CgroupWrite] = []
    for value in values:
        leveled.append(CgroupWrite("memory.min", value.cgroup_dir, value.min_bytes))
        leveled.append(CgroupWrite("memory.low", value.cgroup_dir, value.low_bytes))
        if value.high_bytes is not None:
            leveled.append(CgroupWrite("memory.high", value.cgroup_dir, value.high_bytes))
        plain.extend(_anolis_writes(value))
    steps = []
    leveled = [w for w in leveled if w.resource in supported]
    plain = [w for w in plain if w.resource in supported]
    if leveled:
        steps.append(WriteStep(tuple(leveled), leveled=True))
    if plain:
        steps.append(WriteStep(tuple(plain)))
    return tuple(steps)


class MemoryQoS:
    name = "memoryqos"
    feature_gate = GATE_CGROUP_RECONCILE

    def __init__(
        self,
        builder: SnapshotBuilder,
        executor: ResourceExecutor,
        layout: KubeCgroupLayout,
        interval_s: float = 1.0,
        page_size: int | None = None,
        probe: Callable[[str], bool] | None = None,
    ) -> None:
        """``probe(resource) -> bool``: whether the kernel has that file (default: read it on the kubepods dir
        through the executor)."""
        self.interval_s = interval_s
        self._builder = builder
        self._executor = executor
        self._layout = layout
        self._page_size = page_size or os.sysconf("SC_PAGE_SIZE")
        self._probe = probe or self._kernel_has
        self._supported: frozenset[str] | None = None
        self.last_steps: tuple[WriteStep, ...] = ()

    def _kernel_has(self, resource: str) -> bool:
        try:
            self._executor.read(resource, self._layout.kubepods_dir())
        except UnsupportedResourceError:
            return False
        except ExecutorError as exc:
            logger.debug("cannot probe %s: %s", resource, exc)
            return False
        return True

    @property
    def supported(self) -> frozenset[str]:
        if self._supported is None:
            self._supported = frozenset(r for r in ALL_RESOURCES if self._probe(r))
            missing = sorted(set(ALL_RESOURCES) - self._supported)
            if not self._supported:
                logger.info("memory QoS is a no-op: this kernel has none of %s", ", ".join(ALL_RESOURCES))
            elif missing:
                logger.info("memory QoS: this kernel lacks %s; those files are skipped", ", ".join(missing))
        return self._supported

    def active(self, spec: NodeSLOSpec) -> bool:
        return True

    def deactivate(self) -> None:
        """Nothing to undo: the values follow the NodeSLO, whose disabled classes get the none values."""

    def run(self, now: float) -> None:
        supported = self.supported
        if not supported:
            return
        snapshot = self._builder.build(now=now)
        if snapshot is None:
            return
        self.last_steps = decide(snapshot, self._layout, self._page_size, supported)
        apply_steps(self._executor, self.last_steps, self.name)
