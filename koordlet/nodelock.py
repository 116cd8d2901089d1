"""The node lock that serialises device binds on a node (docs/node-lock.md, docs/node-interfaces.md §6.4).

The scheduler takes the lock in Bind, the device plugin releases it when kubelet's Allocate for
that pod is answered, so Allocate knows which pod it serves. The lock is an annotation on the
Node. Two values are read:
- `<RFC3339 time>,<namespace>,<pod>`: ours and HAMi's; this module writes it;
- a bare `<RFC3339 time>`: the format of docs/node-lock.md §2 (Koordinator #2198, HAMi's original 4pd.io lock). It names
  no pod; the device plugin then serves the Pending pod of the node that waits for its devices.
Times are Go's time.RFC3339 / RFC3339Nano: `2006-01-02T15:04:05Z` or `...+08:00`, optionally with
1-9 fraction digits; nothing else (no space separator, no missing zone).

Rules (HAMi's, plus what its users asked for):
- a live lock held by another pod fails `lock()` with NodeLockHeldError; the same pod re-locking
  gets its lock back;
- a lock older than `expiry` (5 min) is expired, and a lock whose owner pod is gone is dangling:
  both may be taken over, EXCEPT an expired lock whose owner is still pending on the node waiting
  for its devices (HAMi hands that one over and two pods end up with the same GPUs);
- every write is a patch carrying metadata.resourceVersion (optimistic concurrency); a 409 is
  retried up to 5 times with a backoff that starts at 100 ms and doubles;
- `release()` removes only the caller's lock and retries like `lock()`; `held()` releases on
  every path out of its block;
- `release_stale()` removes a lock nobody can use (unreadable, or its pod is gone) only while the
  annotation still holds exactly that raw value; it logs one line and records a Warning Event on the
  Node naming the pod (when known), the node and the raw value. Messages always show the raw value.
"""

from __future__ import annotations

import logging
import random
import re
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError as TransportError

from koordlet.api import device as api
from koordlet.events import InvolvedObject
from koordlet.kubeapi import CoreV1, section

_log = logging.getLogger(__name__)

T = TypeVar("T")


class _Conflict:
    """What one round of :meth:`NodeLocker._retrying` returns when its guarded patch got a 409."""


CONFLICT = _Conflict()

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
    """The annotation value is not `<RFC3339>[,<namespace>,<pod>]`; `value` is the raw value."""

    def __init__(self, message: str, value: str = "") -> None:
        super().__init__(message)
        self.value = value


@dataclass(frozen=True, slots=True)
class NodeLock:
    acquired_at: datetime
    namespace: str
    pod: str
    # The annotation value exactly as read from the node ("" for a lock we build ourselves).
    raw: str = field(default="", compare=False)

    @property
    def owner(self) -> str:
        return f"{self.namespace}/{self.pod}" if self.pod else "<unknown, legacy lock>"

    def value(self) -> str:
        return f"{format_rfc3339(self.acquired_at)},{self.namespace},{self.pod}"

    @property
    def shown(self) -> str:
        """The value as it is on the node, for messages."""
        return self.raw or self.value()

    def expired(self, now: datetime, expiry: timedelta = DEFAULT_EXPIRY) -> bool:
        return now - self.acquired_at > expiry

    def owned_by(self, namespace: str, pod: str) -> bool:
        return self.namespace == namespace and self.pod == pod


def format_rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# Go's time.RFC3339 layout (RFC3339Nano adds the fraction); time.Parse takes the fraction either way.
_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.(\d{1,9}))?(?:Z|[+-]\d{2}:\d{2})", re.ASCII)


def parse_rfc3339(text: str) -> datetime:
    match = _RFC3339.fullmatch(text.strip())
    if match is None:
        raise NodeLockValueError(f"not an RFC3339 time: {text!r}", text)
    iso = match.group(0)
    if match.group(1) is not None:
        # Python takes at most 6 fraction digits.
        start, end = match.span(1)
        iso = iso[:start] + match.group(1)[:6].ljust(6, "0") + iso[end:]
    try:
        return datetime.fromisoformat(iso)
    except ValueError as exc:  # e.g. month 13, offset hour 25
        raise NodeLockValueError(f"not an RFC3339 time: {text!r}", text) from exc


def parse_lock_value(value: str) -> NodeLock:
    """`<RFC3339>,<namespace>,<pod>` or a bare `<RFC3339>` (docs/node-lock.md); errors quote the raw value."""
    parts = value.split(",")
    try:
        if len(parts) == 1:
            return NodeLock(parse_rfc3339(parts[0]), "", "", raw=value)
        if len(parts) != 3 or not parts[1] or not parts[2]:
            raise NodeLockValueError("expected '<RFC3339>,<namespace>,<pod>' or '<RFC3339>'", value)
        return NodeLock(parse_rfc3339(parts[0]), parts[1], parts[2], raw=value)
    except NodeLockValueError as exc:
        raise NodeLockValueError(f"node lock value {value!r} is unreadable: {exc}", value) from exc


def pod_requests_gpu(container: Mapping[str, Any]) -> bool:
    """The container (JSON) limits or requests one of the GPU resources."""
    names = set(section(container, "resources", "limits")) | set(section(container, "resources", "requests"))
    return bool(names & GPU_RESOURCE_NAMES)


def pod_waiting_for_devices(pod: Mapping[str, Any], node_name: str) -> bool:
    """True while the pod (JSON) is pending on (or being bound to) the node and not every GPU container
    has been handed its devices (ANNOTATION_DEVICE_BOUND). A pod in that state must keep its lock."""
    if section(pod, "status").get("phase") not in (None, "Pending"):
        return False
    metadata, spec = section(pod, "metadata"), section(pod, "spec")
    if metadata.get("deletionTimestamp") is not None:
        return False
    if spec.get("nodeName") not in (None, "", node_name):
        return False
    bound_value = section(metadata, "annotations").get(api.ANNOTATION_DEVICE_BOUND)
    if bound_value is None:
        return True
    try:
        bound = api.parse_device_bound(bound_value)
    except api.DeviceAnnotationError:
        return True
    containers = list(spec.get("initContainers") or []) + list(spec.get("containers") or [])
    return any(pod_requests_gpu(c) and c.get("name") not in bound for c in containers)


class NodeLocker:
    """Takes and releases the node lock through the Kubernetes API (:class:`koordlet.kubeapi.CoreV1`); nodes
    and pods are handled as the JSON the API server sent."""

    def __init__(
        self,
        core_api: CoreV1,
        key: str = api.ANNOTATION_NODE_LOCK,
        expiry: timedelta = DEFAULT_EXPIRY,
        retries: int = DEFAULT_RETRIES,
        backoff_s: float = DEFAULT_BACKOFF_S,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        sleep: Callable[[float], None] = time.sleep,
        owner_waiting: Callable[[Mapping[str, Any], str], bool] = pod_waiting_for_devices,
    ) -> None:
        self._api = core_api
        self.key = key
        self.expiry = expiry
        self._retries = retries
        self._backoff_s = backoff_s
        self._clock = clock
        self._sleep = sleep
        self._owner_waiting = owner_waiting

    def _read_node(self, node_name: str) -> dict[str, Any]:
        try:
            return self._api.read_node(node_name)
        except ApiException as exc:
            raise NodeLockError(f"node lock {self.key} on {node_name}: read node: {exc.status} {exc.reason}") from exc
        except TransportError as exc:
            raise NodeLockError(f"node lock {self.key} on {node_name}: read node: {exc}") from exc

    def current(self, node_name: str) -> NodeLock | None:
        """The lock on the node now, None when free; raises NodeLockValueError on a garbled value."""
        node = self._read_node(node_name)
        value = section(node, "metadata", "annotations").get(self.key)
        return None if value is None else parse_lock_value(value)

    def _patch(self, node_name: str, resource_version: str | None, value: str | None) -> bool:
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

    def _owner_pod(self, lock: NodeLock) -> dict[str, Any] | None:
        try:
            return self._api.read_namespaced_pod(lock.pod, lock.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise NodeLockError(f"node lock owner {lock.owner}: read pod: {exc.status} {exc.reason}") from exc
        except TransportError as exc:
            raise NodeLockError(f"node lock owner {lock.owner}: read pod: {exc}") from exc

    def _record_event(self, node: Mapping[str, Any], reason: str, message: str) -> None:
        """A Warning Event on the Node, through the koordlet's recorder (aggregated; best effort)."""
        metadata = section(node, "metadata")
        name = str(metadata.get("name") or "")
        recorder = self._api.kube.event_recorder(name)
        recorder.record(InvolvedObject("Node", name, uid=str(metadata.get("uid") or "")), "Warning", reason, message)

    def _report_dropped(self, node: Mapping[str, Any], value: str, why: str, pod: str, action: str) -> None:
        """One log line and one Warning Event for a lock nobody can use that we removed or replaced."""
        who = f"pod {pod}" if pod else "pod unknown"
        name = section(node, "metadata").get("name")
        message = f"node lock {self.key}={value!r} on node {name} ({who}) {action}: {why}"
        _log.warning("%s", message)
        self._record_event(node, "NodeLockReleased", message)

    def _may_take_over(self, node_name: str, lock: NodeLock, now: datetime) -> str:
        """Why an existing lock of another pod may be replaced ("" when it merely expired, a reason when
        nobody can use it); raises NodeLockHeldError if it may not."""
        owner = self._owner_pod(lock) if lock.pod else None
        if not lock.expired(now, self.expiry):
            if lock.pod and owner is None:
                return f"owner pod {lock.owner} not found"
            raise NodeLockHeldError(
                f"node {node_name} is locked by {lock.owner} ({self.key}={lock.shown!r}, "
                f"expires after {self.expiry})"
            )
        if owner is not None and self._owner_waiting(owner, node_name):
            raise NodeLockHeldError(
                f"node {node_name}: lock of {lock.owner} ({self.key}={lock.shown!r}) expired at "
                f"{format_rfc3339(lock.acquired_at + self.expiry)} but its pod is still pending on the node "
                "waiting for its devices; not handing it over"
            )
        if lock.pod and owner is None:
            return f"expired, and owner pod {lock.owner} not found"
        _log.warning("node %s: taking over expired lock %r of %s", node_name, lock.shown, lock.owner)
        return ""

    def _retrying(self, what: str, attempt: Callable[[], T | _Conflict]) -> T:
        """Run ``attempt`` (one read-decide-patch round) until it returns something other than CONFLICT (a
        409 on the resourceVersion-guarded patch), backing off between rounds; NodeLockConflictError after
        the last one, naming ``what``."""
        for tries in range(self._retries):
            result = attempt()
            if not isinstance(result, _Conflict):
                return result
            if tries + 1 < self._retries:
                self._backoff(tries)
        raise NodeLockConflictError(f"{what}: conflict on every one of {self._retries} tries")

    def lock(self, node_name: str, namespace: str, pod: str) -> NodeLock:
        """Take the node's lock for the pod (or return it if the pod already holds it)."""

        def attempt() -> NodeLock | _Conflict:
            node = self._read_node(node_name)
            now = self._clock()
            value = section(node, "metadata", "annotations").get(self.key)
            dropped = ""  # why the lock on the node is one nobody can use
            dropped_pod = ""
            if value is not None:
                try:
                    existing = parse_lock_value(value)
                except NodeLockValueError as exc:
                    dropped = str(exc)
                    existing = None
                if existing is not None:
                    if existing.owned_by(namespace, pod):
                        return existing
                    dropped = self._may_take_over(node_name, existing, now)
                    dropped_pod = existing.owner if existing.pod else ""
            wanted = NodeLock(now.replace(microsecond=0), namespace, pod)
            if not self._patch(node_name, section(node, "metadata").get("resourceVersion"), wanted.value()):
                return CONFLICT
            if dropped:
                self._report_dropped(node, value or "", dropped, dropped_pod, f"replaced by {wanted.owner}")
            _log.debug("node %s locked by %s", node_name, wanted.owner)
            return wanted

        return self._retrying(f"node lock {self.key} on {node_name} for {namespace}/{pod}", attempt)

    def release(self, node_name: str, namespace: str, pod: str, value: str | None = None) -> bool:
        """Remove the pod's lock. False when the node holds no lock of this pod (nothing to do).
        With `value` (the raw annotation once read), only that exact lock is removed: an owner-less
        bare-timestamp lock is released only while it is still the one that was served."""
        expected = value

        def attempt() -> bool | _Conflict:
            node = self._read_node(node_name)
            value = section(node, "metadata", "annotations").get(self.key)
            if value is None:
                return False
            if expected is not None and value != expected:
                _log.warning(
                    "node %s: not releasing lock %r on behalf of %s/%s: it is no longer %r",
                    node_name, value, namespace, pod, expected,
                )
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
            if not self._patch(node_name, section(node, "metadata").get("resourceVersion"), None):
                return CONFLICT
            _log.debug("node %s unlocked by %s/%s", node_name, namespace, pod)
            return True

        return self._retrying(f"release of node lock {self.key} on {node_name} for {namespace}/{pod}", attempt)

    def release_stale(self, node_name: str, value: str, why: str, pod: str = "") -> bool:
        """Remove a lock nobody can use (unreadable, or its pod is gone) while the annotation still holds
        exactly `value` (raw); one log line and a Warning Event naming `pod` (if known), the node and
        the raw value. False when the node no longer holds that value."""

        def attempt() -> bool | _Conflict:
            node = self._read_node(node_name)
            if section(node, "metadata", "annotations").get(self.key) != value:
                return False
            if not self._patch(node_name, section(node, "metadata").get("resourceVersion"), None):
                return CONFLICT
            self._report_dropped(node, value, why, pod, "released")
            return True

        return self._retrying(f"release of node lock {self.key}={value!r} on {node_name}", attempt)

    @contextmanager
    def held(self, node_name: str, namespace: str, pod: str) -> Iterator[NodeLock]:
        """`with locker.held(node, ns, pod):` - the lock is released however the block ends."""
        taken = self.lock(node_name, namespace, pod)
        try:
            yield taken
        finally:
            self.release(node_name, namespace, pod)
