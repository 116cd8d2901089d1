"""NodeSLO ``spec`` (slo.koordinator.sh/v1alpha1): typed values, defaults, and the merge koordlet applies.

Reference: docs/koordinator.md §5.2 (fields and defaults), docs/koordinator.md §4.2–4.7 and §3.3 (per-feature defaults).
:func:`parse_node_slo_spec` reads the CRD's camelCase ``spec`` dict and merges it field by field over
:func:`default_node_slo_spec`'s values, then gives every QoS class whose cpu/memory/resctrl/network QoS
is disabled the "none" values of that QoS (docs/koordinator.md §5.2 last bullet): a user who sets
``enable: true`` gets the recommended values, one who disables a class gets no tuning, whatever else the
spec says.

Invalid input rejects the **whole** spec: :class:`NodeSLOError` lists every bad field with its path
(``resourceQOSStrategy.beClass.memoryQOS.wmarkMinAdj: 80 is above the maximum 50``). The caller keeps the
last good spec. Merging the valid rest was rejected because a half-applied spec can switch a feature on
with a threshold the operator did not choose (``enable: true`` with a typo in the threshold would run
suppression at the default 65%). Unknown keys are ignored so specs from newer Koordinator releases load.

``blkioQOS`` (per class and for ``cgroupRoot``) is kept as given: the blkio strategy reads ``enable`` itself
(a disabled class removes what koordlet wrote, Koordinator's rule), so it is not replaced by "none" values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from koordlet.api._fields import (
    INT32,
    PERCENT,
    Check,
    FieldError,
    apply,
    check_bool,
    check_enum,
    check_int,
    check_str,
    collect,
    meta,
    nested,
    show,
)
from koordlet.api.qos import QoSClass
from koordlet.api.quantity import QuantityError, parse_quantity
from wire.kernel_ranges import BVT_WARP_NS_MAX, BVT_WARP_NS_MIN, CPU_IDLE_MAX, CPU_IDLE_MIN


class NodeSLOError(ValueError):
    """A NodeSLO spec was rejected; ``errors`` holds one message per invalid field."""

    def __init__(self, errors: list[str] | tuple[str, ...]) -> None:
        self.errors = tuple(errors)
        super().__init__("invalid NodeSLO spec: " + "; ".join(self.errors))


# ----------------------------------------------------------------------- threshold (docs/koordinator.md §5.2, §4.2-4.5)

CPU_SUPPRESS_POLICY_CPUSET = "cpuset"
CPU_SUPPRESS_POLICY_CFS_QUOTA = "cfsQuota"
CPU_EVICT_POLICY_REAL_LIMIT = "evictByRealLimit"
CPU_EVICT_POLICY_ALLOCATABLE = "evictByAllocatable"


@dataclass(frozen=True, slots=True)
class ResourceThresholdStrategy:
    """``resourceUsedThresholdWithBE``. None = unset (the consuming strategy applies its own rule)."""

    enable: bool = field(default=False, metadata=meta("enable", check_bool))
    cpu_suppress_threshold_percent: int = field(default=65, metadata=meta("cpuSuppressThresholdPercent", PERCENT))
    cpu_suppress_min_percent: int | None = field(default=None, metadata=meta("cpuSuppressMinPercent", PERCENT))
    cpu_suppress_policy: str = field(
        default=CPU_SUPPRESS_POLICY_CPUSET,
        metadata=meta("cpuSuppressPolicy", check_enum(CPU_SUPPRESS_POLICY_CPUSET, CPU_SUPPRESS_POLICY_CFS_QUOTA)),
    )
    memory_evict_threshold_percent: int = field(default=70, metadata=meta("memoryEvictThresholdPercent", PERCENT))
    memory_evict_lower_percent: int | None = field(default=None, metadata=meta("memoryEvictLowerPercent", PERCENT))
    memory_allocatable_evict_threshold_percent: int | None = field(
        default=None, metadata=meta("memoryAllocatableEvictThresholdPercent", check_int(0))
    )
    memory_allocatable_evict_lower_percent: int | None = field(
        default=None, metadata=meta("memoryAllocatableEvictLowerPercent", check_int(0))
    )
    cpu_evict_be_satisfaction_upper_percent: int | None = field(
        default=None, metadata=meta("cpuEvictBESatisfactionUpperPercent", PERCENT)
    )
    cpu_evict_be_satisfaction_lower_percent: int | None = field(
        default=None, metadata=meta("cpuEvictBESatisfactionLowerPercent", PERCENT)
    )
    cpu_evict_be_usage_threshold_percent: int = field(
        default=90, metadata=meta("cpuEvictBEUsageThresholdPercent", PERCENT)
    )
    cpu_evict_time_window_seconds: int | None = field(
        default=None, metadata=meta("cpuEvictTimeWindowSeconds", check_int(0))
    )
    cpu_evict_threshold_percent: int | None = field(default=None, metadata=meta("cpuEvictThresholdPercent", PERCENT))
    cpu_evict_lower_percent: int | None = field(default=None, metadata=meta("cpuEvictLowerPercent", PERCENT))
    cpu_allocatable_evict_threshold_percent: int | None = field(
        default=None, metadata=meta("cpuAllocatableEvictThresholdPercent", check_int(0))
    )
    cpu_allocatable_evict_lower_percent: int | None = field(
        default=None, metadata=meta("cpuAllocatableEvictLowerPercent", check_int(0))
    )
    cpu_evict_policy: str = field(
        default=CPU_EVICT_POLICY_REAL_LIMIT,
        metadata=meta("cpuEvictPolicy", check_enum(CPU_EVICT_POLICY_REAL_LIMIT, CPU_EVICT_POLICY_ALLOCATABLE)),
    )
    evict_enabled_priority_threshold: int | None = field(
        default=None, metadata=meta("evictEnabledPriorityThreshold", INT32)
    )
    allocatable_evict_priority_threshold: int | None = field(
        default=None, metadata=meta("allocatableEvictPriorityThreshold", check_int(0, 7999))
    )

    @property
    def effective_memory_evict_lower_percent(self) -> int:
        """Lower bound of memory eviction: the field, or threshold − 2 (docs/koordinator.md §4.5)."""
        if self.memory_evict_lower_percent is not None:
            return self.memory_evict_lower_percent
        return self.memory_evict_threshold_percent - 2


# ----------------------------------------------------------------------- per-class QoS (docs/koordinator.md §5.2, §4.6)


@dataclass(frozen=True, slots=True)
class CPUQOS:
    enable: bool = field(default=False, metadata=meta("enable", check_bool))
    group_identity: int = field(default=0, metadata=meta("groupIdentity", check_int(BVT_WARP_NS_MIN, BVT_WARP_NS_MAX)))
    sched_idle: int = field(default=0, metadata=meta("schedIdle", check_int(CPU_IDLE_MIN, CPU_IDLE_MAX)))
    core_expeller: bool = field(default=False, metadata=meta("coreExpeller", check_bool))


@dataclass(frozen=True, slots=True)
class MemoryQOS:
    """Memory QoS of a class. ``page_cache_limit_size`` is in bytes."""

    enable: bool = field(default=False, metadata=meta("enable", check_bool))
    min_limit_percent: int = field(default=0, metadata=meta("minLimitPercent", PERCENT))
    low_limit_percent: int = field(default=0, metadata=meta("lowLimitPercent", PERCENT))
    throttling_percent: int = field(default=0, metadata=meta("throttlingPercent", PERCENT))
    wmark_ratio: int = field(default=0, metadata=meta("wmarkRatio", PERCENT))
    wmark_scale_permill: int = field(default=50, metadata=meta("wmarkScalePermill", check_int(1, 1000)))
    wmark_min_adj: int = field(default=0, metadata=meta("wmarkMinAdj", check_int(-25, 50)))
    priority_enable: int = field(default=0, metadata=meta("priorityEnable", check_int(0, 1)))
    priority: int = field(default=0, metadata=meta("priority", check_int(0, 12)))
    oom_kill_group: int = field(default=0, metadata=meta("oomKillGroup", check_int(0, 1)))
    page_cache_enable: bool = field(default=False, metadata=meta("pageCacheEnable", check_bool))
    page_cache_limit_percent: int = field(default=0, metadata=meta("pageCacheLimitPercent", PERCENT))
    page_cache_limit_size: int = field(default=0, metadata=meta("pageCacheLimitSize", check_int(0)))
    page_cache_reclaim_sync: bool = field(default=False, metadata=meta("pageCacheReclaimSync", check_bool))


@dataclass(frozen=True, slots=True)
class ResctrlQOS:
    enable: bool = field(default=False, metadata=meta("enable", check_bool))
    cat_range_start_percent: int = field(default=0, metadata=meta("catRangeStartPercent", PERCENT))
    cat_range_end_percent: int = field(default=100, metadata=meta("catRangeEndPercent", PERCENT))
    mba_percent: int = field(default=100, metadata=meta("mbaPercent", check_int(1, 100)))


def _check_int_or_quantity(value: object) -> int | str:
    """IntOrString: an int is a percent of the node bandwidth, a string an absolute rate ("50M")."""
    if isinstance(value, str):
        try:
            rate = parse_quantity(value)
        except QuantityError as exc:
            raise FieldError(str(exc)) from exc
        if rate < 0:
            raise FieldError(f"rate must not be negative, got {show(value)}")
        return value
    return PERCENT(value)  # type: ignore[return-value]


@dataclass(frozen=True, slots=True)
class NetworkQOS:
    """Percent of the node bandwidth (int) or an absolute rate (quantity string, bits/s)."""

    enable: bool = field(default=False, metadata=meta("enable", check_bool))
    ingress_request: int | str = field(default=0, metadata=meta("ingressRequest", _check_int_or_quantity))
    ingress_limit: int | str = field(default=100, metadata=meta("ingressLimit", _check_int_or_quantity))
    egress_request: int | str = field(default=0, metadata=meta("egressRequest", _check_int_or_quantity))
    egress_limit: int | str = field(default=100, metadata=meta("egressLimit", _check_int_or_quantity))


BLOCK_TYPE_DEVICE = "device"
BLOCK_TYPE_VOLUME_GROUP = "volumegroup"
BLOCK_TYPE_POD_VOLUME = "podvolume"
_NON_NEGATIVE_INT64 = check_int(0, 2**63 - 1)
_POSITIVE_INT64 = check_int(1, 2**63 - 1)


@dataclass(frozen=True, slots=True)
class IOCfg:
    """``ioCfg`` of a block (docs/koordinator.md §4.8).

    Throttles (0 = none), the weight percent, and the blk-iocost settings of the root cgroup. None = not set
    (the blkio strategy applies Koordinator's defaults)."""

    read_iops: int | None = field(default=None, metadata=meta("readIOPS", _NON_NEGATIVE_INT64))
    write_iops: int | None = field(default=None, metadata=meta("writeIOPS", _NON_NEGATIVE_INT64))
    read_bps: int | None = field(default=None, metadata=meta("readBPS", _NON_NEGATIVE_INT64))
    write_bps: int | None = field(default=None, metadata=meta("writeBPS", _NON_NEGATIVE_INT64))
    io_weight_percent: int | None = field(default=None, metadata=meta("ioWeightPercent", check_int(1, 100)))
    read_latency: int | None = field(default=None, metadata=meta("readLatency", _NON_NEGATIVE_INT64))
    write_latency: int | None = field(default=None, metadata=meta("writeLatency", _NON_NEGATIVE_INT64))
    read_latency_percent: int | None = field(default=None, metadata=meta("readLatencyPercent", PERCENT))
    write_latency_percent: int | None = field(default=None, metadata=meta("writeLatencyPercent", PERCENT))
    enable_user_model: bool | None = field(default=None, metadata=meta("enableUserModel", check_bool))
    model_read_bps: int | None = field(default=None, metadata=meta("modelReadBPS", _POSITIVE_INT64))
    model_write_bps: int | None = field(default=None, metadata=meta("modelWriteBPS", _POSITIVE_INT64))
    model_read_seq_iops: int | None = field(default=None, metadata=meta("modelReadSeqIOPS", _POSITIVE_INT64))
    model_write_seq_iops: int | None = field(default=None, metadata=meta("modelWriteSeqIOPS", _POSITIVE_INT64))
    model_read_rand_iops: int | None = field(default=None, metadata=meta("modelReadRandIOPS", _POSITIVE_INT64))
    model_write_rand_iops: int | None = field(default=None, metadata=meta("modelWriteRandIOPS", _POSITIVE_INT64))


def _check_block_name(value: object) -> str:
    text = check_str(value)
    if not text or "\x00" in text or len(text) > 255:
        raise FieldError(f"expected a block device or volume group name, got {show(value)}")
    return text


@dataclass(frozen=True, slots=True)
class BlockCfg:
    """One block of ``blkioQOS.blocks``: a device (``/dev/sdb``), an LVM volume group, or a pod volume."""

    name: str = field(default="", metadata=meta("name", _check_block_name))
    block_type: str = field(default="", metadata=meta("type", check_enum(
        BLOCK_TYPE_DEVICE, BLOCK_TYPE_VOLUME_GROUP, BLOCK_TYPE_POD_VOLUME)))
    io_cfg: IOCfg = field(default=IOCfg(), metadata=nested("ioCfg"))


MAX_BLOCKS = 64


def check_blocks(value: object) -> tuple[BlockCfg, ...]:
    """A ``blocks`` list (NodeSLO ``blkioQOS`` and the ``koordinator.sh/blkioQOS`` annotation)."""
    if not isinstance(value, list):
        raise FieldError(f"expected a list, got {show(value)}")
    if len(value) > MAX_BLOCKS:
        raise FieldError(f"at most {MAX_BLOCKS} blocks, got {len(value)}")
    blocks: list[BlockCfg] = []
    errors: list[str] = []
    for index, raw in enumerate(value):
        block = apply(BlockCfg(), collect(BlockCfg, raw, f"[{index}]", errors))
        if not block.name or not block.block_type:
            errors.append(f"[{index}]: name and type are required")
        blocks.append(block)
    if errors:
        raise FieldError("; ".join(errors))
    return tuple(blocks)


@dataclass(frozen=True, slots=True)
class BlkIOQOS:
    """``blkioQOS``: ``enable`` and the ``blocks`` (docs/koordinator.md §4.8)."""

    enable: bool = field(default=False, metadata=meta("enable", check_bool))
    blocks: tuple[BlockCfg, ...] = field(default=(), metadata=meta("blocks", check_blocks))


@dataclass(frozen=True, slots=True)
class ResourceQOS:
    """The QoS settings of one class (``lsrClass``, ``lsClass``, ``beClass``, ``systemClass``)."""

    cpu_qos: CPUQOS = field(default=CPUQOS(), metadata=nested("cpuQOS"))
    memory_qos: MemoryQOS = field(default=MemoryQOS(), metadata=nested("memoryQOS"))
    resctrl_qos: ResctrlQOS = field(default=ResctrlQOS(), metadata=nested("resctrlQOS"))
    network_qos: NetworkQOS = field(default=NetworkQOS(), metadata=nested("networkQOS"))
    blkio_qos: BlkIOQOS = field(default=BlkIOQOS(), metadata=nested("blkioQOS"))


@dataclass(frozen=True, slots=True)
class CgroupRootQOS:
    """``cgroupRoot``: a ResourceQOS of which only ``blkioQOS`` means anything (blk-iocost on the root cgroup)."""

    blkio_qos: BlkIOQOS = field(default=BlkIOQOS(), metadata=nested("blkioQOS"))


CPU_POLICY_GROUP_IDENTITY = "groupIdentity"
CPU_POLICY_CORE_SCHED = "coreSched"
NET_QOS_POLICY_TC = "tc"
NET_QOS_POLICY_TERWAY = "terway-qos"


@dataclass(frozen=True, slots=True)
class ResourceQOSPolicies:
    cpu_policy: str = field(
        default=CPU_POLICY_GROUP_IDENTITY,
        metadata=meta("cpuPolicy", check_enum(CPU_POLICY_GROUP_IDENTITY, CPU_POLICY_CORE_SCHED)),
    )
    net_qos_policy: str = field(
        default=NET_QOS_POLICY_TC,
        metadata=meta("netQOSPolicy", check_enum(NET_QOS_POLICY_TC, NET_QOS_POLICY_TERWAY)),
    )


# "None" values: what a disabled QoS means (docs/koordinator.md §4.6: all 0 except wmarkScalePermill 50;
# docs/koordinator.md §4.7: full cache, 100% MB).
NONE_CPU_QOS = CPUQOS()
NONE_MEMORY_QOS = MemoryQOS()
NONE_RESCTRL_QOS = ResctrlQOS()
NONE_NETWORK_QOS = NetworkQOS()
NONE_RESOURCE_QOS = ResourceQOS()

# Recommended values of an enabled QoS, per class: group identity (docs/koordinator.md §3.3), memory
# (docs/koordinator.md §4.6), resctrl (docs/koordinator.md §4.7), CoreSched.
_MEMORY_QOS_LS = MemoryQOS(wmark_ratio=95, wmark_scale_permill=20, wmark_min_adj=-25)
RECOMMENDED_MEMORY_QOS: Mapping[QoSClass, MemoryQOS] = MappingProxyType(
    {
        QoSClass.LSR: _MEMORY_QOS_LS,
        QoSClass.LS: _MEMORY_QOS_LS,
        QoSClass.BE: replace(_MEMORY_QOS_LS, wmark_min_adj=50),
        QoSClass.SYSTEM: MemoryQOS(wmark_ratio=0, wmark_scale_permill=50, wmark_min_adj=0),
    }
)
_DEFAULT_CLASSES: Mapping[QoSClass, ResourceQOS] = MappingProxyType(
    {
        QoSClass.LSR: ResourceQOS(
            cpu_qos=CPUQOS(group_identity=2, core_expeller=True),
            memory_qos=RECOMMENDED_MEMORY_QOS[QoSClass.LSR],
        ),
        QoSClass.LS: ResourceQOS(
            cpu_qos=CPUQOS(group_identity=2, core_expeller=True),
            memory_qos=RECOMMENDED_MEMORY_QOS[QoSClass.LS],
        ),
        QoSClass.BE: ResourceQOS(
            cpu_qos=CPUQOS(group_identity=-1),
            memory_qos=RECOMMENDED_MEMORY_QOS[QoSClass.BE],
            resctrl_qos=ResctrlQOS(cat_range_end_percent=30),
        ),
        QoSClass.SYSTEM: ResourceQOS(memory_qos=RECOMMENDED_MEMORY_QOS[QoSClass.SYSTEM]),
    }
)


def recommended_memory_qos(qos: QoSClass) -> MemoryQOS:
    """The enabled memory QoS Koordinator recommends for a class (LSE uses LSR's; none → none values)."""
    if qos is QoSClass.LSE:
        qos = QoSClass.LSR
    return replace(RECOMMENDED_MEMORY_QOS.get(qos, NONE_MEMORY_QOS), enable=qos in RECOMMENDED_MEMORY_QOS)


@dataclass(frozen=True, slots=True)
class ResourceQOSStrategy:
    policies: ResourceQOSPolicies = field(default=ResourceQOSPolicies(), metadata=nested("policies"))
    lsr_class: ResourceQOS = field(default=_DEFAULT_CLASSES[QoSClass.LSR], metadata=nested("lsrClass"))
    ls_class: ResourceQOS = field(default=_DEFAULT_CLASSES[QoSClass.LS], metadata=nested("lsClass"))
    be_class: ResourceQOS = field(default=_DEFAULT_CLASSES[QoSClass.BE], metadata=nested("beClass"))
    system_class: ResourceQOS = field(default=_DEFAULT_CLASSES[QoSClass.SYSTEM], metadata=nested("systemClass"))
    cgroup_root: CgroupRootQOS = field(default=CgroupRootQOS(), metadata=nested("cgroupRoot"))

    def for_class(self, qos: QoSClass) -> ResourceQOS:
        """Settings of a QoS class; LSE shares LSR's (docs/koordinator.md §4.6); NONE gets the none values."""
        if qos in (QoSClass.LSE, QoSClass.LSR):
            return self.lsr_class
        if qos is QoSClass.LS:
            return self.ls_class
        if qos is QoSClass.BE:
            return self.be_class
        if qos is QoSClass.SYSTEM:
            return self.system_class
        return NONE_RESOURCE_QOS


# --------------------------------------------------------------------------------- CPU burst (docs/koordinator.md §4.3)

CPU_BURST_POLICY_NONE = "none"
CPU_BURST_POLICY_CPU_BURST_ONLY = "cpuBurstOnly"
CPU_BURST_POLICY_CFS_QUOTA_BURST_ONLY = "cfsQuotaBurstOnly"
CPU_BURST_POLICY_AUTO = "auto"


@dataclass(frozen=True, slots=True)
class CPUBurstStrategy:
    """``cpuBurstStrategy``; the pod annotation ``koordinator.sh/cpuBurst`` overrides the first four fields."""

    policy: str = field(
        default=CPU_BURST_POLICY_NONE,
        metadata=meta(
            "policy",
            check_enum(
                CPU_BURST_POLICY_NONE,
                CPU_BURST_POLICY_CPU_BURST_ONLY,
                CPU_BURST_POLICY_CFS_QUOTA_BURST_ONLY,
                CPU_BURST_POLICY_AUTO,
            ),
        ),
    )
    cpu_burst_percent: int = field(default=1000, metadata=meta("cpuBurstPercent", check_int(0, 2**31 - 1)))
    cfs_quota_burst_percent: int = field(default=300, metadata=meta("cfsQuotaBurstPercent", check_int(100, 2**31 - 1)))
    cfs_quota_burst_period_seconds: int = field(
        default=-1, metadata=meta("cfsQuotaBurstPeriodSeconds", check_int(-1, 2**31 - 1))
    )
    share_pool_threshold_percent: int = field(default=50, metadata=meta("sharePoolThresholdPercent", PERCENT))


# --------------------------------------------------------------------------- system strategy (docs/koordinator.md §4.9)


def _check_sched_features(value: object) -> Mapping[str, bool]:
    if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, bool) for k, v in value.items()):
        raise FieldError(f"expected an object of feature name to true/false, got {show(value)}")
    return MappingProxyType(dict(value))


def _check_quantity(what: str, low: int = 0) -> Check:
    """A quantity (``what``: bits/s, bytes) at least ``low``; JSON may carry it as a string ("10G") or an integer."""

    def check(value: object) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            text = str(value)
        elif isinstance(value, str):
            text = value
        else:
            raise FieldError(f"expected a quantity, got {show(value)}")
        try:
            amount = parse_quantity(text)
        except QuantityError as exc:
            raise FieldError(str(exc)) from exc
        if amount < low:
            raise FieldError(f"{what} must be at least {low}, got {show(value)}")
        return amount

    return check


_check_bandwidth = _check_quantity("bandwidth")


@dataclass(frozen=True, slots=True)
class SystemStrategy:
    """``systemStrategy``: sysctl-level settings; None = leave the kernel value alone (all unset by default)."""

    min_free_kbytes_factor: int | None = field(default=None, metadata=meta("minFreeKbytesFactor", check_int(0)))
    watermark_scale_factor: int | None = field(default=None, metadata=meta("watermarkScaleFactor", check_int(0)))
    memcg_reap_background: int | None = field(default=None, metadata=meta("memcgReapBackGround", check_int(0, 1)))
    sched_group_identity_enabled: int | None = field(
        default=None, metadata=meta("schedGroupIdentityEnabled", check_int(0, 1))
    )
    sched_idle_saver_wmark: int | None = field(default=None, metadata=meta("schedIdleSaverWmark", check_int(0)))
    sched_features: Mapping[str, bool] = field(
        default_factory=lambda: MappingProxyType({}), metadata=meta("schedFeatures", _check_sched_features)
    )
    page_cache_limit_enabled: int | None = field(default=None, metadata=meta("pageCacheLimitEnabled", check_int(0, 1)))
    total_network_bandwidth_bps: int = field(default=0, metadata=meta("totalNetworkBandwidth", _check_bandwidth))


# ------------------------------------------------------------------------- host applications (docs/koordinator.md §5.2)

CGROUP_BASE_ROOT = "CgroupRoot"
CGROUP_BASE_KUBEPODS = "Kubepods"
CGROUP_BASE_KUBEPODS_BURSTABLE = "KubepodsBurstable"
CGROUP_BASE_KUBEPODS_BESTEFFORT = "KubepodsBesteffort"


def _check_relative_dir(value: object) -> str:
    # The path later becomes a cgroup dir; refuse what could climb out of the cgroup root.
    text = check_str(value)
    if "\x00" in text or ".." in text.split("/"):
        raise FieldError(f"must be a plain relative path, got {show(value)}")
    return text


@dataclass(frozen=True, slots=True)
class HostCgroupPath:
    base: str = field(
        default=CGROUP_BASE_ROOT,
        metadata=meta(
            "base",
            check_enum(
                CGROUP_BASE_ROOT,
                CGROUP_BASE_KUBEPODS,
                CGROUP_BASE_KUBEPODS_BURSTABLE,
                CGROUP_BASE_KUBEPODS_BESTEFFORT,
            ),
        ),
    )
    parent_dir: str = field(default="", metadata=meta("parentDir", _check_relative_dir))
    relative_path: str = field(default="", metadata=meta("relativePath", _check_relative_dir))


def _parse_host_cgroup_path(value: object) -> HostCgroupPath:
    errors: list[str] = []
    overrides = collect(HostCgroupPath, value, "", errors)
    if errors:
        raise FieldError("; ".join(errors))
    return apply(HostCgroupPath(), overrides)


def _check_qos(value: object) -> QoSClass:
    return QoSClass(check_enum(*(q.value for q in QoSClass))(value))


@dataclass(frozen=True, slots=True)
class HostApplication:
    """An out-of-band process group on the node (not a pod) with a QoS and a cgroup."""

    name: str = field(default="", metadata=meta("name", check_str))
    priority: str = field(default="", metadata=meta("priority", check_str))
    qos: QoSClass = field(default=QoSClass.NONE, metadata=meta("qos", _check_qos))
    cgroup_path: HostCgroupPath | None = field(default=None, metadata=meta("cgroupPath", _parse_host_cgroup_path))


def _check_host_applications(value: object) -> tuple[HostApplication, ...]:
    if not isinstance(value, list):
        raise FieldError(f"expected a list, got {show(value)}")
    apps: list[HostApplication] = []
    errors: list[str] = []
    for index, raw in enumerate(value):
        app = apply(HostApplication(), collect(HostApplication, raw, f"[{index}]", errors))
        if not app.name:
            errors.append(f"[{index}].name: required")
        apps.append(app)
    if errors:
        raise FieldError("; ".join(errors))
    return tuple(apps)


BE_MEMORY_RECLAIM_EXTENSION = "beMemoryReclaimStrategy"
_MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class BEMemoryReclaimStrategy:
    """``extensions.beMemoryReclaimStrategy``: koordlet-py's extension (Koordinator has none; docs/colocation.md
    "Memory QoS on stock kernels"). In ``extensions``, which Koordinator's CRD keeps as given, so the object
    survives in a cluster running Koordinator's CRDs. Thresholds are percent of the node's memory used *with* page
    cache (MemTotal − MemFree); None: derived from ``memoryEvictThresholdPercent`` (threshold − 10, lower
    threshold − 5)."""

    enable: bool = field(default=False, metadata=meta("enable", check_bool))
    reclaim_threshold_percent: int | None = field(default=None,
                                                  metadata=meta("reclaimThresholdPercent", check_int(1, 100)))
    reclaim_lower_percent: int | None = field(default=None, metadata=meta("reclaimLowerPercent", check_int(0, 99)))
    # bytes asked of all BE pods in one tick: where it starts and its floor, and its bound
    reclaim_step_bytes: int = field(default=64 * _MIB, metadata=meta("reclaimStepBytes", _check_quantity("bytes", 1)))
    reclaim_max_step_bytes: int = field(default=1024 * _MIB,
                                        metadata=meta("reclaimMaxStepBytes", _check_quantity("bytes", 1)))
    # LS pods' memory PSI (``some avg10``, percent) at or above which a rise after a reclaim makes it back off
    ls_memory_pressure_threshold_percent: int = field(default=10,
                                                      metadata=meta("lsMemoryPressureThresholdPercent", PERCENT))


def _be_memory_reclaim(extensions: Mapping[str, object], errors: list[str]) -> BEMemoryReclaimStrategy:
    where = f"extensions.{BE_MEMORY_RECLAIM_EXTENSION}"
    strategy = apply(BEMemoryReclaimStrategy(),
                     collect(BEMemoryReclaimStrategy, extensions.get(BE_MEMORY_RECLAIM_EXTENSION), where, errors))
    if strategy.reclaim_max_step_bytes < strategy.reclaim_step_bytes:
        errors.append(f"{where}.reclaimMaxStepBytes: {strategy.reclaim_max_step_bytes} is below reclaimStepBytes "
                      f"{strategy.reclaim_step_bytes}")
    return strategy


BE_PSI_THROTTLE_EXTENSION = "bePSIThrottleStrategy"


@dataclass(frozen=True, slots=True)
class BEPSIThrottleStrategy:
    """``extensions.bePSIThrottleStrategy``: koordlet-py's extension (Koordinator has none; docs/colocation.md "BE CPU
    and IO steered by the LS pods' pressure"), with the gate ``BEPSIThrottle`` (cgroup v2). Pressures are the
    highest ``some avg10`` (percent) among the LS pods' ``cpu.pressure`` and ``io.pressure``; at or above its
    threshold, the BE pods' CPU (the besteffort dir's ``cpu.max``) or IO (its ``io.weight``) goes one step down, at
    most every ``stepIntervalSeconds``; below ``releasePercent`` of the threshold for ``releaseIntervalSeconds`` it
    comes one step back."""

    enable: bool = field(default=False, metadata=meta("enable", check_bool))
    cpu_pressure_threshold_percent: int = field(default=10, metadata=meta("cpuPressureThresholdPercent",
                                                                         check_int(1, 100)))
    io_pressure_threshold_percent: int = field(default=10, metadata=meta("ioPressureThresholdPercent",
                                                                        check_int(1, 100)))
    # the hysteresis: a pressure below this percent of its threshold counts as gone
    release_percent: int = field(default=50, metadata=meta("releasePercent", check_int(0, 99)))
    step_interval_seconds: int = field(default=4, metadata=meta("stepIntervalSeconds", check_int(1, 3600)))
    release_interval_seconds: int = field(default=10, metadata=meta("releaseIntervalSeconds", check_int(1, 3600)))
    # each CPU step takes this percent of the node's CPUs off the BE pods' limit, which never goes below
    # cpuMinPercent of them
    cpu_step_percent: int = field(default=25, metadata=meta("cpuStepPercent", check_int(1, 100)))
    cpu_min_percent: int = field(default=25, metadata=meta("cpuMinPercent", check_int(1, 100)))
    # each IO step halves the besteffort dir's io.weight (100, the kernel's default, when not throttled), down to this
    io_min_weight: int = field(default=1, metadata=meta("ioMinWeight", check_int(1, 100)))


def _be_psi_throttle(extensions: Mapping[str, object], errors: list[str]) -> BEPSIThrottleStrategy:
    where = f"extensions.{BE_PSI_THROTTLE_EXTENSION}"
    return apply(BEPSIThrottleStrategy(),
                 collect(BEPSIThrottleStrategy, extensions.get(BE_PSI_THROTTLE_EXTENSION), where, errors))


def _check_extensions(value: object) -> Mapping[str, object]:
    if not isinstance(value, Mapping):
        raise FieldError(f"expected an object, got {show(value)}")
    return MappingProxyType(dict(value))


# ------------------------------------------------------------------------------------------------ the spec


@dataclass(frozen=True, slots=True)
class NodeSLOSpec:
    resource_used_threshold_with_be: ResourceThresholdStrategy = field(
        default=ResourceThresholdStrategy(), metadata=nested("resourceUsedThresholdWithBE")
    )
    resource_qos_strategy: ResourceQOSStrategy = field(
        default=ResourceQOSStrategy(), metadata=nested("resourceQOSStrategy")
    )
    cpu_burst_strategy: CPUBurstStrategy = field(default=CPUBurstStrategy(), metadata=nested("cpuBurstStrategy"))
    system_strategy: SystemStrategy = field(default=SystemStrategy(), metadata=nested("systemStrategy"))
    host_applications: tuple[HostApplication, ...] = field(
        default=(), metadata=meta("hostApplications", _check_host_applications)
    )
    extensions: Mapping[str, object] = field(
        default_factory=lambda: MappingProxyType({}), metadata=meta("extensions", _check_extensions)
    )
    # ``extensions.beMemoryReclaimStrategy`` and ``extensions.bePSIThrottleStrategy``, read from ``extensions`` by
    # parse_node_slo_spec
    be_memory_reclaim_strategy: BEMemoryReclaimStrategy = BEMemoryReclaimStrategy()
    be_psi_throttle_strategy: BEPSIThrottleStrategy = BEPSIThrottleStrategy()


def _disable_to_none(resource_qos: ResourceQOS) -> ResourceQOS:
    """Replace every disabled QoS of a class by its none values (keeping enable=False); blkio stays as given."""
    return ResourceQOS(
        cpu_qos=resource_qos.cpu_qos if resource_qos.cpu_qos.enable else NONE_CPU_QOS,
        memory_qos=resource_qos.memory_qos if resource_qos.memory_qos.enable else NONE_MEMORY_QOS,
        resctrl_qos=resource_qos.resctrl_qos if resource_qos.resctrl_qos.enable else NONE_RESCTRL_QOS,
        network_qos=resource_qos.network_qos if resource_qos.network_qos.enable else NONE_NETWORK_QOS,
        blkio_qos=resource_qos.blkio_qos,
    )


def _check_cross_fields(spec: NodeSLOSpec, errors: list[str]) -> None:
    strategy = spec.resource_qos_strategy
    for key, resource_qos in (
        ("lsrClass", strategy.lsr_class),
        ("lsClass", strategy.ls_class),
        ("beClass", strategy.be_class),
        ("systemClass", strategy.system_class),
    ):
        resctrl = resource_qos.resctrl_qos
        if resctrl.cat_range_start_percent >= resctrl.cat_range_end_percent:
            errors.append(
                f"resourceQOSStrategy.{key}.resctrlQOS: catRangeStartPercent {resctrl.cat_range_start_percent}"
                f" must be below catRangeEndPercent {resctrl.cat_range_end_percent}"
            )


def parse_node_slo_spec(spec: object) -> NodeSLOSpec:
    """Merge a NodeSLO ``spec`` (dict from the CRD or a YAML file) over the defaults; None → defaults.

    Raises NodeSLOError naming every invalid field; nothing is merged then (see the module docstring).
    """
    errors: list[str] = []
    overrides = collect(NodeSLOSpec, spec, "", errors)
    merged = apply(_UNRESOLVED_DEFAULTS, overrides)
    _check_cross_fields(merged, errors)
    reclaim = _be_memory_reclaim(merged.extensions, errors)
    throttle = _be_psi_throttle(merged.extensions, errors)
    if errors:
        raise NodeSLOError(errors)
    merged = replace(merged, be_memory_reclaim_strategy=reclaim, be_psi_throttle_strategy=throttle)
    strategy = merged.resource_qos_strategy
    resolved = replace(
        strategy,
        lsr_class=_disable_to_none(strategy.lsr_class),
        ls_class=_disable_to_none(strategy.ls_class),
        be_class=_disable_to_none(strategy.be_class),
        system_class=_disable_to_none(strategy.system_class),
    )
    return replace(merged, resource_qos_strategy=resolved)


_UNRESOLVED_DEFAULTS = NodeSLOSpec()


def default_node_slo_spec() -> NodeSLOSpec:
    """The spec koordlet runs with when no NodeSLO exists: every QoS disabled, thresholds at defaults."""
    return parse_node_slo_spec(None)
