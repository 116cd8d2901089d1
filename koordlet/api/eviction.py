"""Who an eviction feature may take, and in which order (docs/koordinator.md §4.4–4.5; Koordinator
apis/extension evict.go and qosmanager/plugins/util evict.go).

- BE features (``BECPUEvict``, ``BEMemoryEvict``): BE pods only.
- ``CPUEvict``/``MemoryEvict``: pods that opted in with the label ``koordinator.sh/eviction-enabled: "true"``
  and whose priority (``spec.priority``, else the default of their priority class) is at most
  ``evictEnabledPriorityThreshold``; Succeeded/Failed pods never.
- ``CPUAllocatableEvict``/``MemoryAllocatableEvict``: the same, with ``allocatableEvictPriorityThreshold``
  (at most 7999, so a koord-prod pod is never taken).
- Every feature: a pod whose annotation ``koordinator.sh/eviction-policy`` (a JSON list of feature names) does
  not name the feature is left alone; an annotation that is not such a list protects the pod from every
  feature (Koordinator does the same: a policy it cannot read allows nothing).

The opt-in features sort their victims by the annotation ``koordinator.sh/eviction-priority`` ascending
(0 when unset or unreadable), then by priority ascending, then by the label ``koordinator.sh/priority``
ascending (the priority when unset or not an integer), then by what the pod frees, largest first.

:class:`EvictionRule` is checked twice: when a strategy builds its candidates, and by the evictor on the
freshest copy of the pod right before it acts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from koordlet.api.keys import (
    ANNOTATION_EVICTION_POLICY,
    ANNOTATION_EVICTION_PRIORITY,
    LABEL_EVICTION_ENABLED,
    LABEL_SUB_PRIORITY,
)
from koordlet.api.pod import PodMeta
from koordlet.api.qos import PRIORITY_RANGES, PriorityClass, QoSClass

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
PRIORITY_MID_MAX = PRIORITY_RANGES[PriorityClass.MID].high  # 7999: allocatable eviction never goes above it
_INACTIVE_PHASES = ("Succeeded", "Failed")


def eviction_enabled(pod: PodMeta) -> bool:
    """The pod opted in: label ``koordinator.sh/eviction-enabled`` exactly ``"true"``."""
    return pod.labels.get(LABEL_EVICTION_ENABLED) == "true"


def eviction_priority(pod: PodMeta) -> int:
    """Annotation ``koordinator.sh/eviction-priority`` as an int32; 0 when unset or not an int32."""
    text = pod.annotations.get(ANNOTATION_EVICTION_PRIORITY)
    if text is None:
        return 0
    try:
        value = int(text.strip(), 10)
    except ValueError:
        return 0
    return value if INT32_MIN <= value <= INT32_MAX else 0


def eviction_policy_allows(pod: PodMeta, feature: str) -> bool:
    """Annotation ``koordinator.sh/eviction-policy``: absent → every feature; a JSON list of strings → the
    features it names; anything else → none."""
    text = pod.annotations.get(ANNOTATION_EVICTION_POLICY)
    if text is None:
        return True
    try:
        policies = json.loads(text)
    except ValueError:
        return False
    return isinstance(policies, list) and feature in [p for p in policies if isinstance(p, str)]


def priority_value(pod: PodMeta) -> int:
    """``spec.priority`` when set and non-zero, else the default value of the pod's priority class (prod 9500,
    mid 7500, batch 5500, free 3500, none 0); Koordinator's GetPodPriorityValueWithDefault."""
    if pod.priority:
        return pod.priority
    priority_range = PRIORITY_RANGES.get(pod.priority_class)
    return priority_range.default if priority_range is not None else 0


def label_priority(pod: PodMeta, default: int) -> int:
    """Label ``koordinator.sh/priority`` as an integer; ``default`` when unset or not an integer."""
    text = pod.labels.get(LABEL_SUB_PRIORITY)
    if text is None:
        return default
    try:
        return int(text.strip(), 10)
    except ValueError:
        return default


def opt_in_order(pod: PodMeta) -> tuple[int, int, int]:
    """The sort key of the opt-in features before "what the pod frees": eviction priority, priority, label
    priority (all ascending)."""
    priority = priority_value(pod)
    return eviction_priority(pod), priority, label_priority(pod, priority)


@dataclass(frozen=True, slots=True)
class EvictionRule:
    """Which pods ``feature`` may evict: BE pods only (``be_only``), or pods that opted in
    (``require_opt_in``) with a priority value at most ``priority_at_most``."""

    feature: str
    be_only: bool = True
    require_opt_in: bool = False
    priority_at_most: int | None = None

    def refusal(self, pod: PodMeta) -> str | None:
        """Why ``pod`` may not be evicted by this feature; None when it may."""
        if not eviction_policy_allows(pod, self.feature):
            return f"its {ANNOTATION_EVICTION_POLICY} annotation does not allow {self.feature}"
        if self.be_only and pod.qos_class is not QoSClass.BE:
            return f"it is not a BE pod (QoS {pod.qos_class.value or 'none'})"
        if pod.phase in _INACTIVE_PHASES:
            return f"it is {pod.phase}"
        if self.require_opt_in and not eviction_enabled(pod):
            return f'it lacks the label {LABEL_EVICTION_ENABLED}: "true"'
        if self.priority_at_most is not None and priority_value(pod) > self.priority_at_most:
            return f"its priority {priority_value(pod)} is above {self.priority_at_most}"
        return None

    def allows(self, pod: PodMeta) -> bool:
        return self.refusal(pod) is None


def be_rule(feature: str) -> EvictionRule:
    return EvictionRule(feature)


def opt_in_rule(feature: str, priority_at_most: int) -> EvictionRule:
    return EvictionRule(feature, be_only=False, require_opt_in=True, priority_at_most=priority_at_most)
