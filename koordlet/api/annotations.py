"""Parsers of the JSON annotations Koordinator puts on pods and nodes (docs/koordinator.md §3.3, §4.3,
§4.6, §5.5, §12).

Every parser takes the annotation's string value and returns a frozen value, or raises
:class:`AnnotationError` whose message names the annotation and the reason. No other exception escapes,
whatever the input (property-tested), so a hook can catch exactly one type, log it and leave the pod alone.
Resource amounts come back as integers in Koordinator's units (see ``koordlet.api.quantity``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TypeVar

from koordlet.api import device as _device
from koordlet.api._fields import FieldError, Overrides, apply, check_int, collect, show
from koordlet.api.cpuset import CPUListError, parse_cpu_list
from koordlet.api.keys import (
    ANNOTATION_BLKIO_QOS,
    ANNOTATION_CPU_BURST,
    ANNOTATION_CPU_QOS,
    ANNOTATION_DEVICE_ALLOCATED,
    ANNOTATION_EXTENDED_RESOURCE_SPEC,
    ANNOTATION_MEMORY_QOS,
    ANNOTATION_NETWORK_QOS,
    ANNOTATION_NODE_CPU_NORMALIZATION_RATIO,
    ANNOTATION_NODE_RESERVATION,
    ANNOTATION_NODE_SYSTEM_QOS_RESOURCE,
    ANNOTATION_OOM_SCORE_ADJ,
    ANNOTATION_OOM_SCORE_ADJ_SPEC,
    ANNOTATION_RESCTRL,
    ANNOTATION_RESOURCE_STATUS,
    canonical_resource_name,
)
from koordlet.api.nodeslo import (
    CPUQOS,
    NONE_MEMORY_QOS,
    BlkIOQOS,
    CPUBurstStrategy,
    MemoryQOS,
)
from koordlet.api.quantity import QuantityError, parse_quantity, parse_resource_quantity
from koordlet.api.safeload import SafeLoadError, load_json

# A pod's annotations together are at most 256 KiB (the API server's limit); none of ours nests deeply.
MAX_ANNOTATION_BYTES = 256 << 10
MAX_ANNOTATION_DEPTH = 16

DeviceAllocated = _device.DeviceAllocated
GPUAllocation = _device.GPUAllocation


class AnnotationError(ValueError):
    """An annotation value is invalid; the message names the annotation and the reason."""

    def __init__(self, annotation: str, reason: str) -> None:
        self.annotation = annotation
        self.reason = reason
        super().__init__(f"{annotation}: {reason}")


def _load_json(annotation: str, value: object) -> object:
    if not isinstance(value, str):
        raise AnnotationError(annotation, f"value must be a string, got {type(value).__name__}")
    try:
        return load_json(value, annotation, max_bytes=MAX_ANNOTATION_BYTES, max_depth=MAX_ANNOTATION_DEPTH)
    except SafeLoadError as exc:
        raise AnnotationError(annotation, str(exc).removeprefix(f"{annotation}: ")[:120]) from exc


def _object(annotation: str, data: object, where: str = "") -> Mapping[str, object]:
    if not isinstance(data, dict):
        prefix = f"{where}: " if where else ""
        raise AnnotationError(annotation, f"{prefix}expected a JSON object, got {show(data)}")
    return data


def _resource_list(annotation: str, data: object, where: str) -> Mapping[str, int]:
    """``{"kubernetes.io/batch-cpu": "1000", "memory": "2Gi"}`` → canonical names and integer amounts."""
    if data is None:
        return MappingProxyType({})
    amounts: dict[str, int] = {}
    for name, raw in _object(annotation, data, where).items():
        if isinstance(raw, int) and not isinstance(raw, bool):
            raw = str(raw)
        if not isinstance(raw, str):
            raise AnnotationError(annotation, f"{where}.{name}: expected a quantity string, got {show(raw)}")
        canonical = canonical_resource_name(name)
        try:
            amount = parse_resource_quantity(canonical, raw)
        except QuantityError as exc:
            raise AnnotationError(annotation, f"{where}.{name}: {exc}") from exc
        if amount < 0:
            raise AnnotationError(annotation, f"{where}.{name}: must not be negative, got {raw!r}")
        amounts[canonical] = amount
    return MappingProxyType(amounts)


def _cpu_list_field(annotation: str, data: Mapping[str, object], key: str) -> tuple[int, ...]:
    text = data.get(key) or ""
    if not isinstance(text, str):
        raise AnnotationError(annotation, f"{key}: expected a CPU list string, got {show(text)}")
    try:
        return parse_cpu_list(text)
    except CPUListError as exc:
        raise AnnotationError(annotation, f"{key}: {exc}") from exc


def _overrides(annotation: str, cls: type, data: object) -> Overrides:
    errors: list[str] = []
    overrides = collect(cls, data, "", errors)
    if errors:
        raise AnnotationError(annotation, "; ".join(errors))
    return overrides


# -------------------------------------------------------------------- extended-resource-spec (docs/koordinator.md §3.3)


@dataclass(frozen=True, slots=True)
class ContainerResources:
    requests: Mapping[str, int] = field(default_factory=dict)
    limits: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ExtendedResourceSpec:
    """``node.koordinator.sh/extended-resource-spec``: batch requests/limits per container name."""

    containers: Mapping[str, ContainerResources] = field(default_factory=dict)


def parse_extended_resource_spec(value: str) -> ExtendedResourceSpec:
    annotation = ANNOTATION_EXTENDED_RESOURCE_SPEC
    data = _object(annotation, _load_json(annotation, value))
    containers: dict[str, ContainerResources] = {}
    raw_containers = data.get("containers")
    for name, raw in _object(annotation, raw_containers or {}, "containers").items():
        where = f"containers.{name}"
        spec = _object(annotation, raw, where)
        containers[name] = ContainerResources(
            requests=_resource_list(annotation, spec.get("requests"), f"{where}.requests"),
            limits=_resource_list(annotation, spec.get("limits"), f"{where}.limits"),
        )
    return ExtendedResourceSpec(containers=MappingProxyType(containers))


# --------------------------------------------------------------------------- resource-status (docs/koordinator.md §3.3)


@dataclass(frozen=True, slots=True)
class NUMANodeResource:
    node: int
    resources: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ResourceStatus:
    """``scheduling.koordinator.sh/resource-status``: the scheduler's cpuset and NUMA allocation."""

    cpuset: tuple[int, ...] = ()
    numa_node_resources: tuple[NUMANodeResource, ...] = ()


def parse_resource_status(value: str) -> ResourceStatus:
    annotation = ANNOTATION_RESOURCE_STATUS
    data = _object(annotation, _load_json(annotation, value))
    cpuset = _cpu_list_field(annotation, data, "cpuset")
    raw_numa = data.get("numaNodeResources") or []
    if not isinstance(raw_numa, list):
        raise AnnotationError(annotation, f"numaNodeResources: expected a list, got {show(raw_numa)}")
    numa: list[NUMANodeResource] = []
    for index, raw in enumerate(raw_numa):
        where = f"numaNodeResources[{index}]"
        entry = _object(annotation, raw, where)
        node = entry.get("node", 0)
        if isinstance(node, bool) or not isinstance(node, int) or node < 0:
            raise AnnotationError(annotation, f"{where}.node: expected a NUMA node id >= 0, got {show(node)}")
        numa.append(NUMANodeResource(node=node, resources=_resource_list(annotation, entry.get("resources"), where)))
    return ResourceStatus(cpuset=cpuset, numa_node_resources=tuple(numa))


# -------------------------------------------------------------------------- device-allocated (docs/koordinator.md §3.3)


_T = TypeVar("_T")


def _device_allocated(parse: Callable[[str], _T], value: str) -> _T:
    _load_json(ANNOTATION_DEVICE_ALLOCATED, value)  # JSON errors (incl. deep nesting) as AnnotationError
    try:
        return parse(value)
    except _device.DeviceAnnotationError as exc:
        raise AnnotationError(
            ANNOTATION_DEVICE_ALLOCATED, str(exc).removeprefix(f"{ANNOTATION_DEVICE_ALLOCATED}: ")
        ) from exc


def parse_rdma_allocated(value: str) -> tuple[_device.RDMAAllocation, ...]:
    """``scheduling.koordinator.sh/device-allocated`` (RDMA entries); see ``koordlet.api.device``."""
    return _device_allocated(_device.parse_rdma_allocated, value)


def parse_device_allocated(value: str) -> DeviceAllocated:
    """``scheduling.koordinator.sh/device-allocated`` (GPU entries); see ``koordlet.api.device``."""
    return _device_allocated(_device.parse_device_allocated, value)


# ------------------------------------------------------------------ cpuQOS / memoryQOS (docs/koordinator.md §3.3, §4.6)


def parse_cpu_qos(value: str) -> CPUQOS:
    """``koordinator.sh/cpuQOS`` = ``{"enable": bool, "groupIdentity": -1..2}``; missing enable = false."""
    annotation = ANNOTATION_CPU_QOS
    data = _object(annotation, _load_json(annotation, value))
    return apply(CPUQOS(), _overrides(annotation, CPUQOS, data))


MEMORY_QOS_POLICY_DEFAULT = "default"
MEMORY_QOS_POLICY_NONE = "none"
MEMORY_QOS_POLICY_AUTO = "auto"


@dataclass(frozen=True, slots=True)
class PodMemoryQOS:
    """``koordinator.sh/memoryQOS``: a policy and explicit field overrides."""

    policy: str = MEMORY_QOS_POLICY_DEFAULT
    overrides: Overrides = field(default_factory=Overrides)

    def resolve(self, class_config: MemoryQOS, recommended: MemoryQOS) -> MemoryQOS:
        """The pod's memory QoS: ``none`` → none values; ``auto`` → ``recommended`` (enabled);
        ``default`` → the class config from NodeSLO; explicit fields override in every case but none."""
        if self.policy == MEMORY_QOS_POLICY_NONE:
            return NONE_MEMORY_QOS
        if self.policy == MEMORY_QOS_POLICY_AUTO:
            return apply(recommended, {"enable": True, **self.overrides})
        return apply(class_config, self.overrides)


def parse_memory_qos(value: str) -> PodMemoryQOS:
    annotation = ANNOTATION_MEMORY_QOS
    data = _object(annotation, _load_json(annotation, value))
    policy = data.get("policy") or MEMORY_QOS_POLICY_DEFAULT
    if policy not in (MEMORY_QOS_POLICY_DEFAULT, MEMORY_QOS_POLICY_NONE, MEMORY_QOS_POLICY_AUTO):
        raise AnnotationError(annotation, f"policy: expected default, none or auto, got {show(policy)}")
    return PodMemoryQOS(policy=str(policy), overrides=_overrides(annotation, MemoryQOS, data))


# ---------------------------------------------------------------------------------- cpuBurst (docs/koordinator.md §4.3)


@dataclass(frozen=True, slots=True)
class PodCPUBurst:
    """``koordinator.sh/cpuBurst``: CPUBurstConfig fields that override the node's cpuBurstStrategy."""

    overrides: Overrides = field(default_factory=Overrides)

    def resolve(self, node_strategy: CPUBurstStrategy) -> CPUBurstStrategy:
        return apply(node_strategy, self.overrides)


def parse_cpu_burst(value: str) -> PodCPUBurst:
    annotation = ANNOTATION_CPU_BURST
    data = dict(_object(annotation, _load_json(annotation, value)))
    data.pop("sharePoolThresholdPercent", None)  # a node-level setting; a pod cannot change it
    return PodCPUBurst(overrides=_overrides(annotation, CPUBurstStrategy, data))


# ----------------------------------------------------------------------------------- resctrl (docs/koordinator.md §3.3)


@dataclass(frozen=True, slots=True)
class CacheRange:
    """An LLC way range in percent of the cache, [start, end), for one cache id or all (cache_id None)."""

    start_percent: int
    end_percent: int
    cache_id: int | None = None


@dataclass(frozen=True, slots=True)
class MemoryBandwidth:
    percent: int
    cache_id: int | None = None


@dataclass(frozen=True, slots=True)
class PodResctrl:
    """``node.koordinator.sh/resctrl``: pod-level LLC and memory-bandwidth schemata (None = not set)."""

    llc: CacheRange | None = None
    llc_per_cache: tuple[CacheRange, ...] = ()
    mb: MemoryBandwidth | None = None
    mb_per_cache: tuple[MemoryBandwidth, ...] = ()


_PERCENT = check_int(0, 100)


def _percent(annotation: str, raw: object, where: str) -> int:
    try:
        return _PERCENT(raw)  # type: ignore[return-value]
    except FieldError as exc:
        raise AnnotationError(annotation, f"{where}: {exc}") from exc


def _cache_id(annotation: str, entry: Mapping[str, object], where: str) -> int:
    cache_id = entry.get("cacheID")
    if isinstance(cache_id, bool) or not isinstance(cache_id, int) or cache_id < 0:
        raise AnnotationError(annotation, f"{where}.cacheID: expected an integer >= 0, got {show(cache_id)}")
    return cache_id


def _cache_range(annotation: str, raw: object, where: str, cache_id: int | None) -> CacheRange:
    if not isinstance(raw, list) or len(raw) != 2:
        raise AnnotationError(annotation, f"{where}: expected [startPercent, endPercent], got {show(raw)}")
    start = _percent(annotation, raw[0], f"{where}[0]")
    end = _percent(annotation, raw[1], f"{where}[1]")
    if start >= end:
        raise AnnotationError(annotation, f"{where}: start {start} must be below end {end}")
    return CacheRange(start_percent=start, end_percent=end, cache_id=cache_id)


def _list(annotation: str, raw: object, where: str) -> list[object]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise AnnotationError(annotation, f"{where}: expected a list, got {show(raw)}")
    return raw


def parse_resctrl(value: str) -> PodResctrl:
    annotation = ANNOTATION_RESCTRL
    data = _object(annotation, _load_json(annotation, value))
    llc = _object(annotation, data.get("llc") or {}, "llc")
    mb = _object(annotation, data.get("mb") or {}, "mb")
    llc_schemata = _object(annotation, llc.get("schemata") or {}, "llc.schemata")
    mb_schemata = _object(annotation, mb.get("schemata") or {}, "mb.schemata")
    llc_all = None
    if llc_schemata.get("range") is not None:
        llc_all = _cache_range(annotation, llc_schemata["range"], "llc.schemata.range", None)
    llc_per_cache = []
    for index, raw in enumerate(_list(annotation, llc.get("schemataPerCache"), "llc.schemataPerCache")):
        where = f"llc.schemataPerCache[{index}]"
        entry = _object(annotation, raw, where)
        cache_id = _cache_id(annotation, entry, where)
        llc_per_cache.append(_cache_range(annotation, entry.get("range"), f"{where}.range", cache_id))
    mb_all = None
    if mb_schemata.get("percent") is not None:
        mb_all = MemoryBandwidth(percent=_percent(annotation, mb_schemata["percent"], "mb.schemata.percent"))
    mb_per_cache = []
    for index, raw in enumerate(_list(annotation, mb.get("schemataPerCache"), "mb.schemataPerCache")):
        where = f"mb.schemataPerCache[{index}]"
        entry = _object(annotation, raw, where)
        cache_id = _cache_id(annotation, entry, where)
        percent = _percent(annotation, entry.get("percent"), f"{where}.percent")
        mb_per_cache.append(MemoryBandwidth(percent=percent, cache_id=cache_id))
    return PodResctrl(llc=llc_all, llc_per_cache=tuple(llc_per_cache), mb=mb_all, mb_per_cache=tuple(mb_per_cache))


# -------------------------------------------------------------------------------- networkQOS (docs/koordinator.md §3.3)


@dataclass(frozen=True, slots=True)
class PodNetworkQOS:
    """``koordinator.sh/networkQOS``: ingress/egress limits in bits per second (None = not limited)."""

    ingress_limit_bps: int | None = None
    egress_limit_bps: int | None = None


def parse_network_qos(value: str) -> PodNetworkQOS:
    annotation = ANNOTATION_NETWORK_QOS
    data = _object(annotation, _load_json(annotation, value))
    limits: dict[str, int | None] = {}
    for key in ("ingressLimit", "egressLimit"):
        raw = data.get(key)
        if raw is None or raw == "":
            limits[key] = None
            continue
        if not isinstance(raw, str):
            raise AnnotationError(annotation, f'{key}: expected a quantity string like "10M", got {show(raw)}')
        try:
            rate = parse_quantity(raw)
        except QuantityError as exc:
            raise AnnotationError(annotation, f"{key}: {exc}") from exc
        if rate < 0:
            raise AnnotationError(annotation, f"{key}: must not be negative, got {raw!r}")
        limits[key] = rate
    return PodNetworkQOS(ingress_limit_bps=limits["ingressLimit"], egress_limit_bps=limits["egressLimit"])


# ------------------------------------------------------------------------------------- node annotations


def parse_cpu_normalization_ratio(value: str) -> float | None:
    """``node.koordinator.sh/cpu-normalization-ratio``: a ratio ≥ 1 rounded to 2 decimals; −1 → None (off)."""
    annotation = ANNOTATION_NODE_CPU_NORMALIZATION_RATIO
    try:
        ratio = float(value)
    except (TypeError, ValueError) as exc:
        raise AnnotationError(annotation, f"not a number: {show(value)}") from exc
    if ratio == -1:
        return None
    if not math.isfinite(ratio) or ratio < 1:
        raise AnnotationError(annotation, f"ratio must be >= 1 (or -1 to disable), got {show(value)}")
    return round(ratio, 2)


RESERVATION_APPLY_DEFAULT = "Default"
RESERVATION_APPLY_RESERVED_CPUS_ONLY = "ReservedCPUsOnly"


@dataclass(frozen=True, slots=True)
class NodeReservation:
    """``node.koordinator.sh/reservation``: resources and CPUs kept away from pods."""

    resources: Mapping[str, int] = field(default_factory=dict)
    reserved_cpus: tuple[int, ...] = ()
    apply_policy: str = RESERVATION_APPLY_DEFAULT


def parse_node_reservation(value: str) -> NodeReservation:
    annotation = ANNOTATION_NODE_RESERVATION
    data = _object(annotation, _load_json(annotation, value))
    reserved_cpus = _cpu_list_field(annotation, data, "reservedCPUs")
    policy = data.get("applyPolicy") or RESERVATION_APPLY_DEFAULT
    if policy not in (RESERVATION_APPLY_DEFAULT, RESERVATION_APPLY_RESERVED_CPUS_ONLY):
        raise AnnotationError(annotation, f"applyPolicy: expected Default or ReservedCPUsOnly, got {show(policy)}")
    return NodeReservation(
        resources=_resource_list(annotation, data.get("resources"), "resources"),
        reserved_cpus=reserved_cpus,
        apply_policy=str(policy),
    )


@dataclass(frozen=True, slots=True)
class SystemQOSResource:
    """``node.koordinator.sh/system-qos-resource``: CPUs for SYSTEM-QoS pods, exclusive or shared.

    Exclusive unless ``cpusetExclusive`` is false (Koordinator ``SystemQOSResource.IsCPUSetExclusive``)."""

    cpuset: tuple[int, ...] = ()
    cpuset_exclusive: bool = True


def parse_system_qos_resource(value: str) -> SystemQOSResource:
    annotation = ANNOTATION_NODE_SYSTEM_QOS_RESOURCE
    data = _object(annotation, _load_json(annotation, value))
    cpuset = _cpu_list_field(annotation, data, "cpuset")
    exclusive = data.get("cpusetExclusive")
    if exclusive is None:  # absent or null: exclusive
        exclusive = True
    if not isinstance(exclusive, bool):
        raise AnnotationError(annotation, f"cpusetExclusive: expected true or false, got {show(exclusive)}")
    return SystemQOSResource(cpuset=cpuset, cpuset_exclusive=exclusive)


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _int64_text(annotation: str, text: str) -> int:
    """A base-10 int64 as Go's strconv.ParseInt reads it: optional sign, ASCII digits, nothing else."""
    body = text[1:] if text[:1] in "+-" else text
    if not body or not body.isascii() or not body.isdigit() or len(body) > 19:
        raise AnnotationError(annotation, f"expected an integer, got {show(text)}")
    value = int(text)
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise AnnotationError(annotation, f"{text} is out of the int64 range")
    return value


def parse_oom_score_adj(annotations: Mapping[str, str], container: str) -> int | None:
    """The oom_score_adj a container's processes are to get (docs/koordinator.md §3.3 OOMScoreAdj).

    The container's entry of ``koordinator.sh/oom-score-adj-spec`` (a JSON object of container name → integer),
    else the pod-wide ``koordinator.sh/oom-score-adj`` (an integer string); None when neither names a value. A
    spec that cannot be read stops here (no fall back), as in Koordinator. The range (−1000..1000) is
    hooks/validate.py's."""
    spec = annotations.get(ANNOTATION_OOM_SCORE_ADJ_SPEC)
    if spec:
        data = _object(ANNOTATION_OOM_SCORE_ADJ_SPEC, _load_json(ANNOTATION_OOM_SCORE_ADJ_SPEC, spec))
        for name, raw in data.items():
            if isinstance(raw, bool) or not isinstance(raw, int) or not _INT64_MIN <= raw <= _INT64_MAX:
                raise AnnotationError(ANNOTATION_OOM_SCORE_ADJ_SPEC, f"{show(name)}: expected an integer, got "
                                                                     f"{show(raw)}")
        if container in data:
            return int(data[container])  # type: ignore[arg-type]
    pod_wide = annotations.get(ANNOTATION_OOM_SCORE_ADJ)
    if pod_wide:
        return _int64_text(ANNOTATION_OOM_SCORE_ADJ, pod_wide)
    return None


def parse_blkio_qos(value: str) -> BlkIOQOS:
    """``koordinator.sh/blkioQOS`` (docs/koordinator.md §4.8) for the pod's own cgroup.

    ``{"blocks": [{"name", "type", "ioCfg": {...}}]}``. (An empty value means no blocks; the blkio strategy
    handles that before parsing.)"""
    data = _object(ANNOTATION_BLKIO_QOS, _load_json(ANNOTATION_BLKIO_QOS, value))
    return apply(BlkIOQOS(), _overrides(ANNOTATION_BLKIO_QOS, BlkIOQOS, data))
