"""What the eviction strategies share (docs/koordinator.md §4.4–4.5 "Eviction mechanics"; Koordinator
qosmanager/plugins/util evict.go): the cool-down kept in ``Plan.memo``, the :class:`~koordlet.plan.Evictions`
tasks, the node-usage trigger and its opt-in victims shared by ``MemoryEvict`` and ``CPUEvict``, what a pod's
request is in its priority class's resource, and the allocatable trigger shared by ``CPUAllocatableEvict`` and
``MemoryAllocatableEvict``.

The walk over the tasks (each task's candidates in order until its target is released; pods already being
evicted count as released; refused pods skipped; only pods the task's rule allows) is
:func:`koordlet.plan.walk_evictions`, the one loop both the planned victims and the runner use.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType

from koordlet.api.eviction import PRIORITY_MID_MAX, EvictionRule, opt_in_order, priority_value
from koordlet.api.keys import (
    RESOURCE_BATCH_CPU,
    RESOURCE_BATCH_MEMORY,
    RESOURCE_CPU,
    RESOURCE_MEMORY,
    RESOURCE_MID_CPU,
    RESOURCE_MID_MEMORY,
)
from koordlet.api.pod import PodMeta, aggregate_request
from koordlet.api.qos import PriorityClass
from koordlet.plan import Evictions, Plan, Victim, planned_victims
from koordlet.qosmanager.snapshot import Snapshot, container_resource


@dataclass(frozen=True, slots=True)
class EvictMemo:
    """An eviction strategy rests until ``resting_until`` (wall clock): its cool time after an eviction, or
    after the agent's start."""

    resting_until: float = float("-inf")


def rest(snapshot: Snapshot, cool_time_s: float, initial: float = float("-inf")) -> EvictMemo:
    """The strategy's rest after this snapshot: the memo's, extended by ``cool_time_s`` after the previous
    tick's accepted evictions (``snapshot.last``); ``initial`` before the first tick."""
    until = snapshot.memo.resting_until if isinstance(snapshot.memo, EvictMemo) else initial
    last = snapshot.last
    if last is not None and last.evicted:
        until = max(until, last.at + cool_time_s)
    return EvictMemo(until)


def eviction_task(feature: str, target: float, candidates: Sequence[Victim], message: Callable[[Victim], str],
                  reason: str, *, rule: EvictionRule | None = None,
                  counts: Mapping[str, float] | None = None) -> Evictions:
    """Evict ``candidates`` in order until ``target`` is released, each with its Event message; ``reason``: the
    trigger and its figures; ``counts``: what every pod releases in this task's measure (for pods an earlier
    task of the plan evicted)."""
    with_messages = tuple(replace(v, message=message(v)) for v in candidates)
    return Evictions(feature, target, with_messages, rule, MappingProxyType(dict(counts or {})), reason)


Builder = Callable[[], tuple[tuple[Evictions, ...], object]]


def tasks_plan(features: Sequence[str], invalid: Callable[[str], str | None], builders: Mapping[str, Builder],
               memo: object) -> Plan:
    """One plan with the tasks of every feature in ``features`` (in that order) whose config is valid;
    ``report`` maps each feature to its decision (or to why its config keeps it inert)."""
    tasks: list[Evictions] = []
    decisions: dict[str, object] = {}
    for feature in features:
        problem = invalid(feature)
        if problem is not None:
            decisions[feature] = problem
            continue
        more, decisions[feature] = builders[feature]()
        tasks.extend(more)
    return Plan(evictions=tuple(tasks), memo=memo, report=MappingProxyType(decisions))


# ------------------------------------------------------------------------------------ the node-usage trigger


def usage_release(used: float, capacity: int, threshold_percent: int, lower_percent: int) -> tuple[int, int]:
    """(usage%, what to release) of a node-usage trigger, in integer percents as Koordinator computes them:
    usage% = used × 100 // capacity; at or above ``threshold_percent`` release capacity × (usage% − lower%) / 100,
    else 0. ``used`` and ``capacity`` in one unit (bytes, milli-cores), ``capacity`` positive."""
    usage_percent = int(used * 100 // capacity)
    if usage_percent < threshold_percent:
        return usage_percent, 0
    return usage_percent, capacity * (usage_percent - lower_percent) // 100


def opt_in_victims(snapshot: Snapshot, rule: EvictionRule, used: Mapping[str, float]) -> tuple[Victim, ...]:
    """The pods ``rule`` allows that have a usage sample in ``used`` (pod uid → what the pod uses, which is what
    its eviction releases), in the opt-in order, then the largest user first."""
    victims = [Victim(pod, used[pod.uid]) for pod in snapshot.pods if pod.uid in used and rule.allows(pod)]
    victims.sort(key=lambda v: (*opt_in_order(v.pod), -v.releases))
    return tuple(victims)


def usage_task(snapshot: Snapshot, rule: EvictionRule, release: float, used: Mapping[str, float], reason: str,
               amount: Callable[[float], str]) -> tuple[Evictions, tuple[Victim, ...], tuple[Victim, ...]]:
    """A node-usage task (``MemoryEvict``, ``CPUEvict``): the opted-in pods releasing what they use until
    ``release`` is freed; with its candidates and the victims it plans. ``amount`` words a pod's use for its
    Event."""
    candidates = opt_in_victims(snapshot, rule, used)
    task = eviction_task(rule.feature, release, candidates, lambda v: f"{reason}; this pod uses {amount(v.releases)}",
                         reason, rule=rule, counts=used)
    return task, candidates, planned_victims(candidates, release, rule=rule)


# ---------------------------------------------------------------------------------- requests by priority class

# Koordinator ReverseResourceNameMap: the resources whose over-commitment names the class to evict from.
_CLASS_RESOURCES: Mapping[str, Mapping[PriorityClass, str]] = MappingProxyType({
    RESOURCE_CPU: MappingProxyType({PriorityClass.MID: RESOURCE_MID_CPU, PriorityClass.BATCH: RESOURCE_BATCH_CPU}),
    RESOURCE_MEMORY: MappingProxyType({PriorityClass.MID: RESOURCE_MID_MEMORY,
                                       PriorityClass.BATCH: RESOURCE_BATCH_MEMORY}),
})


def class_request(pod: PodMeta, base: str) -> tuple[str, int]:
    """(resource, amount) of ``pod``'s request of ``base`` (cpu or memory) in its priority class's resource:
    koord-mid → mid-cpu/mid-memory, koord-batch → batch-cpu/batch-memory (Σ of the containers, init (sidecar)
    containers included), others → cpu/memory (the larger of Σ regular containers and the largest init
    container), the pod-level request where the pod sets one (koordlet.api.pod.aggregate_request). Koordinator's
    GetRequestTypeAndValueFromPod; cpu amounts in milli-cores, memory in bytes."""
    resource = _CLASS_RESOURCES[base].get(pod.priority_class)
    if resource is not None:
        return resource, sum(max(container_resource(c, resource), 0) for c in pod.containers)
    return base, aggregate_request(pod, base, lambda c: container_resource(c, base))


def allocatable_invalid(threshold: int | None, lower: int | None, priority: int | None) -> str | None:
    """Why an allocatable feature's config keeps it inert (Koordinator's isAllocatableThresholdConfigValid)."""
    if threshold is None or lower is None:
        return "the allocatable threshold and lower percents are not both set"
    if lower >= threshold:
        return f"allocatable lower percent {lower} is not below the threshold {threshold}"
    if priority is None:
        return "allocatableEvictPriorityThreshold is not set"
    if priority > PRIORITY_MID_MAX:
        return f"allocatableEvictPriorityThreshold {priority} is above {PRIORITY_MID_MAX} (koord-prod pods stay)"
    return None


@dataclass(frozen=True, slots=True)
class AllocatableDecision:
    """Requested (Σ of the pods at or below the priority threshold) and allocatable per resource, and what each
    over-committed resource must release."""

    requested: Mapping[str, int]
    allocatable: Mapping[str, int]
    release: Mapping[str, int]


def allocatable_release(requested: int, allocatable: int, threshold: int, lower: int) -> int:
    """What to release of one resource: all of it when the node has none, requested − allocatable × lower%
    when requested / allocatable > threshold%, else 0 (Koordinator calculate…ByAllocatableThresholdPercent)."""
    if requested <= 0:
        return 0
    if allocatable <= 0:
        return requested
    if requested / allocatable > threshold / 100:
        return int(requested - lower / 100 * allocatable)
    return 0


def allocatable_tasks(snapshot: Snapshot, base: str, rule: EvictionRule, threshold: int, lower: int,
                      usage: Mapping[str, float], unit: str) -> tuple[tuple[Evictions, ...], AllocatableDecision]:
    """One task per over-committed class resource (batch/mid of ``base``): the opted-in pods of that class with a
    usage sample, in the opt-in order and then request descending; each releases its request."""
    assert rule.priority_at_most is not None
    requested: dict[str, int] = {}
    for pod in snapshot.pods:
        if priority_value(pod) <= rule.priority_at_most:
            resource, amount = class_request(pod, base)
            requested[resource] = requested.get(resource, 0) + amount
    allocatable = {name: int(snapshot.node.allocatable.get(name, 0)) for name in requested}
    release = {name: amount for name, amount in (
        (name, allocatable_release(requested[name], allocatable[name], threshold, lower)) for name in requested)
        if amount > 0}
    tasks = []
    for resource in _CLASS_RESOURCES[base].values():
        target = release.get(resource, 0)
        if target <= 0:
            continue
        candidates = [Victim(pod, float(amount)) for pod in snapshot.pods
                      if pod.uid in usage and rule.allows(pod)
                      for name, amount in (class_request(pod, base),) if name == resource and amount > 0]
        candidates.sort(key=lambda v: (*opt_in_order(v.pod), -v.releases))
        reason = (f"{resource} requested {requested[resource]} of allocatable {allocatable[resource]} "
                  f"> {threshold}%, releasing {target} down to {lower}%")
        counts = {pod.uid: float(amount) for pod in snapshot.pods
                  for name, amount in (class_request(pod, base),) if name == resource}
        tasks.append(eviction_task(rule.feature, float(target), candidates,
                                   lambda v, reason=reason: f"{reason}; this pod requests {v.releases:.0f} {unit}",
                                   reason, rule=rule, counts=counts))
    return tuple(tasks), AllocatableDecision(MappingProxyType(requested), MappingProxyType(allocatable),
                                             MappingProxyType(release))


__all__ = ["AllocatableDecision", "EvictMemo", "allocatable_invalid", "allocatable_release", "allocatable_tasks",
           "class_request", "eviction_task", "opt_in_victims", "planned_victims", "rest", "tasks_plan", "usage_release",
           "usage_task"]
