"""One decision per pod and per container call, when the proxy's hook server and the NRI plugin both see it.

With both front doors on (as Koordinator allows), a container created through koord-runtime-proxy is seen
twice: the proxy asks the hook server (PreCreateContainer) and changes the CRI request, then containerd asks
the NRI plugin (CreateContainer) about the request *as the proxy changed it*. Deciding again there could
give a second, different answer: a rule relative to kubelet's value (CPU normalization divides kubelet's
quota by the node's ratio) would be applied twice.

So the hook server remembers what it decided, keyed by what both doors see (the pod uid; the pod uid and
container name for a creation; the container id for an update), and the NRI plugin takes that decision
instead of deciding again. The NRI answer then only carries what differs from the container as it arrives,
which after the proxy is nothing: the container gets exactly the proxy's answer. An entry is taken once and
forgotten after ``ttl_s`` (a call through the proxy reaches NRI within milliseconds), or when the memo is
full, oldest first; a container created straight on containerd finds no entry and NRI decides.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable

from hooks.protocol import Changes

DEFAULT_TTL_S = 30.0
DEFAULT_CAPACITY = 4096


def pod_key(pod_uid: str) -> tuple[str, str]:
    return ("pod", pod_uid)


def create_key(pod_uid: str, container_name: str) -> tuple[str, str, str]:
    return ("create", pod_uid, container_name)


def update_key(container_id: str) -> tuple[str, str]:
    return ("update", container_id)


class Decisions:
    """A small, bounded, thread-safe memo of plugin results (the hook server and the NRI plugin run in
    different threads)."""

    def __init__(self, ttl_s: float = DEFAULT_TTL_S, capacity: int = DEFAULT_CAPACITY,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl_s = ttl_s
        self._capacity = capacity
        self._clock = clock
        self._entries: OrderedDict[Hashable, tuple[float, Changes]] = OrderedDict()
        self._lock = threading.Lock()
        self.reused = 0  # decisions taken by the second door

    def remember(self, key: Hashable, changes: Changes) -> None:
        with self._lock:
            self._entries.pop(key, None)
            self._entries[key] = (self._clock() + self._ttl_s, changes)
            while len(self._entries) > self._capacity:
                self._entries.popitem(last=False)

    def take(self, key: Hashable) -> Changes | None:
        """The decision remembered under ``key`` (and forget it); None when there is none or it expired."""
        with self._lock:
            entry = self._entries.pop(key, None)
            if entry is None:
                return None
            expires, changes = entry
            if self._clock() > expires:
                return None
            self.reused += 1
            return changes

    def forget_pod(self, pod_uid: str) -> None:
        """Drop what is remembered for a pod that went away."""
        with self._lock:
            for key in [k for k in self._entries if isinstance(k, tuple) and len(k) > 1 and k[1] == pod_uid]:
                del self._entries[key]

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
