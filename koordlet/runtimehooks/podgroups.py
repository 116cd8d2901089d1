"""The pods' own resctrl groups (``koordlet-<pod uid>``, hooks/resctrl.py): made before a container is given one as
its RDT class, and removed from the record of what koordlet made.

**A container is named only a group that exists.** Through NRI the pod's group is the RDT class of each of its
containers. containerd (1.7 and 2.x) puts that class into the OCI spec as ``linux.intelRdt.closID`` unchanged, and
runc, given a closID without schemata, requires the group's directory to exist ("clos dir not accessible (must be
pre-created when l3CacheSchema and memBwSchema are empty)"), so a class whose group is missing fails the container,
and with it the pod. The group is made at RunPodSandbox, but that work runs after the answer on the handlers'
background pod queue, so a CreateContainer can arrive first; and a mkdir can fail (ENOSPC once the CPU's CLOSIDs
are used up). So CreateContainer itself makes sure of the group before it answers (:meth:`PodGroups.ready`): a
group already there is used; a missing one is made now with its schemata (a mkdir and one write, bounded by the
handler's deadline like the rest of the answer); a group the kernel will not make leaves the class out of the
answer (logged, counted, a Warning Event), and the container starts in the root group.

That is the better of the two choices on real containerd and runc. The other, always leaving the class out and
letting the reconciler move the tasks later, is worse twice over: ``tasks`` in resctrl moves one thread per write,
so the threads a process starts before the move stay in the root group, while a class given at creation puts
runc's init in the group before the container's process execs, and everything it starts inherits the group; and
until the reconciler's next pass (10 s by default) the container runs unbounded.

**Removal goes by the record.** :class:`~koordlet.executor.records.NodeRecords` keeps every pod group koordlet made
(or took for a pod it serves). A group is removed when its pod goes, whichever way koordlet hears of it:
PostStopPodSandbox through the proxy, RemovePodSandbox through NRI, and the collector's passes
(:mod:`koordlet.collector`: pods that ended while koordlet was down, the gate switched off, the node without RDT).
None of these runs the plugins again, so a gate switched off or an annotation changed since the group was made
does not keep it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

from hooks import registry
from hooks import resctrl as resctrl_hook
from hooks.protocol import Changes, NodeContext, PodContext
from hooks.validate import Rejected
from koordlet.actuator import PlanRunner
from koordlet.api.pod import PodMeta
from koordlet.executor import ResourceExecutor
from koordlet.plan import Plan, ResctrlGroup, ResctrlRemoveGroup, ResctrlWrite

from .apply import RejectedValues, report_plugin_error

log = logging.getLogger(__name__)

AUDIT_REASON = "PodResctrlGroup"


def pod_group(pod_uid: str) -> str:
    return resctrl_hook.GROUP_PREFIX + pod_uid


class PodGroups:
    """The pod groups of one front door (``source``: "nri", "hookserver"), carried out by its runner."""

    def __init__(self, executor: ResourceExecutor, runner: PlanRunner, source: str,
                 rejects: RejectedValues | None = None) -> None:
        self._records = executor.records.resctrl_groups
        self._runner = runner
        self._source = source
        self._rejects = rejects or RejectedValues()

    def ready(self, pod: PodMeta, node: Callable[[], NodeContext], group: str) -> bool:
        """Make sure ``group``, the pod's own, exists: True when it does (made now if it was missing, with its
        schemata); False when the kernel refused it (reported)."""
        record = self._runner.run(Plan(resctrl=(ResctrlGroup(group, pod.uid),), reason=AUDIT_REASON,
                                       why=f"the RDT class of a container of {pod.key}"), self._source)
        if record.resctrl_errors:
            self._rejects.report(pod, "", [Rejected("resctrl_group", group, "; ".join(record.resctrl_errors) +
                                                    ": the containers start without their RDT class")])
            return False
        if group in record.created_groups:
            self._write_schemata(pod, node, group)
        return True

    def _write_schemata(self, pod: PodMeta, node: Callable[[], NodeContext], group: str) -> None:
        changes = registry.run_pod([resctrl_hook.PLUGIN], node(), PodContext(pod), report_plugin_error)
        if changes.resctrl_group != group or not changes.resctrl_schemata:
            return
        record = self._runner.run(Plan(resctrl=(ResctrlWrite(group, "schemata", changes.resctrl_schemata),),
                                       reason=AUDIT_REASON, why=f"{pod.key}'s resctrl annotation"), self._source)
        for error in record.resctrl_errors:
            log.warning("pod %s: schemata of resctrl group %s: %s", pod.key, group, error)

    def checked(self, pod: PodMeta, node: Callable[[], NodeContext], changes: Changes) -> Changes:
        """``changes`` for a container, without an RDT class whose group cannot be made (``node``: the node's
        context, asked for only when a group is made)."""
        if not changes.resctrl_group or self.ready(pod, node, changes.resctrl_group):
            return changes
        return replace(changes, resctrl_group=None)

    def remove(self, pod_uid: str, why: str) -> bool:
        """Remove the pod's group if koordlet made it (its tasks back to the root group first); True when removed."""
        group = pod_group(pod_uid)
        if self._records.get(group) is None:
            return False
        record = self._runner.run(Plan(resctrl=(ResctrlRemoveGroup(group),), reason=AUDIT_REASON, why=why),
                                  self._source)
        for error in record.resctrl_errors:
            log.warning("pod %s: removing resctrl group %s", pod_uid, error)
        return group in record.removed_groups
