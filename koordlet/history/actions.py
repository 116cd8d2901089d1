"""The last things koordlet did to each cgroup dir and each pod, for ``/debug/pods``: recorded by the plan runner
(:class:`koordlet.actuator.PlanRunner`) for every file it wrote or failed to write and every eviction it asked
for, with the plan's source, reason and figures, whatever the audit log's gate says.

Bounded: the last :data:`PER_KEY` actions per cgroup dir (or pod, for evictions), at most :data:`MAX_KEYS` dirs
and pods, the least recently touched forgotten first; a pod's entries go once the states no longer list it
(:meth:`RecentActions.retain`, :data:`KEEP_UNLISTED_S` after its first action at the earliest).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from koordlet.system.kubepods import pod_uid_from_dir_name

PER_KEY = 8
MAX_KEYS = 4096
KEEP_UNLISTED_S = 120.0  # a pod's first writes come before the informer's next poll lists it


@dataclass(frozen=True, slots=True)
class Action:
    at: float  # wall-clock time
    source: str  # who asked: a strategy (cpusuppress...), the reconciler, the hook server, NRI
    what: str  # "cpu.cfs_quota_us = 150000", "cpu.shares not written: ...", "evicted"
    reason: str = ""  # the plan's reason (Koordinator's audit reasons, e.g. AdjustBEByNodeCPUUsage)
    why: str = ""  # the decision's figures


def _key(cgroup_dir: str) -> str:
    return cgroup_dir.strip("/")


def _pod_key(pod_uid: str) -> str:
    return f"pod:{pod_uid}"


def _pod_of(cgroup_dir: str) -> str | None:
    for part in cgroup_dir.split("/"):
        uid = pod_uid_from_dir_name(part) if part else None
        if uid is not None:
            return uid
    return None


class RecentActions:
    def __init__(self, per_key: int = PER_KEY, max_keys: int = MAX_KEYS,
                 clock: Callable[[], float] = time.time) -> None:
        self._per_key = per_key
        self._clock = clock
        self._max_keys = max_keys
        self._entries: OrderedDict[str, deque[Action]] = OrderedDict()
        self._owners: dict[str, tuple[str, float]] = {}  # key -> (pod uid, first action), for the keys of pods
        self._lock = threading.Lock()

    def _add(self, key: str, action: Action, pod_uid: str | None) -> None:
        with self._lock:
            entries = self._entries.get(key)
            if entries is None:
                entries = self._entries[key] = deque(maxlen=self._per_key)
                if pod_uid is not None:
                    self._owners[key] = (pod_uid, action.at)
                while len(self._entries) > self._max_keys:
                    gone, _ = self._entries.popitem(last=False)
                    self._owners.pop(gone, None)
            else:
                self._entries.move_to_end(key)
            entries.append(action)

    def wrote(self, cgroup_dir: str, resource: str, value: object, source: str, reason: str = "", why: str = "",
              error: str = "") -> None:
        """A cgroup file written (``error`` "") or not written (why not in ``error``)."""
        what = f"{resource} = {value}" if not error else f"{resource} not set to {value}: {error}"
        self._add(_key(cgroup_dir), Action(self._clock(), source, what, reason, why), _pod_of(cgroup_dir))

    def evicted(self, pod_uid: str, outcome: str, source: str, reason: str = "", why: str = "") -> None:
        """An eviction asked for (``outcome``: evicted, refused, stopped...)."""
        self._add(_pod_key(pod_uid), Action(self._clock(), source, outcome, reason, why), pod_uid)

    def of(self, cgroup_dirs: Iterable[str] = (), pod_uid: str = "") -> list[tuple[str, Action]]:
        """(where, action) for these dirs and the pod's evictions, newest first; ``where`` is the dir, or ``pod``."""
        found: list[tuple[str, Action]] = []
        with self._lock:
            for cgroup_dir in cgroup_dirs:
                found += [(_key(cgroup_dir) or "/", a) for a in self._entries.get(_key(cgroup_dir), ())]
            if pod_uid:
                found += [("pod", a) for a in self._entries.get(_pod_key(pod_uid), ())]
        return sorted(found, key=lambda item: item[1].at, reverse=True)

    def retain(self, listed_uids: Iterable[str]) -> int:
        """Forget the dirs and evictions of pods the states no longer list; returns how many keys went."""
        listed = set(listed_uids)
        cutoff = self._clock() - KEEP_UNLISTED_S
        with self._lock:
            gone = [key for key, (uid, since) in self._owners.items() if uid not in listed and since < cutoff]
            for key in gone:
                self._entries.pop(key, None)
                del self._owners[key]
        return len(gone)


RECENT = RecentActions()  # the agent's: every PlanRunner records here unless given another
