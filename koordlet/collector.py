"""The collector pass: what koordlet made on the node, against what should be there now (ARCHITECTURE.md, "What
koordlet makes on the node").

Each pass compares the records of what koordlet made (:class:`~koordlet.executor.records.NodeRecords`: persisted,
so the pass after a crash or a restart with other flags sees what the agent before made) with what the gates, the
node's RDT, the NodeSLO and the pods ask for now, and takes away the rest through the plan runner, one audited plan
per item (reason ``NodeStateCollect``, the why naming what no longer asks for it):

- a pod's resctrl group ``koordlet-<pod uid>`` whose pod is gone (not listed, or finished), no longer annotated,
  or that nothing can ask for (gate ``Resctrl`` off, the node without RDT); its tasks go back to the root group
  first. A group made in the last :data:`FRESH_GROUP_GRACE_S` for a pod the states informer does not list yet is
  kept: NRI's RunPodSandbox makes it before kubelet lists the pod;
- a class group (LSR, LS, BE) of the RdtResctrl strategy while the strategy cannot ask for it (gate off, the QoS
  manager off, the NodeSLO's ``resctrlQOS`` off in every class, the node without RDT);
- every blkio line the blkio strategy wrote while that strategy is off (gate ``BlkIOReconcile``, or the QoS
  manager), put back as it was before koordlet (:mod:`koordlet.executor.lines`). While it is on, the strategy
  puts back each tick what it no longer asks for. The besteffort dir's ``io.weight`` default line BE PSI throttle
  wrote (kept in the same record) goes back the same way while that strategy is off (gate ``BEPSIThrottle``, or the
  QoS manager);
- every sysctl the SystemConfig strategy changed while that strategy is off (its gate, or the QoS manager; the QoS
  manager also puts them back when it starts with the gate off), put back as it was before koordlet. The record is
  shared with the cold page collector's kidled settings: only the keys :func:`sysreconcile.owns` names are the
  strategy's (the rule the QoS manager's own put-back follows); kidled's are the cold page collector's to put back;
- a host dir made for a container's mounts (HAMi-core's cache dir, :mod:`koordlet.hostdirs`) whose pod is gone or
  finished, past the same grace: a gate switched off does not take it from a pod that still runs, whose
  container has it mounted.

Nothing is taken away that is not in a record (a group of another tool, even one named ``koordlet-*``, is left
alone), and no pass runs before the states informer has synced: an empty pod list at start must not cost every pod
its group. The first pass runs at start (retried every :data:`RETRY_S` until the states have synced), then every
``interval_s`` (:data:`COLLECT_INTERVAL_S`).

:func:`collect` is the pure part (records and wants in, plans out); :class:`NodeStateCollector` reads the records,
the states and the node's RDT, and runs the plans.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from prometheus_client import Counter

from hooks.resctrl import GROUP_PREFIX
from koordlet.actuator import PlanRunner
from koordlet.api.keys import ANNOTATION_RESCTRL
from koordlet.api.pod import PodMeta
from koordlet.api.qos import skips_hooks
from koordlet.executor import ResourceExecutor
from koordlet.executor.records import recorded_lines
from koordlet.plan import HostDirRemove, LineKey, LineRestore, Plan, ResctrlRemoveGroup, SystemRestore
from koordlet.qosmanager import sysreconcile
from koordlet.qosmanager.resctrl import GROUPS as CLASS_GROUPS
from koordlet.qosmanager.resctrl import ResctrlConfig
from koordlet.statesinformer.api import StatesProvider
from koordlet.system.blkiolines import IO_WEIGHT_DEFAULT_LINE
from koordlet.system.resctrl import ResctrlInfoError, read_resctrl_info
from koordlet.ticker import PeriodicThread

logger = logging.getLogger(__name__)

AUDIT_REASON = "NodeStateCollect"
COLLECT_INTERVAL_S = 180.0
RETRY_S = 5.0  # while the states have not synced
FRESH_GROUP_GRACE_S = 300.0
_FINISHED = ("Succeeded", "Failed")

COLLECTED = Counter(
    "koordlet_node_state_collected",
    "Things koordlet made on the node that its collector took away because nothing asks for them any more: resctrl "
    "groups removed, blkio lines and sysctls put back as they were before koordlet, host dirs removed.",
    ["kind"],
)


@dataclass(frozen=True, slots=True)
class CollectorConfig:
    """Which of koordlet's makers are on (from the feature gates and the QoS manager's flags)."""

    pod_groups: bool = False  # gate Resctrl: pods' own resctrl groups
    class_groups: bool = False  # gate RdtResctrl with the QoS manager: the LSR/LS/BE groups
    blkio: bool = False  # gate BlkIOReconcile with the QoS manager
    system_config: bool = False  # gate SystemConfig with the QoS manager
    resctrl_dir: str | None = None
    host_dir_root: str | None = None  # below which koordlet makes host dirs (the HAMi-core cache root)
    interval_s: float = COLLECT_INTERVAL_S
    grace_s: float = FRESH_GROUP_GRACE_S
    psi_throttle: bool = False  # gate BEPSIThrottle with the QoS manager


@dataclass(frozen=True, slots=True)
class Wants:
    """What asks for koordlet's things now. ``pods``: the states informer's list (synced); ``rdt``: the node has
    RDT (None: unknown, so nothing is taken away for that reason)."""

    config: CollectorConfig
    pods: Sequence[PodMeta]
    rdt: bool | None
    class_groups_enabled: bool  # some class's NodeSLO resctrlQOS is on


@dataclass(frozen=True, slots=True)
class Made:
    """What the records say koordlet made: resctrl group → when recorded; blkio lines; host dir → (pod uid, when
    recorded)."""

    groups: Mapping[str, float]
    lines: Sequence[LineKey] = ()
    sysctls: Sequence[str] = ()  # the keys of the sysctl record (the SystemConfig strategy's and kidled's)
    host_dirs: Mapping[str, tuple[str, float]] = field(default_factory=lambda: MappingProxyType({}))


def _pod_gone(uid: str, recorded_at: float, wants: Wants, pods: Mapping[str, PodMeta], now: float) -> str | None:
    """Why the pod ``uid`` no longer has what koordlet made for it: gone (past the grace: what NRI's RunPodSandbox
    makes comes before kubelet lists the pod) or finished; None while it is there."""
    pod = pods.get(uid)
    if pod is None:
        return None if now - recorded_at < wants.config.grace_s else "its pod is gone"
    if pod.phase in _FINISHED:
        return f"pod {pod.key} has finished ({pod.phase})"
    return None


def _pod_group_why(group: str, recorded_at: float, wants: Wants, pods: Mapping[str, PodMeta],
                   now: float) -> str | None:
    """Why a recorded pod group is to go; None while something asks for it (or may soon)."""
    if not wants.config.pod_groups:
        return "feature gate Resctrl is off"
    if wants.rdt is False:
        return "the node has no RDT (no info/L3/cbm_mask under the resctrl root)"
    uid = group.removeprefix(GROUP_PREFIX)
    pod = pods.get(uid)
    if pod is None or pod.phase in _FINISHED:
        return _pod_gone(uid, recorded_at, wants, pods, now)
    if ANNOTATION_RESCTRL not in pod.annotations or skips_hooks(pod.labels):
        return f"pod {pod.key} no longer asks for a resctrl group of its own"
    return None


def _class_group_why(wants: Wants) -> str | None:
    if not wants.config.class_groups:
        return "the RdtResctrl strategy is off (its feature gate, or the QoS manager)"
    if wants.rdt is False:
        return "the node has no RDT (no info/L3/cbm_mask under the resctrl root)"
    if not wants.class_groups_enabled:
        return "NodeSLO resctrlQOS is off in every class"
    return None


def collect(made: Made, wants: Wants, now: float) -> list[Plan]:
    """The plans that take away what nothing asks for, one per item (the blkio lines: one for all)."""
    pods = {pod.uid: pod for pod in wants.pods}
    plans: list[Plan] = []
    for group, recorded_at in sorted(made.groups.items()):
        if group.startswith(GROUP_PREFIX):
            why = _pod_group_why(group, recorded_at, wants, pods, now)
        elif group in CLASS_GROUPS:
            why = _class_group_why(wants)
        else:
            continue  # not a name koordlet gives: a record edited by hand is no reason to remove anything
        if why is not None:
            plans.append(Plan(resctrl=(ResctrlRemoveGroup(group),), reason=AUDIT_REASON,
                              why=f"resctrl group {group}: {why}"))
    for owned, on, strategy in ((lambda k: k.resource != IO_WEIGHT_DEFAULT_LINE, wants.config.blkio, "BlkIOReconcile"),
                                (lambda k: k.resource == IO_WEIGHT_DEFAULT_LINE, wants.config.psi_throttle,
                                 "BEPSIThrottle")):
        lines = [k for k in made.lines if owned(k)]
        if lines and not on:
            why = f"the {strategy} strategy is off (its feature gate, or the QoS manager)"
            plans.append(Plan(lines=tuple(LineRestore(k.resource, k.cgroup_dir, k.device, why) for k in lines),
                              reason=AUDIT_REASON, why=why))
    sysctls = tuple(key for key in made.sysctls if sysreconcile.owns(key))
    if sysctls and not wants.config.system_config:
        why = "the SystemConfig strategy is off (its feature gate, or the QoS manager)"
        plans.append(Plan(system=tuple(SystemRestore(key, why) for key in sysctls), reason=AUDIT_REASON, why=why))
    root = wants.config.host_dir_root
    for path, (uid, recorded_at) in sorted(made.host_dirs.items()):
        if not root or not path.startswith(root.rstrip("/") + "/"):
            continue  # not where koordlet makes them: a record edited by hand is no reason to remove anything
        why = _pod_gone(uid, recorded_at, wants, pods, now)
        if why is not None:
            plans.append(Plan(host_dirs=(HostDirRemove(path, root),), reason=AUDIT_REASON,
                              why=f"host dir {path}: {why}"))
    return plans


def _recorded_at(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 0.0  # unreadable: as old as can be (no grace)


def _host_dir_owner(text: str) -> tuple[str, float]:
    uid, _, at = text.partition(" ")
    return uid, _recorded_at(at)


class NodeStateCollector:
    """Runs :func:`collect` at start and every ``config.interval_s``, once the states have synced."""

    def __init__(self, config: CollectorConfig, states: StatesProvider, executor: ResourceExecutor,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self._states = states
        self._records = executor.records
        self._sysctls = executor.originals
        self._runner = PlanRunner(executor)
        self._clock = wall_clock
        self.passes = 0
        self._thread = PeriodicThread("node-state-collector",
                                      lambda: self.config.interval_s if self.passes else RETRY_S, self.collect_once,
                                      on_error=lambda err: logger.exception("node state collector pass failed"))

    def _rdt(self) -> bool | None:
        if not self.config.resctrl_dir:
            return False
        try:
            return read_resctrl_info(self.config.resctrl_dir) is not None
        except (OSError, ResctrlInfoError) as err:
            logger.warning("resctrl at %s unreadable (%s): no group is collected for the node's RDT",
                           self.config.resctrl_dir, err)
            return None

    def wants(self) -> Wants:
        class_enabled = ResctrlConfig.from_node_slo(self._states.node_slo()).enabled
        return Wants(self.config, self._states.pods(), self._rdt(), class_enabled)

    def collect_once(self) -> int:
        """One pass; returns how many plans were run (0 before the states have synced)."""
        if not self._states.has_synced():
            logger.debug("node state collector: states not synced yet")
            return 0
        records = self._records
        made = Made({name: _recorded_at(at) for name, at in records.resctrl_groups.items().items()},
                    sorted(recorded_lines(records), key=LineKey.text),
                    sorted(self._sysctls.keys()),
                    {path: _host_dir_owner(owner) for path, owner in records.host_dirs.items().items()})
        plans = collect(made, self.wants(), self._clock())
        for plan in plans:
            record = self._runner.run(plan, "collector")
            COLLECTED.labels("resctrl_group").inc(len(record.removed_groups))
            COLLECTED.labels("blkio_line").inc(record.lines_written)
            COLLECTED.labels("host_dir").inc(len(record.removed_dirs))
            COLLECTED.labels("sysctl").inc(record.system_written)
            done = len(record.removed_groups) + record.lines_written + len(record.removed_dirs) + record.system_written
            logger.info("collected: %s (%d done, %d failed)", plan.why, done, record.failed)
            for error in (*record.resctrl_errors, *record.line_errors, *record.dir_errors, *record.system_errors):
                logger.warning("collector: %s", error)
        self.passes += 1
        return len(plans)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> bool:
        return self._thread.stop(timeout_s)
