"""Memory eviction (``BEMemoryEvict``, ``MemoryAllocatableEvict``, ``MemoryEvict``).

docs/koordinator.md §4.5; Koordinator qosmanager/plugins/memoryevict.

One strategy runs the three features in Koordinator's order (BE, allocatable, opt-in) as the tasks of one plan:
a pod evicted by an earlier task counts for the later ones, and the strategy rests for the cool-down (4 s)
after any eviction. Each feature needs its gate and ``resourceUsedThresholdWithBE.enable``.

- ``BEMemoryEvict``: node memory used = MemTotal − MemAvailable (latest); usage% = used × 100 // capacity. At
  or above ``memoryEvictThresholdPercent`` (70) it releases capacity × (usage% − lower%) / 100, lower =
  ``memoryEvictLowerPercent`` or threshold − 2, from BE pods: lowest spec.priority first, then the largest
  memory user (pods without usage last, then by name descending); each releases its memory used.
- ``MemoryEvict``: the same trigger and amount, from the pods that opted in (``koordinator.sh/eviction-enabled``)
  at or below ``evictEnabledPriorityThreshold`` and have a usage sample, in the opt-in order
  (:mod:`koordlet.api.eviction`) and then memory used descending.
- ``MemoryAllocatableEvict``: Σ memory requests of the pods at or below ``allocatableEvictPriorityThreshold``
  (≤ 7999), per resource (``kubernetes.io/batch-memory`` of koord-batch pods, ``kubernetes.io/mid-memory`` of
  koord-mid pods), against the node's allocatable of that resource: above
  ``memoryAllocatableEvictThresholdPercent`` it releases requested − allocatable × lower% / 100 (all of it
  when the node has none), from the opted-in pods of that class by the opt-in order, then request descending;
  each releases its request.

Differences from Koordinator, on purpose: ``MemoryEvict`` counts a victim's memory in bytes (Koordinator
multiplies it by 1000, so one victim always looks like enough); allocatable tasks take only pods that free
some of the over-committed resource (Koordinator walks every opted-in pod, freeing nothing with some).
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass

from koordlet.api.eviction import be_rule, opt_in_rule
from koordlet.api.keys import RESOURCE_MEMORY
from koordlet.api.nodeslo import NodeSLOSpec
from koordlet.plan import Evictions, Plan, Victim, planned_victims
from koordlet.qosmanager.framework import (
    GATE_BE_MEMORY_EVICT,
    GATE_MEMORY_ALLOCATABLE_EVICT,
    GATE_MEMORY_EVICT,
    QoSManagerConfig,
    Strategy,
)
from koordlet.qosmanager.snapshot import Needs, Snapshot, is_be
from koordlet.qosmanager.victims import (
    EvictMemo,
    allocatable_invalid,
    allocatable_tasks,
    eviction_task,
    rest,
    tasks_plan,
    usage_release,
    usage_task,
)

logger = logging.getLogger(__name__)

DEFAULT_COOL_TIME_S = 4.0
FEATURES = (GATE_BE_MEMORY_EVICT, GATE_MEMORY_ALLOCATABLE_EVICT, GATE_MEMORY_EVICT)  # Koordinator's order


@dataclass(frozen=True, slots=True)
class MemoryEvictConfig:
    threshold_percent: int = 70
    lower_percent: int = 68
    enabled: bool = True  # resourceUsedThresholdWithBE.enable
    cool_time_s: float = DEFAULT_COOL_TIME_S  # flag -memory-evict-cool-time-seconds
    features: tuple[str, ...] = (GATE_BE_MEMORY_EVICT,)  # the gates that are on, in FEATURES order
    evict_enabled_priority_threshold: int | None = None  # MemoryEvict
    allocatable_threshold_percent: int | None = None  # MemoryAllocatableEvict
    allocatable_lower_percent: int | None = None
    allocatable_priority_threshold: int | None = None

    @classmethod
    def from_node_slo(cls, spec: NodeSLOSpec, flags: QoSManagerConfig | None = None) -> MemoryEvictConfig:
        t = spec.resource_used_threshold_with_be
        features = tuple(f for f in FEATURES if flags.gate(f)) if flags else (GATE_BE_MEMORY_EVICT,)
        return cls(t.memory_evict_threshold_percent, t.effective_memory_evict_lower_percent, t.enable,
                   flags.memory_evict_cool_time_s if flags else DEFAULT_COOL_TIME_S, features,
                   t.evict_enabled_priority_threshold, t.memory_allocatable_evict_threshold_percent,
                   t.memory_allocatable_evict_lower_percent, t.allocatable_evict_priority_threshold)

    @property
    def needs(self) -> Needs:
        # The victims are sorted by their memory: BE pods, and with the features that may take any pod, every pod.
        return _NEEDS if set(self.features) <= {GATE_BE_MEMORY_EVICT} else _NEEDS_EVERY_POD

    def invalid(self, feature: str) -> str | None:
        """Why ``feature`` cannot run with this config (Koordinator's config checks); None when it can."""
        if feature == GATE_MEMORY_ALLOCATABLE_EVICT:
            return allocatable_invalid(self.allocatable_threshold_percent, self.allocatable_lower_percent,
                                        self.allocatable_priority_threshold)
        if self.lower_percent >= self.threshold_percent:
            return f"lower percent {self.lower_percent} is not below the threshold {self.threshold_percent}"
        if feature == GATE_MEMORY_EVICT and self.evict_enabled_priority_threshold is None:
            return "evictEnabledPriorityThreshold is not set"
        return None


_NEEDS = Needs(pod_usage=is_be, container_usage=None)
_NEEDS_EVERY_POD = Needs(container_usage=None)


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


def _usage_release(snapshot: Snapshot, config: MemoryEvictConfig) -> tuple[int | None, int]:
    """(usage%, bytes to release) of the node-usage trigger; (None, 0) without a sample."""
    capacity = snapshot.capacity_memory_bytes
    used = snapshot.node_memory_bytes
    if used is None or capacity <= 0:
        return None, 0
    return usage_release(used, capacity, config.threshold_percent, config.lower_percent)


def decide_release(
    snapshot: Snapshot, config: MemoryEvictConfig, evicting: Collection[str] = ()
) -> MemoryEvictDecision:
    """``BEMemoryEvict``'s figures."""
    usage_percent, release = _usage_release(snapshot, config)
    if release <= 0:
        return MemoryEvictDecision(usage_percent, 0, (), ())
    candidates = memory_victims(snapshot)
    victims = planned_victims(candidates, release, frozenset(evicting), be_rule(GATE_BE_MEMORY_EVICT))
    return MemoryEvictDecision(usage_percent, release, candidates, victims)


def _usage_message(snapshot: Snapshot, config: MemoryEvictConfig, usage_percent: int, release: int) -> str:
    return (f"node memory usage {usage_percent}% of {snapshot.capacity_memory_bytes} bytes >= threshold "
            f"{config.threshold_percent}%, releasing {release} bytes down to {config.lower_percent}%")


def _be_task(snapshot: Snapshot, config: MemoryEvictConfig) -> tuple[tuple[Evictions, ...], object]:
    decision = decide_release(snapshot, config)
    if not decision.triggered:
        return (), decision
    assert decision.usage_percent is not None
    reason = _usage_message(snapshot, config, decision.usage_percent, decision.release_bytes)
    task = eviction_task(GATE_BE_MEMORY_EVICT, decision.release_bytes, decision.candidates,
                         lambda v: f"{reason}; this pod uses {int(v.releases)} bytes", reason,
                         counts=snapshot.pod_memory_bytes)
    return (task,), decision


def _opt_in_task(snapshot: Snapshot, config: MemoryEvictConfig) -> tuple[tuple[Evictions, ...], object]:
    usage_percent, release = _usage_release(snapshot, config)
    if release <= 0 or usage_percent is None:
        return (), MemoryEvictDecision(usage_percent, 0, (), ())
    assert config.evict_enabled_priority_threshold is not None
    rule = opt_in_rule(GATE_MEMORY_EVICT, config.evict_enabled_priority_threshold)
    reason = _usage_message(snapshot, config, usage_percent, release)
    task, candidates, victims = usage_task(snapshot, rule, release, snapshot.pod_memory_bytes, reason,
                                           lambda used: f"{int(used)} bytes")
    return (task,), MemoryEvictDecision(usage_percent, release, candidates, victims)


def _allocatable_tasks(snapshot: Snapshot, config: MemoryEvictConfig) -> tuple[tuple[Evictions, ...], object]:
    assert (config.allocatable_threshold_percent is not None and config.allocatable_lower_percent is not None
            and config.allocatable_priority_threshold is not None)
    rule = opt_in_rule(GATE_MEMORY_ALLOCATABLE_EVICT, config.allocatable_priority_threshold)
    return allocatable_tasks(snapshot, RESOURCE_MEMORY, rule, config.allocatable_threshold_percent,
                             config.allocatable_lower_percent, snapshot.pod_memory_bytes, "bytes")


def decide(snapshot: Snapshot, config: MemoryEvictConfig) -> Plan:
    """Evict to release what is above the lower percent (each feature that is on, in order); rests the cool
    time after an eviction."""
    memo: EvictMemo = rest(snapshot, config.cool_time_s)
    if not config.enabled or snapshot.timestamp < memo.resting_until:
        return Plan(memo=memo)
    return tasks_plan(config.features, config.invalid, {
        GATE_BE_MEMORY_EVICT: lambda: _be_task(snapshot, config),
        GATE_MEMORY_ALLOCATABLE_EVICT: lambda: _allocatable_tasks(snapshot, config),
        GATE_MEMORY_EVICT: lambda: _opt_in_task(snapshot, config),
    }, memo)


STRATEGY = Strategy("memoryevict", FEATURES, MemoryEvictConfig, decide)
