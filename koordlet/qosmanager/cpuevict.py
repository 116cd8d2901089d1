"""CPU eviction (``BECPUEvict``, ``CPUAllocatableEvict``, ``CPUEvict``; docs/koordinator.md §4.4, Koordinator
qosmanager/plugins/cpuevict).

One strategy runs the three features in Koordinator's order (BE satisfaction, allocatable, node usage) as the
tasks of one plan: a pod evicted by an earlier task counts for the later ones. Each feature needs its gate and
``resourceUsedThresholdWithBE.enable``; the strategy rests 20 s after an eviction and for the first 20 s
after start.

``BECPUEvict``: over a window of max(collect interval, ``cpuEvictTimeWindowSeconds``) the BE usage, request and
real limit (``node_be`` series, milli-cores) are averaged; at least window/3 seconds of samples are required. The BE
limit is the real limit (min of BE cpuset size × 1000 and the besteffort quota) or, with
``evictByAllocatable``, the node's allocatable batch-cpu (0 → 1 milli). It triggers only when BE pods use
≥ ``cpuEvictBEUsageThresholdPercent`` (90) of the limit (a limit below one core always passes) and the
satisfaction limit/request ≤ lower%: release = request × (upper% − satisfaction), taking the smaller of
the figure from averages and from the last samples (when request or limit changed). Victims: BE pods by
spec.priority ascending, then usage/request descending; each releases its batch-cpu request. Inert until
both satisfaction bounds are set (lower in (0, 60], upper in (0, 100), upper ≥ lower).

``CPUEvict``: the node's CPU usage averaged over the same window, usage% = used milli × 100 // capacity
milli; at or above ``cpuEvictThresholdPercent`` it releases capacity × (usage% − lower%) / 100 milli-cores,
lower = ``cpuEvictLowerPercent`` or threshold − 2, from the pods that opted in (``koordinator.sh/eviction-
enabled``) at or below ``evictEnabledPriorityThreshold`` and have a usage sample, in the opt-in order
(:mod:`koordlet.api.eviction`) and then CPU used descending; each releases its CPU used.

``CPUAllocatableEvict``: Σ cpu requests of the pods at or below ``allocatableEvictPriorityThreshold`` (≤ 7999)
per resource (``kubernetes.io/batch-cpu`` of koord-batch pods, ``kubernetes.io/mid-cpu`` of koord-mid pods)
against the node's allocatable: above ``cpuAllocatableEvictThresholdPercent`` it releases requested −
allocatable × lower% / 100 (all when the node has none), from the opted-in pods of that class with a usage
sample, in the opt-in order and then request descending; each releases its request (only pods that free some
of the over-committed resource are taken; Koordinator walks every opted-in pod).
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass

from koordlet.api.eviction import be_rule, opt_in_rule
from koordlet.api.keys import RESOURCE_BATCH_CPU, RESOURCE_CPU
from koordlet.api.nodeslo import CPU_EVICT_POLICY_ALLOCATABLE, CPU_EVICT_POLICY_REAL_LIMIT, NodeSLOSpec
from koordlet.plan import Evictions, Plan, Victim, planned_victims
from koordlet.qosmanager.framework import (
    GATE_BE_CPU_EVICT,
    GATE_CPU_ALLOCATABLE_EVICT,
    GATE_CPU_EVICT,
    QoSManagerConfig,
    Strategy,
)
from koordlet.qosmanager.snapshot import (
    BECPUWindow,
    Needs,
    Snapshot,
    every_pod,
    is_be,
    pod_batch_cpu_request_milli,
)
from koordlet.qosmanager.victims import (
    allocatable_invalid,
    allocatable_tasks,
    eviction_task,
    rest,
    tasks_plan,
    usage_task,
)
from koordlet.qosmanager.victims import usage_release as node_usage_release

logger = logging.getLogger(__name__)

DEFAULT_COOL_TIME_S = 20.0
CPU_RELEASE_BUFFER_PERCENT = 2  # CPUEvict's lower percent when unset: threshold − 2
FEATURES = (GATE_BE_CPU_EVICT, GATE_CPU_ALLOCATABLE_EVICT, GATE_CPU_EVICT)  # Koordinator's order


@dataclass(frozen=True, slots=True)
class CPUEvictConfig:
    upper_percent: int | None = None
    lower_percent: int | None = None
    usage_threshold_percent: int = 90
    time_window_s: int | None = None
    policy: str = CPU_EVICT_POLICY_REAL_LIMIT
    enabled: bool = True  # resourceUsedThresholdWithBE.enable
    collect_interval_s: float = 1.0  # flag -collect-res-used-interval
    cool_time_s: float = DEFAULT_COOL_TIME_S  # flag -cpu-evict-cool-time-seconds
    started_at: float | None = None  # the agent's start (wall clock): rests the cool time after it
    features: tuple[str, ...] = (GATE_BE_CPU_EVICT,)  # the gates that are on, in FEATURES order
    threshold_percent: int | None = None  # CPUEvict: cpuEvictThresholdPercent
    lower_percent_usage: int | None = None  # CPUEvict: cpuEvictLowerPercent
    evict_enabled_priority_threshold: int | None = None
    allocatable_threshold_percent: int | None = None  # CPUAllocatableEvict
    allocatable_lower_percent: int | None = None
    allocatable_priority_threshold: int | None = None

    @classmethod
    def from_node_slo(cls, spec: NodeSLOSpec, flags: QoSManagerConfig | None = None) -> CPUEvictConfig:
        t = spec.resource_used_threshold_with_be
        flags = flags or QoSManagerConfig(cpu_evict_cool_time_s=DEFAULT_COOL_TIME_S)
        return cls(
            upper_percent=t.cpu_evict_be_satisfaction_upper_percent,
            lower_percent=t.cpu_evict_be_satisfaction_lower_percent,
            usage_threshold_percent=t.cpu_evict_be_usage_threshold_percent,
            time_window_s=t.cpu_evict_time_window_seconds,
            policy=t.cpu_evict_policy,
            enabled=t.enable,
            collect_interval_s=flags.collect_res_used_interval_s,
            cool_time_s=flags.cpu_evict_cool_time_s,
            started_at=flags.started_at,
            features=tuple(f for f in FEATURES if flags.gate(f)),
            threshold_percent=t.cpu_evict_threshold_percent,
            lower_percent_usage=t.cpu_evict_lower_percent,
            evict_enabled_priority_threshold=t.evict_enabled_priority_threshold,
            allocatable_threshold_percent=t.cpu_allocatable_evict_threshold_percent,
            allocatable_lower_percent=t.cpu_allocatable_evict_lower_percent,
            allocatable_priority_threshold=t.allocatable_evict_priority_threshold,
        )

    @property
    def needs(self) -> Needs:
        window = self.window_s(self.collect_interval_s)
        # The victims are sorted by their CPU: BE pods, and with the features that may take any pod, every pod.
        return Needs(be_window_s=window if GATE_BE_CPU_EVICT in self.features else None,
                     node_cpu_avg_window_s=window if GATE_CPU_EVICT in self.features else None,
                     pod_usage=is_be if set(self.features) <= {GATE_BE_CPU_EVICT} else every_pod,
                     container_usage=None)

    @property
    def effective_lower_percent_usage(self) -> int | None:
        if self.lower_percent_usage is not None:
            return self.lower_percent_usage
        return None if self.threshold_percent is None else self.threshold_percent - CPU_RELEASE_BUFFER_PERCENT

    def invalid(self, feature: str) -> str | None:
        """Why ``feature`` cannot run with this config (Koordinator's config checks); None when it can."""
        if feature == GATE_BE_CPU_EVICT:
            return None if self.valid else "satisfaction bounds not set or invalid"
        if feature == GATE_CPU_ALLOCATABLE_EVICT:
            return allocatable_invalid(self.allocatable_threshold_percent, self.allocatable_lower_percent,
                                       self.allocatable_priority_threshold)
        lower = self.effective_lower_percent_usage
        if self.threshold_percent is None or lower is None:
            return "cpuEvictThresholdPercent is not set"
        if lower >= self.threshold_percent:
            return f"lower percent {lower} is not below the threshold {self.threshold_percent}"
        if self.evict_enabled_priority_threshold is None:
            return "evictEnabledPriorityThreshold is not set"
        return None

    @property
    def valid(self) -> bool:
        upper, lower = self.upper_percent, self.lower_percent
        if upper is None or lower is None:
            return False
        return 0 < lower <= 60 and 0 < upper < 100 and upper >= lower

    def window_s(self, collect_interval_s: float) -> float:
        return max(collect_interval_s, float(self.time_window_s or 0))


@dataclass(frozen=True, slots=True)
class CPUEvictDecision:
    release_milli: float
    satisfaction: float | None
    candidates: tuple[Victim, ...] = ()
    victims: tuple[Victim, ...] = ()
    reason: str = ""

    @property
    def triggered(self) -> bool:
        return self.release_milli > 0


def release_for(usage_milli: float, request_milli: float, limit_milli: float, config: CPUEvictConfig) -> float:
    """Milli-cores to release for one set of figures (0 when not triggered)."""
    assert config.upper_percent is not None and config.lower_percent is not None
    if request_milli <= 0:
        return 0.0
    if limit_milli >= 1000 and usage_milli * 100.0 / limit_milli < config.usage_threshold_percent:
        return 0.0
    satisfaction = limit_milli / request_milli
    if satisfaction > config.lower_percent / 100.0:
        return 0.0
    return request_milli * (config.upper_percent / 100.0 - satisfaction)


def cpu_victims(snapshot: Snapshot) -> tuple[Victim, ...]:
    """BE pods by priority ascending, then usage/request descending; each releases its batch-cpu request."""

    def ratio(victim: Victim) -> float:
        used_milli = snapshot.pod_cpu_cores.get(victim.pod.uid, 0.0) * 1000.0
        return used_milli / victim.releases if victim.releases > 0 else 0.0

    victims = [Victim(pod, float(pod_batch_cpu_request_milli(pod))) for pod in snapshot.pods if is_be(pod)]
    victims.sort(key=lambda v: (v.pod.priority or 0, -ratio(v)))
    return tuple(victims)


def decide_release(snapshot: Snapshot, config: CPUEvictConfig, evicting: Collection[str] = ()) -> CPUEvictDecision:
    if not config.valid:
        return CPUEvictDecision(0.0, None, reason="satisfaction bounds not set or invalid")
    if any(is_be(pod) and not pod.requests_known for pod in snapshot.pods):
        # Satisfaction and what a victim releases are batch-cpu requests: not known (the CRI pod source).
        return CPUEvictDecision(0.0, None, reason="BE pods' batch-cpu requests are not known")
    window: BECPUWindow | None = snapshot.be_cpu
    if window is None:
        return CPUEvictDecision(0.0, None, reason="no BE metrics")
    if window.samples * snapshot.collect_interval_s < window.window_s / 3:
        return CPUEvictDecision(0.0, None, reason="too few samples in the window")
    avg_limit, last_limit = window.avg_real_limit_milli, window.last_real_limit_milli
    if config.policy == CPU_EVICT_POLICY_ALLOCATABLE:
        allocatable = float(snapshot.node.allocatable.get(RESOURCE_BATCH_CPU, 0)) or 1.0
        avg_limit = last_limit = allocatable
    release = release_for(window.avg_usage_milli, window.avg_request_milli, avg_limit, config)
    unchanged = window.last_request_milli == window.avg_request_milli and last_limit == avg_limit
    if release > 0 and not unchanged:
        release = min(release, release_for(window.last_usage_milli, window.last_request_milli, last_limit, config))
    satisfaction = avg_limit / window.avg_request_milli if window.avg_request_milli > 0 else None
    if release <= 0:
        return CPUEvictDecision(0.0, satisfaction)
    candidates = cpu_victims(snapshot)
    victims = planned_victims(candidates, release, frozenset(evicting), be_rule(GATE_BE_CPU_EVICT))
    return CPUEvictDecision(release, satisfaction, candidates, victims)


def _be_task(snapshot: Snapshot, config: CPUEvictConfig) -> tuple[tuple[Evictions, ...], object]:
    decision = decide_release(snapshot, config)
    if not decision.triggered:
        return (), decision
    window = snapshot.be_cpu
    assert window is not None
    reason = (f"BE CPU satisfaction {decision.satisfaction:.3f} (limit {window.avg_real_limit_milli:.0f}m / "
              f"request {window.avg_request_milli:.0f}m, usage {window.avg_usage_milli:.0f}m) <= "
              f"{config.lower_percent}%, releasing {decision.release_milli:.0f}m to reach {config.upper_percent}%")
    counts = {pod.uid: float(pod_batch_cpu_request_milli(pod)) for pod in snapshot.pods}
    task = eviction_task(GATE_BE_CPU_EVICT, decision.release_milli, decision.candidates,
                         lambda v: f"{reason}; this pod requests {v.releases:.0f}m batch-cpu", reason, counts=counts)
    return (task,), decision


@dataclass(frozen=True, slots=True)
class UsageDecision:
    """``CPUEvict``'s figures: the node's average CPU use over the window and what to release."""

    used_milli: float | None
    usage_percent: int | None
    release_milli: int
    candidates: tuple[Victim, ...] = ()
    victims: tuple[Victim, ...] = ()


def usage_release(snapshot: Snapshot, config: CPUEvictConfig) -> UsageDecision:
    """``CPUEvict``: release capacity × (usage% − lower%) / 100 when the window's average usage% reaches the
    threshold (integer percents, as Koordinator computes them)."""
    capacity = snapshot.capacity_cpu_milli
    if snapshot.node_cpu_avg_cores is None or capacity <= 0:
        return UsageDecision(None, None, 0)
    assert config.threshold_percent is not None and config.effective_lower_percent_usage is not None
    used_milli = int(snapshot.node_cpu_avg_cores * 1000)
    usage_percent, release = node_usage_release(used_milli, capacity, config.threshold_percent,
                                                 config.effective_lower_percent_usage)
    return UsageDecision(used_milli, usage_percent, release)


def _usage_task(snapshot: Snapshot, config: CPUEvictConfig) -> tuple[tuple[Evictions, ...], object]:
    decision = usage_release(snapshot, config)
    if decision.release_milli <= 0:
        return (), decision
    assert config.evict_enabled_priority_threshold is not None
    rule = opt_in_rule(GATE_CPU_EVICT, config.evict_enabled_priority_threshold)
    reason = (f"node CPU usage {decision.usage_percent}% ({decision.used_milli:.0f}m of "
              f"{snapshot.capacity_cpu_milli}m) >= threshold {config.threshold_percent}%, releasing "
              f"{decision.release_milli}m down to {config.effective_lower_percent_usage}%")
    used_milli = {uid: float(int(cores * 1000)) for uid, cores in snapshot.pod_cpu_cores.items()}
    task, candidates, planned = usage_task(snapshot, rule, float(decision.release_milli), used_milli, reason,
                                           lambda used: f"{used:.0f}m")
    return (task,), UsageDecision(decision.used_milli, decision.usage_percent, decision.release_milli,
                                  candidates, planned)


def _allocatable_tasks(snapshot: Snapshot, config: CPUEvictConfig) -> tuple[tuple[Evictions, ...], object]:
    assert (config.allocatable_threshold_percent is not None and config.allocatable_lower_percent is not None
            and config.allocatable_priority_threshold is not None)
    rule = opt_in_rule(GATE_CPU_ALLOCATABLE_EVICT, config.allocatable_priority_threshold)
    if any(not pod.requests_known for pod in snapshot.pods):
        return (), "pods' requests are not known"
    return allocatable_tasks(snapshot, RESOURCE_CPU, rule, config.allocatable_threshold_percent,
                             config.allocatable_lower_percent, snapshot.pod_cpu_cores, "m")


def decide(snapshot: Snapshot, config: CPUEvictConfig) -> Plan:
    """Evict to bring BE CPU satisfaction back to upper%, the requests of the low-priority classes under the
    allocatable threshold, and the node's usage under the threshold (each feature that is on, in that order);
    rests the cool time after start and after an eviction."""
    initial = float("-inf") if config.started_at is None else config.started_at + config.cool_time_s
    memo = rest(snapshot, config.cool_time_s, initial)
    if not config.enabled or snapshot.timestamp < memo.resting_until:
        return Plan(memo=memo)
    return tasks_plan(config.features, config.invalid, {
        GATE_BE_CPU_EVICT: lambda: _be_task(snapshot, config),
        GATE_CPU_ALLOCATABLE_EVICT: lambda: _allocatable_tasks(snapshot, config),
        GATE_CPU_EVICT: lambda: _usage_task(snapshot, config),
    }, memo)


STRATEGY = Strategy("cpuevict", FEATURES, CPUEvictConfig, decide)
