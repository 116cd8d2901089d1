"""BE CPU suppress: shrink what BE pods may use to what LS pods and the system leave (docs/koordinator.md §4.2).

Budget (cores): ``capacity × threshold% − podNonBEUsed − hostAppNonBE − systemUsed``, raised to
``capacity × minPercent%`` when that is set. Two policies carry it out on the besteffort cgroups:
``cpuset`` (default) gives BE pods ``ceil(budget)`` CPUs, at least 2, growing by at most ceil(10 % of
the CPUs) per tick and preferring whole physical cores; ``cfsQuota`` sets the besteffort quota
(floor 2000 µs, small changes skipped, increases capped at 10 % of capacity per tick).
Switching policy, or turning suppress off, restores what the other policy imposed.

kubelet's CPU manager (``Needs.kubelet_cpu_manager``): with the ``static`` policy the CPUs kubelet gave a
container exclusively are never BE candidates, and the cpuset policy uses Koordinator's static variant: the
besteffort and pod dirs keep the full BE cpuset, the suppressed one is written at container level only (so
kubelet's own cpuset writes never collide with ours).

``BECPUManager`` (Koordinator cpu_suppress.go recoverCPUSetForBECPUManager): suppress stands down; every tick the
besteffort quota goes back to unlimited and the besteffort dir, the BE pod dirs and the containers of BE pods
without a scheduler allocation (``scheduling.koordinator.sh/resource-status`` cpuset or NUMA resources) get the
whole BE cpuset (every CPU but reserved, SYSTEM-exclusive and LSE ones); the containers of allocated BE pods are
the cpuset hook's (their NUMA nodes' BE shared pools, hooks/cpuset.py).

The strategy reads the besteffort ``cpuset.cpus`` and ``cpu.cfs_quota_us`` through its snapshot
(``SuppressConfig.needs``) and remembers the policy it last carried out in ``Plan.memo``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from koordlet.api.annotations import AnnotationError, NodeReservation, parse_resource_status
from koordlet.api.cfsquota import BEQuotaOwner, be_quota_owner
from koordlet.api.cpupools import KUBELET_POLICY_STATIC, CPUPools, compute_cpu_pools
from koordlet.api.cpuset import format_cpu_list, parse_cpu_list
from koordlet.api.keys import ANNOTATION_RESOURCE_STATUS, RESOURCE_CPU
from koordlet.api.nodeslo import (
    CGROUP_BASE_KUBEPODS,
    CGROUP_BASE_KUBEPODS_BESTEFFORT,
    CGROUP_BASE_KUBEPODS_BURSTABLE,
    CPU_SUPPRESS_POLICY_CFS_QUOTA,
    CPU_SUPPRESS_POLICY_CPUSET,
    HostApplication,
    NodeSLOSpec,
)
from koordlet.api.pod import PodMeta
from koordlet.api.qos import KubeQoS, QoSClass
from koordlet.api.units import CFS_PERIOD_US, UNLIMITED
from koordlet.plan import CgroupWrite, GaugeSet, Plan, WriteStep
from koordlet.qosmanager import metrics
from koordlet.qosmanager.framework import (
    GATE_BE_CPU_MANAGER,
    GATE_BE_CPU_SUPPRESS,
    GATE_BE_PSI_THROTTLE,
    QoSManagerConfig,
    Strategy,
)
from koordlet.qosmanager.snapshot import (
    CgroupRead,
    Needs,
    Scope,
    Snapshot,
    container_cgroup_dir,
    parse_quota_us,
    pod_cgroup_dir,
    pod_kube_qos,
)
from koordlet.system.kubepods import KubeCgroupLayout
from koordlet.system.sysfs import CPUInfo

logger = logging.getLogger(__name__)

BE_MIN_CPUSET_CORES = 2  # beMinCPUSetCores
CPUSET_GROWTH_RATIO = 0.1  # growth per tick, of the node's CPUs
CFS_QUOTA_MIN_US = 2000
CFS_QUOTA_SKIP_RATIO = 0.01  # changes below 1 % of capacity are not written
CFS_QUOTA_INCREASE_RATIO = 0.1  # increases capped at 10 % of capacity per tick
_KUBEPODS_BASES = (CGROUP_BASE_KUBEPODS, CGROUP_BASE_KUBEPODS_BURSTABLE, CGROUP_BASE_KUBEPODS_BESTEFFORT)


@dataclass(frozen=True, slots=True)
class SuppressConfig:
    threshold_percent: int = 65
    min_percent: int | None = None
    policy: str = CPU_SUPPRESS_POLICY_CPUSET
    enabled: bool = True  # resourceUsedThresholdWithBE.enable (always with the BE CPU manager)
    be_cpu_manager: bool = False  # gate BECPUManager: suppress stands down, BE cpusets go to the share pool
    # BE PSI throttle owns the besteffort quota on cgroup v2 (api/cfsquota.be_quota_owner): suppress leaves it alone
    psi_throttle_owns_quota: bool = False

    @classmethod
    def from_node_slo(cls, spec: NodeSLOSpec, flags: QoSManagerConfig | None = None) -> SuppressConfig:
        threshold = spec.resource_used_threshold_with_be
        manager = flags is not None and flags.gate(GATE_BE_CPU_MANAGER)
        psi = flags is not None and flags.gate(GATE_BE_PSI_THROTTLE)
        return cls(
            threshold_percent=threshold.cpu_suppress_threshold_percent,
            min_percent=threshold.cpu_suppress_min_percent,
            policy=threshold.cpu_suppress_policy,
            enabled=threshold.enable or manager,
            be_cpu_manager=manager,
            psi_throttle_owns_quota=be_quota_owner(spec, suppress=True, psi_throttle=psi)
            is BEQuotaOwner.PSI_THROTTLE,
        )

    @property
    def needs(self) -> Needs:
        return _NEEDS


def _counts_as_be(pod: PodMeta) -> bool:
    # docs/koordinator.md §4.2 filters on the raw label or the kube QoS, not on the derived class.
    return pod.qos_label is QoSClass.BE or pod.effective_kube_qos is KubeQoS.BESTEFFORT


def _be_outside_besteffort(pod: PodMeta) -> bool:
    """A pod that counts as BE but whose cgroup is not under the besteffort dir (a BE label on a Burstable pod): the
    one kind of BE pod the besteffort dir's usage does not hold."""
    return _counts_as_be(pod) and pod_kube_qos(pod) is not KubeQoS.BESTEFFORT


# The budget reads every pod at once through the kubepods and besteffort dirs' usage; one pod at a time only those
# two dirs do not sort right.
_NEEDS = Needs(cgroup_reads=(CgroupRead("cpuset.cpus", Scope.BESTEFFORT),
                             CgroupRead("cpu.cfs_quota_us", Scope.BESTEFFORT)),
               kubelet_cpu_manager=True, pod_usage=_be_outside_besteffort, container_usage=None)


@dataclass(frozen=True, slots=True)
class SuppressBudget:
    """The figures of docs/koordinator.md §4.2, in cores."""

    suppress_cores: float
    pod_non_be_used_cores: float
    host_app_non_be_cores: float
    system_used_cores: float
    node_reserved_cores: float
    be_used_cores: float

    @property
    def ls_used_cores(self) -> float:
        return self.pod_non_be_used_cores + self.host_app_non_be_cores


@dataclass(frozen=True, slots=True)
class SuppressCurrent:
    """What the besteffort cgroup holds now (read through the executor before ``decide``)."""

    be_cpus: tuple[int, ...] = ()
    be_cfs_quota_us: int = UNLIMITED


@dataclass(frozen=True, slots=True)
class SuppressDecision:
    budget: SuppressBudget | None
    policy: str
    steps: tuple[WriteStep, ...] = ()
    be_cpus: tuple[int, ...] | None = None  # cpuset policy: the BE cpuset decided
    be_cfs_quota_us: int | None = None  # cfsQuota policy: the quota decided (None = unchanged)
    reason: str = ""


# ---------------------------------------------------------------------------------------- the budget


def node_cpu_pools(snapshot: Snapshot) -> CPUPools:
    """The node's CPU pools from the snapshot, by the rules the NRT reporter publishes (koordlet/api/cpupools.py):
    computed once per tick, for the cpuset candidates and for the budget's node reservation."""
    return compute_cpu_pools(snapshot.cpus, snapshot.pods, snapshot.kubelet_cpu_manager, snapshot.node.annotations)


def _node_reserved_cores(snapshot: Snapshot, reservation: NodeReservation | None) -> float:
    capacity = snapshot.node.capacity.get(RESOURCE_CPU, 0)
    allocatable = snapshot.node.allocatable.get(RESOURCE_CPU, capacity)
    reserved_milli = max(capacity - allocatable, 0)
    if reservation is not None:
        reserved_milli = max(reserved_milli, reservation.resources.get(RESOURCE_CPU, 0))
    return reserved_milli / 1000.0


def _app_base(app: HostApplication) -> str | None:
    return app.cgroup_path.base if app.cgroup_path is not None else None


def pods_cpu_used(snapshot: Snapshot) -> tuple[float, float, float] | None:
    """(all pods, non-BE pods, BE pods) CPU in cores: a BE pod is a BE-labelled or BestEffort one (docs/koordinator.md
    §4.2), pods with usage but no meta count as non-BE. From the kubepods and besteffort dirs (a pod is in the
    besteffort dir exactly when it is BestEffort) with the host applications that live inside them taken out and the
    BE-labelled pods outside the besteffort dir moved over; without those two, the sum over the pods, when the
    snapshot holds every pod's usage. None when it cannot be told."""
    pods_by_uid = {pod.uid: pod for pod in snapshot.pods}
    kubepods, besteffort = snapshot.kubepods_cpu_cores, snapshot.besteffort_cpu_cores
    if kubepods is not None and besteffort is not None:
        for app in snapshot.node_slo.host_applications:
            base = _app_base(app)
            used = snapshot.host_app_cpu_cores.get(app.name, 0.0)
            if base in _KUBEPODS_BASES:
                kubepods -= used
            if base == CGROUP_BASE_KUBEPODS_BESTEFFORT:
                besteffort -= used
        be_used = max(besteffort, 0.0) + sum(used for uid, used in snapshot.pod_cpu_cores.items()
                                             if (pod := pods_by_uid.get(uid)) is not None
                                             and _be_outside_besteffort(pod))
        all_pods_used = max(kubepods, be_used)
        return all_pods_used, all_pods_used - be_used, be_used
    if not snapshot.usage_of_every_pod:
        return None
    all_pods_used = non_be_used = be_used = 0.0
    for uid, used in snapshot.pod_cpu_cores.items():
        all_pods_used += used
        pod = pods_by_uid.get(uid)
        if pod is not None and _counts_as_be(pod):
            be_used += used
        else:
            non_be_used += used  # includes pods with metrics but no meta
    return all_pods_used, non_be_used, be_used


def suppress_budget(snapshot: Snapshot, config: SuppressConfig, pools: CPUPools | None = None) -> SuppressBudget | None:
    """Cores left to BE pods (docs/koordinator.md §4.2); None without a node CPU sample or the pods' usage.

    ``pools``: :func:`node_cpu_pools` of the snapshot when the caller has them (the node reservation comes
    from there)."""
    node_used = snapshot.node_cpu_cores
    if node_used is None:
        return None
    if pools is None:
        pools = node_cpu_pools(snapshot)
    pods_used = pods_cpu_used(snapshot)
    if pods_used is None:
        return None
    all_pods_used, non_be_used, be_used = pods_used
    capacity_cores = snapshot.capacity_cpu_milli / 1000.0
    host_apps_used = host_apps_non_be = 0.0
    for app in snapshot.node_slo.host_applications:
        used = snapshot.host_app_cpu_cores.get(app.name)
        if used is None:
            continue
        host_apps_used += used
        if not (app.qos is QoSClass.BE and _app_base(app) == CGROUP_BASE_KUBEPODS_BESTEFFORT):
            host_apps_non_be += used
    node_reserved = _node_reserved_cores(snapshot, pools.node_reservation)
    system_used = max(max(node_used - all_pods_used - host_apps_used, 0.0), node_reserved)
    suppress = capacity_cores * config.threshold_percent / 100.0 - non_be_used - host_apps_non_be - system_used
    if config.min_percent is not None:
        suppress = max(suppress, capacity_cores * config.min_percent / 100.0)
    return SuppressBudget(
        suppress_cores=suppress,
        pod_non_be_used_cores=non_be_used,
        host_app_non_be_cores=host_apps_non_be,
        system_used_cores=system_used,
        node_reserved_cores=node_reserved,
        be_used_cores=be_used,
    )


# ------------------------------------------------------------------------------------------- cpuset


@dataclass(frozen=True, slots=True)
class CPUBuckets:
    """CPUs BE pods may be given: those shared with LSR pods and the rest (LS)."""

    lsr: tuple[CPUInfo, ...] = ()
    ls: tuple[CPUInfo, ...] = ()

    @property
    def all_ids(self) -> tuple[int, ...]:
        return tuple(sorted(c.cpu_id for c in (*self.lsr, *self.ls)))


def kubelet_static(snapshot: Snapshot) -> bool:
    state = snapshot.kubelet_cpu_manager
    return state is not None and getattr(state, "policy", "") == KUBELET_POLICY_STATIC


def candidate_buckets(snapshot: Snapshot, pools: CPUPools | None = None) -> CPUBuckets:
    """The BE shared pool (``pools``, :func:`node_cpu_pools` of the snapshot): all CPUs − node-reserved −
    SYSTEM-exclusive − LSE-bound − kubelet-exclusive (static policy), exactly what the NRT tells the scheduler BE
    may use; the CPUs of LSR pods form the LSR bucket (docs/koordinator.md §4.2)."""
    if pools is None:
        pools = node_cpu_pools(snapshot)
    be_cpus = pools.be_shared_cpus
    lsr_pods = {pod.uid for pod in snapshot.pods if pod.qos_label is QoSClass.LSR}
    lsr_cpus = {cpu for alloc in pools.pod_allocs if alloc.uid in lsr_pods and not alloc.managed_by_kubelet
                for cpu in alloc.cpus}
    usable = [cpu for cpu in snapshot.cpus if cpu.cpu_id in be_cpus]
    return CPUBuckets(
        lsr=tuple(c for c in usable if c.cpu_id in lsr_cpus),
        ls=tuple(c for c in usable if c.cpu_id not in lsr_cpus),
    )


def select_cpus(bucket: Sequence[CPUInfo], count: int) -> list[int]:
    """``count`` CPUs of ``bucket``: groups by (NUMA node, socket), each sorted by (core, cpu); groups visited
    largest first, round-robin, taking both hyper-threads of a core while ≥ 2 are still needed, then single
    CPUs round-robin (docs/koordinator.md §4.2)."""
    if count <= 0:
        return []
    groups: dict[tuple[int, int], dict[int, list[int]]] = {}
    for cpu in sorted(bucket, key=lambda c: (c.core_id, c.cpu_id)):
        groups.setdefault((cpu.node_id, cpu.socket_id), {}).setdefault(cpu.core_id, []).append(cpu.cpu_id)
    # Largest group first; ties in (node, socket) order.
    ordered = [
        [list(cpus) for cpus in cores.values()]
        for _, cores in sorted(groups.items(), key=lambda item: (-sum(map(len, item[1].values())), item[0]))
    ]
    chosen: list[int] = []
    remaining = _round_robin(ordered, count, 2, chosen)
    _round_robin(ordered, remaining, 1, chosen)
    return sorted(chosen)


def _round_robin(groups: list[list[list[int]]], remaining: int, per_core: int, chosen: list[int]) -> int:
    """Visit ``groups`` round-robin, taking ``per_core`` CPUs from the first core of each group that still has
    that many, while ``remaining`` needs them and a round takes any; returns what is left to take."""
    progress = True
    while remaining >= per_core and progress:
        progress = False
        for cores in groups:
            if remaining < per_core:
                break
            for core in cores:
                if len(core) >= per_core:
                    chosen.extend(core[:per_core])
                    del core[:per_core]
                    remaining -= per_core
                    progress = True
                    break
    return remaining


def be_cpuset_size(budget_cores: float, current_size: int, num_cpus: int, candidates: int) -> int:
    """ceil(budget), at least 2, growing by at most ceil(10 % of the CPUs) above the current size.

    docs/koordinator.md §4.2."""
    size = max(math.ceil(budget_cores), BE_MIN_CPUSET_CORES)
    if current_size > 0:
        size = min(size, current_size + math.ceil(CPUSET_GROWTH_RATIO * num_cpus))
    return min(size, candidates)


def choose_be_cpus(buckets: CPUBuckets, size: int) -> tuple[int, ...]:
    """Split ``size`` between the buckets by their sizes: nLSR = floor(size × |LSR| / (|LSR| + |LS|))."""
    total = len(buckets.lsr) + len(buckets.ls)
    if total == 0 or size <= 0:
        return ()
    n_lsr = size * len(buckets.lsr) // total
    n_ls = size - n_lsr
    return tuple(sorted(select_cpus(buckets.lsr, n_lsr) + select_cpus(buckets.ls, n_ls)))


def be_cgroup_dirs(layout: KubeCgroupLayout, pods: Iterable[PodMeta], containers_only: bool = False) -> tuple[str, ...]:
    """The besteffort QoS dir, the pod dirs under it and their container dirs (only these: ``containers_only``)."""
    dirs = [] if containers_only else [layout.qos_dir(KubeQoS.BESTEFFORT)]
    for pod in pods:
        if pod.effective_kube_qos is not KubeQoS.BESTEFFORT:
            continue
        pod_dir = pod_cgroup_dir(layout, pod)
        if pod_dir is None:
            continue
        if not containers_only:
            dirs.append(pod_dir)
        for container in pod.containers:
            container_dir = container_cgroup_dir(layout, pod_dir, container)
            if container_dir is not None:
                dirs.append(container_dir)
    return tuple(dirs)


def _cpuset_step(dirs: Sequence[str], cpus: Sequence[int]) -> WriteStep:
    value = format_cpu_list(cpus)
    return WriteStep(tuple(CgroupWrite("cpuset.cpus", d, value) for d in dirs), leveled=True)


def _cpuset_steps(layout: KubeCgroupLayout, pods: Sequence[PodMeta], cpus: Sequence[int],
                  full: Sequence[int], static: bool) -> tuple[WriteStep, ...]:
    """The BE cpuset writes: on every besteffort dir; with kubelet's static policy, the QoS and pod dirs get the
    full BE cpuset (``full``) and only the containers the suppressed one."""
    dirs = be_cgroup_dirs(layout, pods)
    if not static:
        return (_cpuset_step(dirs, cpus),)
    containers = set(be_cgroup_dirs(layout, pods, containers_only=True))
    upper = [d for d in dirs if d not in containers]
    steps = [_cpuset_step(upper, full)] if full else []
    if containers:
        steps.append(_cpuset_step(sorted(containers), cpus))
    return tuple(steps)


# ------------------------------------------------------------------------------------------ cfsQuota


def decide_cfs_quota(budget_cores: float, current_quota_us: int, capacity_cores: float) -> int | None:
    """The besteffort quota to write, or None to leave it (docs/koordinator.md §4.2 cfsQuota policy)."""
    wanted = max(int(budget_cores * CFS_PERIOD_US), CFS_QUOTA_MIN_US)
    if current_quota_us != UNLIMITED:
        if abs(wanted - current_quota_us) < capacity_cores * CFS_PERIOD_US * CFS_QUOTA_SKIP_RATIO and (
            wanted != CFS_QUOTA_MIN_US
        ):
            return None
        if wanted > current_quota_us:
            wanted = min(wanted, current_quota_us + int(capacity_cores * CFS_PERIOD_US * CFS_QUOTA_INCREASE_RATIO))
    return None if wanted == current_quota_us else wanted


# --------------------------------------------------------------------------------------------- decide


def decide_suppress(
    snapshot: Snapshot,
    config: SuppressConfig,
    current: SuppressCurrent,
    layout: KubeCgroupLayout,
    previous_policy: str | None = None,
) -> SuppressDecision:
    """What suppress writes this tick: the policy's limit, plus a restore of the other policy's limit when
    the policy changed since ``previous_policy``."""
    pools = node_cpu_pools(snapshot)
    budget = suppress_budget(snapshot, config, pools)
    be_qos_dir = layout.qos_dir(KubeQoS.BESTEFFORT)
    buckets = candidate_buckets(snapshot, pools)
    static = kubelet_static(snapshot)
    steps: list[WriteStep] = []
    switched = previous_policy is not None and previous_policy != config.policy
    if switched and config.policy == CPU_SUPPRESS_POLICY_CFS_QUOTA and buckets.all_ids:
        steps.extend(_cpuset_steps(layout, snapshot.pods, buckets.all_ids, buckets.all_ids, static))
    # Into the cpuset policy, and at the first tick under it: the quota suppress owns is unlimited (a limit left by
    # the cfsQuota policy, or by BE PSI throttle before its gate went off, goes)
    first = previous_policy is None and current.be_cfs_quota_us != UNLIMITED
    if (switched or first) and config.policy == CPU_SUPPRESS_POLICY_CPUSET:
        steps.append(WriteStep((CgroupWrite("cpu.cfs_quota_us", be_qos_dir, UNLIMITED),)))
    if budget is None:
        return SuppressDecision(None, config.policy, tuple(steps), reason="no node CPU sample")
    if config.policy == CPU_SUPPRESS_POLICY_CPUSET:
        size = be_cpuset_size(
            budget.suppress_cores, len(current.be_cpus), snapshot.num_cpus, len(buckets.all_ids)
        )
        cpus = choose_be_cpus(buckets, size)
        if cpus:
            steps.extend(_cpuset_steps(layout, snapshot.pods, cpus, buckets.all_ids, static))
        return SuppressDecision(budget, config.policy, tuple(steps), be_cpus=cpus)
    quota = decide_cfs_quota(budget.suppress_cores, current.be_cfs_quota_us, snapshot.capacity_cpu_milli / 1000.0)
    if quota is not None:
        steps.append(WriteStep((CgroupWrite("cpu.cfs_quota_us", be_qos_dir, quota),)))
    return SuppressDecision(budget, config.policy, tuple(steps), be_cfs_quota_us=quota)


def _allocated(pod: PodMeta) -> bool:
    """The scheduler gave the pod a cpuset or NUMA resources (resource-status): its containers are the hook's."""
    raw = pod.annotations.get(ANNOTATION_RESOURCE_STATUS)
    if not raw:
        return False
    try:
        status = parse_resource_status(raw)
    except AnnotationError:
        return False
    return bool(status.cpuset or status.numa_node_resources)


def decide_be_cpu_manager(snapshot: Snapshot, layout: KubeCgroupLayout) -> tuple[WriteStep, ...]:
    """BECPUManager: quota unlimited; the whole BE cpuset on the besteffort and BE pod dirs and on the containers
    of BE pods the scheduler did not allocate."""
    buckets = candidate_buckets(snapshot)
    steps = [WriteStep((CgroupWrite("cpu.cfs_quota_us", layout.qos_dir(KubeQoS.BESTEFFORT), UNLIMITED,
                                    "BECPUManager: besteffort quota unlimited"),))]
    if buckets.all_ids:
        hook_owned = set(be_cgroup_dirs(layout, [p for p in snapshot.pods if _allocated(p)], containers_only=True))
        dirs = [d for d in be_cgroup_dirs(layout, snapshot.pods) if d not in hook_owned]
        steps.append(_cpuset_step(dirs, buckets.all_ids))
    return tuple(steps)


def decide_restore(snapshot: Snapshot, layout: KubeCgroupLayout) -> tuple[WriteStep, ...]:
    """Undo suppress: BE cpuset back to every candidate CPU, besteffort quota unlimited."""
    buckets = candidate_buckets(snapshot)
    steps = [WriteStep((CgroupWrite("cpu.cfs_quota_us", layout.qos_dir(KubeQoS.BESTEFFORT), UNLIMITED),))]
    if buckets.all_ids:
        steps.extend(_cpuset_steps(layout, snapshot.pods, buckets.all_ids, buckets.all_ids, kubelet_static(snapshot)))
    return tuple(steps)


# ------------------------------------------------------------------------------------------- strategy


@dataclass(frozen=True, slots=True)
class SuppressMemo:
    """What suppress remembers between ticks: the policy it last carried out."""

    last_policy: str | None = None


def current_of(snapshot: Snapshot) -> SuppressCurrent:
    """What the besteffort cgroup held when the snapshot was taken (its ``needs`` reads)."""
    be_dir = snapshot.layout.qos_dir(KubeQoS.BESTEFFORT)
    cpus: tuple[int, ...] = ()
    quota = UNLIMITED
    raw = snapshot.cgroup_value("cpuset.cpus", be_dir)
    if raw is not None:
        try:
            cpus = parse_cpu_list(raw)
        except ValueError as exc:
            logger.debug("cannot parse the besteffort cpuset %r: %s", raw, exc)
    raw = snapshot.cgroup_value("cpu.cfs_quota_us", be_dir)
    if raw is not None:
        try:
            quota = parse_quota_us(raw)
        except ValueError as exc:
            logger.debug("cannot parse the besteffort cfs quota %r: %s", raw, exc)
    return SuppressCurrent(be_cpus=cpus, be_cfs_quota_us=quota)


def _gauges(node: str, decision: SuppressDecision) -> tuple[GaugeSet, ...]:
    gauges: list[GaugeSet] = []
    if decision.budget is not None:
        gauges.append(GaugeSet(metrics.BE_SUPPRESS_LS_USED_CPU_CORES_NAME, (("node", node),),
                               decision.budget.ls_used_cores))
        gauges.append(GaugeSet(metrics.BE_SUPPRESS_BE_USED_CPU_CORES_NAME, (("node", node),),
                               decision.budget.be_used_cores))
    if decision.be_cpus is not None:
        gauges.append(GaugeSet(metrics.BE_SUPPRESS_CPU_CORES_NAME, (("node", node), ("type", "cpuset")),
                               len(decision.be_cpus)))
    if decision.be_cfs_quota_us is not None:
        gauges.append(GaugeSet(metrics.BE_SUPPRESS_CPU_CORES_NAME, (("node", node), ("type", "cfsQuota")),
                               decision.be_cfs_quota_us / CFS_PERIOD_US))
    return tuple(gauges)


AUDIT_REASON = "AdjustBEByNodeCPUUsage"  # Koordinator's audit reason for suppress writes


def budget_why(snapshot: Snapshot, config: SuppressConfig, decision: SuppressDecision) -> str:
    """The audit log's why of a suppress plan: the docs/koordinator.md §4.2 budget with its figures."""
    budget = decision.budget
    if budget is None:
        return f"policy {config.policy}: {decision.reason or 'no budget'}"
    capacity = snapshot.capacity_cpu_milli / 1000.0
    text = (f"policy {config.policy}: BE budget {budget.suppress_cores:.2f} cores = {capacity:g} cores x "
            f"{config.threshold_percent}% - LS pods {budget.pod_non_be_used_cores:.2f} - host apps "
            f"{budget.host_app_non_be_cores:.2f} - system {budget.system_used_cores:.2f} (reserved "
            f"{budget.node_reserved_cores:.2f}); BE pods use {budget.be_used_cores:.2f}")
    if config.min_percent is not None:
        text += f"; floor {config.min_percent}% of capacity"
    return text


def _without_be_quota(steps: tuple[WriteStep, ...], layout: KubeCgroupLayout) -> tuple[WriteStep, ...]:
    """``steps`` less the besteffort quota writes (BE PSI throttle owns that quota)."""
    be_dir = layout.qos_dir(KubeQoS.BESTEFFORT)
    kept = (WriteStep(tuple(w for w in step.writes if (w.resource, w.cgroup_dir) != ("cpu.cfs_quota_us", be_dir)),
                      step.leveled, step.reason, step.why) for step in steps)
    return tuple(step for step in kept if step.writes)


def decide(snapshot: Snapshot, config: SuppressConfig) -> Plan:
    """Suppress's plan: the policy's limit (plus the restore of the other policy's after a switch); with
    suppress switched off, the restore of both. The besteffort quota is left to BE PSI throttle where that owns it
    (cgroup v2, koordlet/api/cfsquota.py)."""
    yields = config.psi_throttle_owns_quota and snapshot.cgroup_v2
    if config.be_cpu_manager:
        steps = decide_be_cpu_manager(snapshot, snapshot.layout)
        return Plan(_without_be_quota(steps, snapshot.layout) if yields else steps, memo=SuppressMemo())
    if not config.enabled:
        steps = decide_restore(snapshot, snapshot.layout)
        return Plan(_without_be_quota(steps, snapshot.layout) if yields else steps, memo=SuppressMemo(),
                    reason=AUDIT_REASON, why="suppress off (resourceUsedThresholdWithBE.enable false): BE limits "
                                             "restored")
    memo = snapshot.memo if isinstance(snapshot.memo, SuppressMemo) else SuppressMemo()
    decision = decide_suppress(snapshot, config, current_of(snapshot), snapshot.layout, memo.last_policy)
    steps = _without_be_quota(decision.steps, snapshot.layout) if yields else decision.steps
    why = budget_why(snapshot, config, decision) if steps else ""
    return Plan(steps, gauges=_gauges(snapshot.node.name, decision), memo=SuppressMemo(config.policy),
                report=decision, reason=AUDIT_REASON, why=why)


STRATEGY = Strategy("cpusuppress", GATE_BE_CPU_SUPPRESS, SuppressConfig, decide)
