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
from koordlet.qosmanager.snapshot import Snapshot


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


def eviction_plan(feature: str, target: float, candidates: Sequence[Victim], message: Callable[[Victim], str],
                  memo: EvictMemo, report: object) -> Plan:
    """Evict ``candidates`` in order until ``target`` is released, each with its Event message."""
    with_messages = tuple(replace(v, message=message(v)) for v in candidates)
    return Plan(evictions=Evictions(feature, target, with_messages), memo=memo, report=report)
