"""A typed view of a pod for the node side: what the hook server and the reconciler both need.

Built from a CRI hook request (labels, annotations, cgroup parent) or from kubelet ``/pods``; no
kubernetes-client types so that ``hooks/`` can use it. Resource amounts are integers in Koordinator's units
(``cpu`` in milli-cores, memory in bytes, batch-cpu in milli-cores, batch-memory in bytes; see
:func:`koordlet.api.quantity.parse_resource_quantity`).

The amounts are what the container (or pod) really has, not what was last asked for: after an in-place resize
(GA in Kubernetes 1.35) the spec holds the new request while kubelet may not have carried it out yet, so the
sources take cpu and memory from the status where kubelet reports them (``statesinformer/kubelet.py``) or from
the runtime (``statesinformer/cri.py``). Pod-level resources (``spec.resources``, KEP-2837) are
:attr:`PodMeta.pod_requests` / :attr:`PodMeta.pod_limits`; the functions at the end apply Kubernetes' rules
for them (``k8s.io/component-helpers/resource`` PodRequests/PodLimits, kubelet's getCPULimit/getMemoryLimit),
and every part that sums or reads a pod's or a container's amounts goes through them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from koordlet.api.keys import ANNOTATION_DOCKER_TYPE
from koordlet.api.qos import (
    KubeQoS,
    PriorityClass,
    QoSClass,
    kube_qos_from_cgroup_parent,
    priority_class_for_pod,
    qos_class_for_pod,
    qos_class_from_labels,
)

DEFAULT_RUNTIME = "containerd"


def split_container_id(container_id: str, default_runtime: str = DEFAULT_RUNTIME) -> tuple[str, str]:
    """``"containerd://abc"`` → ``("containerd", "abc")``; a bare id gets ``default_runtime``."""
    runtime, sep, bare = container_id.partition("://")
    if not sep:
        return default_runtime, container_id
    return runtime, bare


def runtime_for_pod(annotations: Mapping[str, str], default_runtime: str = DEFAULT_RUNTIME) -> str:
    """Runtime name that prefixes the pod's container ids.

    docker when dockershim annotated it (docs/koordinator.md §3.2)."""
    return "docker" if ANNOTATION_DOCKER_TYPE in annotations else default_runtime


@dataclass(frozen=True, slots=True)
class ContainerMeta:
    """One container of a pod. ``container_id`` is bare (no ``<runtime>://``); empty before creation."""

    name: str
    container_id: str = ""
    runtime: str = DEFAULT_RUNTIME
    requests: Mapping[str, int] = field(default_factory=dict)
    limits: Mapping[str, int] = field(default_factory=dict)
    is_init: bool = False


@dataclass(frozen=True, slots=True)
class PodMeta:
    """A pod as the node side sees it.

    ``kube_qos`` None means "not known": it is then derived from ``cgroup_parent`` where that is set.
    ``cgroup_parent`` is the CRI form, relative to the cgroup root (``/kubepods/besteffort/pod<uid>``).
    Mapping fields make instances unhashable; compare them, do not put them in sets.
    """

    name: str
    namespace: str
    uid: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    kube_qos: KubeQoS | None = None
    cgroup_parent: str = ""
    priority: int | None = None
    containers: tuple[ContainerMeta, ...] = ()
    phase: str = ""  # Pending/Running/Succeeded/Failed; "" where the source does not say (CRI)
    sandbox_id: str = ""  # the CRI pod sandbox id, where the source knows it
    ips: tuple[str, ...] = ()  # the pod's IP addresses (a hostNetwork pod: the node's, or none)
    # Whether the source knows the pod spec's requests. The CRI (local mode) does not: its containers carry
    # the limits and the cpu request kubelet encoded in the Linux resources (cpu.shares), but no memory or
    # extended-resource (batch-cpu/batch-memory) requests. What needs those leaves such a pod as it is.
    requests_known: bool = True
    created_at: float | None = None  # metadata.creationTimestamp (the CRI: the sandbox's), Unix seconds
    deleting: bool = False  # metadata.deletionTimestamp is set
    # Pod-level resources (spec.resources; status.resources once kubelet reports them): empty when the pod sets
    # none. Only cpu, memory and hugepages-* count at pod level (is_pod_level_resource).
    pod_requests: Mapping[str, int] = field(default_factory=dict)
    pod_limits: Mapping[str, int] = field(default_factory=dict)

    @property
    def effective_kube_qos(self) -> KubeQoS | None:
        if self.kube_qos is not None:
            return self.kube_qos
        if self.cgroup_parent:
            return kube_qos_from_cgroup_parent(self.cgroup_parent)
        return None

    @property
    def qos_label(self) -> QoSClass:
        """The raw qosClass label (NONE when absent); what cpuset/batchresource/suppress look at."""
        return qos_class_from_labels(self.labels)

    @property
    def qos_class(self) -> QoSClass:
        """The qosClass label, else derived from kube QoS (docs/koordinator.md §12)."""
        return qos_class_for_pod(self.labels, self.effective_kube_qos)

    @property
    def priority_class(self) -> PriorityClass:
        return priority_class_for_pod(self.labels, self.priority, self.qos_class)

    def container(self, name: str) -> ContainerMeta | None:
        for container in self.containers:
            if container.name == name:
                return container
        return None

    @property
    def key(self) -> str:
        """``namespace/name``, for logs."""
        return f"{self.namespace}/{self.name}"


# ----------------------------------------------------------------------------------------- pod-level resources

_POD_LEVEL = ("cpu", "memory")
_HUGEPAGES_PREFIX = "hugepages-"


def is_pod_level_resource(name: str) -> bool:
    """A resource pod-level resources may set (component-helpers IsSupportedPodLevelResource)."""
    return name in _POD_LEVEL or name.startswith(_HUGEPAGES_PREFIX)


def pod_level_amount(pod: PodMeta, resource: str, limits: bool = False) -> int | None:
    """The pod-level request (or limit) of ``resource``; None when the pod sets none for it, so the containers'
    amounts count instead. Pod-level values win for the resources they set (component-helpers PodRequests and
    PodLimits: applyPodLevelResources)."""
    if not is_pod_level_resource(resource):
        return None
    value = (pod.pod_limits if limits else pod.pod_requests).get(resource)
    return int(value) if value is not None else None


def aggregate_request(pod: PodMeta, resource: str, amount: Callable[[ContainerMeta], int] | None = None) -> int:
    """The pod's request of ``resource``: its pod-level request where it sets one, else the larger of the
    regular containers' sum and the largest init container (Kubernetes' rule for init containers).
    ``amount``: how to read one container's request (default: ``container.requests[resource]``)."""
    level = pod_level_amount(pod, resource)
    if level is not None:
        return level
    read = amount if amount is not None else (lambda container: int(container.requests.get(resource, 0)))
    regular = sum(read(c) for c in pod.containers if not c.is_init)
    init = max((read(c) for c in pod.containers if c.is_init), default=0)
    return max(regular, init)


def container_limit(pod: PodMeta, container: ContainerMeta, resource: str, own: int | None = None) -> int:
    """The limit of ``resource`` the container's cgroup gets: its own, else the pod-level limit (kubelet's
    getCPULimit/getMemoryLimit: a container without a cpu or memory limit in a pod with pod-level resources is
    given the pod's); 0 when neither is set. ``own``: the container's own limit where the caller read it
    (aliases resolved), else ``container.limits[resource]``."""
    value = int(container.limits.get(resource, 0)) if own is None else own
    if value > 0 or resource not in _POD_LEVEL or not (pod.pod_requests or pod.pod_limits):
        return value
    return pod_level_amount(pod, resource, limits=True) or 0
