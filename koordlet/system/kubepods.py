"""Kubelet's cgroup layout: kubepods, QoS, pod and container dirs for both drivers (docs/node-interfaces.md §8.1,
docs/koordinator.md §8.2), and the parse back from a dir name to a pod uid or container id.

Dirs are returned relative to a hierarchy root, without a leading slash (``kubepods/besteffort/pod<uid>``);
:meth:`koordlet.system.cgroup.CgroupFS.cgroup_dir` turns them into absolute paths per subsystem.
``cgroup_root`` is kubelet's ``--cgroup-root``: ``/`` in production, ``/koordlet-py`` in our tests, which
put every pod under ``/koordlet-py/kubepods/...``. With the systemd driver the prefix is prepended as a
plain dir (kubelet's own slice expansion of a non-root ``--cgroup-root`` is not modelled).

Every component that comes from outside (pod uid, container id) is checked to be a single plain name, so
no input can make a builder produce a path that climbs out of the hierarchy.
"""

from __future__ import annotations

import functools
import logging
import re
from dataclasses import dataclass

from koordlet.api.pod import DEFAULT_RUNTIME, PodMeta, split_container_id
from koordlet.api.qos import KubeQoS
from koordlet.system.cgroup import CgroupDriver

logger = logging.getLogger(__name__)

KUBEPODS = "kubepods"
_SYSTEMD_QOS = {KubeQoS.BURSTABLE: "burstable", KubeQoS.BESTEFFORT: "besteffort"}
# Runtime → (cgroupfs container dir prefix, systemd scope prefix), docs/node-interfaces.md §8.1 and
# docs/koordinator.md §3.2.
_CONTAINER_PREFIXES = {
    "containerd": ("", "cri-containerd-"),
    "docker": ("", "docker-"),
    "cri-o": ("crio-", "crio-"),
    "crio": ("crio-", "crio-"),
    "pouch": ("", "pouch-"),
}
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")
_POD_CGROUPFS = re.compile(r"^pod([0-9a-fA-F-]+)$")
_POD_SYSTEMD = re.compile(r"^kubepods(?:-(?:burstable|besteffort))?-pod([0-9a-fA-F_]+)\.slice$")
_CONTAINER_SCOPE = re.compile(r"^(?:cri-containerd|docker|crio|pouch)-([0-9a-fA-F]+)\.scope$")
_CONTAINER_CGROUPFS = re.compile(r"^(?:crio-)?([0-9a-fA-F]{12,})$")


class CgroupPathError(ValueError):
    """A pod uid, container id or cgroup parent cannot be turned into a safe cgroup dir."""


def _safe_component(kind: str, value: str) -> str:
    if not _SAFE_NAME.match(value) or ".." in value:
        raise CgroupPathError(f"unsafe {kind} for a cgroup dir name: {value!r}")
    return value


def join_dirs(*parts: str) -> str:
    """Cgroup dir parts joined with single slashes, empty parts and outer slashes dropped."""
    return "/".join(part.strip("/") for part in parts if part.strip("/"))


def expand_systemd_slice(slice_name: str) -> str:
    """A systemd slice name as its nested dir path, as systemd lays it out.

    ``kubepods-burstable-pod1_2.slice`` → ``kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1_2.slice``
    """
    if not slice_name.endswith(".slice") or "/" in slice_name:
        raise CgroupPathError(f"not a systemd slice name: {slice_name!r}")
    stem = slice_name.removesuffix(".slice")
    if stem == "-":
        return ""
    parts = stem.split("-")
    if any(not part for part in parts):
        raise CgroupPathError(f"malformed systemd slice name: {slice_name!r}")
    return "/".join("-".join(parts[: depth + 1]) + ".slice" for depth in range(len(parts)))


@dataclass(frozen=True, slots=True)
class KubeCgroupLayout:
    """Path builders for one driver and kubelet ``--cgroup-root`` (normalised to ``/a/b`` form)."""

    driver: CgroupDriver = CgroupDriver.CGROUPFS
    cgroup_root: str = "/"

    def __post_init__(self) -> None:
        for component in self.cgroup_root.strip("/").split("/"):
            if component:
                _safe_component("cgroup root component", component)
        object.__setattr__(self, "cgroup_root", "/" + self.cgroup_root.strip("/"))

    @property
    def _systemd(self) -> bool:
        return self.driver is CgroupDriver.SYSTEMD

    def kubepods_dir(self) -> str:
        """The node-allocatable dir; Guaranteed pods sit directly in it."""
        return join_dirs(self.cgroup_root, "kubepods.slice" if self._systemd else KUBEPODS)

    def qos_dir(self, kube_qos: KubeQoS) -> str:
        if kube_qos is KubeQoS.GUARANTEED:
            return self.kubepods_dir()
        name = _SYSTEMD_QOS[kube_qos]
        return join_dirs(self.kubepods_dir(), f"kubepods-{name}.slice" if self._systemd else name)

    def pod_dir(self, pod_uid: str, kube_qos: KubeQoS) -> str:
        _safe_component("pod uid", pod_uid)
        if not self._systemd:
            return join_dirs(self.qos_dir(kube_qos), f"pod{pod_uid}")
        escaped = pod_uid.replace("-", "_")
        if kube_qos is KubeQoS.GUARANTEED:
            return join_dirs(self.qos_dir(kube_qos), f"kubepods-pod{escaped}.slice")
        return join_dirs(self.qos_dir(kube_qos), f"kubepods-{_SYSTEMD_QOS[kube_qos]}-pod{escaped}.slice")

    def container_dir(self, pod_dir: str, container_id: str, runtime: str = DEFAULT_RUNTIME) -> str:
        """Container dir under ``pod_dir``; ``container_id`` may carry its ``<runtime>://`` prefix."""
        runtime, bare_id = split_container_id(container_id, runtime)
        _safe_component("container id", bare_id)
        cgroupfs_prefix, scope_prefix = _CONTAINER_PREFIXES.get(runtime, ("", f"{runtime}-"))
        name = f"{scope_prefix}{bare_id}.scope" if self._systemd else f"{cgroupfs_prefix}{bare_id}"
        return join_dirs(pod_dir, name)

    def dir_from_cgroup_parent(self, cgroup_parent: str) -> str:
        """The pod dir for a CRI ``cgroup_parent``.

        Accepts the path form (``/kubepods/besteffort/pod<uid>``, ``/kubepods.slice/…/…pod<uid>.slice``)
        and the bare systemd slice name kubelet passes with the systemd driver
        (``kubepods-besteffort-pod<uid_>.slice``). The path already includes kubelet's ``--cgroup-root``.
        """
        parent = cgroup_parent.strip()
        if not parent.strip("/"):
            raise CgroupPathError(f"empty cgroup parent: {cgroup_parent!r}")
        if "/" not in parent and parent.endswith(".slice"):
            return expand_systemd_slice(parent)
        parts = [part for part in parent.split("/") if part]
        for part in parts:
            _safe_component("cgroup parent component", part)
        return "/".join(parts)


def pod_cgroup_dir(layout: KubeCgroupLayout, pod: PodMeta, cgroup_parent: str = "") -> str | None:
    """The pod's cgroup dir relative to the hierarchy root: from its CRI cgroup parent (``cgroup_parent`` when given,
    as a hook request carries it, else the pod's), else built from its uid and kube QoS; None when neither is known
    or what is known does not make a safe dir (logged once, as a warning).

    Every part that needs a pod's dir asks here: the QoS strategies every tick, the reconciler every pass, the hook
    server and the NRI handlers for every call, the states informer's cgroup list, the debug endpoints. So the
    answer is memoised (sized above a node's pods; kubelet's ``--max-pods`` defaults to 110)."""
    return _pod_dir(layout, cgroup_parent or pod.cgroup_parent, pod.uid, pod.effective_kube_qos)


@functools.lru_cache(maxsize=1024)
def _pod_dir(layout: KubeCgroupLayout, cgroup_parent: str, pod_uid: str, kube_qos: KubeQoS | None) -> str | None:
    try:
        if cgroup_parent:
            return layout.dir_from_cgroup_parent(cgroup_parent)
        return layout.pod_dir(pod_uid, kube_qos) if kube_qos is not None else None
    except CgroupPathError as err:
        logger.warning("pod %s has no cgroup dir: %s", pod_uid, err)
        return None


def pod_uid_from_dir_name(name: str) -> str | None:
    """Pod uid of a pod dir name in either driver (``pod<uid>``, ``kubepods-…-pod<uid_>.slice``)."""
    match = _POD_CGROUPFS.match(name)
    if match:
        return match.group(1)
    match = _POD_SYSTEMD.match(name)
    if match:
        return match.group(1).replace("_", "-")
    return None


def container_id_from_dir_name(name: str) -> str | None:
    """Bare container id of a container dir name (``<id>``, ``crio-<id>``, ``cri-containerd-<id>.scope``…)."""
    match = _CONTAINER_SCOPE.match(name) or _CONTAINER_CGROUPFS.match(name)
    return match.group(1) if match else None
