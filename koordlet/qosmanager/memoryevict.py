"""BE memory eviction (``BEMemoryEvict``, koordinator.md §4.5).

Node memory used = MemTotal − MemAvailable (latest); usage% = used × 100 // capacity. At or above
``memoryEvictThresholdPercent`` (70) it releases capacity × (usage% − lower%) / 100, lower =
``memoryEvictLowerPercent`` or threshold − 2, by evicting BE pods: lowest spec.priority first, then the
largest memory user (pods without usage last, then by name descending); each releases its memory used.
After an eviction the strategy rests for the cool-down (4 s).
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass

from koordlet.api.nodeslo import NodeSLOSpec
from koordlet.plan import Plan, Victim, planned_victims
from koordlet.qosmanager.framework import GATE_BE_MEMORY_EVICT, QoSManagerConfig, Strategy
from koordlet.qosmanager.snapshot import Needs, Snapshot, is_be
from koordlet.qosmanager.victims import eviction_plan, rest

logger = logging.getLogger(__name__)

DEFAULT_COOL_TIME_S = 4.0


@dataclass(frozen=True, slots=True)
class MemoryEvictConfig:
    threshold_percent: int = 70
    lower_percent: int = 68
    enabled: bool = True  # resourceUsedThresholdWithBE.enable
    cool_time_s: float = DEFAULT_COOL_TIME_S  # flag -memory-evict-cool-time-seconds

    @classmethod
    def from_node_slo(cls, spec: NodeSLOSpec, flags: QoSManagerConfig | None = None) -> MemoryEvictConfig:
        threshold = spec.resource_used_threshold_with_be
        return cls(threshold.memory_evict_threshold_percent, threshold.effective_memory_evict_lower_percent,
                   threshold.enable, flags.memory_evict_cool_time_s if flags else DEFAULT_COOL_TIME_S)

    @property
    def needs(self) -> Needs:
        return _NEEDS


_NEEDS = Needs()


@dataclass(frozen=True, slots=True)
class MemoryEvictDecision:
    usage_percent: int | None
    release_bytes: int
    candidates: tuple[Victim, ...]  # every BE pod, in victim order
    victims: tuple[Victim, ...]  # what the plan asks for, assuming every eviction succeeds

    @property
    def triggered(self) -> bool:
        return self.release_bytes > 0


def memory_victims(snapshot: Snapshot) -> tuple[Victim, ...]:
    """BE pods by priority ascending, then memory used descending; pods with no usage last, by name desc."""
    victims = [Victim(pod, snapshot.pod_memory_bytes.get(pod.uid, 0.0)) for pod in snapshot.pods if is_be(pod)]
    victims.sort(key=lambda v: v.pod.name, reverse=True)
    victims.sort(key=lambda v: (v.pod.priority or 0, v.releases <= 0, -v.releases))
    return tuple(victims)


def decide_release(
    snapshot: Snapshot, config: MemoryEvictConfig, evicting: Collection[str] = ()
) -> MemoryEvictDecision:
    capacity = snapshot.capacity_memory_bytes
    used = snapshot.node_memory_bytes
    if used is None or capacity <= 0:
        return MemoryEvictDecision(None, 0, (), ())
    usage_percent = int(used * 100 // capacity)
    if usage_percent < config.threshold_percent:
        return MemoryEvictDecision(usage_percent, 0, (), ())
    release = capacity * (usage_percent - config.lower_percent) // 100
    candidates = memory_victims(snapshot)
    victims = planned_victims(candidates, release, frozenset(evicting))
    return MemoryEvictDecision(usage_percent, release, candidates, victims)


def decide(snapshot: Snapshot, config: MemoryEvictConfig) -> Plan:
    """Evict BE pods to release what is above the lower percent; rests the cool time after an eviction."""
    memo = rest(snapshot, config.cool_time_s)
    if not config.enabled or snapshot.timestamp < memo.resting_until:
        return Plan(memo=memo)
    decision = decide_release(snapshot, config)
    if not decision.triggered:
        return Plan(memo=memo, report=decision)
    capacity = snapshot.capacity_memory_bytes
    logger.info(
        "node memory %d%% >= %d%%: releasing %d bytes from BE pods",
        decision.usage_percent,
        config.threshold_percent,
        decision.release_bytes,
    )

    def message(victim: Victim) -> str:
        return (
            f"node memory usage {decision.usage_percent}% of {capacity} bytes >= threshold "
            f"{config.threshold_percent}%, releasing {decision.release_bytes} bytes down to "
            f"{config.lower_percent}%; this pod uses {int(victim.releases)} bytes"
        )

    return eviction_plan(GATE_BE_MEMORY_EVICT, decision.release_bytes, decision.candidates, message, memo,
                         decision)


STRATEGY = Strategy("memoryevict", GATE_BE_MEMORY_EVICT, MemoryEvictConfig, decide)
