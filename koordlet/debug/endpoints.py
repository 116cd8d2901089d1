"""``/debug/nodeslo`` and ``/debug/pods/<namespace>/<name>``: what koordlet runs with, and why a pod has what it has.

``GET /debug/nodeslo`` (JSON): the NodeSLO spec in effect merged with the defaults (every field, camelCase, as the
CRD spells it), where it came from (``source``: ``apiserver`` with the object and its ``resourceVersion``, ``file``
with its path and a digest of its content, or ``defaults`` and why) and the last spec refused, if any.

``GET /debug/pods/<namespace>/<name>`` (JSON), for one pod of this node:
- ``hooks``: per level (``pod``, then each container) what each hook plugin answered when it was created: its
  changes, or the error it was skipped for; the values the check dropped; the merged answer; which front door
  asked (hook server, NRI) or the reconciler's first pass for a pod that predates koordlet. ``notRun`` lists the
  plugins whose feature gate is off;
- ``cgroups``: the values in the pod's and its containers' cgroup files now (v2 files by their v2 names);
- ``actions``: the last writes to those dirs and to the pod's QoS dirs above them, and the evictions asked for the
  pod, newest first, each with who did it, its reason and its figures;
- ``strategies``: each QoS strategy, whether its NodeSLO switch is on, when it ticks next, whether its last plan
  touched this pod (its dirs, its QoS dirs, or an eviction of it), with that plan's reason and figures; ``next`` is
  the active strategy that touched the pod and ticks first.

Both answer 503 while the agent is starting; a pod not on the node is 404.
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from hooks import registry
from hooks.protocol import Changes
from koordlet.api._fields import dump
from koordlet.api.pod import PodMeta
from koordlet.api.qos import skips_hooks
from koordlet.executor import ExecutorError, ResourceExecutor
from koordlet.history.actions import RecentActions
from koordlet.history.answers import POD_LEVEL, HookRecord
from koordlet.metrics import Reply, Request
from koordlet.plan import Plan
from koordlet.system.cgroup import CgroupVersion
from koordlet.system.kubepods import CgroupPathError, KubeCgroupLayout, pod_cgroup_dir
from koordlet.system.resources import get_resource

if TYPE_CHECKING:
    from koordlet.qosmanager.framework import QoSManager, StrategyState
    from koordlet.runtimehooks import RuntimeHooks
    from koordlet.statesinformer.informer import StatesInformer

PODS_PREFIX = "/debug/pods"
NODESLO_PATH = "/debug/nodeslo"
# The files shown for a pod and its containers (registry names; v2 shows the v2 file once).
SHOWN_RESOURCES = ("cpu.shares", "cpu.cfs_quota_us", "cpu.cfs_period_us", "cpu.cfs_burst_us", "cpu.idle",
                   "cpu.bvt_warp_ns", "cpuset.cpus", "cpuset.mems", "memory.limit_in_bytes", "memory.min",
                   "memory.low", "memory.high")


@dataclass(frozen=True, slots=True)
class DebugSources:
    """What the endpoints read, once the agent's parts are built."""

    node_name: str
    states: StatesInformer
    executor: ResourceExecutor
    layout: KubeCgroupLayout
    actions: RecentActions
    hooks: RuntimeHooks | None = None
    qos: QoSManager | None = None


def _time(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds") if at else ""


def _json(status: int, body: object) -> Reply:
    return Reply(status, "application/json", json.dumps(body, indent=2, default=str).encode() + b"\n")


def changes_json(changes: Changes | None) -> dict[str, Any] | None:
    """The fields a plugin set (None and empty ones left out)."""
    if changes is None:
        return None
    out: dict[str, Any] = {}
    for f in dataclasses.fields(changes):
        value = getattr(changes, f.name)
        if value in (None, {}, ()):
            continue
        if isinstance(value, tuple):
            value = [dataclasses.asdict(item) if dataclasses.is_dataclass(item) else item for item in value]
        out[f.name] = dict(value) if isinstance(value, Mapping) else value
    return out


def _record_json(record: HookRecord) -> dict[str, Any]:
    return {
        "stage": record.stage, "by": record.door, "at": _time(record.at), "note": record.note,
        "plugins": [{"plugin": a.plugin, "answered": changes_json(a.changes), "error": a.error}
                    for a in record.answers],
        "rejected": [dataclasses.asdict(r) for r in record.rejected],
        "result": changes_json(record.result),
    }


class DebugEndpoints:
    def __init__(self, sources: Callable[[], DebugSources | None]) -> None:
        self._sources = sources

    # ------------------------------------------------------------------------------------------ nodeslo
    def nodeslo(self, request: Request) -> Reply:
        sources = self._sources()
        if sources is None:
            return Reply.text(503, "koordlet is starting")
        return _json(200, self.nodeslo_json(sources))

    @staticmethod
    def nodeslo_json(sources: DebugSources) -> dict[str, Any]:
        states = sources.states
        origin = states.node_slo_origin()
        rejected = states.node_slo_rejected()
        return {
            "node": sources.node_name,
            "source": {"source": origin.source, "detail": origin.detail, "name": origin.name,
                       "resourceVersion": origin.resource_version, "path": origin.path, "takenAt": _time(origin.at)},
            "lastRejected": {"at": _time(rejected[0]), "reason": rejected[1]} if rejected else None,
            "spec": dump(states.node_slo()),
        }

    # --------------------------------------------------------------------------------------------- pods
    def pod(self, request: Request) -> Reply:
        rest = request.path[len(PODS_PREFIX):].strip("/")
        namespace, _, name = rest.partition("/")
        if not namespace or not name or "/" in name:
            return Reply.text(404, f"use {PODS_PREFIX}/<namespace>/<name>")
        sources = self._sources()
        if sources is None:
            return Reply.text(503, "koordlet is starting")
        pod = next((p for p in sources.states.pods() if p.namespace == namespace and p.name == name), None)
        if pod is None:
            return Reply.text(404, f"pod {namespace}/{name} is not on node {sources.node_name} (koordlet knows "
                                   f"{len(sources.states.pods())} pods)")
        return _json(200, self.pod_json(sources, pod))

    def pod_json(self, sources: DebugSources, pod: PodMeta) -> dict[str, Any]:
        origin = sources.states.node_slo_origin()
        dirs = self._dirs(sources.layout, pod)
        pod_dir = dirs[0][2] if dirs else None
        related = [d for _, _, d in dirs] + _ancestors(pod_dir, sources.layout)
        strategies, next_name = self._strategies(sources.qos, pod, related)
        return {
            "pod": {"namespace": pod.namespace, "name": pod.name, "uid": pod.uid, "qosClass": pod.qos_class.value,
                    "kubeQoS": pod.effective_kube_qos.value if pod.effective_kube_qos else "",
                    "phase": pod.phase, "skipsHooks": skips_hooks(pod.labels)},
            "node": sources.node_name,
            "nodeSLO": {"source": origin.source, "detail": origin.detail, "resourceVersion": origin.resource_version,
                        "path": origin.path},
            "hooks": self._hooks(sources, pod),
            "cgroups": [self._cgroup(sources.executor, level, name, cgroup_dir) for level, name, cgroup_dir in dirs],
            "actions": [{"at": _time(a.at), "where": where, "by": a.source, "what": a.what, "reason": a.reason,
                         "why": a.why} for where, a in sources.actions.of(related, pod.uid)],
            "strategies": strategies,
            "next": next_name,
        }

    @staticmethod
    def _dirs(layout: KubeCgroupLayout, pod: PodMeta) -> list[tuple[str, str, str]]:
        """(level, container name, cgroup dir) of the pod and its created containers; empty when unknown."""
        pod_dir = pod_cgroup_dir(layout, pod)
        if pod_dir is None:
            return []
        try:
            return [("pod", "", pod_dir)] + [
                ("container", c.name, layout.container_dir(pod_dir, c.container_id, c.runtime))
                for c in pod.containers if c.container_id]
        except (CgroupPathError, ValueError):
            return []

    @staticmethod
    def _cgroup(executor: ResourceExecutor, level: str, name: str, cgroup_dir: str) -> dict[str, Any]:
        version = executor.cgroup_fs.version
        values: dict[str, str] = {}
        for resource_name in SHOWN_RESOURCES:
            resource = get_resource(resource_name)
            file_name = resource.file_name(version)
            if file_name is None or file_name in values:
                continue
            try:
                values[file_name] = executor.read(resource, cgroup_dir)
            except ExecutorError:
                continue  # not on this kernel, or the dir is gone
        return {"level": level, "container": name, "dir": cgroup_dir,
                "cgroupVersion": "v2" if version is CgroupVersion.V2 else "v1", "values": values}

    @staticmethod
    def _hooks(sources: DebugSources, pod: PodMeta) -> dict[str, Any]:
        hooks = sources.hooks
        enabled = {p.name for p in hooks.plugins} if hooks is not None else set()
        not_run = [{"plugin": plugin.name, "why": f"feature gate {plugin.gate} off"}
                   for plugin in registry.all_plugins() if plugin.name not in enabled]
        records = hooks.answers.of(pod.uid) if hooks is not None else {}
        return {
            "running": hooks is not None,
            "pod": _record_json(records[POD_LEVEL]) if POD_LEVEL in records else None,
            "containers": {name: _record_json(record) for name, record in sorted(records.items())
                           if name != POD_LEVEL},
            "notRun": not_run,
        }

    @staticmethod
    def _strategies(qos: QoSManager | None, pod: PodMeta,
                    related: Sequence[str]) -> tuple[list[dict[str, Any]], str]:
        if qos is None:
            return [], ""
        states: list[StrategyState] = qos.schedule()
        rows = []
        for state in states:
            plan = state.plan
            rows.append({"name": state.name, "active": state.active, "intervalS": state.interval_s,
                         "nextInS": round(state.next_in_s, 3), "touchesPod": _touches(plan, pod, related),
                         "lastReason": plan.reason if plan else "", "lastWhy": plan.why if plan else ""})
        acting = [row for row in rows if row["active"] and row["touchesPod"]]
        return rows, min(acting, key=lambda row: row["nextInS"])["name"] if acting else ""


def _ancestors(pod_dir: str | None, layout: KubeCgroupLayout) -> list[str]:
    """The dirs above the pod dir up to kubepods (its QoS dir and kubepods): what QoS strategies write for a class."""
    if not pod_dir:
        return []
    top = layout.kubepods_dir().strip("/")
    out: list[str] = []
    parent = posixpath.dirname(pod_dir.strip("/"))
    while parent and (parent == top or parent.startswith(top + "/")):
        out.append(parent)
        parent = posixpath.dirname(parent)
    return out


def _touches(plan: Plan | None, pod: PodMeta, related: Sequence[str]) -> bool:
    if plan is None:
        return False
    wanted = {d.strip("/") for d in related}
    if any(w.cgroup_dir.strip("/") in wanted for step in plan.steps for w in step.writes):
        return True
    if any(p.cgroup_dir.strip("/") in wanted for p in plan.processes):
        return True
    return any(victim.pod.uid == pod.uid for task in plan.evictions for victim in task.candidates)
