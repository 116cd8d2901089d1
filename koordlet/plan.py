"""What every part that changes the node hands over: a :class:`Plan`, plain data (DESIGN.md §4).

The QoS strategies (``decide(snapshot, config) -> Plan``), the runtime hooks' reconciler and the hook
server's pod-level writes all say what they want as a Plan and never touch the executor or the evictor
themselves; :class:`koordlet.actuator.PlanRunner` carries a Plan out and records what it did.

A Plan holds, carried out in this order:
1. ``steps``: cgroup writes (:class:`WriteStep`: in the given order, or ``leveled`` — parents loosened
   first, then exact values children first, the executor's leveled update);
2. ``resctrl``: resctrl actions (make a group, write a group file, move the tasks of cgroups into a group,
   remove a group after moving its tasks back to the root group);
3. ``evictions``: an :class:`Evictions` request (ordered candidates and the amount to release);
4. ``gauges``: Prometheus gauge values to set or remove (so a decision's figures are exported by the runner,
   not by the strategy).

``memo`` is the strategy's own state for its next tick (token buckets, the last policy, a cool-down): the
manager hands it back in the next snapshot, so ``decide`` stays a pure function. ``report`` is the decision's
detail (budgets, usage, victims), for logs and tests.

``reason`` and ``why`` go into the audit log (:mod:`koordlet.audit`) with every write, resctrl action and
eviction the runner carries out for the plan: ``reason`` a short name (Koordinator's audit reasons, such as
``AdjustBEByNodeCPUUsage``; the plan's source when empty), ``why`` the decision's figures. A
:class:`WriteStep` may carry its own; a :class:`Victim`'s ``message`` is its eviction's why.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from koordlet.api.pod import PodMeta
from koordlet.api.qos import QoSClass


@dataclass(frozen=True, slots=True)
class CgroupWrite:
    """Write ``value`` (v1 semantics) to ``resource`` of ``cgroup_dir`` (relative to the hierarchy root)."""

    resource: str
    cgroup_dir: str
    value: str | int


@dataclass(frozen=True, slots=True)
class WriteStep:
    """Writes carried out together: in the given order, or ``leveled`` (parents loosened first, then exact
    values children first; the executor's leveled update)."""

    writes: tuple[CgroupWrite, ...]
    leveled: bool = False
    reason: str = ""  # for the audit log; "" = the plan's
    why: str = ""  # for the audit log; "" = the plan's


@dataclass(frozen=True, slots=True)
class ResctrlGroup:
    """Make the resctrl group ``group`` (a mkdir under the resctrl root) when it is missing."""

    group: str


@dataclass(frozen=True, slots=True)
class ResctrlWrite:
    """Write ``value`` to ``file`` (``schemata`` or ``tasks``) of the resctrl group ``group``."""

    group: str
    file: str
    value: str


@dataclass(frozen=True, slots=True)
class ResctrlMoveTasks:
    """Move the tasks of ``cgroup_dirs`` (the IDs in their ``source`` file: ``tasks`` for every thread,
    ``cgroup.procs`` for the processes) into ``group``; tasks already in the group are not written again."""

    group: str
    cgroup_dirs: tuple[str, ...]
    source: str = "tasks"


@dataclass(frozen=True, slots=True)
class ResctrlRemoveGroup:
    """Undo :class:`ResctrlGroup`: move the tasks of ``group`` back to the root group, then remove the group
    (an rmdir under the resctrl root)."""

    group: str


ResctrlAction = ResctrlGroup | ResctrlWrite | ResctrlMoveTasks | ResctrlRemoveGroup


@dataclass(frozen=True, slots=True)
class Victim:
    """An eviction candidate, what evicting it releases (bytes or milli-cores) and the Event message."""

    pod: PodMeta
    releases: float
    message: str = ""


@dataclass(frozen=True, slots=True)
class Evictions:
    """Evict ``candidates`` in order until ``target`` is released (koordinator.md §4.5): pods already being
    evicted count as released, a refused pod (PDB, failure) is skipped and the next one tried, non-BE pods
    are never asked for. ``feature`` names the strategy's feature gate in the Event."""

    feature: str
    target: float
    candidates: tuple[Victim, ...]


@dataclass(frozen=True, slots=True)
class GaugeSet:
    """Set the gauge ``name`` (a metric of ``koordlet.qosmanager.metrics``) for ``labels`` to ``value``;
    ``value`` None removes that labelled series."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float | None


@dataclass(frozen=True, slots=True)
class Plan:
    steps: tuple[WriteStep, ...] = ()
    resctrl: tuple[ResctrlAction, ...] = ()
    evictions: Evictions | None = None
    gauges: tuple[GaugeSet, ...] = ()
    memo: Any = None
    report: Any = None
    reason: str = ""
    why: str = ""

    @property
    def empty(self) -> bool:
        return not (self.steps or self.resctrl or self.evictions or self.gauges)


def walk_victims(
    candidates: Sequence[Victim], target: float, outcome: Callable[[Victim], str]
) -> tuple[float, list[Victim], list[Victim]]:
    """The one eviction walk: candidates in order until ``target`` is released, BE pods only.

    ``outcome(victim)`` says what asking for ``victim`` gives: ``"released"`` (already being evicted: counts,
    nothing asked), ``"evicted"`` (asked and accepted), or ``"refused"`` (asked and refused: the next one is
    tried). Returns (released, asked-and-accepted, refused). :func:`planned_victims` runs it assuming every
    request is accepted; the runner runs it against the evictor.
    """
    released = 0.0
    accepted: list[Victim] = []
    refused: list[Victim] = []
    for victim in candidates:
        if released >= target:
            break
        if victim.pod.qos_class is not QoSClass.BE:
            continue
        result = outcome(victim)
        if result == "refused":
            refused.append(victim)
            continue
        released += victim.releases
        if result == "evicted":
            accepted.append(victim)
    return released, accepted, refused


def planned_victims(candidates: Sequence[Victim], target: float, evicting: frozenset[str] = frozenset()) -> tuple[
        Victim, ...]:
    """The victims an :class:`Evictions` request asks for when every eviction is accepted; pods in
    ``evicting`` (uids) count as released without a new request."""
    _, accepted, _ = walk_victims(
        candidates, target, lambda v: "released" if v.pod.uid in evicting else "evicted"
    )
    return tuple(accepted)
