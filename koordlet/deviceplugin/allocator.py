"""Allocate that honours the scheduler's device choice (docs/node-lock.md, docs/node-interfaces.md §6.3-6.5).

kubelet's AllocateRequest carries only device IDs, never the pod. The scheduler therefore takes
the node lock in Bind (koordlet/nodelock.py), and writes the GPUs it chose into the pod's
`scheduling.koordinator.sh/device-allocated` annotation. Here:

1. the pod is the holder of the node lock; it must be on this node, Pending, carry the
   annotation, and still have a GPU container without devices (ANNOTATION_DEVICE_BOUND). A lock
   that is a bare RFC3339 timestamp (the format of docs/node-lock.md §2) names no pod: as the
   proposal says (docs/node-lock.md §2), Allocate then serves the latest Pending pod of this node
   that waits for its devices (latest by the scheduler's bind-timestamp annotation, else by
   creation), and releases the lock like any other;
2. the annotation's GPUs are split over the pod's GPU containers in order (init containers first,
   as kubelet admits them), each taking as many as it requests of our resource; the container
   kubelet asks for is the next one not yet bound, and its count must equal the request's;
3. the answer gives exactly those GPUs: NVIDIA_VISIBLE_DEVICES computed by the same function the
   GPU env hook uses (koordlet.api.device.nvidia_visible_devices), the /dev/nvidia<minor> nodes and
   the driver's control nodes;
4. the binding is recorded on the pod, and the node lock is released once every GPU container of
   the pod is bound - and on every error and on timeout, so a failed pod never blocks the node.

An Allocate that cannot find or match its pod fails with an error naming the pod and the
annotation that was missing, stale or mismatched; kubelet then fails the pod's admission. A lock
nobody can use - unreadable, its pod gone, or a bare lock with no pod waiting - is released with
a Warning Event carrying the raw annotation value (NodeLocker.release_stale).
kubelet may call Allocate concurrently; one mutex serialises the calls (as HAMi does).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError as TransportError

from koordlet.api import device as api
from koordlet.gpu.health import GPUHealth
from koordlet.gpu.nvml import GPUInfo
from koordlet.kubeapi import CoreV1, section
from koordlet.nodelock import NodeLock, NodeLocker, NodeLockError, NodeLockValueError, parse_rfc3339
from koordlet.system.devfs import device_path, existing_devices
from koordlet.system.roots import DEV_DIR

_log = logging.getLogger(__name__)

# Driver device nodes every CUDA container needs besides its /dev/nvidia<minor>.
CONTROL_DEVICE_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
DEFAULT_ALLOCATE_TIMEOUT_S = 10.0


class AllocationError(RuntimeError):
    """Allocate cannot hand devices to the pod; the message names the pod and the reason."""


class AllocationTimeoutError(AllocationError):
    """Allocate ran past its time budget."""


class StaleLockError(AllocationError):
    """The node lock serves no pod (unreadable, its pod is gone, or no pod waits); it is to be
    released. `value` is the raw annotation value, `pod` the owner when known."""

    def __init__(self, message: str, value: str, why: str, pod: str = "") -> None:
        super().__init__(message)
        self.value = value
        self.why = why
        self.pod = pod


@dataclass(frozen=True, slots=True)
class DeviceNode:
    container_path: str
    host_path: str
    permissions: str = "rw"


@dataclass(frozen=True, slots=True)
class ContainerAllocation:
    """What one container gets: the answer to one ContainerAllocateRequest."""

    pod: str
    container: str
    gpus: tuple[api.GPUAllocation, ...]
    envs: Mapping[str, str]
    devices: tuple[DeviceNode, ...]


@dataclass(frozen=True, slots=True)
class _GpuContainer:
    name: str
    count: int
    gpus: tuple[api.GPUAllocation, ...]


@dataclass(frozen=True, slots=True)
class _Target:
    pod: Mapping[str, Any]  # as the API server sent it
    lock: NodeLock
    containers: tuple[_GpuContainer, ...]
    bound: dict[str, tuple[int, ...]]

    @property
    def name(self) -> str:
        return _pod_name(self.pod)

    def pending(self) -> list[_GpuContainer]:
        return [c for c in self.containers if c.name not in self.bound]


def _pod_name(pod: Mapping[str, Any]) -> str:
    metadata = section(pod, "metadata")
    return f"{metadata.get('namespace')}/{metadata.get('name')}"


def _created_s(pod: Mapping[str, Any]) -> float:
    created = section(pod, "metadata").get("creationTimestamp")
    try:
        return parse_rfc3339(created).timestamp() if isinstance(created, str) else 0.0
    except NodeLockValueError:
        return 0.0


def _bind_order(pod: Mapping[str, Any]) -> tuple[int, float, str]:
    """Later binds sort higher: the scheduler's bind-timestamp (unix ns), then creation time."""
    stamp = section(pod, "metadata", "annotations").get(api.ANNOTATION_BIND_TIMESTAMP, "")
    return (int(stamp) if stamp.isdigit() else -1, _created_s(pod), _pod_name(pod))


def _containers(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Init containers first, as kubelet admits them."""
    spec = section(pod, "spec")
    return list(spec.get("initContainers") or []) + list(spec.get("containers") or [])


def _requested(container: Mapping[str, Any], resource_name: str) -> int:
    resources = section(container, "resources")
    for part in (resources.get("limits"), resources.get("requests")):
        if part and resource_name in part:
            try:
                return int(str(part[resource_name]))
            except ValueError:
                return 0
    return 0


class SchedulerAllocator:
    """Serves Allocate and GetPreferredAllocation from the lock holder's device annotation."""

    def __init__(
        self,
        core_api: CoreV1 | None,
        node_name: str,
        locker: NodeLocker,
        gpus: Callable[[], Sequence[GPUInfo]],
        health: Callable[[], Mapping[str, GPUHealth]],
        resource_name: str = api.RESOURCE_NVIDIA_GPU,
        dev_dir: str = DEV_DIR,
        timeout_s: float = DEFAULT_ALLOCATE_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = core_api
        self.node_name = node_name
        self._locker = locker
        self._gpus = gpus
        self._health = health
        self.resource_name = resource_name
        self._dev_dir = dev_dir
        self._timeout_s = timeout_s
        self._clock = clock
        self._mutex = threading.Lock()

    # -- finding the pod ---------------------------------------------------------------------------

    def _check_time(self, deadline: float, step: str) -> None:
        if self._clock() > deadline:
            raise AllocationTimeoutError(f"Allocate on node {self.node_name} timed out ({self._timeout_s}s) {step}")

    def _lock_holder(self) -> NodeLock:
        if self._api is None:
            raise AllocationError(
                f"node {self.node_name}: no API server (local mode), so the node lock {self._locker.key} and the "
                f"pods' {api.ANNOTATION_DEVICE_ALLOCATED} cannot be read; this Allocate of {self.resource_name} "
                "cannot be matched to the scheduler's choice"
            )
        try:
            lock = self._locker.current(self.node_name)
        except NodeLockValueError as exc:
            raise StaleLockError(
                f"node {self.node_name}: annotation {self._locker.key}: {exc}; cannot tell which pod this Allocate "
                "is for",
                exc.value,
                str(exc),
            ) from exc
        except NodeLockError as exc:
            raise AllocationError(f"node {self.node_name}: cannot read the node lock: {exc}") from exc
        if lock is None:
            raise AllocationError(
                f"node {self.node_name}: annotation {self._locker.key} is missing: no pod holds the node lock, so "
                f"this Allocate of {self.resource_name} cannot be matched to a pod (the scheduler must lock the "
                "node in Bind)"
            )
        return lock

    def _waits_for_devices(self, pod: Mapping[str, Any]) -> bool:
        """Pending here, not deleting, given GPUs by the scheduler, and a container of our resource unbound."""
        if section(pod, "status").get("phase") not in (None, "Pending"):
            return False
        if section(pod, "metadata").get("deletionTimestamp") is not None:
            return False
        annotations = section(pod, "metadata", "annotations")
        if api.ANNOTATION_DEVICE_ALLOCATED not in annotations:
            return False
        try:
            bound = api.parse_device_bound(annotations.get(api.ANNOTATION_DEVICE_BOUND) or "{}")
        except api.DeviceAnnotationError:
            bound = {}
        return any(_requested(c, self.resource_name) > 0 and c.get("name") not in bound for c in _containers(pod))

    def _lock_pod(self, lock: NodeLock) -> Mapping[str, Any]:
        """The pod the lock is for: its named owner, or for a bare-timestamp lock the latest pod of this
        node waiting for its devices. StaleLockError when there is none."""
        if not lock.pod:
            return self._pending_pod(lock)
        who = f"pod {lock.owner}"
        try:
            return self._api.read_namespaced_pod(lock.pod, lock.namespace, _request_timeout=self._timeout_s)
        except ApiException as exc:
            if exc.status == 404:
                raise StaleLockError(
                    f"{who} named by node lock annotation {self._locker.key}={lock.shown!r} on {self.node_name} "
                    "does not exist (stale lock)",
                    lock.shown,
                    f"owner pod {lock.owner} not found",
                    lock.owner,
                ) from exc
            raise AllocationError(f"{who}: read failed: {exc.status} {exc.reason}") from exc
        except TransportError as exc:
            raise AllocationTimeoutError(f"{who}: read failed or timed out: {exc}") from exc

    def _pending_pod(self, lock: NodeLock) -> Mapping[str, Any]:
        what = f"node {self.node_name}: bare-timestamp lock {self._locker.key}={lock.shown!r}"
        try:
            listed = self._api.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={self.node_name}", _request_timeout=self._timeout_s
            )
        except ApiException as exc:
            raise AllocationError(f"{what}: listing the node's pods failed: {exc.status} {exc.reason}") from exc
        except TransportError as exc:
            raise AllocationTimeoutError(f"{what}: listing the node's pods failed or timed out: {exc}") from exc
        pods = (listed or {}).get("items") or []
        waiting = sorted((pod for pod in pods if self._waits_for_devices(pod)), key=_bind_order)
        if not waiting:
            raise StaleLockError(
                f"{what} names no pod and no Pending pod on the node waits for {self.resource_name} "
                f"(annotation {api.ANNOTATION_DEVICE_ALLOCATED}); cannot tell which pod this Allocate is for",
                lock.shown,
                f"no Pending pod on the node waits for {self.resource_name}",
            )
        if len(waiting) > 1:
            _log.warning(
                "%s: %d pods wait for devices (%s); serving the latest bound, %s",
                what, len(waiting), ", ".join(_pod_name(p) for p in waiting), _pod_name(waiting[-1]),
            )
        return waiting[-1]

    def _target(self, lock: NodeLock) -> _Target:
        pod = self._lock_pod(lock)
        who = f"pod {_pod_name(pod)}"
        node = section(pod, "spec").get("nodeName")
        if node not in (None, "", self.node_name):
            raise AllocationError(
                f"{who} holds the node lock {self._locker.key} of {self.node_name} but is bound to node {node} "
                "(mismatched)"
            )
        phase = section(pod, "status").get("phase")
        if phase not in (None, "Pending"):
            raise AllocationError(f"{who} holds the node lock of {self.node_name} but is {phase}, not Pending (stale)")
        annotations = section(pod, "metadata", "annotations")
        value = annotations.get(api.ANNOTATION_DEVICE_ALLOCATED)
        if value is None:
            raise AllocationError(f"{who}: annotation {api.ANNOTATION_DEVICE_ALLOCATED} is missing")
        try:
            allocated = api.parse_device_allocated(value)
        except api.DeviceAnnotationError as exc:
            raise AllocationError(f"{who}: {exc}") from exc
        if not allocated.gpus:
            raise AllocationError(f"{who}: annotation {api.ANNOTATION_DEVICE_ALLOCATED} lists no GPU")
        bound: dict[str, tuple[int, ...]] = {}
        bound_value = annotations.get(api.ANNOTATION_DEVICE_BOUND)
        if bound_value is not None:
            try:
                bound = api.parse_device_bound(bound_value)
            except api.DeviceAnnotationError as exc:
                raise AllocationError(f"{who}: {exc}") from exc
        wanted = [(c.get("name") or "", _requested(c, self.resource_name)) for c in _containers(pod)]
        wanted = [(name, count) for name, count in wanted if count > 0]
        total = sum(count for _, count in wanted)
        if total != len(allocated.gpus):
            raise AllocationError(
                f"{who}: annotation {api.ANNOTATION_DEVICE_ALLOCATED} lists {len(allocated.gpus)} GPUs but the pod's "
                f"containers request {total} {self.resource_name} (mismatched)"
            )
        containers: list[_GpuContainer] = []
        offset = 0
        for name, count in wanted:
            containers.append(_GpuContainer(name, count, allocated.gpus[offset : offset + count]))
            offset += count
        target = _Target(pod=pod, lock=lock, containers=tuple(containers), bound=bound)
        if not target.pending():
            raise AllocationError(
                f"{who}: every GPU container is already in annotation {api.ANNOTATION_DEVICE_BOUND} (stale: the "
                "node lock should have been released)"
            )
        return target

    # -- building the answer -----------------------------------------------------------------------

    def _device_nodes(self, gpus: Sequence[api.GPUAllocation]) -> tuple[DeviceNode, ...]:
        names = [f"nvidia{gpu.minor}" for gpu in gpus]
        # A device spec whose host node is missing makes the runtime fail the container.
        names += existing_devices(CONTROL_DEVICE_NODES, self._dev_dir)
        return tuple(DeviceNode(device_path(name), device_path(name)) for name in names)

    def _check_gpus_here(self, who: str, gpus: Sequence[api.GPUAllocation]) -> None:
        by_minor = {gpu.minor: gpu for gpu in self._gpus()}
        health = self._health()
        for chosen in gpus:
            here = by_minor.get(chosen.minor)
            if here is None:
                raise AllocationError(
                    f"pod {who}: annotation {api.ANNOTATION_DEVICE_ALLOCATED} names GPU minor {chosen.minor}, which "
                    f"node {self.node_name} does not have (stale)"
                )
            if chosen.uuid and chosen.uuid != here.uuid:
                raise AllocationError(
                    f"pod {who}: annotation {api.ANNOTATION_DEVICE_ALLOCATED} names GPU minor {chosen.minor} as "
                    f"{chosen.uuid} but it is {here.uuid} on {self.node_name} (mismatched)"
                )
            state = health.get(here.uuid)
            if state is not None and not state.healthy:
                raise AllocationError(
                    f"pod {who}: GPU minor {chosen.minor} chosen by the scheduler is unhealthy ({state.reason})"
                )

    def _record(self, target: _Target, served: Mapping[str, tuple[int, ...]]) -> None:
        merged = {**target.bound, **served}
        body = {"metadata": {"annotations": {api.ANNOTATION_DEVICE_BOUND: api.format_device_bound(merged)}}}
        metadata = section(target.pod, "metadata")
        try:
            self._api.patch_namespaced_pod(
                metadata.get("name"), metadata.get("namespace"), body, _request_timeout=self._timeout_s
            )
        except ApiException as exc:
            raise AllocationError(
                f"pod {target.name}: recording annotation {api.ANNOTATION_DEVICE_BOUND} failed: {exc.status} "
                f"{exc.reason}"
            ) from exc
        except TransportError as exc:
            raise AllocationTimeoutError(
                f"pod {target.name}: recording annotation {api.ANNOTATION_DEVICE_BOUND} failed or timed out: {exc}"
            ) from exc

    def _release(self, lock: NodeLock, why: str) -> None:
        try:
            # Only the lock that was read: an owner-less lock carries no name to check.
            released = self._locker.release(self.node_name, lock.namespace, lock.pod, value=lock.raw or None)
        except NodeLockError as exc:
            _log.error(
                "node %s: releasing the lock %r of %s (%s) failed: %s", self.node_name, lock.shown, lock.owner, why, exc
            )
            return
        if released:
            _log.info("node %s: lock %r of %s released (%s)", self.node_name, lock.shown, lock.owner, why)

    def _release_stale(self, stale: StaleLockError) -> None:
        try:
            self._locker.release_stale(self.node_name, stale.value, stale.why, pod=stale.pod)
        except NodeLockError as exc:
            _log.error("node %s: releasing the stale lock %r failed: %s", self.node_name, stale.value, exc)

    def allocate(self, device_id_requests: Sequence[Sequence[str]]) -> list[ContainerAllocation]:
        """Answer one AllocateRequest (one entry per container, each the device IDs kubelet picked)."""
        with self._mutex:
            deadline = self._clock() + self._timeout_s
            try:
                lock = self._lock_holder()
            except StaleLockError as exc:
                self._release_stale(exc)
                raise
            outcome = "error"
            try:
                target = self._target(lock)
                self._check_time(deadline, f"reading the pod of lock {lock.shown!r}")
                answers, still_pending = self._answer(target, device_id_requests)
                self._check_time(deadline, f"matching pod {target.name}")
                self._record(target, {a.container: tuple(g.minor for g in a.gpus) for a in answers})
                outcome = "pending" if still_pending else "done"
            except AllocationTimeoutError:
                outcome = "timeout"
                raise
            except StaleLockError as exc:
                outcome = "stale"
                self._release_stale(exc)
                raise
            finally:
                # Every way out but "another container of this pod is still to come" frees the node.
                if outcome not in ("pending", "stale"):
                    self._release(lock, "all GPU containers bound" if outcome == "done" else outcome)
            for answer in answers:
                _log.info(
                    "pod %s container %s: GPUs %s",
                    answer.pod,
                    answer.container,
                    answer.envs[api.ENV_NVIDIA_VISIBLE_DEVICES],
                )
            return answers

    def _answer(
        self, target: _Target, device_id_requests: Sequence[Sequence[str]]
    ) -> tuple[list[ContainerAllocation], bool]:
        """The containers kubelet asks for, in order; and whether GPU containers remain after them."""
        pending = target.pending()
        answers: list[ContainerAllocation] = []
        for ids in device_id_requests:
            if not pending:
                raise AllocationError(
                    f"pod {target.name}: kubelet asks for {len(ids)} more {self.resource_name} but every GPU "
                    f"container is already bound (mismatched with {api.ANNOTATION_DEVICE_ALLOCATED})"
                )
            container = pending.pop(0)
            if len(ids) != container.count:
                raise AllocationError(
                    f"pod {target.name}: kubelet asks for {len(ids)} {self.resource_name} but container "
                    f"{container.name} was given {container.count} in {api.ANNOTATION_DEVICE_ALLOCATED} "
                    "(mismatched)"
                )
            self._check_gpus_here(target.name, container.gpus)
            answers.append(
                ContainerAllocation(
                    pod=target.name,
                    container=container.name,
                    gpus=container.gpus,
                    envs={api.ENV_NVIDIA_VISIBLE_DEVICES: api.nvidia_visible_devices(container.gpus)},
                    devices=self._device_nodes(container.gpus),
                )
            )
        return answers, bool(pending)

    def preferred(self, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
        """GetPreferredAllocation: the UUIDs the scheduler chose for the lock holder's next container,
        so kubelet's own bookkeeping matches what the container gets; otherwise a plain pick."""
        with self._mutex:
            try:
                target = self._target(self._lock_holder())
                pending = target.pending()
                if pending and pending[0].count == size:
                    by_minor = {gpu.minor: gpu.uuid for gpu in self._gpus()}
                    chosen = [by_minor.get(gpu.minor, "") for gpu in pending[0].gpus]
                    if all(uuid in available for uuid in chosen) and set(must_include) <= set(chosen):
                        return chosen
            except AllocationError as exc:
                _log.debug("preferred allocation falls back to a plain pick: %s", exc)
        picked = list(must_include)
        picked += [uuid for uuid in available if uuid not in picked]
        return picked[:size]
