"""Memory QoS (``CgroupReconcile``): memory.min/low/high per pod and container, kubeQoS sums, and the Anolis
watermark/priority files where the kernel has them (docs/koordinator.md §4.6).

Per pod: the class config from the merged NodeSLO, then the pod annotation ``koordinator.sh/memoryQOS``.
  memRequest = Σ container memory requests, or the pod-level request where the pod sets one (BE: batch-memory);
             the amounts are what the containers really have after an in-place resize (koordlet/api/pod.py)
  pod        memory.min = req × minLimitPercent/100, memory.low = req × lowLimitPercent/100 (≥ min)
  container  the same from its own request; memory.high = "max" when throttlingPercent = 0, else
             floor((req + (limit − req) × pct/100) / page) × page (≥ min), limit = its memory limit
             (BE: batch-memory), else its pod's pod-level limit (kubelet gives it that), else the node's
             allocatable memory
  kubeQoS    min/low = Σ of its pods; the kubepods dir (Guaranteed) the sum over all three;
             priority/use_priority_oom/oom.group from the class of the QoS dir
A pod whose source does not know its requests (``requests_known`` False: the CRI pod source of local mode)
is left as it is, pod and containers, and so are min/low of its QoS dir and of the kubepods dir: a sum
without its request would lower them. (The CRI source says so once at start-up.)
kubelet's own memory QoS (KEP-2570; ``snapshot.kubelet_memory_qos``, from its KubeletConfiguration) writes some of
the same files: each file it writes, at that level for that kube QoS class (koordlet/api/kubeletmemqos.py), is left
to kubelet, and kubelet's value (the request) counts where koordlet sums pods into their QoS dir and the QoS dirs into
kubepods. The change of what kubelet writes is logged (the strategy's memo).
min/low/high go through the executor's leveled update (parents raised first, exact values children
first). Files the kernel lacks are dropped once, at the first tick, with one log line; a kernel without
any of them (plain cgroup v1) makes the strategy a no-op.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from koordlet.api.annotations import AnnotationError, parse_memory_qos
from koordlet.api.keys import ANNOTATION_MEMORY_QOS, RESOURCE_BATCH_MEMORY, RESOURCE_MEMORY
from koordlet.api.kubeletmemqos import (
    MEMORY_HIGH,
    MEMORY_LOW,
    MEMORY_MIN,
    KubeletMemoryQoS,
    Level,
    kubelet_value,
    kubelet_writes,
)
from koordlet.api.nodeslo import MemoryQOS, NodeSLOSpec, recommended_memory_qos
from koordlet.api.pod import PodMeta
from koordlet.api.qos import KubeQoS, QoSClass
from koordlet.api.units import UNLIMITED
from koordlet.plan import CgroupWrite, Plan, WriteStep
from koordlet.qosmanager.framework import GATE_CGROUP_RECONCILE, QoSManagerConfig, Strategy
from koordlet.qosmanager.snapshot import (
    Needs,
    Snapshot,
    container_cgroup_dir,
    container_limit_of,
    container_resource,
    is_be,
    pod_cgroup_dir,
    pod_kube_qos,
    pod_memory_request_bytes,
)
from koordlet.system.kubepods import KubeCgroupLayout

logger = logging.getLogger(__name__)

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
    """What one cgroup dir gets. None: not written (``high`` at this level; min and low where a request under the dir
    is unknown, or where kubelet's memory QoS owns the file)."""

    cgroup_dir: str
    min_bytes: int | None
    low_bytes: int | None
    high_bytes: int | None = None
    qos: MemoryQOS | None = None  # source of the Anolis values; None: not written


def pod_memory_qos(pod: PodMeta, spec: NodeSLOSpec) -> MemoryQOS:
    """Class config (LSE uses LSR's), then the pod annotation (docs/koordinator.md §4.6)."""
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


def _owned(file: str, level: Level, kube_qos: KubeQoS, koordlet: int | None, request: int,
           kubelet: KubeletMemoryQoS) -> tuple[int | None, int]:
    """(what koordlet writes, None where kubelet owns the file; the value the dir holds, for its parent's sum)."""
    if kubelet_writes(file, level, kube_qos, kubelet):
        return None, kubelet_value(file, level, kube_qos, request, kubelet)
    return koordlet, koordlet or 0


def decide_values(snapshot: Snapshot, layout: KubeCgroupLayout, page_size: int) -> tuple[MemoryValues, ...]:
    """Values for the kubeQoS dirs, then every pod and its containers; a file kubelet's own memory QoS writes
    (``snapshot.kubelet_memory_qos``, koordlet/api/kubeletmemqos.py) is left to kubelet, and its value counts in the
    parent's sum."""
    spec = snapshot.node_slo
    kubelet = snapshot.kubelet_memory_qos
    allocatable = int(snapshot.node.allocatable.get(RESOURCE_MEMORY, 0))
    sums: dict[KubeQoS, tuple[int, int]] = dict.fromkeys(KubeQoS, (0, 0))
    requests: dict[KubeQoS, int] = dict.fromkeys(KubeQoS, 0)
    unknown: set[KubeQoS] = set()  # QoS dirs holding a pod whose requests are not known
    pod_values: list[MemoryValues] = []
    for pod in snapshot.pods:
        if not pod.requests_known:
            unknown.add(pod_kube_qos(pod))
            continue
        pod_dir = pod_cgroup_dir(layout, pod)
        if pod_dir is None:
            continue
        config = pod_memory_qos(pod, spec)
        kube_qos = pod_kube_qos(pod)
        request = pod_memory_request_bytes(pod)
        koord_min, koord_low = min_low(request, config)
        pod_min, held_min = _owned(MEMORY_MIN, Level.POD, kube_qos, koord_min, request, kubelet)
        pod_low, held_low = _owned(MEMORY_LOW, Level.POD, kube_qos, koord_low, request, kubelet)
        qos_min, qos_low = sums[kube_qos]
        sums[kube_qos] = (qos_min + held_min, qos_low + held_low)
        requests[kube_qos] += request
        pod_values.append(MemoryValues(pod_dir, pod_min, pod_low, None, config))
        resource = RESOURCE_BATCH_MEMORY if is_be(pod) else RESOURCE_MEMORY
        for container in pod.containers:
            container_dir = container_cgroup_dir(layout, pod_dir, container)
            if container_dir is None or container.is_init:
                continue
            request = container_resource(container, resource)
            limit = container_limit_of(pod, container, resource) or allocatable
            c_min, c_low = min_low(request, config)
            high = memory_high(request, limit, c_min, config, page_size)
            pod_values.append(MemoryValues(
                container_dir, _owned(MEMORY_MIN, Level.CONTAINER, kube_qos, c_min, request, kubelet)[0],
                _owned(MEMORY_LOW, Level.CONTAINER, kube_qos, c_low, request, kubelet)[0],
                _owned(MEMORY_HIGH, Level.CONTAINER, kube_qos, high, request, kubelet)[0], config))
    qos_values = []
    for kube_qos in (KubeQoS.BURSTABLE, KubeQoS.BESTEFFORT):
        qos_min, qos_low = sums[kube_qos]
        qos_config = spec.resource_qos_strategy.for_class(_QOS_DIR_CLASS[kube_qos]).memory_qos
        if kube_qos in unknown:
            qos_values.append(MemoryValues(layout.qos_dir(kube_qos), None, None, None, qos_config))
            continue
        written_min, held_min = _owned(MEMORY_MIN, Level.QOS, kube_qos, qos_min, requests[kube_qos], kubelet)
        written_low, held_low = _owned(MEMORY_LOW, Level.QOS, kube_qos, qos_low, requests[kube_qos], kubelet)
        sums[kube_qos] = (held_min, held_low)  # what the QoS dir holds, for the kubepods dir above it
        qos_values.append(MemoryValues(layout.qos_dir(kube_qos), written_min, written_low, None, qos_config))
    total_min = sum(v[0] for v in sums.values()) if not unknown else None
    total_low = sum(v[1] for v in sums.values()) if not unknown else None
    guaranteed = spec.resource_qos_strategy.for_class(QoSClass.LSR).memory_qos
    both = requests[KubeQoS.GUARANTEED] + requests[KubeQoS.BURSTABLE]  # kubelet's kubepods memory.min
    kubepods_min = _owned(MEMORY_MIN, Level.QOS, KubeQoS.GUARANTEED, total_min, both, kubelet)[0]
    kubepods_low = _owned(MEMORY_LOW, Level.QOS, KubeQoS.GUARANTEED, total_low, both, kubelet)[0]
    qos_values.insert(0, MemoryValues(layout.qos_dir(KubeQoS.GUARANTEED), kubepods_min, kubepods_low, None,
                                      guaranteed))
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


def decide_steps(
    snapshot: Snapshot, layout: KubeCgroupLayout, page_size: int, supported: frozenset[str] = frozenset(ALL_RESOURCES)
) -> tuple[WriteStep, ...]:
    """The writes of one tick, restricted to the ``supported`` files."""
    values = decide_values(snapshot, layout, page_size)
    leveled: list[CgroupWrite] = []
    plain: list[CgroupWrite] = []
    for value in values:
        if value.min_bytes is not None:
            leveled.append(CgroupWrite("memory.min", value.cgroup_dir, value.min_bytes))
        if value.low_bytes is not None:
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


@dataclass(frozen=True, slots=True)
class MemoryQoSConfig:
    """Memory QoS reads the per-class configs from the snapshot's NodeSLO and the pod annotations, so it is
    always on; disabled classes get the none values."""

    enabled: bool = True

    @classmethod
    def from_node_slo(cls, spec: NodeSLOSpec, flags: QoSManagerConfig | None = None) -> MemoryQoSConfig:
        return cls()

    @property
    def needs(self) -> Needs:
        return _NEEDS


_NEEDS = Needs(kernel_files=ALL_RESOURCES, pod_usage=None, container_usage=None, kubelet_memory_qos=True)


def _log_missing(supported: frozenset[str]) -> None:
    missing = [r for r in ALL_RESOURCES if r not in supported]
    if not supported:
        logger.info("memory QoS is a no-op: this kernel has none of %s", ", ".join(ALL_RESOURCES))
    elif missing:
        logger.info("memory QoS: this kernel lacks %s; those files are skipped", ", ".join(missing))


def decide(snapshot: Snapshot, config: MemoryQoSConfig) -> Plan:
    """min/low/high (and the Anolis files) of every QoS dir, pod and container, limited to the files this
    kernel has (``snapshot.kernel_files``); what the kernel lacks is logged at the first tick."""
    supported = snapshot.kernel_files
    if snapshot.memo is None:
        _log_missing(supported)
    kubelet = snapshot.kubelet_memory_qos
    if snapshot.memo != kubelet and (supported or snapshot.memo is not None):
        logger.info("memory QoS: %s; the files it writes are kubelet's (docs/colocation.md)", kubelet.describe())
    if not supported or not config.enabled:
        return Plan(memo=kubelet)
    return Plan(decide_steps(snapshot, snapshot.layout, snapshot.page_size, supported), memo=kubelet,
                reason="CgroupReconcile",
                why="memory QoS of the pod's class (NodeSLO resourceQOSStrategy memoryQOS, pod annotation "
                    "koordinator.sh/memoryQOS): min/low = request x min/lowLimitPercent, high = request + "
                    "(limit - request) x throttlingPercent")


STRATEGY = Strategy("memoryqos", GATE_CGROUP_RECONCILE, MemoryQoSConfig, decide)
