"""Whose cgroup dir an action touched: a pod (and its container), or the node."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from koordlet.api.pod import PodMeta
from koordlet.audit.events import TYPE_NODE, TYPE_POD
from koordlet.system.kubepods import container_id_from_dir_name, pod_uid_from_dir_name


@dataclass(frozen=True, slots=True)
class Owner:
    """Who an action concerns: a pod (and container), or the node."""

    type: str = TYPE_NODE
    namespace: str = ""
    name: str = ""
    container: str = ""


NODE = Owner()
OwnerResolver = Callable[[str], Owner]  # cgroup dir (relative to the hierarchy root) -> owner


def pod_owner_resolver(pods: Callable[[], Sequence[PodMeta]]) -> OwnerResolver:
    """Whose cgroup dir: the pod whose ``pod<uid>`` (or systemd ``…-pod<uid>.slice``) dir it is or is in,
    and the container whose dir follows; the node for the QoS dirs and anything else. The uid index is
    built again only when ``pods()`` returns another list.

    Several threads resolve at once (the QoS manager's, the reconciler's, the NRI and hook server's runners): an
    index is never changed once built, and the (list, index) pair is replaced in one assignment, so a reader
    always sees a whole index of one list."""
    built: list[tuple[object, dict[str, PodMeta]]] = [(None, {})]

    def resolve(cgroup_dir: str) -> Owner:
        listed = pods()
        seen, index = built[0]
        if listed is not seen:
            index = {pod.uid: pod for pod in listed}
            built[0] = (listed, index)
        parts = [part for part in cgroup_dir.split("/") if part]
        for i, part in enumerate(parts):
            uid = pod_uid_from_dir_name(part)
            if uid is None:
                continue
            pod = index.get(uid)
            if pod is None:
                return Owner(TYPE_POD, name=f"pod{uid}")
            container = ""
            if i + 1 < len(parts):
                container_id = container_id_from_dir_name(parts[i + 1])
                container = next((c.name for c in pod.containers if c.container_id == container_id), "")
            return Owner(TYPE_POD, pod.namespace, pod.name, container)
        return NODE

    return resolve
