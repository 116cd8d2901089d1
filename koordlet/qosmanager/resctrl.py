"""Class-level RDT: resctrl groups LSR, LS and BE with L3 CAT masks and MBA, and pod tasks moved in
(``RdtResctrl``, koordinator.md §4.7, mask rule of §3.3).

L3 mask of a group = bits [ceil(ways × start/100), ceil(ways × end/100)) where ways is the bit length of
the root ``info/L3/cbm_mask`` (contiguous); MB = ``mbaPercent`` rounded up to a multiple of 10 (Intel) or
25 × 8 × 0.8 × pct/100 (AMD, 100 % → 2048). Both are written for every L3 cache id named in the root
``schemata``. Every active pod without a pod-level ``node.koordinator.sh/resctrl`` annotation whose class
enables resctrl gets the PIDs of its containers' and sandbox's cgroups moved to its class group
(LSE → LSR; the class comes from the label or the kube QoS).

A node without ``info/L3/cbm_mask`` (no RDT, or resctrl not mounted) makes the strategy a no-op, logged
once. Creating the three group dirs is the one thing done here rather than in the executor, which writes
files only; the group names are constants.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from koordlet.api.keys import ANNOTATION_RESCTRL
from koordlet.api.nodeslo import NodeSLOSpec, ResctrlQOS
from koordlet.api.qos import QoSClass
from koordlet.api.resctrl import VENDOR_INTEL, l3_mask, mb_value
from koordlet.executor import ExecutorError, ResourceExecutor
from koordlet.qosmanager.framework import GATE_RDT_RESCTRL
from koordlet.qosmanager.snapshot import Snapshot, SnapshotBuilder, container_cgroup_dir, pod_cgroup_dir
from koordlet.system.kubepods import CgroupPathError, KubeCgroupLayout
from koordlet.system.resctrl import ResctrlInfo, read_group_tasks, read_resctrl_info

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
class ResctrlDecision:
    schemata: Mapping[str, str]  # group → schemata text
    tasks: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # group → PIDs to move in


def decide(
    snapshot: Snapshot,
    info: ResctrlInfo,
    pod_tasks: Mapping[str, tuple[int, ...]],
    group_tasks: Mapping[str, frozenset[int]],
) -> ResctrlDecision:
    """``pod_tasks``: PIDs in each pod's cgroups (by uid); ``group_tasks``: PIDs already in each group."""
    strategy = snapshot.node_slo.resource_qos_strategy
    schemata = {
        group: schemata_text(info, strategy.for_class(QoSClass(group)).resctrl_qos) for group in GROUPS
    }
    moves: dict[str, list[int]] = {}
    for pod in snapshot.pods:
        if pod.phase not in ("Running", "Pending", "") or ANNOTATION_RESCTRL in pod.annotations:
            continue
        group = group_of(pod.qos_class)
        if group is None or not strategy.for_class(pod.qos_class).resctrl_qos.enable:
            continue
        present = group_tasks.get(group, frozenset())
        moves.setdefault(group, []).extend(pid for pid in pod_tasks.get(pod.uid, ()) if pid not in present)
    return ResctrlDecision(schemata, {group: tuple(sorted(set(pids))) for group, pids in moves.items() if pids})


class ResctrlReconcile:
    name = "resctrl"
    feature_gate = GATE_RDT_RESCTRL

    def __init__(
        self,
        builder: SnapshotBuilder,
        executor: ResourceExecutor,
        layout: KubeCgroupLayout,
        interval_s: float = 1.0,
        vendor: str = VENDOR_INTEL,
    ) -> None:
        self.interval_s = interval_s
        self._builder = builder
        self._executor = executor
        self._layout = layout
        self._vendor = vendor
        self._info: ResctrlInfo | None = None
        self._probed = False
        self.last_decision: ResctrlDecision | None = None

    def active(self, spec: NodeSLOSpec) -> bool:
        strategy = spec.resource_qos_strategy
        return any(strategy.for_class(QoSClass(g)).resctrl_qos.enable for g in GROUPS)

    def deactivate(self) -> None:
        """Groups are left in place: removing them would move their tasks to the root group anyway."""

    def _resctrl_info(self) -> ResctrlInfo | None:
        root = self._executor.resctrl_root
        if not self._probed:
            self._probed = True
            self._info = read_resctrl_info(root, self._vendor) if root else None
            if self._info is None:
                logger.info("resctrl QoS is a no-op: no RDT (info/L3/cbm_mask) under %s", root)
        return self._info

    def _pids(self, cgroup_dir: str) -> tuple[int, ...]:
        try:
            text = self._executor.read("tasks", cgroup_dir)
        except ExecutorError:
            return ()
        return tuple(int(line) for line in text.split() if line.isdigit())

    def _pod_tasks(self, snapshot: Snapshot) -> dict[str, tuple[int, ...]]:
        tasks: dict[str, tuple[int, ...]] = {}
        for pod in snapshot.pods:
            pod_dir = pod_cgroup_dir(self._layout, pod)
            if pod_dir is None:
                continue
            pids: list[int] = []
            dirs = [container_cgroup_dir(self._layout, pod_dir, c) for c in pod.containers]
            if pod.sandbox_id:
                try:
                    dirs.append(self._layout.container_dir(pod_dir, pod.sandbox_id))
                except CgroupPathError:
                    logger.debug("unsafe sandbox id of %s", pod.key)
            for cgroup_dir in dirs:
                if cgroup_dir is not None:
                    pids.extend(self._pids(cgroup_dir))
            tasks[pod.uid] = tuple(pids)
        return tasks

    def _group_tasks(self, root: str) -> dict[str, frozenset[int]]:
        return read_group_tasks(root, GROUPS)

    def run(self, now: float) -> None:
        info = self._resctrl_info()
        root = self._executor.resctrl_root
        if info is None or root is None:
            return
        snapshot = self._builder.build(now=now)
        if snapshot is None:
            return
        for group in GROUPS:
            self._executor.ensure_resctrl_group(group)  # the executor is the only writer, mkdir included
        decision = decide(snapshot, info, self._pod_tasks(snapshot), self._group_tasks(root))
        self.last_decision = decision
        for group, text in decision.schemata.items():
            self._executor.write_resctrl(group, "schemata", text)
        for group, pids in decision.tasks.items():
            for pid in pids:
                try:
                    self._executor.write_resctrl(group, "tasks", str(pid))
                except ExecutorError as exc:
                    logger.debug("cannot move task %d to resctrl group %s: %s", pid, group, exc)
