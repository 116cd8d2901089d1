"""What every part that changes the node hands over: a :class:`Plan`, plain data (docs/design.md §4).

The QoS strategies (``decide(snapshot, config) -> Plan``), the runtime hooks' reconciler and the hook
server's pod-level writes all say what they want as a Plan and never touch the executor or the evictor
themselves; :class:`koordlet.actuator.PlanRunner` carries a Plan out and records what it did.

A Plan holds, carried out in this order:
1. ``steps``: cgroup writes (:class:`WriteStep`: in the given order, or ``leveled`` — parents loosened
   first, then exact values children first, the executor's leveled update);
2. ``resctrl``: resctrl actions (make a group, write a group file, move the tasks of cgroups into a group,
   remove a group after moving its tasks back to the root group);
3. ``evictions``: :class:`Evictions` tasks (ordered candidates and the amount to release), walked once;
4. ``gauges``: Prometheus gauge values to set or remove (so a decision's figures are exported by the runner,
   not by the strategy);
5. ``system``: node-wide kernel files (sysctls) to write, or to put back as they were before koordlet;
6. ``processes``: per-process files (``oom_score_adj``) of every process of a cgroup;
7. ``lines``: one device's line of a per-device blkio file, written with a record of what it held before, or put
   back from that record (:mod:`koordlet.executor.lines`);
8. ``host_dirs``: host directories koordlet made for containers' mounts, removed (:mod:`koordlet.hostdirs`).

``memo`` is the strategy's own state for its next tick (token buckets, the last policy, a cool-down): the
manager hands it back in the next snapshot, so ``decide`` stays a pure function. ``report`` is the decision's
detail (budgets, usage, victims), for logs and tests.

``reason`` and ``why`` go into the audit log (:mod:`koordlet.audit`) with every write, resctrl action and
eviction the runner carries out for the plan: ``reason`` a short name (Koordinator's audit reasons, such as
``AdjustBEByNodeCPUUsage``; the plan's source when empty), ``why`` the decision's figures. A
:class:`WriteStep` may carry its own; a :class:`Victim`'s ``message`` is its eviction's why.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from koordlet.api.eviction import EvictionRule, be_rule
from koordlet.api.pod import PodMeta


@dataclass(frozen=True, slots=True)
class CgroupWrite:
    """Write ``value`` (v1 semantics) to ``resource`` of ``cgroup_dir`` (relative to the hierarchy root)."""

    resource: str
    cgroup_dir: str
    value: str | int
    reason: str = ""  # why, with the figures (the audit's line); "" where the step's owner says it


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
    """Make the resctrl group ``group`` (a mkdir under the resctrl root) when it is missing. The runner records
    a group its mkdir made; ``pod_uid`` names the pod a pod-level group is for, and such a group is recorded even
    when it was there already (by Koordinator's contract ``koordlet-<pod uid>`` is that pod's group, whichever
    agent made it), so it goes when the pod goes."""

    group: str
    pod_uid: str = ""


@dataclass(frozen=True, slots=True)
class ResctrlWrite:
    """Write ``value`` to ``file`` (``schemata`` or ``tasks``) of the resctrl group ``group``."""

    group: str
    file: str
    value: str


@dataclass(frozen=True, slots=True)
class ResctrlMoveTasks:
    """Move the tasks of ``cgroup_dirs`` (the IDs in their ``source`` file: ``tasks`` for every thread,
    ``cgroup.procs`` for the processes) and ``task_ids`` (threads the states informer read, ``-enable-pod-taskids``)
    into ``group``; tasks already in the group are not written again."""

    group: str
    cgroup_dirs: tuple[str, ...]
    source: str = "tasks"
    task_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class ResctrlRemoveGroup:
    """Undo :class:`ResctrlGroup`: move the tasks of ``group`` back to the root group, then remove the group
    (an rmdir under the resctrl root)."""

    group: str


ResctrlAction = ResctrlGroup | ResctrlWrite | ResctrlMoveTasks | ResctrlRemoveGroup


@dataclass(frozen=True, slots=True)
class SystemWrite:
    """Write ``value`` to the node-wide kernel file ``name`` (``koordlet.system.sysctl``: a sysctl, or one
    ``sched_features`` flag). ``reason``: why, with the figures (the audit's line)."""

    name: str
    value: str
    reason: str = ""


@dataclass(frozen=True, slots=True)
class SystemRestore:
    """Put back what ``key`` (a sysctl name, or ``sched_features:<NAME>``) held before koordlet's first write."""

    key: str
    reason: str = ""


SystemAction = SystemWrite | SystemRestore


_LINE_KEY_SEPARATOR = "@"


@dataclass(frozen=True, slots=True)
class LineKey:
    """One device's line of a per-device blkio file of one cgroup dir ("" = the root)."""

    resource: str
    cgroup_dir: str
    device: str

    @classmethod
    def of(cls, resource: str, cgroup_dir: str, device: str) -> LineKey:
        """The key with the cgroup dir as the record keeps it (no leading or trailing ``/``)."""
        return cls(resource, cgroup_dir.strip("/"), device)

    def text(self) -> str:
        return _LINE_KEY_SEPARATOR.join((self.resource, self.device, self.cgroup_dir))

    @classmethod
    def parse(cls, text: str) -> LineKey | None:
        """The key of a record entry; None for one that is not a line key (a record edited by hand)."""
        parts = text.split(_LINE_KEY_SEPARATOR, 2)
        if len(parts) != 3 or not parts[0] or not parts[1]:
            return None
        return cls(parts[0], parts[2], parts[1])


@dataclass(frozen=True, slots=True)
class LineWrite:
    """Write ``value`` (``"MAJ:MIN ..."``, v1 form) as its device's line of the per-device blkio file ``resource`` of
    ``cgroup_dir``, recording the line as it was before koordlet's first write to it. ``reason``: the audit's line."""

    resource: str
    cgroup_dir: str
    value: str
    reason: str = ""


@dataclass(frozen=True, slots=True)
class LineRestore:
    """Put ``device``'s line of ``resource`` in ``cgroup_dir`` back as it was before koordlet's first write to it
    (nothing when koordlet never wrote it), and forget the record."""

    resource: str
    cgroup_dir: str
    device: str
    reason: str = ""


LineAction = LineWrite | LineRestore


@dataclass(frozen=True, slots=True)
class HostDirRemove:
    """Remove the host directory ``path`` koordlet made (and what is in it), if it is a directory below ``root``."""

    path: str
    root: str


@dataclass(frozen=True, slots=True)
class ProcessWrite:
    """Write ``value`` to the per-process file ``name`` (``oom_score_adj``) of every process in the cgroup
    ``cgroup_dir`` (its ``cgroup.procs``) whose value differs. ``reason``: why (the audit's line)."""

    name: str
    cgroup_dir: str
    value: int
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Victim:
    """An eviction candidate, what evicting it releases (in its task's measure: bytes or milli-cores) and the
    Event message."""

    pod: PodMeta
    releases: float
    message: str = ""


@dataclass(frozen=True, slots=True)
class Evictions:
    """One eviction task (docs/koordinator.md §4.5): evict ``candidates`` in order until ``target`` is released.

    Pods already being evicted count as released; a refused pod (PDB, failure) is skipped and the next one
    tried; a pod ``rule`` does not allow is never asked for (by default: BE pods only). ``feature`` names the
    feature gate in the Event and the metric. ``counts``: what the other pods of the node would release in
    this task's measure, so that a pod evicted by an earlier task of the same plan counts here too (Koordinator
    adds every evicted pod's release to every task's account). ``reason``: the trigger and its figures, for
    the record and the audit."""

    feature: str
    target: float
    candidates: tuple[Victim, ...]
    rule: EvictionRule | None = None
    counts: Mapping[str, float] = field(default_factory=lambda: _NO_COUNTS)
    reason: str = ""

    @property
    def eviction_rule(self) -> EvictionRule:
        return self.rule if self.rule is not None else be_rule(self.feature)

    def counted(self, uid: str) -> float:
        """What pod ``uid`` releases in this task's measure."""
        for victim in self.candidates:
            if victim.pod.uid == uid:
                return victim.releases
        return self.counts.get(uid, 0.0)


_NO_COUNTS: Mapping[str, float] = MappingProxyType({})


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
    evictions: tuple[Evictions, ...] = ()
    gauges: tuple[GaugeSet, ...] = ()
    memo: Any = None
    report: Any = None
    system: tuple[SystemAction, ...] = ()
    processes: tuple[ProcessWrite, ...] = ()
    reason: str = ""
    why: str = ""
    lines: tuple[LineAction, ...] = ()
    host_dirs: tuple[HostDirRemove, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.steps or self.resctrl or self.evictions or self.gauges or self.system or self.processes
                    or self.lines or self.host_dirs)


class VictimOutcome(enum.Enum):
    """What asking for one victim gave, in :func:`walk_evictions`."""

    RELEASED = "released"  # already being evicted (or gone): counts as released, nothing asked
    EVICTED = "evicted"  # asked and accepted
    REFUSED = "refused"  # asked and refused: the next candidate is tried


@dataclass(frozen=True, slots=True)
class TaskOutcome:
    """What the walk did for one task: released (in its measure), the victims asked and accepted, and the
    victims asked and refused."""

    feature: str
    target: float
    released: float
    accepted: tuple[Victim, ...] = ()
    refused: tuple[Victim, ...] = ()


Outcome = Callable[[Evictions, Victim], VictimOutcome]


def walk_evictions(tasks: Sequence[Evictions], outcome: Outcome) -> tuple[TaskOutcome, ...]:
    """The one eviction walk: each task in order, its candidates in order until its target is released.

    ``outcome(task, victim)`` says what asking for ``victim`` gives (:class:`VictimOutcome`); anything else is a
    bug in the caller and raises TypeError rather than counting as released. A pod gone (evicted or already
    going) in an earlier task is not asked for again, and what it releases counts for every later task
    (``Evictions.counted``). Pods the task's rule does not allow are skipped before anything is asked.
    :func:`planned_victims` runs it assuming every request is accepted; the runner runs it against the evictor."""
    gone: list[str] = []
    results: list[TaskOutcome] = []
    for task in tasks:
        rule = task.eviction_rule
        released = sum(task.counted(uid) for uid in gone)
        accepted: list[Victim] = []
        refused: list[Victim] = []
        for victim in task.candidates:
            if released >= task.target:
                break
            if victim.pod.uid in gone or not rule.allows(victim.pod):
                continue
            result = outcome(task, victim)
            if not isinstance(result, VictimOutcome):
                raise TypeError(f"an eviction outcome must be a VictimOutcome, not {result!r}")
            if result is VictimOutcome.REFUSED:
                refused.append(victim)
                continue
            gone.append(victim.pod.uid)
            released += victim.releases
            if result is VictimOutcome.EVICTED:
                accepted.append(victim)
        results.append(TaskOutcome(task.feature, task.target, released, tuple(accepted), tuple(refused)))
    return tuple(results)


def planned_victims(candidates: Sequence[Victim], target: float, evicting: frozenset[str] = frozenset(),
                    rule: EvictionRule | None = None) -> tuple[Victim, ...]:
    """The victims one task asks for when every eviction is accepted; pods in ``evicting`` (uids) count as
    released without a new request."""
    task = Evictions(rule.feature if rule else "", target, tuple(candidates), rule)
    (done,) = walk_evictions(
        (task,), lambda _, v: VictimOutcome.RELEASED if v.pod.uid in evicting else VictimOutcome.EVICTED)
    return done.accepted
