"""What kubelet last set on running containers with UpdateContainerResources (an in-place resize), laid over the pods
until kubelet's status reports it.

kubelet resizes a container with the CRI call first and reports the enacted amounts in the pod's status after; koordlet
reads the status at its next poll. In between, every part reading the pod list would see the old limits, and the
parts that write a quota or a throttle from them (CPU burst's reset to the limit, CPU normalization's reconciler) would
put kubelet's old limit back. The hook server (PreUpdateContainerResources, through the proxy) and the NRI plugin
(UpdateContainer) see the call itself: they record the new amounts here, and :meth:`EnactedResources.apply` gives
the pods with them until the states report the same limits (then the record goes) or ``ttl_s`` passes (a
resize kubelet gave up on: its status never changes).

Only what the CRI call carries: the cpu limit (quota × 1000 / period), the memory limit and the cpu request
(shares × 1000 / 1024, lossy: compared within rounding). Memory requests are not in it: they come with the status.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from koordlet.api.pod import ContainerMeta, PodMeta

_CPU, _MEMORY = "cpu", "memory"
_MIN_SHARES = 2  # kubelet's cpu.shares for "no cpu request"


class LinuxResources:
    """The fields read of a CRI or hook API LinuxContainerResources (both generated classes have them)."""

    cpu_period: int
    cpu_quota: int
    cpu_shares: int
    memory_limit_in_bytes: int


def requests_limits(resources: LinuxResources) -> tuple[dict[str, int], dict[str, int]]:
    """(requests, limits) in Koordinator units from the Linux resources kubelet set: the inverse of kubelet's
    conversion (cpu limit = quota × 1000 / period, cpu request = shares × 1000 / 1024, shares of 2 being "none",
    memory limit = memory_limit_in_bytes)."""
    requests: dict[str, int] = {}
    limits: dict[str, int] = {}
    if resources.cpu_quota > 0 and resources.cpu_period > 0:
        limits[_CPU] = resources.cpu_quota * 1000 // resources.cpu_period
    if resources.cpu_shares > _MIN_SHARES:
        requests[_CPU] = resources.cpu_shares * 1000 // 1024
    if resources.memory_limit_in_bytes > 0:
        limits[_MEMORY] = resources.memory_limit_in_bytes
    return requests, limits


@dataclass(frozen=True, slots=True)
class _Enacted:
    requests: Mapping[str, int]
    limits: Mapping[str, int]
    at: float


def _same_request(have: int | None, enacted: int | None) -> bool:
    """Equal within the shares rounding (1 milli-core in 1024)."""
    if have is None or enacted is None:
        return have == enacted
    return abs(have - enacted) <= max(1, have // 1000)


class EnactedResources:
    """The records (module docstring); safe to use from any thread."""

    def __init__(self, ttl_s: float = 300.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._by_id: dict[str, _Enacted] = {}
        self._version = 0
        self._applied: tuple[tuple[PodMeta, ...], int, tuple[PodMeta, ...]] | None = None

    def record(self, container_id: str, resources: LinuxResources) -> None:
        """kubelet set ``resources`` on the container (bare id) with UpdateContainerResources."""
        requests, limits = requests_limits(resources)
        with self._lock:
            self._by_id[container_id] = _Enacted(requests, limits, self._clock())
            self._version += 1

    def __len__(self) -> int:
        return len(self._by_id)

    def apply(self, pods: tuple[PodMeta, ...]) -> tuple[PodMeta, ...]:
        """``pods`` with the recorded amounts over their containers'; the very same tuple when nothing is recorded,
        and the same result for the same pods while the records stay (the pod list's identity means "unchanged")."""
        if not self._by_id:
            return pods
        with self._lock:
            applied = self._applied
            if applied is not None and applied[0] is pods and applied[1] == self._version:
                return applied[2]
            now = self._clock()
            for container_id in [c for c, e in self._by_id.items() if now - e.at > self._ttl_s]:
                del self._by_id[container_id]
            out = tuple(self._pod(pod) for pod in pods)
            self._version += 1
            self._applied = (pods, self._version, out)
            return out

    def _pod(self, pod: PodMeta) -> PodMeta:
        containers = tuple(self._container(c) for c in pod.containers)
        if all(new is old for new, old in zip(containers, pod.containers, strict=True)):
            return pod
        return replace(pod, containers=containers)

    def _container(self, container: ContainerMeta) -> ContainerMeta:
        enacted = self._by_id.get(container.container_id) if container.container_id else None
        if enacted is None:
            return container
        limits_reported = all(container.limits.get(r) == enacted.limits.get(r) for r in (_CPU, _MEMORY))
        if limits_reported and _same_request(container.requests.get(_CPU), enacted.requests.get(_CPU)):
            del self._by_id[container.container_id]  # the states report it now: the record has done its work
            return container
        requests = {k: v for k, v in container.requests.items() if k != _CPU} | dict(enacted.requests)
        limits = {k: v for k, v in container.limits.items() if k not in (_CPU, _MEMORY)} | dict(enacted.limits)
        return replace(container, requests=requests, limits=limits)
