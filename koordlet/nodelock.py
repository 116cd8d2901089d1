"""The node lock that serialises device binds on a node (seed 000, reference/peers.md §6.4).

The scheduler takes the lock in Bind, the device plugin releases it when kubelet's Allocate for
that pod is answered, so Allocate knows which pod it serves. The lock is an annotation on the
Node, value `<RFC3339 time>,<namespace>,<pod>` (a bare timestamp, the legacy form, is still read).

Rules (HAMi's, plus what its users asked for):
- a live lock held by another pod fails `lock()` with NodeLockHeldError; the same pod re-locking
  gets its lock back;
- a lock older than `expiry` (5 min) is expired, and a lock whose owner pod is gone is dangling:
  both may be taken over, EXCEPT an expired lock whose owner is still pending on the node waiting
  for its devices (HAMi hands that one over and two pods end up with the same GPUs);
- every write is a patch carrying metadata.resourceVersion (optimistic concurrency); a 409 is
  retried up to 5 times with a backoff that starts at 100 ms and doubles;
- `release()` removes only the caller's lock and retries like `lock()`; `held()` releases on
  every path out of its block.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError as TransportError

from koordlet.api import device as api

_log = logging.getLogger(__name__)

DEFAULT_EXPIRY = timedelta(minutes=5)
DEFAULT_RETRIES = 5
DEFAULT_BACKOFF_S = 0.1

# Resources whose containers wait for devices from the device plugin or the GPU hook.
GPU_RESOURCE_NAMES: frozenset[str] = frozenset(
    {
        api.RESOURCE_NVIDIA_GPU,
        api.RESOURCE_KOORD_GPU,
        api.RESOURCE_GPU_CORE,
        api.RESOURCE_GPU_MEMORY,
        api.RESOURCE_GPU_MEMORY_RATIO,
        api.RESOURCE_GPU_SHARED,
    }
)


class NodeLockError(RuntimeError):
    """The node lock could not be taken or released."""


class NodeLockHeldError(NodeLockError):
    """Another pod holds the lock (live, or expired while its owner still waits for devices)."""


class NodeLockConflictError(NodeLockError):
    """Every try hit a 409: the node kept changing under us."""


class NodeLockValueError(ValueError):
    """The annotation value is not `<RFC3339>[,<namespace>,<pod>]`."""


@dataclass(frozen=True, slots=True)
class NodeLock:
    acquired_at: datetime
    namespace: str
    pod: str

    @property
    def owner(self) -> str:
        return f"{self.namespace}/{self.pod}" if self.pod else "<unknown, legacy lock>"

    def value(self) -> str:
        return f"{format_rfc3339(self.acquired_at)},{self.namespace},{self.pod}"

    def expired(self, now: datetime, expiry: timedelta = DEFAULT_EXPIRY) -> bool:
        return now - self.acquired_at > expiry

    def owned_by(self, namespace: str, pod: str) -> bool:
        return self.namespace == namespace and self.pod == pod


def format_rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: str) -> datetime:
    text = text.strip()
    if "." in text:
        # Go's RFC3339Nano has up to 9 fraction digits; Python takes 6.
        head, _, tail = text.partition(".")
        digits = len(tail) - len(tail.lstrip("0123456789"))
        tail = tail[:digits][:6] + tail[digits:]
        text = f"{head}.{tail}"
    try:
        moment = datetime.fromisoformat(text)
    except ValueError as exc:
        raise NodeLockValueError(f"not an RFC3339 time: {text!r}") from exc
    if moment.tzinfo is None:
        raise NodeLockValueError(f"RFC3339 time without zone: {text!r}")
    return moment


def parse_lock_value(value: str) -> NodeLock:
    parts = value.split(",")
    if len(parts) == 1:
        return NodeLock(parse_rfc3339(parts[0]), "", "")
    if len(parts) != 3 or not parts[1] or not parts[2]:
        raise NodeLockValueError(f"node lock value {value!r} is not '<RFC3339>,<namespace>,<pod>'")
    return NodeLock(parse_rfc3339(parts[0]), parts[1], parts[2])


def pod_requests_gpu(container: Any) -> bool:
    resources = getattr(container, "resources", None)
    names: set[str] = set()
    for part in (getattr(resources, "limits", None), getattr(resources, "requests", None)):
        names.update((part or {}).keys())
    return bool(names & GPU_RESOURCE_NAMES)


def pod_waiting_for_devices(pod: Any, node_name: str) -> bool:
    """True while the pod is pending on (or being bound to) the node and not every GPU container
    has been handed its devices (ANNOTATION_DEVICE_BOUND). A pod in that state must keep its lock."""
    if (pod.status.phase if pod.status else None) not in (None, "Pending"):
        return False
    if pod.metadata.deletion_timestamp is not None:
        return False
    assigned = pod.spec.node_name if pod.spec else None
    if assigned not in (None, "", node_name):
        return False
    bound_value = (pod.metadata.annotations or {}).get(api.ANNOTATION_DEVICE_BOUND)
    if bound_value is None:
        return True
    try:
        bound = api.parse_device_bound(bound_value)
    except api.DeviceAnnotationError:
        return True
    containers = list(pod.spec.init_containers or []) + list(pod.spec.containers or [])
    return any(pod_requests_gpu(c) and c.name not in bound for c in containers)


class NodeLocker:
    """Takes and releases the node lock through the Kubernetes API (kubernetes CoreV1Api)."""

    def __init__(
        self,
        core_api: Any,
        key: str = api.ANNOTATION_NODE_LOCK,
        expiry: timedelta = DEFAULT_EXPIRY,
        retries: int = DEFAULT_RETRIES,
        backoff_s: float = DEFAULT_BACKOFF_S,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        sleep: Callable[[float], None] = time.sleep,
        owner_waiting: Callable[[Any, str], bool] = pod_waiting_for_devices,
    ) -> None:
        self._api = core_api
        self.key = key
        self.expiry = expiry
        self._retries = retries
        self._backoff_s = backoff_s
        self._clock = clock
        self._sleep = sleep
        self._owner_waiting = owner_waiting

    def _read_node(self, node_name: str) -> Any:
        try:
            return self._api.read_node(node_name)
        except ApiException as exc:
            raise NodeLockError(f"node lock {self.key} on {node_name}: read node: {exc.status} {exc.reason}") from exc
        except TransportError as exc:
            raise NodeLockError(f"node lock {self.key} on {node_name}: read node: {exc}") from exc

    def current(self, node_name: str) -> NodeLock | None:
        """The lock on the node now, None when free; raises NodeLockValueError on a garbled value."""
        node = self._read_node(node_name)
        value = (node.metadata.annotations or {}).get(self.key)
        return None if value is None else parse_lock_value(value)

    def _patch(self, node_name: str, resource_version: str, value: str | None) -> bool:
        """One optimistic write; False on 409 (the node changed since we read it)."""
        body = {"metadata": {"resourceVersion": resource_version, "annotations": {self.key: value}}}
        try:
            self._api.patch_node(node_name, body)
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise NodeLockError(
                f"node lock {self.key} on {node_name}: patch: {exc.status} {exc.reason}"
            ) from exc
        except TransportError as exc:
            raise NodeLockError(f"node lock {self.key} on {node_name}: patch: {exc}") from exc
        return True

    def _backoff(self, attempt: int) -> None:
        # 100 ms, 200 ms, 400 ms ... with jitter so racing binders do not retry in step.
        self._sleep(self._backoff_s * (2**attempt) * random.uniform(1.0, 1.5))

    def _owner_pod(self, lock: NodeLock) -> Any | None:
        try:
            return self._api.read_namespaced_pod(lock.pod, lock.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise NodeLockError(f"node lock owner {lock.owner}: read pod: {exc.status} {exc.reason}") from exc
        except TransportError as exc:
            raise NodeLockError(f"node lock owner {lock.owner}: read pod: {exc}") from exc

    def _may_take_over(self, node_name: str, lock: NodeLock, now: datetime) -> bool:
        """Whether an existing lock of another pod may be replaced; raises NodeLockHeldError if not."""
        owner = self._owner_pod(lock) if lock.pod else None
        if not lock.expired(now, self.expiry):
            if lock.pod and owner is None:
                _log.warning("node %s: taking over dangling lock of deleted pod %s", node_name, lock.owner)
                return True
            raise NodeLockHeldError(
                f"node {node_name} is locked by {lock.owner} since {format_rfc3339(lock.acquired_at)} "
                f"(expires after {self.expiry})"
            )
        if owner is not None and self._owner_waiting(owner, node_name):
            raise NodeLockHeldError(
                f"node {node_name}: lock of {lock.owner} expired at "
                f"{format_rfc3339(lock.acquired_at + self.expiry)} but its pod is still pending on the node "
                "waiting for its devices; not handing it over"
            )
        _log.warning("node %s: taking over expired lock of %s", node_name, lock.owner)
        return True

    def lock(self, node_name: str, namespace: str, pod: str) -> NodeLock:
        """Take the node's lock for the pod (or return it if the pod already holds it)."""
        for attempt in range(self._retries):
            node = self._read_node(node_name)
            now = self._clock()
            value = (node.metadata.annotations or {}).get(self.key)
            if value is not None:
                try:
                    existing = parse_lock_value(value)
                except NodeLockValueError as exc:
                    _log.warning("node %s: replacing unreadable lock %r: %s", node_name, value, exc)
                    existing = None
                if existing is not None:
                    if existing.owned_by(namespace, pod):
                        return existing
                    self._may_take_over(node_name, existing, now)
            wanted = NodeLock(now.replace(microsecond=0), namespace, pod)
            if self._patch(node_name, node.metadata.resource_version, wanted.value()):
                _log.debug("node %s locked by %s", node_name, wanted.owner)
                return wanted
            if attempt + 1 < self._retries:
                self._backoff(attempt)
        raise NodeLockConflictError(
            f"node lock {self.key} on {node_name} for {namespace}/{pod}: conflict on every one of "
            f"{self._retries} tries"
        )

    def release(self, node_name: str, namespace: str, pod: str) -> bool:
        """Remove the pod's lock. False when the node holds no lock of this pod (nothing to do)."""
        for attempt in range(self._retries):
            node = self._read_node(node_name)
            value = (node.metadata.annotations or {}).get(self.key)
            if value is None:
                return False
            try:
                existing = parse_lock_value(value)
            except NodeLockValueError as exc:
                raise NodeLockError(f"node {node_name}: cannot release unreadable lock {value!r}: {exc}") from exc
            if existing.pod and not existing.owned_by(namespace, pod):
                _log.warning(
                    "node %s: not releasing lock of %s on behalf of %s/%s", node_name, existing.owner, namespace, pod
                )
                return False
            if self._patch(node_name, node.metadata.resource_version, None):
                _log.debug("node %s unlocked by %s/%s", node_name, namespace, pod)
                return True
            if attempt + 1 < self._retries:
                self._backoff(attempt)
        raise NodeLockConflictError(
            f"release of node lock {self.key} on {node_name} for {namespace}/{pod}: conflict on every one of "
            f"{self._retries} tries"
        )

    @contextmanager
    def held(self, node_name: str, namespace: str, pod: str) -> Iterator[NodeLock]:
        """`with locker.held(node, ns, pod):` - the lock is released however the block ends."""
        taken = self.lock(node_name, namespace, pod)
        try:
            yield taken
        finally:
            self.release(node_name, namespace, pod)
