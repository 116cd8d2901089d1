"""What the eviction strategies share (koordinator.md §4.5 "Eviction mechanics"): the cool-down kept in
``Plan.memo`` and the :class:`~koordlet.plan.Evictions` request.

The walk over the candidates (in order until the released amount reaches the target; pods already being
evicted count as released; refused pods skipped; only BE pods) is :func:`koordlet.plan.walk_victims`, the
one loop both the decision's ``victims`` and the runner use.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from koordlet.plan import Evictions, Plan, Victim


@dataclass(frozen=True, slots=True)
class EvictMemo:
    """An eviction strategy rests until ``resting_until`` (wall clock): its cool time after an eviction, or
    after the agent's start."""

    resting_until: float = float("-inf")


def resting_until(memo: object, last_evicted_at: float | None, cool_time_s: float, initial: float) -> float:
    """When the strategy may act again: the memo's rest, extended by a cool time after the previous tick's
    accepted evictions (``last_evicted_at``); ``initial`` before the first tick."""
    until = memo.resting_until if isinstance(memo, EvictMemo) else initial
    if last_evicted_at is not None:
        until = max(until, last_evicted_at + cool_time_s)
    return until


def eviction_plan(feature: str, target: float, candidates: Sequence[Victim], message: Callable[[Victim], str],
                  memo: EvictMemo, report: object) -> Plan:
    """Evict ``candidates`` in order until ``target`` is released, each with its Event message."""
    with_messages = tuple(replace(v, message=message(v)) for v in candidates)
    return Plan(evictions=Evictions(feature, target, with_messages), memo=memo, report=report)
