""":class:`PlanRunner` carries :class:`~koordlet.plan.Plan` s out: cgroup writes, resctrl, sysctls and blkio lines
through the executor, evictions through the evictor, gauges on the QoS manager's metrics; and a record of what it
did.

What it makes on the node it records in the executor's :class:`~koordlet.executor.records.NodeRecords` (resctrl
groups; the blkio lines, through :class:`~koordlet.executor.lines.DeviceLines`), so the collector
(:mod:`koordlet.collector`) and a restarted agent know what is koordlet's to take away or put back.

Every part that changes the node hands its Plan to a :class:`PlanRunner` and never calls the executor's writes or
the evictor itself. Each holds a runner of its own, on its own thread: the QoS manager (its strategies), the hook
server (pod-level writes), the NRI handlers (pod-level writes, resctrl groups), the runtime hooks' reconciler and
the node-state collector (:mod:`koordlet.collector`); the cold page collector runs one for kidled's two settings. A
runner keeps nothing between plans but its last records (under a lock); what runners share, the executor, its
records, the audit log and ``/debug``'s recent actions, is thread-safe. The one write to kernel files that is no
plan is the page-idle bitmap's marks (``ResourceExecutor.mark_page_idle``, koordlet/executor/pageidle.py):
nothing to record or put back.
A failed write never stops the rest of the plan: it is counted in the record (and logged at debug level;
the executor counts every outcome in Prometheus itself).

With auditing on (gate ``AuditEvents``, :mod:`koordlet.audit`) the runner writes one audit event for every
file it wrote (not for writes the executor skipped as already there; blkio lines and sysctls put back included),
every resctrl action, every host dir removed and every eviction it asked for, from the plan's ``reason`` and
``why`` (a step's own, a victim's message): any part that changes the node through a Plan is audited without
doing anything for it.
"""

from __future__ import annotations

import errno
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from prometheus_client import Gauge

from koordlet import audit
from koordlet.eviction import EvictionOutcome, Evictor
from koordlet.executor import (
    BatchResult,
    CgroupNotFoundError,
    ExecutorError,
    PartialWriteError,
    ResourceExecutor,
    ResourceUpdate,
    UpdateFailure,
)
from koordlet.executor.lines import DeviceLines
from koordlet.history.actions import RECENT, RecentActions
from koordlet.hostdirs import remove_host_dir
from koordlet.plan import (
    Evictions,
    GaugeSet,
    HostDirRemove,
    LineAction,
    LineKey,
    LineWrite,
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
    lines_written: int = 0  # per-device blkio lines written or put back
    line_errors: tuple[str, ...] = ()
    removed_dirs: tuple[str, ...] = ()  # host dirs removed
    dir_errors: tuple[str, ...] = ()

    @property
    def partial(self) -> tuple[str, ...]:
        """The dirs whose action write (``memory.reclaim``) the kernel carried out only in part (not failures)."""
        return tuple(f.update.cgroup_dir for f in self.failures if isinstance(f.error, PartialWriteError))

    @property
    def failed(self) -> int:
        return (len(self.failures) - len(self.partial) + len(self.unknown_resources) + len(self.resctrl_errors)
                + len(self.system_errors) + len(self.process_errors) + len(self.line_errors) + len(self.dir_errors))


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
    lines_written: int = 0
    line_errors: list[str] = field(default_factory=list)
    removed_dirs: list[str] = field(default_factory=list)
    dir_errors: list[str] = field(default_factory=list)


_AGENTS_AUDITOR = object()  # PlanRunner(auditor=...) default: the agent's auditor (audit.current()), at each run


@dataclass(frozen=True, slots=True)
class _AuditContext:
    auditor: audit.Auditor
    source: str
    reason: str
    why: str

    def write(self, step: WriteStep, update: ResourceUpdate, why: str = "") -> None:
        """One cgroup file written; ``why``: the write's own reason (CgroupWrite.reason), else the step's."""
        where = update.cgroup_dir.strip("/") or "/"
        self.file(self.auditor.owner_of(update.cgroup_dir), f"{update.resource.name} of {where}", update.value,
                  step.reason, why or step.why)

    def file(self, owner: audit.Owner, what: str, value: object, reason: str = "", why: str = "") -> None:
        """One file written: ``what`` (a cgroup file of a dir, a sysctl) set to ``value``; the plan's reason and
        why unless given."""
        why = why or self.why
        message = f"{what} to {value} by {self.source}" + (f": {why}" if why else "")
        self.auditor.log(audit.LEVEL_UPDATE, owner, reason or self.reason, message)

    def resctrl(self, level: int, what: str) -> None:
        self._log(level, audit.Owner(audit.TYPE_GROUP, name="resctrl"), what)

    def node(self, what: str) -> None:
        """Something of the node's that is not a file written (a host dir removed)."""
        self._log(audit.LEVEL_UPDATE, audit.NODE, what)

    def _log(self, level: int, owner: audit.Owner, what: str) -> None:
        message = f"{what} by {self.source}" + (f": {self.why}" if self.why else "")
        self.auditor.log(level, owner, self.reason, message)


@dataclass(frozen=True, slots=True)
class _Noted:
    """Where one run's writes and evictions are remembered for ``/debug/pods`` (koordlet.history.actions)."""

    actions: RecentActions
    source: str
    reason: str
    why: str

    def write(self, step: WriteStep, update: ResourceUpdate, why: str = "", error: str = "") -> None:
        self.actions.wrote(update.cgroup_dir, update.resource.name, update.value, self.source,
                           step.reason or self.reason, why or step.why or self.why, error)


class PlanRunner:
    """Carries plans out. ``verify``: compare a cached write with the file before skipping it (the reconciler,
    which must restore a value someone changed by hand at once)."""

    def __init__(self, executor: ResourceExecutor, evictor: Evictor | None = None,
                 gauges: Mapping[str, Gauge] | None = None, auditor: object = _AGENTS_AUDITOR,
                 actions: RecentActions | None = RECENT) -> None:
        """``gauges``: the gauges plans may set, by name (the QoS manager's metrics); ``auditor``: where the
        audit events go (an :class:`~koordlet.audit.Auditor`, None for none; default: the agent's, looked up
        at every run so that one installed after this runner was built is used); ``actions``: where the last
        writes and evictions are remembered for ``/debug/pods`` (None: nowhere)."""
        self._executor = executor
        self._lines = DeviceLines(executor)
        self._evictor = evictor
        self._gauges = dict(gauges or {})
        self._auditor = auditor
        self._actions = actions
        self._lock = threading.Lock()
        self._last: dict[str, PlanRecord] = {}

    def _audit(self, plan: Plan, source: str) -> _AuditContext | None:
        auditor = audit.current() if self._auditor is _AGENTS_AUDITOR else self._auditor
        if not isinstance(auditor, audit.Auditor):
            return None
        return _AuditContext(auditor, source, plan.reason or source, plan.why)

    def last(self, source: str) -> PlanRecord | None:
        """The record of the newest plan run for ``source``."""
        with self._lock:
            return self._last.get(source)

    def run(self, plan: Plan, source: str, now: float = 0.0, *, verify: bool = False) -> PlanRecord:
        counts = _Counts()
        audited = self._audit(plan, source) if not plan.empty else None
        noted = _Noted(self._actions, source, plan.reason, plan.why) if self._actions is not None and not plan.empty \
            else None
        for step in plan.steps:
            self._write(step, counts, verify, audited, noted)
        for action in plan.resctrl:
            self._resctrl(action, counts, audited)
        released, evicted, blocked = self._evict(plan.evictions, audited, noted) if plan.evictions else ((), (), ())
        for gauge in plan.gauges:
            self._set_gauge(gauge)
        for action in plan.system:
            self._system(action, counts, audited)
        for write in plan.processes:
            self._processes(write, counts, audited)
        for line in plan.lines:
            self._line(line, counts, audited)
        for host_dir in plan.host_dirs:
            self._host_dir(host_dir, counts, audited)
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
            lines_written=counts.lines_written,
            line_errors=tuple(counts.line_errors),
            removed_dirs=tuple(counts.removed_dirs),
            dir_errors=tuple(counts.dir_errors),
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

    def _system(self, action: SystemAction, counts: _Counts, audited: _AuditContext | None) -> None:
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
            if audited is not None:
                if isinstance(action, SystemWrite):
                    audited.file(audit.NODE, action.name, action.value, why=action.reason)
                else:
                    audited.file(audit.NODE, action.key, "the value found before koordlet's first write",
                                 why=action.reason)

    def _line(self, action: LineAction, counts: _Counts, audited: _AuditContext | None) -> None:
        """One device's blkio line written (its line before recorded) or put back from the record."""
        try:
            if isinstance(action, LineWrite):
                done = self._lines.write(action.resource, action.cgroup_dir, action.value)
            else:
                done = self._lines.restore(LineKey.of(action.resource, action.cgroup_dir, action.device))
        except (ExecutorError, UnknownCgroupResourceError) as exc:
            counts.line_errors.append(f"{action}: {exc}")
            logger.debug("%s not carried out: %s", action, exc)
            return
        if not done:
            return
        counts.lines_written += 1
        if audited is not None:
            where = action.cgroup_dir.strip("/") or "/"
            value = action.value if isinstance(action, LineWrite) else \
                f"the line of {action.device} found before koordlet's first write"
            audited.file(audited.auditor.owner_of(action.cgroup_dir), f"{action.resource} of {where}", value,
                         why=action.reason)

    def _host_dir(self, action: HostDirRemove, counts: _Counts, audited: _AuditContext | None) -> None:
        """A host dir koordlet made, removed and forgotten (forgotten too when it is gone already)."""
        try:
            removed = remove_host_dir(action.path, action.root)
        except (OSError, ValueError) as exc:
            counts.dir_errors.append(f"{action.path}: {exc}")
            logger.warning("host dir %s not removed: %s", action.path, exc)
            return
        self._executor.records.host_dirs.forget(action.path)
        if removed:
            counts.removed_dirs.append(action.path)
            if audited is not None:
                audited.node(f"removed host dir {action.path}")

    def _processes(self, write: ProcessWrite, counts: _Counts, audited: _AuditContext | None) -> None:
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
        if audited is not None and written:
            where = write.cgroup_dir.strip("/") or "/"
            audited.file(audited.auditor.owner_of(write.cgroup_dir), f"{write.name} of {written} processes of {where}",
                         write.value, why=write.reason)

    def _write(self, step: WriteStep, counts: _Counts, verify: bool, audited: _AuditContext | None,
               noted: _Noted | None = None) -> None:
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
        if (audited is None and noted is None) or not (result.done or result.failures):
            return  # nothing written or refused: nothing to tell (the reconciler's usual pass)
        reasons = {(w.resource, w.cgroup_dir): w.reason for w in step.writes if w.reason}
        for update in result.done:
            why = reasons.get((update.resource.name, update.cgroup_dir), "")
            if audited is not None:
                audited.write(step, update, why)
            if noted is not None:
                noted.write(step, update, why)
        for failure in result.failures if noted is not None else ():
            if isinstance(failure.error, CgroupNotFoundError):
                continue  # not made yet (a pod's first hook) or gone: nothing was refused
            noted.write(step, failure.update, reasons.get((failure.update.resource.name, failure.update.cgroup_dir),
                                                          ""), str(failure.error))

    def _resctrl(self, action: ResctrlAction, counts: _Counts, audited: _AuditContext | None) -> None:
        moved_before = sum(len(pids) for pids in counts.moved.values())
        try:
            if isinstance(action, ResctrlGroup):
                # recorded before it is made (what koordlet made, or took for a pod it serves, it collects)
                created = self._executor.ensure_resctrl_group(action.group, for_pod=bool(action.pod_uid))
                if created:
                    counts.created.append(action.group)
                    if audited is not None:
                        audited.resctrl(audit.LEVEL_UPDATE, f"created resctrl group {action.group}")
            elif isinstance(action, ResctrlWrite):
                self._executor.write_resctrl(action.group, action.file, action.value)
                counts.resctrl_written += 1
                if audited is not None:
                    audited.resctrl(audit.LEVEL_UPDATE, f"resctrl {action.group or '/'} {action.file} to "
                                                        f"{action.value.strip()!r}")
            elif isinstance(action, ResctrlRemoveGroup):
                self._remove_group(action, counts)
                if audited is not None and action.group in counts.removed:
                    audited.resctrl(audit.LEVEL_UPDATE, f"removed resctrl group {action.group}")
            else:
                self._move_tasks(action, counts)
                moved = sum(len(pids) for pids in counts.moved.values()) - moved_before
                if audited is not None and moved:
                    audited.resctrl(audit.LEVEL_TASKS, f"moved {moved} tasks into resctrl group {action.group}")
        except ExecutorError as exc:
            counts.resctrl_errors.append(f"{action.group}: {exc}")
            logger.debug("resctrl action %r not carried out: %s", action, exc)

    def _remove_group(self, action: ResctrlRemoveGroup, counts: _Counts) -> None:
        """The group's tasks to the root group's ``tasks`` (recorded as moved to ""), then the group away."""
        pids = {p for p in self._executor.read_resctrl(action.group, "tasks").split() if p.isdigit()}
        self._write_tasks("", pids, counts)
        removed = self._executor.remove_resctrl_group(action.group)
        self._executor.records.resctrl_groups.forget(action.group)  # removed now, or gone already
        if removed:
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
        wanted.update(tid for tid in map(str, action.task_ids) if tid not in present)
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

    def _evict(self, tasks: tuple[Evictions, ...], audited: _AuditContext | None, noted: _Noted | None = None,
               ) -> tuple[tuple[tuple[str, float], ...], tuple[str, ...], tuple[str, ...]]:
        evictor = self._evictor
        if evictor is None:
            logger.warning("%s asked for evictions but this agent has no evictor", tasks[0].feature)
            return (), (), ()

        def outcome(task: Evictions, victim: Victim) -> VictimOutcome:
            if evictor.is_evicting(victim.pod.uid):
                return VictimOutcome.RELEASED
            result = evictor.evict(victim.pod, task.feature, victim.message, task.eviction_rule)
            answer = (VictimOutcome.REFUSED if not result.releases else
                      VictimOutcome.EVICTED if result.outcome is EvictionOutcome.EVICTED else VictimOutcome.RELEASED)
            if audited is not None:
                self._audit_eviction(audited, task, victim, answer, result.outcome.value)
            if noted is not None:
                noted.actions.evicted(victim.pod.uid, f"{answer.value} ({result.outcome.value}): releases "
                                      f"{victim.releases:.0f} of {task.target:.0f}", noted.source,
                                      task.feature, victim.message or task.reason or noted.why)
            return answer

        done = walk_evictions(tasks, outcome)
        for task in done:
            if task.released < task.target:
                logger.info("%s: released %.0f of %.0f after trying every candidate", task.feature, task.released,
                            task.target)
        return (tuple((t.feature, t.released) for t in done),
                tuple(v.pod.key for t in done for v in t.accepted),
                tuple(v.pod.key for t in done for v in t.refused))

    @staticmethod
    def _audit_eviction(audited: _AuditContext, task: Evictions, victim: Victim, answer: VictimOutcome,
                        outcome: str) -> None:
        pod = victim.pod
        done = {VictimOutcome.EVICTED: "evicted", VictimOutcome.RELEASED: f"stopped ({outcome})"}.get(
            answer, f"eviction refused ({outcome})")
        message = (f"{done} by {audited.source} to release {task.target:.0f} of which this pod holds "
                   f"{victim.releases:.0f}: {victim.message or task.reason or audited.why}")
        reason = audited.reason if audited.reason != audited.source else task.feature
        audited.auditor.log(audit.LEVEL_EVICTION, audit.Owner(audit.TYPE_POD, pod.namespace, pod.name), reason,
                            message)
