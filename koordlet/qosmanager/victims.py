"""Shared eviction mechanics of the eviction strategies (koordinator.md §4.5 "Eviction mechanics").

Victims are tried in order until the released amount reaches the target; pods already being evicted
count as released. Only BE pods ever become candidates here, and the evictor checks again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from koordlet.api.nodeslo import NodeSLOSpec
from koordlet.api.pod import PodMeta
from koordlet.eviction import EvictionOutcome, Evictor
from koordlet.qosmanager.snapshot import SnapshotBuilder, is_be

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Victim:
    """A candidate and what evicting it releases (bytes or milli-cores, per strategy)."""

    pod: PodMeta
    releases: float


@dataclass(frozen=True, slots=True)
class EvictionRound:
    released: float
    evicted: tuple[str, ...]  # keys (namespace/name) of pods whose eviction was accepted this round
    blocked: tuple[str, ...]


def plan_victims(candidates: Sequence[Victim], target: float, evicting: Collection[str]) -> tuple[Victim, ...]:
    """The victims to ask for, assuming every eviction succeeds: in order until released ≥ target, pods in
    ``evicting`` (uids) counting as released without a new request."""
    planned: list[Victim] = []
    released = 0.0
    for victim in candidates:
        if released >= target:
            break
        if not is_be(victim.pod):
            continue
        released += victim.releases
        if victim.pod.uid not in evicting:
            planned.append(victim)
    return tuple(planned)


def evict_until(
    evictor: Evictor,
    candidates: Sequence[Victim],
    target: float,
    feature: str,
    message: Callable[[Victim], str],
) -> EvictionRound:
    """Ask the evictor for victims in order until released ≥ target; a refused pod (PDB, failure) is skipped
    and the next one tried."""
    released = 0.0
    evicted: list[str] = []
    blocked: list[str] = []
    for victim in candidates:
        if released >= target:
            break
        if not is_be(victim.pod):
            continue
        if evictor.is_evicting(victim.pod.uid):
            released += victim.releases
            continue
        result = evictor.evict(victim.pod, feature, message(victim))
        if result.releases:
            released += victim.releases
            if result.outcome is EvictionOutcome.EVICTED:
                evicted.append(victim.pod.key)
        else:
            blocked.append(victim.pod.key)
    if released < target:
        logger.info("%s: released %.0f of %.0f after trying every candidate", feature, released, target)
    return EvictionRound(released, tuple(evicted), tuple(blocked))


class EvictionStrategy:
    """What the eviction strategies share: the NodeSLO switch, the evictor and the cool-down after an
    eviction (subclasses set ``name``, ``feature_gate`` and write ``run``)."""

    name = ""
    feature_gate = ""

    def __init__(self, builder: SnapshotBuilder, evictor: Evictor, interval_s: float, cool_time_s: float,
                 resting_until: float = float("-inf")) -> None:
        self.interval_s = interval_s
        self._builder = builder
        self._evictor = evictor
        self._cool_time_s = cool_time_s
        self._resting_until = resting_until
        self.last_round: EvictionRound | None = None

    def active(self, spec: NodeSLOSpec) -> bool:
        return spec.resource_used_threshold_with_be.enable

    def deactivate(self) -> None:
        """Nothing imposed to undo."""

    def resting(self, now: float) -> bool:
        return now < self._resting_until

    def evict(self, now: float, candidates: Sequence[Victim], target: float,
              message: Callable[[Victim], str]) -> EvictionRound:
        """Evict until ``target`` is released; rest for the cool-down when anything was evicted."""
        self.last_round = evict_until(self._evictor, candidates, target, self.feature_gate, message)
        if self.last_round.evicted:
            self._resting_until = now + self._cool_time_s
        return self.last_round
