"""The states informer: one StatesProvider fed by a pod source (polled) and node / NodeSLO sources (pushed).

Pods are polled from a :class:`PodSource` (kubelet ``/pods`` or the CRI) every sync interval
(docs/koordinator.md §8.1: 10 s); a failed poll keeps the last good list, is logged once when failing starts
and once on recovery, and is counted. When the pod list changes, the metric cache drops the series of pods
and containers that are gone (:meth:`MetricCache.gc`) and ``AllPods`` callbacks fire. The node and NodeSLO
watchers push through :meth:`set_node`, :meth:`set_node_slo` and :meth:`reject_node_slo`; a rejected NodeSLO
leaves the last good one in place.

With a ``task_reader`` (``-enable-pod-taskids``, Koordinator statesinformer states_pods.go getTaskIds) each sync
also reads the thread ids of every container and sandbox of the pods not terminated; :meth:`container_task_ids`
gives them (the resctrl reconciler moves them into a pod's group). They are kept apart from the pods, so threads
coming and going never count as a pod change.

Callbacks run on the thread that changed the state, after the change and outside the lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Protocol

from koordlet.api.nodeslo import NodeSLOSpec, default_node_slo_spec
from koordlet.api.pod import PodMeta
from koordlet.logs import V4
from koordlet.metriccache import Label, MetricCache
from koordlet.statesinformer.api import NOT_RECEIVED, CallbackKind, Callbacks, NodeInfo, NodeSLOOrigin
from koordlet.statesinformer.enacted import EnactedResources
from koordlet.ticker import PeriodicThread

logger = logging.getLogger(__name__)


class PodSourceError(RuntimeError):
    """The pod source could not give a pod list this time (unreachable, bad answer, empty list)."""


class PodSource(Protocol):
    @property
    def name(self) -> str: ...

    def list_pods(self) -> tuple[PodMeta, ...]:
        """The node's pods now; raises PodSourceError."""
        ...


ErrorCounter = Callable[[str], None]
# A pod → its containers' and sandbox's thread ids, by container id (koordlet.statesinformer.cgroups).
TaskReader = Callable[[PodMeta], Mapping[str, tuple[int, ...]]]
MIN_RESYNC_GAP_S = 0.2
_TERMINATED = ("Succeeded", "Failed")
_NO_TASKS: Mapping[str, tuple[int, ...]] = MappingProxyType({})


class StatesInformer:
    """Implements :class:`koordlet.statesinformer.api.StatesProvider`."""

    def __init__(
        self,
        pod_source: PodSource,
        sync_interval_s: float = 10.0,
        metric_cache: MetricCache | None = None,
        count_error: ErrorCounter | None = None,
        needs_node: bool = True,
        needs_node_slo: bool = True,
        task_reader: TaskReader | None = None,
    ) -> None:
        if sync_interval_s <= 0:
            raise ValueError("sync interval must be positive")
        self._pod_source = pod_source
        self._sync_interval_s = sync_interval_s
        self._cache = metric_cache
        self._count_error = count_error or (lambda source: None)
        self._lock = threading.Lock()
        self._node: NodeInfo | None = None
        self._node_slo = default_node_slo_spec()
        self._node_slo_origin = NOT_RECEIVED
        self._node_slo_rejected: tuple[float, str] | None = None  # (wall time, why) of the last rejected spec
        self._pods: tuple[PodMeta, ...] = ()
        self.enacted = EnactedResources()
        self._task_reader = task_reader
        self._task_ids: Mapping[str, Mapping[str, tuple[int, ...]]] = {}
        self._pods_synced = False
        self._node_slo_synced = not needs_node_slo
        self._needs_node = needs_node
        self._pods_failing = ""  # the reason of the failing pod syncs, "" while they succeed
        self._callbacks = Callbacks()
        self._synced = threading.Event()
        # docs/koordinator.md §8.1: event-driven syncs at most 5 per second, however many pods appear at once.
        self._thread = PeriodicThread("statesinformer-pods", sync_interval_s, self.sync_pods, fixed_rate=True,
                                      min_gap_s=MIN_RESYNC_GAP_S)
        self.pod_syncs = 0
        self.pod_sync_failures = 0
        self.last_pod_sync: float | None = None  # monotonic time of the last pod list taken (health checks)
        self.last_pod_sync_error = ""

    # ----------------------------------------------------------------------------- StatesProvider

    def node(self) -> NodeInfo | None:
        return self._node

    def node_slo(self) -> NodeSLOSpec:
        return self._node_slo

    def node_slo_origin(self) -> NodeSLOOrigin:
        """Where the spec :meth:`node_slo` returns came from."""
        return self._node_slo_origin

    def node_slo_rejected(self) -> tuple[float, str] | None:
        """The last spec refused (wall time, why), None when none was; the spec in effect is the one before it."""
        return self._node_slo_rejected

    def pods(self) -> tuple[PodMeta, ...]:
        return self.enacted.apply(self._pods)

    def container_task_ids(self, pod_uid: str) -> Mapping[str, tuple[int, ...]]:
        """The thread ids of the pod's containers and sandbox at the last sync (empty without a task reader)."""
        with self._lock:
            return self._task_ids.get(pod_uid, _NO_TASKS)

    def register_callback(self, kind: CallbackKind, name: str, fn: Callable[[], None]) -> None:
        self._callbacks.register(kind, name, fn)

    def has_synced(self) -> bool:
        return self._synced.is_set()

    @property
    def sync_interval_s(self) -> float:
        return self._sync_interval_s

    def wait_synced(self, timeout_s: float) -> bool:
        return self._synced.wait(timeout_s)

    # ----------------------------------------------------------------------------- pushed states

    def set_node(self, node: NodeInfo) -> None:
        with self._lock:
            first = self._node is None
            changed = node != self._node
            self._node = node
        if first and not self._pods_synced:
            self._thread.wake()  # the kubelet address comes with the node: poll now, not a sync interval later
        self._update_synced()
        if changed:
            self._callbacks.fire(CallbackKind.NODE_METADATA)

    def set_node_slo(self, spec: NodeSLOSpec, origin: NodeSLOOrigin | None = None) -> None:
        with self._lock:
            changed = spec != self._node_slo
            self._node_slo = spec
            self._node_slo_origin = origin or NodeSLOOrigin("unknown", at=time.time())
            self._node_slo_synced = True
        self._update_synced()
        if changed:
            self._gc_host_apps(spec)
            self._callbacks.fire(CallbackKind.NODE_SLO_SPEC)

    def reject_node_slo(self, reason: str) -> None:
        """An invalid NodeSLO arrived: keep the last good one (or the defaults), but count as synced so
        a bad spec cannot hold the agent's start forever."""
        logger.warning("NodeSLO rejected, keeping the last good spec: %s", reason)
        self._count_error("nodeslo")
        with self._lock:
            self._node_slo_synced = True
            self._node_slo_rejected = (time.time(), reason)
        self._update_synced()

    def _update_synced(self) -> None:
        with self._lock:
            ready = self._pods_synced and self._node_slo_synced and (self._node is not None or not self._needs_node)
        if ready and not self._synced.is_set():
            logger.info("states informer synced: %d pods", len(self._pods))
            self._synced.set()

    # ----------------------------------------------------------------------------- pods

    def sync_pods(self) -> bool:
        """Poll the pod source once; True when a list was taken."""
        try:
            pods = self._pod_source.list_pods()
        except PodSourceError as err:
            self.pod_sync_failures += 1
            self.last_pod_sync_error = str(err)
            self._count_error(self._pod_source.name)
            # Logged again when the reason changes: "kubelet address not known yet" followed by a silent
            # "empty pod list" once hid why a start waited for the sync until its bound.
            if str(err) != self._pods_failing:
                logger.warning("pod sync from %s failed (keeping %d known pods): %s",
                               self._pod_source.name, len(self._pods), err)
            self._pods_failing = str(err)
            return False
        if self._pods_failing:
            logger.info("pod sync from %s recovered", self._pod_source.name)
            self._pods_failing = ""
        self.pod_syncs += 1
        self.last_pod_sync = time.monotonic()
        task_ids = self._read_task_ids(pods) if self._task_reader is not None else {}
        with self._lock:
            changed = not self._pods_synced or pods != self._pods
            self._pods = pods
            self._task_ids = task_ids
            self._pods_synced = True
        self._update_synced()
        if changed:
            logger.log(V4, "pods from %s: %d", self._pod_source.name, len(pods))
            self._gc(pods)
            self._callbacks.fire(CallbackKind.ALL_PODS)
        return True

    def _read_task_ids(self, pods: tuple[PodMeta, ...]) -> dict[str, Mapping[str, tuple[int, ...]]]:
        assert self._task_reader is not None
        return {pod.uid: MappingProxyType(dict(self._task_reader(pod))) for pod in pods if pod.phase not in _TERMINATED}

    def _gc(self, pods: tuple[PodMeta, ...]) -> None:
        if self._cache is None:
            return
        uids = {pod.uid for pod in pods}
        container_ids = {c.container_id for pod in pods for c in pod.containers if c.container_id}
        dropped = self._cache.gc(uids, container_ids)
        if dropped:
            logger.debug("dropped %d metric series of pods that are gone", dropped)

    def _gc_host_apps(self, spec: NodeSLOSpec) -> None:
        """Drop the series of host applications the NodeSLO no longer lists."""
        if self._cache is None:
            return
        names = {app.name for app in spec.host_applications}
        dropped = self._cache.drop_where(
            lambda key: (name := key.label(Label.HOST_APP_NAME)) is not None and name not in names
        )
        if dropped:
            logger.debug("dropped %d metric series of host applications no longer in NodeSLO", dropped)

    def request_resync(self, follow_up_s: float = 0.0) -> None:
        """Poll pods now (a new pod cgroup appeared, docs/koordinator.md §8.1 PLEG), and once more ``follow_up_s``
        later: the cgroup appears before the runtime reports the sandbox ready, so the first poll can miss the
        pod."""
        self._thread.wake(follow_up_s)

    def start(self) -> None:
        """The first poll at once, then every sync interval (from the start of the previous poll)."""
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> bool:
        return self._thread.stop(timeout_s)
