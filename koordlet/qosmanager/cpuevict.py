"""BE CPU satisfaction eviction (``BECPUEvict``, koordinator.md §4.4).

Over a window of max(collect interval, ``cpuEvictTimeWindowSeconds``) the BE usage, request and real limit
(``node_be`` series, milli-cores) are averaged; at least window/3 seconds of samples are required. The BE
limit is the real limit (min of BE cpuset size × 1000 and the besteffort quota) or, with
``evictByAllocatable``, the node's allocatable batch-cpu (0 → 1 milli). It triggers only when BE pods use
≥ ``cpuEvictBEUsageThresholdPercent`` (90) of the limit (a limit below one core always passes) and the
satisfaction limit/request ≤ lower%: release = request × (upper% − satisfaction), taking the smaller of
the figure from averages and from the last samples (when request or limit changed). Victims: BE pods by
spec.priority ascending, then usage/request descending; each releases its batch-cpu request. The strategy
rests 20 s after an eviction and for the first 20 s after start. Inert until both satisfaction bounds are
set (lower in (0, 60], upper in (0, 100), upper ≥ lower).
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass

from koordlet.api.keys import RESOURCE_BATCH_CPU
from koordlet.api.nodeslo import CPU_EVICT_POLICY_ALLOCATABLE, CPU_EVICT_POLICY_REAL_LIMIT, NodeSLOSpec
from koordlet.plan import Plan, Victim, planned_victims
from koordlet.qosmanager.framework import GATE_BE_CPU_EVICT, QoSManagerConfig, Strategy
from koordlet.qosmanager.snapshot import BECPUWindow, Needs, Snapshot, is_be, pod_batch_cpu_request_milli
from koordlet.qosmanager.victims import eviction_plan, rest

logger = logging.getLogger(__name__)

DEFAULT_COOL_TIME_S = 20.0


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
        )

    @property
    def needs(self) -> Needs:
        return Needs(be_window_s=self.window_s(self.collect_interval_s))

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
    victims = planned_victims(candidates, release, frozenset(evicting))
    return CPUEvictDecision(release, satisfaction, candidates, victims)


def decide(snapshot: Snapshot, config: CPUEvictConfig) -> Plan:
    """Evict BE pods to bring BE CPU satisfaction back to upper%; rests the cool time after start and after
    an eviction."""
    initial = float("-inf") if config.started_at is None else config.started_at + config.cool_time_s
    memo = rest(snapshot, config.cool_time_s, initial)
    if not config.enabled or snapshot.timestamp < memo.resting_until:
        return Plan(memo=memo)
    decision = decide_release(snapshot, config)
    if not decision.triggered:
        return Plan(memo=memo, report=decision)
    window = snapshot.be_cpu
    assert window is not None

    def message(victim: Victim) -> str:
        return (
            f"BE CPU satisfaction {decision.satisfaction:.3f} (limit {window.avg_real_limit_milli:.0f}m / "
            f"request {window.avg_request_milli:.0f}m, usage {window.avg_usage_milli:.0f}m) <= "
            f"{config.lower_percent}%, releasing {decision.release_milli:.0f}m to reach {config.upper_percent}%; "
            f"this pod requests {victim.releases:.0f}m batch-cpu"
        )

    return eviction_plan(GATE_BE_CPU_EVICT, decision.release_milli, decision.candidates, message, memo, decision)


STRATEGY = Strategy("cpuevict", GATE_BE_CPU_EVICT, CPUEvictConfig, decide)
