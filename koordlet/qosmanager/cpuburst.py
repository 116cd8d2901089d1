"""CPU burst: static ``cfs_burst_us`` and dynamic CFS quota scaling for LS pods (docs/koordinator.md §4.3).

Eligible: running or pending pods whose qosClass label is not LSR/LSE/BE; their config is the node's
``cpuBurstStrategy`` with the pod annotation ``koordinator.sh/cpuBurst`` over it.

- Static burst (policies ``cpuBurstOnly``, ``auto``): container ``cpu.cfs_burst_us`` =
  limit_cores × cpuBurstPercent/100 × 100000, pod = Σ containers. Mainline kernels refuse a burst above the
  quota (EINVAL, kernel/sched/core.c ``tg_set_cfs_bandwidth``), so the value is capped at the quota of
  the same cgroup; Anolis kernels, for which Koordinator's 1000 % default was chosen, have no such rule.
- Dynamic quota (policies ``cfsQuotaBurstOnly``, ``auto``): per container with a CPU limit, scale the
  quota up ×1.2 when it was throttled, down ×0.8 when its token bucket is empty or the node's share pool
  is overloaded, within [base, base × cfsQuotaBurstPercent/100]; other policies reset it to the base (the CPU
  limit's quota, normalized as below).
  Writes: scaling up pod then container, scaling down container then pod; a pod quota of −1 stays.

The quota's base is kubelet's limit normalized by the node's CPU normalization ratio where CPUNormalization would
own the container (koordlet/api/cfsquota.py): burst owns the quota of the running containers it takes, and
normalization's reconciler leaves them to it, so neither undoes the other (Koordinator #2306). A container whose
quota is another part's (a pod bound to a cpuset) is not scaled.
"""

from __future__ import annotations

import enum
import logging
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from koordlet.api.annotations import AnnotationError, parse_cpu_burst
from koordlet.api.cfsquota import (
    QuotaGates,
    QuotaOwner,
    burst_base_quota_us,
    burst_eligible,
    node_normalization_ratio,
    quota_owner,
)
from koordlet.api.keys import ANNOTATION_CPU_BURST, RESOURCE_CPU
from koordlet.api.nodeslo import (
    CPU_BURST_POLICY_AUTO,
    CPU_BURST_POLICY_CFS_QUOTA_BURST_ONLY,
    CPU_BURST_POLICY_CPU_BURST_ONLY,
    CPU_BURST_POLICY_NONE,
    CPUBurstStrategy,
    NodeSLOSpec,
)
from koordlet.api.pod import ContainerMeta, PodMeta, aggregate_request
from koordlet.api.qos import KubeQoS, QoSClass
from koordlet.api.units import CFS_PERIOD_US, UNLIMITED
from koordlet.plan import CgroupWrite, GaugeSet, Plan, WriteStep
from koordlet.qosmanager import metrics
from koordlet.qosmanager.framework import GATE_CPU_BURST, QoSManagerConfig, Strategy
from koordlet.qosmanager.snapshot import (
    CgroupRead,
    Needs,
    Scope,
    Snapshot,
    container_cgroup_dir,
    container_limit_of,
    container_resource,
    parse_quota_us,
    pod_cgroup_dir,
    pod_kube_qos,
)
from koordlet.system.kubepods import KubeCgroupLayout

logger = logging.getLogger(__name__)

CFS_BURST_MAX_US = 100 * 10 * CFS_PERIOD_US  # the registry's validator maximum
SCALE_UP_RATIO = 1.2
SCALE_DOWN_RATIO = 0.8
COOLING_RATIO = 0.9  # share pool ≥ 0.9 × threshold is "cooling"
NODE_STATE_WINDOW_MAX_S = 10.0
LIMITER_REFILL_BELOW_PERCENT = 60.0
_QUOTA_BURST_POLICIES = (CPU_BURST_POLICY_CFS_QUOTA_BURST_ONLY, CPU_BURST_POLICY_AUTO)
_STATIC_BURST_POLICIES = (CPU_BURST_POLICY_CPU_BURST_ONLY, CPU_BURST_POLICY_AUTO)


AUDIT_REASON_QUOTA = "CFSQuotaBurst"  # Koordinator's audit reasons
AUDIT_REASON_BURST = "CPUBurst"


class SharePoolState(enum.StrEnum):
    OVERLOAD = "overload"
    COOLING = "cooling"
    IDLE = "idle"
    UNKNOWN = "unknown"


class BurstOperation(enum.StrEnum):
    UP = "up"
    DOWN = "down"
    REMAIN = "remain"
    RESET = "reset"


@dataclass(frozen=True, slots=True)
class TokenBucket:
    """The cfsQuotaBurstPeriodSeconds limiter of one container; tokens are percent-seconds above 100 %.

    capacity = period × (cfsQuotaBurstPercent − 100). Each second at ≥ 100 % of the limit consumes
    (usage% − 100) × dt, each second below 60 % refills (100 − usage%) × dt; bursting is allowed while
    tokens > 0.
    """

    capacity: float
    tokens: float
    updated_at: float

    @property
    def allows(self) -> bool:
        return self.tokens > 0

    def advance(self, usage_percent: float, now: float) -> TokenBucket:
        elapsed = max(now - self.updated_at, 0.0)
        tokens = self.tokens
        if usage_percent >= 100.0:
            tokens -= (usage_percent - 100.0) * elapsed
        elif usage_percent < LIMITER_REFILL_BELOW_PERCENT:
            tokens += (100.0 - usage_percent) * elapsed
        return TokenBucket(self.capacity, min(max(tokens, 0.0), self.capacity), now)


def bucket_capacity(config: CPUBurstStrategy) -> float:
    return float(config.cfs_quota_burst_period_seconds * (config.cfs_quota_burst_percent - 100))


@dataclass(frozen=True, slots=True)
class BurstContainer:
    """An eligible container with its pod, config and cgroup dirs; ``base_quota_us`` is the quota burst scales from
    and resets to (kubelet's limit, normalized where normalization would own it), ``owns_quota`` whether the quota is
    burst's at all (koordlet/api/cfsquota.py)."""

    pod: PodMeta
    container: ContainerMeta
    config: CPUBurstStrategy
    pod_dir: str
    container_dir: str
    base_quota_us: int
    owns_quota: bool = True

    @property
    def limit_milli(self) -> int:
        return container_limit_of(self.pod, self.container, RESOURCE_CPU)


@dataclass(frozen=True, slots=True)
class BurstCurrent:
    """Quotas as read back: by bare container id and by pod uid (−1 = unlimited)."""

    container_quota_us: Mapping[str, int] = field(default_factory=dict)
    pod_quota_us: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class BurstDecision:
    node_state: SharePoolState
    steps: tuple[WriteStep, ...]
    buckets: Mapping[str, TokenBucket]
    container_quota_us: Mapping[str, int]  # new quotas (changed or not) of the containers scaled
    container_burst_us: Mapping[str, int]
    operations: Mapping[str, BurstOperation]


def pod_burst_config(pod: PodMeta, node_strategy: CPUBurstStrategy) -> CPUBurstStrategy:
    raw = pod.annotations.get(ANNOTATION_CPU_BURST)
    if not raw:
        return node_strategy
    try:
        return parse_cpu_burst(raw).resolve(node_strategy)
    except AnnotationError as exc:
        logger.debug("ignoring cpuBurst annotation of %s: %s", pod.key, exc)
        return node_strategy


is_eligible = burst_eligible  # a running or pending pod whose qosClass label is not LSR/LSE/BE


_BURST_ALONE = QuotaGates(cpu_burst=True)  # no other quota writer's gate on


def eligible_containers(snapshot: Snapshot, layout: KubeCgroupLayout, gates: QuotaGates = _BURST_ALONE,
                        ratio: float | None = None,
                        visit: Callable[[PodMeta, str], bool] | None = None) -> tuple[BurstContainer, ...]:
    """Containers of running/pending pods whose qosClass label is not LSR/LSE/BE (docs/koordinator.md §4.3), with
    the base of their quota given the other quota writers' ``gates`` and the node's normalization ``ratio``; with
    ``visit``, of the pods it accepts (given the pod and its dir) only."""
    node_strategy = snapshot.node_slo.cpu_burst_strategy
    found: list[BurstContainer] = []
    for pod in snapshot.pods:
        if not is_eligible(pod):
            continue
        pod_dir = pod_cgroup_dir(layout, pod)
        if pod_dir is None or (visit is not None and not visit(pod, pod_dir)):
            continue
        config = pod_burst_config(pod, node_strategy)
        owns = quota_owner(pod, gates, running=True, ratio=ratio) is QuotaOwner.BURST
        for container in pod.containers:
            if container.is_init:
                continue
            container_dir = container_cgroup_dir(layout, pod_dir, container)
            if container_dir is not None:
                limit_quota_us = container_limit_of(pod, container, RESOURCE_CPU) * CFS_PERIOD_US // 1000
                found.append(BurstContainer(pod, container, config, pod_dir, container_dir,
                                            burst_base_quota_us(pod, limit_quota_us, gates, ratio), owns))
    return tuple(found)


_OUT_OF_POOL = (QoSClass.LSE, QoSClass.LSR, QoSClass.BE)  # the labels whose pods' usage is not the share pool's


def _sorted_apart(pod: PodMeta) -> bool:
    """A pod the besteffort dir's usage sorts wrong for the share pool: labelled LSE/LSR/BE outside it, or in it
    (BestEffort) without such a label."""
    return (pod.qos_label in _OUT_OF_POOL) != (pod_kube_qos(pod) is KubeQoS.BESTEFFORT)


def _out_of_pool_used(snapshot: Snapshot) -> float | None:
    """The average CPU of the LSE/LSR/BE-labelled pods: the besteffort dir's with the pods it sorts wrong
    (:func:`_sorted_apart`) moved over; without its average, the sum over the pods when the snapshot holds every
    pod's usage; None when it cannot be told."""
    averages = snapshot.pod_cpu_avg_cores
    if snapshot.besteffort_cpu_avg_cores is not None:
        used = snapshot.besteffort_cpu_avg_cores
        for pod in snapshot.pods:
            if _sorted_apart(pod):
                used += averages.get(pod.uid, 0.0) * (1 if pod.qos_label in _OUT_OF_POOL else -1)
        return max(used, 0.0)
    if not snapshot.usage_of_every_pod:
        return None
    return sum(averages.get(pod.uid, 0.0) for pod in snapshot.pods if pod.qos_label in _OUT_OF_POOL)


def share_pool_state(snapshot: Snapshot, threshold_percent: int) -> SharePoolState:
    """Node share-pool state from averages (docs/koordinator.md §4.3).

    total = #CPUs − Σ LSE/LSR requests, used = node used − usage of LSE/LSR/BE pods; ratio ≥ threshold →
    overload, ≥ 0.9 × threshold → cooling, else idle."""
    node_used = snapshot.node_cpu_avg_cores
    out_of_pool = _out_of_pool_used(snapshot)
    if node_used is None or out_of_pool is None:
        return SharePoolState.UNKNOWN
    total = float(snapshot.num_cpus)
    used = node_used - out_of_pool
    for pod in snapshot.pods:
        if pod.qos_label in (QoSClass.LSE, QoSClass.LSR):
            total -= aggregate_request(pod, RESOURCE_CPU, lambda c: container_resource(c, RESOURCE_CPU)) / 1000.0
    if total <= 0:
        return SharePoolState.UNKNOWN
    ratio = used / total
    threshold = threshold_percent / 100.0
    if ratio >= threshold:
        return SharePoolState.OVERLOAD
    if ratio >= COOLING_RATIO * threshold:
        return SharePoolState.COOLING
    return SharePoolState.IDLE


def container_operation(
    quota_burst: bool, limiter_allows: bool, throttled_ratio: float, node_state: SharePoolState
) -> BurstOperation:
    """Operation of one container (docs/koordinator.md §4.3), node overrides applied."""
    if not quota_burst:
        return BurstOperation.RESET
    if not limiter_allows:
        operation = BurstOperation.DOWN
    elif throttled_ratio > 0:
        operation = BurstOperation.UP
    else:
        operation = BurstOperation.REMAIN
    if node_state is SharePoolState.OVERLOAD:
        return BurstOperation.DOWN
    if operation is BurstOperation.UP and node_state in (SharePoolState.COOLING, SharePoolState.UNKNOWN):
        return BurstOperation.REMAIN
    return operation


def scaled_quota(operation: BurstOperation, current_us: int, base_us: int, ceil_us: int) -> int:
    """up ×1.2, down ×0.8, reset = base, remain = current; clamped to [base, ceil]."""
    if operation is BurstOperation.RESET:
        return base_us
    if operation is BurstOperation.UP:
        wanted = int(current_us * SCALE_UP_RATIO)
    elif operation is BurstOperation.DOWN:
        wanted = int(current_us * SCALE_DOWN_RATIO)
    else:
        wanted = current_us
    return min(max(wanted, base_us), ceil_us)


def static_burst_us(limit_milli: int, config: CPUBurstStrategy) -> int:
    """limit_cores × cpuBurstPercent/100 × 100000 (= limit_milli × cpuBurstPercent); 0 when not enabled."""
    if config.policy not in _STATIC_BURST_POLICIES or limit_milli <= 0:
        return 0
    return min(limit_milli * config.cpu_burst_percent, CFS_BURST_MAX_US)


def node_state_window_s(reconcile_interval_s: float) -> float:
    return min(5 * reconcile_interval_s, NODE_STATE_WINDOW_MAX_S)


@dataclass(frozen=True, slots=True)
class PodBurstState:
    """What :func:`decide_burst` gathers for one pod while it walks the pod's containers: the pod's cgroup dir
    and quota as read, the sum of its containers' static burst, and its containers' quota changes (those that
    grow and those that shrink) with their sum."""

    pod_dir: str
    pod_quota_us: int
    burst_sum_us: int = 0
    quota_delta_us: int = 0
    ups: tuple[CgroupWrite, ...] = ()
    downs: tuple[CgroupWrite, ...] = ()
    notes: tuple[str, ...] = ()  # what happened to each scaled container, for the audit log

    def with_burst(self, burst_us: int) -> PodBurstState:
        return replace(self, burst_sum_us=self.burst_sum_us + burst_us)

    def with_quota(self, container_dir: str, old_us: int, new_us: int, note: str) -> PodBurstState:
        write = CgroupWrite("cpu.cfs_quota_us", container_dir, new_us)
        changed = replace(self, quota_delta_us=self.quota_delta_us + new_us - old_us, notes=(*self.notes, note))
        if new_us > old_us:
            return replace(changed, ups=(*self.ups, write))
        return replace(changed, downs=(*self.downs, write))

    def quota_step(self, node_state: SharePoolState) -> WriteStep | None:
        """The pod's and its containers' quota writes in a safe order (v1: a child's quota may not exceed its
        parent's): scaling up, the pod first; scaling down, the containers first. A pod quota of −1 stays."""
        if not self.ups and not self.downs:
            return None
        pod_write: tuple[CgroupWrite, ...] = ()
        if self.pod_quota_us != UNLIMITED:
            pod_write = (CgroupWrite("cpu.cfs_quota_us", self.pod_dir, self.pod_quota_us + self.quota_delta_us),)
        why = f"share pool {node_state.value}: " + "; ".join(self.notes)
        writes = pod_write + self.downs + self.ups if self.quota_delta_us >= 0 else self.downs + self.ups + pod_write
        return WriteStep(writes, reason=AUDIT_REASON_QUOTA, why=why)

    def burst_write(self) -> CgroupWrite:
        """The pod's ``cpu.cfs_burst_us``: its containers' sum, capped at its own quota."""
        value = self.burst_sum_us if self.pod_quota_us == UNLIMITED else min(self.burst_sum_us, self.pod_quota_us)
        return CgroupWrite("cpu.cfs_burst_us", self.pod_dir, value)


@dataclass(frozen=True, slots=True)
class _QuotaScaling:
    """One container's dynamic quota this tick: the operation, the new quota, and its limiter as advanced."""

    operation: BurstOperation
    quota_us: int
    bucket: TokenBucket | None
    base_us: int = 0
    ceil_us: int = 0


def _scale_quota(entry: BurstContainer, snapshot: Snapshot, container_quota: int, bucket: TokenBucket | None,
                 node_state: SharePoolState) -> _QuotaScaling | None:
    """The dynamic quota of a container with a CPU limit and a known quota (docs/koordinator.md §4.3).

    None when a reset would find it at its base already."""
    limit_milli = entry.limit_milli
    base = entry.base_quota_us
    ceil = base * entry.config.cfs_quota_burst_percent // 100
    quota_burst = entry.config.policy in _QUOTA_BURST_POLICIES
    allows = True
    if quota_burst and entry.config.cfs_quota_burst_period_seconds >= 0 and bucket is not None:
        usage_cores = snapshot.container_cpu_cores.get(entry.container.container_id, 0.0)
        bucket = bucket.advance(usage_cores * 1000.0 / limit_milli * 100.0, snapshot.timestamp)
        allows = bucket.allows
    else:
        bucket = None
    operation = container_operation(
        quota_burst, allows, snapshot.container_throttled_ratio.get(entry.container.container_id, 0.0), node_state
    )
    if operation is BurstOperation.RESET and container_quota == base:
        return None
    return _QuotaScaling(operation, scaled_quota(operation, container_quota, base, ceil), bucket, base, ceil)


def decide_burst(
    snapshot: Snapshot,
    containers: tuple[BurstContainer, ...],
    current: BurstCurrent,
    buckets: Mapping[str, TokenBucket],
) -> BurstDecision:
    """Burst values and quotas of the eligible ``containers``; ``buckets`` holds the limiter of every
    container whose config has ``cfsQuotaBurstPeriodSeconds`` ≥ 0 (the runner creates them)."""
    node_state = share_pool_state(snapshot, snapshot.node_slo.cpu_burst_strategy.share_pool_threshold_percent)
    new_buckets: dict[str, TokenBucket] = {}
    quotas: dict[str, int] = {}
    bursts: dict[str, int] = {}
    operations: dict[str, BurstOperation] = {}
    burst_writes: list[CgroupWrite] = []
    pods: dict[str, PodBurstState] = {}  # by uid, in the order their first container came
    for entry in containers:
        cid, uid = entry.container.container_id, entry.pod.uid
        container_quota = current.container_quota_us.get(cid, UNLIMITED)
        state = pods.get(uid) or PodBurstState(entry.pod_dir, current.pod_quota_us.get(uid, UNLIMITED))
        # Static burst, capped at the cgroup's own quota (see module docstring).
        burst = static_burst_us(entry.limit_milli, entry.config)
        if container_quota != UNLIMITED:
            burst = min(burst, container_quota)
        bursts[cid] = burst
        burst_writes.append(CgroupWrite("cpu.cfs_burst_us", entry.container_dir, burst))
        state = pods[uid] = state.with_burst(burst)
        # Dynamic quota: only containers with a CPU limit and a known quota that is burst's.
        if entry.limit_milli <= 0 or container_quota == UNLIMITED or not entry.owns_quota:
            continue
        scaling = _scale_quota(entry, snapshot, container_quota, buckets.get(cid), node_state)
        if scaling is not None and scaling.bucket is not None:
            new_buckets[cid] = scaling.bucket
        if scaling is None:
            continue
        operations[cid] = scaling.operation
        quotas[cid] = scaling.quota_us
        if scaling.quota_us != container_quota:
            note = (f"{entry.container.name} {scaling.operation.value} {container_quota}->{scaling.quota_us} "
                    f"(throttled {snapshot.container_throttled_ratio.get(cid, 0.0):.2f}, base {scaling.base_us}, "
                    f"ceil {scaling.ceil_us})")
            pods[uid] = state.with_quota(entry.container_dir, container_quota, scaling.quota_us, note)
    steps = [step for step in (state.quota_step(node_state) for state in pods.values()) if step is not None]
    burst_writes.extend(state.burst_write() for state in pods.values())
    steps.append(WriteStep(tuple(burst_writes), reason=AUDIT_REASON_BURST,
                           why="burst = CPU limit x cpuBurstPercent% x cfs period, capped at the cgroup's quota; "
                               "a pod's is the sum of its containers'"))
    return BurstDecision(
        node_state=node_state,
        steps=tuple(steps),
        buckets=MappingProxyType(new_buckets),
        container_quota_us=MappingProxyType(quotas),
        container_burst_us=MappingProxyType(bursts),
        operations=MappingProxyType(operations),
    )


@dataclass(frozen=True, slots=True)
class _QuotaBursting:
    """The pods whose containers' quota burst scales (a policy with quota burst, the node's or the pod's own):
    those whose containers' usage and throttling it reads every tick."""

    node_strategy: CPUBurstStrategy

    def __call__(self, pod: PodMeta) -> bool:
        return is_eligible(pod) and pod_burst_config(pod, self.node_strategy).policy in _QUOTA_BURST_POLICIES


@dataclass(frozen=True, slots=True)
class _Bursting:
    """The pods burst acts on every tick: those with a policy other than ``none`` (the node's or the pod's own). The
    others (idle) only have their static burst kept at 0 and their quota at its base: looked after once a fan-out
    interval (``BurstConfig.idle_every_s``)."""

    node_strategy: CPUBurstStrategy

    def __call__(self, pod: PodMeta) -> bool:
        return pod_burst_config(pod, self.node_strategy).policy != CPU_BURST_POLICY_NONE


@dataclass(frozen=True, slots=True)
class BurstConfig:
    """Burst reads its per-pod config from the snapshot (node strategy + pod annotation), so it is always on:
    pods can turn burst on by annotation even when the node policy is none."""

    window_s: float = node_state_window_s(1.0)  # of the share-pool averages
    enabled: bool = True
    quota_gates: QuotaGates = _BURST_ALONE  # the other quota writers that are on
    node_strategy: CPUBurstStrategy = field(default_factory=CPUBurstStrategy)  # the NodeSLO's (for ``needs``)
    idle_every_s: float | None = None  # idle pods (``_Bursting``) looked after this often; None: every tick

    @classmethod
    def from_node_slo(cls, spec: NodeSLOSpec, flags: QoSManagerConfig | None = None) -> BurstConfig:
        if flags is None:
            return cls(node_strategy=spec.cpu_burst_strategy)
        gates = QuotaGates(cpuset=flags.gate("CPUSetAllocator"), cpu_burst=True,
                           normalization=flags.gate("CPUNormalization"))
        idle_every_s = flags.fanout_interval_s if flags.fanout_interval_s > flags.reconcile_interval_s else None
        return cls(window_s=node_state_window_s(flags.reconcile_interval_s), quota_gates=gates,
                   node_strategy=spec.cpu_burst_strategy, idle_every_s=idle_every_s)

    @property
    def needs(self) -> Needs:
        # The share pool reads every pod at once through the besteffort dir's usage, and one pod at a time those it
        # sorts wrong; the quotas scale on their containers' usage and throttling; the quotas of idle pods are read in
        # their turn.
        acting = _Bursting(self.node_strategy)
        return Needs(node_cpu_avg_window_s=self.window_s,
                     cgroup_reads=(CgroupRead("cpu.cfs_quota_us", Scope.PODS, is_eligible, self.idle_every_s, acting),
                                   CgroupRead("cpu.cfs_quota_us", Scope.APP_CONTAINERS, is_eligible,
                                              self.idle_every_s, acting)),
                     pod_usage=_sorted_apart, container_usage=_QuotaBursting(self.node_strategy))


@dataclass(frozen=True, slots=True)
class BurstMemo:
    """Token buckets of live containers and the metric labels exported last tick (to drop gone ones)."""

    buckets: Mapping[str, TokenBucket] = field(default_factory=dict)
    labelled: Mapping[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)


def _quota(snapshot: Snapshot, cgroup_dir: str) -> int:
    raw = snapshot.cgroup_value("cpu.cfs_quota_us", cgroup_dir)
    if raw is None:
        return UNLIMITED
    try:
        return parse_quota_us(raw)
    except ValueError as exc:
        logger.debug("cannot parse the cfs quota %r of %s: %s", raw, cgroup_dir, exc)
        return UNLIMITED


def initial_fill(container_id: str) -> float:
    """Where a new container's bucket starts, in [0, 0.5) of its capacity: spread by container id, so that
    containers started together do not all burst together (Koordinator draws it at random)."""
    return zlib.crc32(container_id.encode()) / 2**32 * 0.5


def refresh_buckets(
    containers: tuple[BurstContainer, ...], previous: Mapping[str, TokenBucket], now: float
) -> dict[str, TokenBucket]:
    """Buckets for containers with a limiter: new ones start at :func:`initial_fill`; a bucket not used for
    2 × period expires (and the state stays bounded by the live containers)."""
    live: dict[str, TokenBucket] = {}
    for entry in containers:
        config = entry.config
        if config.cfs_quota_burst_period_seconds < 0 or config.policy not in _QUOTA_BURST_POLICIES:
            continue
        cid = entry.container.container_id
        bucket = previous.get(cid)
        expired = bucket is not None and now - bucket.updated_at > 2 * config.cfs_quota_burst_period_seconds
        capacity = bucket_capacity(config)
        if bucket is None or expired or bucket.capacity != capacity:
            bucket = TokenBucket(capacity, initial_fill(cid) * capacity, now)
        live[cid] = bucket
    return live


def _gauges(
    node: str, containers: tuple[BurstContainer, ...], decision: BurstDecision,
    previous: Mapping[str, tuple[tuple[str, str], ...]], unvisited: frozenset[str] = frozenset(),
) -> tuple[tuple[GaugeSet, ...], dict[str, tuple[tuple[str, str], ...]]]:
    """The containers' gauges of this tick; ``unvisited``: containers of pods left for another tick, whose series
    stay as they are."""
    gauges: list[GaugeSet] = []
    labelled: dict[str, tuple[tuple[str, str], ...]] = {cid: labels for cid, labels in previous.items()
                                                        if cid in unvisited}
    for entry in containers:
        cid = entry.container.container_id
        labels = (("node", node), ("pod_namespace", entry.pod.namespace), ("pod_name", entry.pod.name),
                  ("container_id", cid), ("container_name", entry.container.name))
        if cid in decision.container_quota_us:
            gauges.append(GaugeSet(metrics.CONTAINER_SCALED_CFS_QUOTA_US_NAME, labels,
                                   decision.container_quota_us[cid]))
        if cid in decision.container_burst_us:
            gauges.append(GaugeSet(metrics.CONTAINER_SCALED_CFS_BURST_US_NAME, labels,
                                   decision.container_burst_us[cid]))
        labelled[cid] = labels
    # Series of containers that are gone are removed: the exported set stays bounded.
    for cid, labels in previous.items():
        if labelled.get(cid) != labels:
            gauges.append(GaugeSet(metrics.CONTAINER_SCALED_CFS_QUOTA_US_NAME, labels, None))
            gauges.append(GaugeSet(metrics.CONTAINER_SCALED_CFS_BURST_US_NAME, labels, None))
    return tuple(gauges), labelled


def _normalization_ratio(snapshot: Snapshot) -> float | None:
    try:
        return node_normalization_ratio(snapshot.node.annotations)
    except AnnotationError as exc:  # the normalization hook reports it; burst scales from kubelet's limit then
        logger.debug("no CPU normalization ratio: %s", exc)
        return None


def _visits(snapshot: Snapshot, config: BurstConfig) -> tuple[Callable[[PodMeta, str], bool] | None, set[str]]:
    """Which pods this tick looks after: with ``idle_every_s``, those burst acts on and the idle ones whose quota was
    read this tick (their turn); and the containers of the eligible pods it leaves for another tick (filled in as
    ``visit`` is asked)."""
    later: set[str] = set()
    if config.idle_every_s is None:
        return None, later
    acting = _Bursting(config.node_strategy)

    def visit(pod: PodMeta, pod_dir: str) -> bool:
        if acting(pod) or snapshot.cgroup_value("cpu.cfs_quota_us", pod_dir) is not None:
            return True
        later.update(c.container_id for c in pod.containers)
        return False

    return visit, later


def decide(snapshot: Snapshot, config: BurstConfig) -> Plan:
    """Burst's plan for the eligible containers of the snapshot, with their quotas as read back."""
    memo = snapshot.memo if isinstance(snapshot.memo, BurstMemo) else BurstMemo()
    if not config.enabled:
        return Plan(memo=BurstMemo(labelled=memo.labelled))
    visit, later = _visits(snapshot, config)
    containers = eligible_containers(snapshot, snapshot.layout, config.quota_gates, _normalization_ratio(snapshot),
                                     visit)
    current = BurstCurrent(
        container_quota_us={e.container.container_id: _quota(snapshot, e.container_dir) for e in containers},
        pod_quota_us={e.pod.uid: _quota(snapshot, e.pod_dir) for e in containers},
    )
    buckets = refresh_buckets(containers, memo.buckets, snapshot.timestamp)
    decision = decide_burst(snapshot, containers, current, buckets)
    gauges, labelled = _gauges(snapshot.node.name, containers, decision, memo.labelled, frozenset(later))
    return Plan(decision.steps, gauges=gauges,
                memo=BurstMemo(MappingProxyType({**buckets, **decision.buckets}), labelled), report=decision)


STRATEGY = Strategy("cpuburst", GATE_CPU_BURST, BurstConfig, decide)


__all__ = [
    "BurstContainer",
    "BurstCurrent",
    "BurstDecision",
    "BurstOperation",
    "BurstConfig",
    "BurstMemo",
    "SharePoolState",
    "TokenBucket",
    "container_operation",
    "decide",
    "decide_burst",
    "eligible_containers",
    "scaled_quota",
    "share_pool_state",
    "static_burst_us",
]
