"""Class-level RDT: resctrl groups LSR, LS and BE with L3 CAT masks and MBA, and pod tasks moved in
(``RdtResctrl``, docs/koordinator.md §4.7, mask rule of docs/koordinator.md §3.3).

L3 mask of a group = bits [ceil(ways × start/100), ceil(ways × end/100)) where ways is the bit length of
the root ``info/L3/cbm_mask`` (contiguous); MB = ``mbaPercent`` rounded up to a multiple of 10 (Intel) or
25 × 8 × 0.8 × pct/100 (AMD, 100 % → 2048). Both are written for every L3 cache id named in the root
``schemata``. Every active pod without a pod-level ``node.koordinator.sh/resctrl`` annotation whose class
enables resctrl gets the PIDs of its containers' and sandbox's cgroups moved to its class group
(LSE → LSR; the class comes from the label or the kube QoS).

A node without ``info/L3/cbm_mask`` (no RDT, or resctrl not mounted) makes the strategy a no-op, logged
once (by the snapshot builder, which reads the resctrl facts). The plan makes the three groups, writes
their schemata and asks the runner to move the pods' tasks in (tasks already there are not written again).

Switched off (every class's ``resctrlQOS.enable`` false), the groups this strategy made are removed, their
tasks moved back to the root group first. Only what it made is undone: the runner's record names the groups
its mkdir created (``PlanRecord.created_groups``, back as ``snapshot.last``), and the memo keeps them from tick
to tick, so groups that were there before (another tool's, or a previous agent's) are left alone.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from koordlet.api.keys import ANNOTATION_RESCTRL
from koordlet.api.nodeslo import NodeSLOSpec, ResctrlQOS
from koordlet.api.pod import PodMeta
from koordlet.api.qos import QoSClass
from koordlet.api.resctrl import l3_mask, mb_value
from koordlet.plan import Plan, ResctrlAction, ResctrlGroup, ResctrlMoveTasks, ResctrlRemoveGroup, ResctrlWrite
from koordlet.qosmanager.framework import GATE_RDT_RESCTRL, QoSManagerConfig, Strategy
from koordlet.qosmanager.snapshot import Needs, Snapshot, container_cgroup_dir, pod_cgroup_dir
from koordlet.system.kubepods import CgroupPathError
from koordlet.system.resctrl import ResctrlInfo

logger = logging.getLogger(__name__)

GROUPS = (QoSClass.LSR.value, QoSClass.LS.value, QoSClass.BE.value)


def schemata_text(info: ResctrlInfo, config: ResctrlQOS) -> str:
    mask = l3_mask(info.cbm_mask, config.cat_range_start_percent, config.cat_range_end_percent)
    lines = ["L3:" + ";".join(f"{cache_id}={mask:x}" for cache_id in info.cache_ids)]
    if info.has_mb:
        mb = mb_value(config.mba_percent, info.vendor)
        lines.append("MB:" + ";".join(f"{cache_id}={mb}" for cache_id in info.cache_ids))
    return "\n".join(lines) + "\n"


def group_of(qos: QoSClass) -> str | None:
    if qos in (QoSClass.LSE, QoSClass.LSR):
        return QoSClass.LSR.value
    if qos in (QoSClass.LS, QoSClass.BE):
        return qos.value
    return None


@dataclass(frozen=True, slots=True)
class ResctrlConfig:
    """On while any class enables ``resctrlQOS``; the schemata come from the snapshot's NodeSLO."""

    enabled: bool = True

    @classmethod
    def from_node_slo(cls, spec: NodeSLOSpec, flags: QoSManagerConfig | None = None) -> ResctrlConfig:
        strategy = spec.resource_qos_strategy
        return cls(enabled=any(strategy.for_class(QoSClass(g)).resctrl_qos.enable for g in GROUPS))

    @property
    def needs(self) -> Needs:
        return _NEEDS


_NEEDS = Needs(resctrl=True, pod_usage=None, container_usage=None)


@dataclass(frozen=True, slots=True)
class ResctrlDecision:
    schemata: Mapping[str, str]  # group → schemata text
    tasks: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # group → cgroup dirs whose tasks move in


def pod_dirs(snapshot: Snapshot, pod: PodMeta) -> tuple[str, ...]:
    """The cgroup dirs of a pod's containers and sandbox (their tasks are the pod's)."""
    layout = snapshot.layout
    pod_dir = pod_cgroup_dir(layout, pod)
    if pod_dir is None:
        return ()
    dirs = [d for c in pod.containers if (d := container_cgroup_dir(layout, pod_dir, c)) is not None]
    if pod.sandbox_id:
        try:
            dirs.append(layout.container_dir(pod_dir, pod.sandbox_id))
        except CgroupPathError:
            logger.debug("unsafe sandbox id of %s", pod.key)
    return tuple(dirs)


def decide_groups(snapshot: Snapshot, info: ResctrlInfo) -> ResctrlDecision:
    """Schemata of the three class groups, and the pods whose tasks move into each."""
    strategy = snapshot.node_slo.resource_qos_strategy
    schemata = {
        group: schemata_text(info, strategy.for_class(QoSClass(group)).resctrl_qos) for group in GROUPS
    }
    moves: dict[str, list[str]] = {}
    for pod in snapshot.pods:
        if pod.phase not in ("Running", "Pending", "") or ANNOTATION_RESCTRL in pod.annotations:
            continue
        group = group_of(pod.qos_class)
        if group is None or not strategy.for_class(pod.qos_class).resctrl_qos.enable:
            continue
        moves.setdefault(group, []).extend(pod_dirs(snapshot, pod))
    return ResctrlDecision(schemata, {group: tuple(dirs) for group, dirs in moves.items() if dirs})


def decide(snapshot: Snapshot, config: ResctrlConfig) -> Plan:
    """Make the groups, write their schemata, move the pods' tasks in; a no-op without RDT
    (``snapshot.resctrl`` None). Switched off, the groups made earlier (``snapshot.memo``) are removed, their
    tasks back in the root group."""
    made: frozenset[str] = frozenset(snapshot.memo or ())
    if snapshot.last is not None:
        made = (made | frozenset(snapshot.last.created_groups)) - frozenset(snapshot.last.removed_groups)
    if not config.enabled:
        return Plan(resctrl=tuple(ResctrlRemoveGroup(group) for group in GROUPS if group in made), memo=made,
                    reason="ResctrlReconcile", why="resctrlQOS off: the class groups go, their tasks to the root")
    info = snapshot.resctrl
    if info is None:
        return Plan(memo=made)
    decision = decide_groups(snapshot, info)
    actions: list[ResctrlAction] = [ResctrlGroup(group) for group in GROUPS]
    actions += [ResctrlWrite(group, "schemata", text) for group, text in decision.schemata.items()]
    actions += [ResctrlMoveTasks(group, dirs) for group, dirs in decision.tasks.items()]
    strategy = snapshot.node_slo.resource_qos_strategy
    why = "; ".join(f"{group}: {_class_figures(strategy.for_class(QoSClass(group)).resctrl_qos)}" for group in GROUPS)
    return Plan(resctrl=tuple(actions), memo=made, report=decision, reason="ResctrlReconcile", why=why)


def _class_figures(qos: ResctrlQOS) -> str:
    """A class's NodeSLO resctrlQOS, for the audit log."""
    return (f"enable {qos.enable}, L3 {qos.cat_range_start_percent}-{qos.cat_range_end_percent}%, "
            f"MB {qos.mba_percent}%")


STRATEGY = Strategy("resctrl", GATE_RDT_RESCTRL, ResctrlConfig, decide)
