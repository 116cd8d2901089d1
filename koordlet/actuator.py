"""The one runner of :class:`~koordlet.plan.Plan` s: cgroup writes and resctrl through the executor,
evictions through the evictor, gauges on the QoS manager's metrics; and a record of what it did.

Every part that changes the node (QoS strategies, the runtime hooks' reconciler, the hook server's pod-level
writes) hands its Plan to a :class:`PlanRunner`; none of them calls the executor or the evictor itself.
A failed write never stops the rest of the plan: it is counted in the record (and logged at debug level;
the executor counts every outcome in Prometheus itself).
"""

from __future__ import annotations

import errno
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from prometheus_client import Gauge

from koordlet.eviction import EvictionOutcome, Evictor
from koordlet.executor import (
    BatchResult,
    CgroupNotFoundError,
    ExecutorError,
    ResourceExecutor,
    ResourceUpdate,
    UpdateFailure,
)
from koordlet.plan import (
    Evictions,
    GaugeSet,
    Plan,
    ProcessWrite,
    ResctrlAction,
    ResctrlGroup,
    ResctrlMoveTasks,
    ResctrlRemoveGroup,
    ResctrlWrite,
    SystemAction,
    SystemWrite,
    Victim,
    VictimOutcome,
    WriteStep,
    walk_evictions,
)
from koordlet.system.resources import UnknownCgroupResourceError
from koordlet.system.sysctl import UnknownSystemResourceError

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ProcessResult:
    """What one :class:`~koordlet.plan.ProcessWrite` did: the processes found, how many got the value, and the
    refusals (``errno`` names, e.g. ``EACCES``)."""

    write: ProcessWrite
    processes: int = 0
    written: int = 0
    refused: tuple[str, ...] = ()

    @property
    def holds(self) -> bool:
        """Some process of the cgroup holds the value now."""
        return self.processes > len(self.refused)


@dataclass(frozen=True, slots=True)
class PlanRecord:
    """What one :meth:`PlanRunner.run` did."""

    source: str
    at: float
    written: int = 0
    skipped: int = 0
    failures: tuple[UpdateFailure, ...] = ()
    unknown_resources: tuple[str, ...] = ()  # resources the plan named that the registry does not know
    resctrl_written: int = 0
    resctrl_errors: tuple[str, ...] = ()
    moved_tasks: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # resctrl group → PIDs moved in
    created_groups: tuple[str, ...] = ()  # resctrl groups this run made (missing before)
    removed_groups: tuple[str, ...] = ()  # resctrl groups this run removed
    released: tuple[tuple[str, float], ...] = ()  # (feature, what its task counted as released), task order
    system_written: int = 0  # node-wide files written or restored
    system_errors: tuple[str, ...] = ()
    processes_written: int = 0  # per-process files written (e.g. oom_score_adj of one PID)
    process_errors: tuple[str, ...] = ()  # "<pid>: <error>" (e.g. EACCES lowering oom_score_adj)
    process_results: tuple[ProcessResult, ...] = ()  # one per ProcessWrite of the plan
    evicted: tuple[str, ...] = ()  # pod keys whose eviction was accepted
    blocked: tuple[str, ...] = ()  # pod keys whose eviction was refused

    @property
    def failed(self) -> int:
        return (len(self.failures) + len(self.unknown_resources) + len(self.resctrl_errors) + len(self.system_errors)
                + len(self.process_errors))


@dataclass(slots=True)
class _Counts:
    written: int = 0
    skipped: int = 0
    failures: list[UpdateFailure] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    resctrl_written: int = 0
    resctrl_errors: list[str] = field(default_factory=list)
    moved: dict[str, list[int]] = field(default_factory=dict)
    created: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    system_written: int = 0
    system_errors: list[str] = field(default_factory=list)
    processes_written: int = 0
    process_errors: list[str] = field(default_factory=list)
    process_results: list[ProcessResult] = field(default_factory=list)


class PlanRunner:
    """Carries plans out. ``verify``: compare a cached write with the file before skipping it (the reconciler,
    which must restore a value someone changed by hand at once)."""

    def __init__(self, executor: ResourceExecutor, evictor: Evictor | None = None,
                 gauges: Mapping[str, Gauge] | None = None) -> None:
        """``gauges``: the gauges plans may set, by name (the QoS manager's metrics)."""
        self._executor = executor
        self._evictor = evictor
        self._gauges = dict(gauges or {})
        self._lock = threading.Lock()
        self._last: dict[str, PlanRecord] = {}

    def last(self, source: str) -> PlanRecord | None:
        """The record of the newest plan run for ``source``."""
        with self._lock:
            return self._last.get(source)

    def run(self, plan: Plan, source: str, now: float = 0.0, *, verify: bool = False) -> PlanRecord:
        counts = _Counts()
        for step in plan.steps:
            self._write(step, counts, verify)
        for action in plan.resctrl:
            self._resctrl(action, counts)
        released, evicted, blocked = self._evict(plan.evictions) if plan.evictions else ((), (), ())
        for gauge in plan.gauges:
            self._set_gauge(gauge)
        for action in plan.system:
            self._system(action, counts)
        for write in plan.processes:
            self._processes(write, counts)
        record = PlanRecord(
            source=source,
            at=now,
            written=counts.written,
            skipped=counts.skipped,
            failures=tuple(counts.failures),
            unknown_resources=tuple(counts.unknown),
            resctrl_written=counts.resctrl_written,
            resctrl_errors=tuple(counts.resctrl_errors),
            moved_tasks=MappingProxyType({group: tuple(pids) for group, pids in counts.moved.items()}),
            created_groups=tuple(counts.created),
            removed_groups=tuple(counts.removed),
            released=released,
            evicted=evicted,
            blocked=blocked,
            system_written=counts.system_written,
            system_errors=tuple(counts.system_errors),
            processes_written=counts.processes_written,
            process_errors=tuple(counts.process_errors),
            process_results=tuple(counts.process_results),
        )
        for failure in record.failures:
            logger.debug("%s: %s of %r not written: %s", source, failure.update.resource.name,
                         failure.update.cgroup_dir, failure.error)
        with self._lock:
            self._last[source] = record
        return record

    def _set_gauge(self, update: GaugeSet) -> None:
        gauge = self._gauges.get(update.name)
        if gauge is None:
            logger.error("a plan set the unknown gauge %s", update.name)
            return
        labels = dict(update.labels)
        if update.value is not None:
            gauge.labels(**labels).set(update.value)
            return
        try:
            # by name, so the plan's label order does not matter; a GaugeSet names every label, so this is the
            # one series (a series never set is no error)
            gauge.remove_by_labels(labels)
        except ValueError as exc:
            logger.error("a plan removed %s by labels it does not have: %s", update.name, exc)

    def _system(self, action: SystemAction, counts: _Counts) -> None:
        try:
            if isinstance(action, SystemWrite):
                done = self._executor.write_system(action.name, action.value)
            else:
                done = self._executor.restore_system(action.key)
        except (ExecutorError, UnknownSystemResourceError) as exc:
            counts.system_errors.append(f"{action}: {exc}")
            logger.warning("%s not carried out: %s", action, exc)
            return
        if done:
            counts.system_written += 1
            logger.info("%s (%s)", action, action.reason or "no reason given")

    def _processes(self, write: ProcessWrite, counts: _Counts) -> None:
        """``write.value`` to each process of the cgroup whose file differs; a process that exited meanwhile is
        skipped; a refusal (EACCES: lowering oom_score_adj without CAP_SYS_RESOURCE) is counted, not raised."""
        try:
            procs = self._executor.read("cgroup.procs", write.cgroup_dir)
        except ExecutorError as exc:
            logger.debug("no processes of %s: %s", write.cgroup_dir, exc)
            counts.process_results.append(ProcessResult(write))
            return  # gone, or not made yet
        found = written = 0
        refused: list[str] = []
        for pid in sorted({int(p) for p in procs.split() if p.isdigit()}):
            try:
                found += 1
                if self._executor.write_system(write.name, write.value, pid=pid):
                    written += 1
            except CgroupNotFoundError:
                found -= 1  # exited meanwhile
            except ExecutorError as exc:
                code = getattr(exc, "errno", None)
                refused.append(errno.errorcode.get(code, "EIO") if code else type(exc).__name__)
                counts.process_errors.append(f"{pid}: {exc}")
        counts.processes_written += written
        counts.process_results.append(ProcessResult(write, found, written, tuple(refused)))

    def _write(self, step: WriteStep, counts: _Counts, verify: bool) -> None:
        updates: list[ResourceUpdate] = []
        for write in step.writes:
            try:
                updates.append(ResourceUpdate.of(write.resource, write.cgroup_dir, write.value))
            except UnknownCgroupResourceError:
                logger.error("a plan asked for the unknown resource %s", write.resource)
                counts.unknown.append(write.resource)
        if not updates:
            return
        if step.leveled:
            result: BatchResult = self._executor.leveled_update(updates, verify=verify)
        else:
            result = self._executor.update_batch(updates, verify=verify)
        counts.written += result.written
        counts.skipped += result.skipped
        counts.failures.extend(result.failures)

    def _resctrl(self, action: ResctrlAction, counts: _Counts) -> None:
        try:
            if isinstance(action, ResctrlGroup):
                if self._executor.ensure_resctrl_group(action.group):
                    counts.created.append(action.group)
            elif isinstance(action, ResctrlWrite):
                self._executor.write_resctrl(action.group, action.file, action.value)
                counts.resctrl_written += 1
            elif isinstance(action, ResctrlRemoveGroup):
                self._remove_group(action, counts)
            else:
                self._move_tasks(action, counts)
        except ExecutorError as exc:
            counts.resctrl_errors.append(f"{action.group}: {exc}")
            logger.debug("resctrl action %r not carried out: %s", action, exc)

    def _remove_group(self, action: ResctrlRemoveGroup, counts: _Counts) -> None:
        """The group's tasks to the root group's ``tasks`` (recorded as moved to ""), then the group away."""
        pids = {p for p in self._executor.read_resctrl(action.group, "tasks").split() if p.isdigit()}
        self._write_tasks("", pids, counts)
        if self._executor.remove_resctrl_group(action.group):
            counts.resctrl_written += 1
            counts.removed.append(action.group)

    def _move_tasks(self, action: ResctrlMoveTasks, counts: _Counts) -> None:
        present = set(self._executor.read_resctrl(action.group, "tasks").split())
        wanted: set[str] = set()
        for cgroup_dir in action.cgroup_dirs:
            try:
                text = self._executor.read(action.source, cgroup_dir)
            except ExecutorError:
                continue  # gone meanwhile
            wanted.update(pid for pid in text.split() if pid.isdigit() and pid not in present)
        self._write_tasks(action.group, wanted, counts)

    def _write_tasks(self, group: str, pids: set[str], counts: _Counts) -> None:
        """Write each PID (in numeric order) to ``group``'s ``tasks`` ("" = the root group); a task that exited
        meanwhile (ESRCH) is skipped."""
        for pid in sorted(pids, key=int):
            try:
                self._executor.write_resctrl(group, "tasks", pid)
                counts.resctrl_written += 1
                counts.moved.setdefault(group, []).append(int(pid))
            except ExecutorError as exc:
                logger.debug("cannot move task %s to resctrl group %r: %s", pid, group, exc)

    def _evict(self, tasks: tuple[Evictions, ...]) -> tuple[tuple[tuple[str, float], ...], tuple[str, ...],
                                                            tuple[str, ...]]:
        evictor = self._evictor
        if evictor is None:
            logger.warning("%s asked for evictions but this agent has no evictor", tasks[0].feature)
            return (), (), ()

        def outcome(task: Evictions, victim: Victim) -> VictimOutcome:
            if evictor.is_evicting(victim.pod.uid):
                return VictimOutcome.RELEASED
            result = evictor.evict(victim.pod, task.feature, victim.message, task.eviction_rule)
            if not result.releases:
                return VictimOutcome.REFUSED
            return VictimOutcome.EVICTED if result.outcome is EvictionOutcome.EVICTED else VictimOutcome.RELEASED

        done = walk_evictions(tasks, outcome)
        for task in done:
            if task.released < task.target:
                logger.info("%s: released %.0f of %.0f after trying every candidate", task.feature, task.released,
                            task.target)
        return (tuple((t.feature, t.released) for t in done),
                tuple(v.pod.key for t in done for v in t.accepted),
                tuple(v.pod.key for t in done for v in t.refused))
