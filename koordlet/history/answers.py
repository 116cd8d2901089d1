"""What each hook plugin answered when a pod and its containers were created, for ``/debug/pods``.

The hook server (PreRunPodSandbox, PreCreateContainer), the NRI plugin (RunPodSandbox, CreateContainer, when it
decided itself rather than taking the hook server's decision) and the reconciler (only for a pod or container
with no record yet: one created before koordlet started, or on a node with neither front door) run the plugins
with a :class:`hooks.registry.Trace` and hand it here. One record per pod and per container (a container created
again replaces its record); at most :data:`DEFAULT_CAPACITY` pods, the oldest forgotten first, and a pod is
forgotten once the states informer no longer lists it (after :data:`KEEP_UNLISTED_S`, as a pod is created before
the informer's next poll lists it).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from hooks.protocol import Changes
from hooks.registry import PluginAnswer, Trace

DEFAULT_CAPACITY = 2048
KEEP_UNLISTED_S = 120.0
POD_LEVEL = ""  # the container name of a pod-level record


@dataclass(frozen=True, slots=True)
class Rejection:
    """A value the check dropped (``hooks.validate.Rejected``, its value as text)."""

    key: str
    value: str
    reason: str


@dataclass(frozen=True, slots=True)
class HookRecord:
    """One run of the plugins for a pod (``container`` "") or a container."""

    stage: str  # PreRunPodSandbox, PreCreateContainer, or "reconcile"
    door: str  # hookserver, nri, reconciler
    at: float  # wall-clock time
    answers: tuple[PluginAnswer, ...] = ()
    rejected: tuple[Rejection, ...] = ()
    result: Changes | None = None  # the merged, checked answer; None when the plugins did not run
    note: str = ""  # why the plugins did not run (a stage turned off...)


class HookAnswers:
    def __init__(self, capacity: int = DEFAULT_CAPACITY, keep_unlisted_s: float = KEEP_UNLISTED_S,
                 clock: Callable[[], float] = time.time) -> None:
        self._capacity = capacity
        self._keep_unlisted_s = keep_unlisted_s
        self._clock = clock
        self._pods: OrderedDict[str, dict[str, HookRecord]] = OrderedDict()
        self._first_seen: dict[str, float] = {}
        self._lock = threading.Lock()

    def record(self, pod_uid: str, container: str, stage: str, door: str, trace: Trace | None,
               result: Changes | None, note: str = "") -> None:
        """Remember what the plugins answered (``trace``) for the pod (``container`` "") or its container."""
        if not pod_uid:
            return
        rejected = tuple(Rejection(item.key, repr(item.value)[:200], item.reason)
                         for item in (trace.rejected if trace is not None else ()))
        record = HookRecord(stage, door, self._clock(), tuple(trace.answers) if trace is not None else (), rejected,
                            result, note)
        with self._lock:
            entries = self._pods.get(pod_uid)
            if entries is None:
                entries = self._pods[pod_uid] = {}
                self._first_seen[pod_uid] = record.at
                while len(self._pods) > self._capacity:
                    gone, _ = self._pods.popitem(last=False)
                    self._first_seen.pop(gone, None)
            entries[container] = record

    def missing(self, pod_uid: str, container: str = POD_LEVEL) -> bool:
        """No record yet for this pod (or container): the reconciler records its answer then. Read without the lock
        (one dict lookup each, atomic under the GIL): the reconciler asks for every pod on every pass."""
        entries = self._pods.get(pod_uid)
        return entries is None or container not in entries

    def of(self, pod_uid: str) -> Mapping[str, HookRecord]:
        """The records of one pod by container name (``""``: the pod level)."""
        with self._lock:
            return dict(self._pods.get(pod_uid) or {})

    def retain(self, listed_uids: Iterable[str]) -> int:
        """Forget the pods the states no longer list (recorded more than ``keep_unlisted_s`` ago); returns how many."""
        listed = set(listed_uids)
        cutoff = self._clock() - self._keep_unlisted_s
        with self._lock:
            gone = [uid for uid in self._pods if uid not in listed and self._first_seen.get(uid, 0.0) < cutoff]
            for uid in gone:
                del self._pods[uid]
                self._first_seen.pop(uid, None)
        return len(gone)

    def __len__(self) -> int:
        with self._lock:
            return len(self._pods)
