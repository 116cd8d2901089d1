"""GPU health: a shared board of per-GPU health, and an NVML Xid watcher that writes to it.

The board is what the Device CR reporter and the device plugin's ListAndWatch read; every change
bumps a generation counter and wakes the waiters, so a stream can block until something changed.

Unlike NVIDIA's plugin (docs/node-interfaces.md §7.2: "a device marked unhealthy never becomes healthy again"),
a GPU comes back: after `recover_after_s` without another critical Xid, and only when a probe of
the device (a memory-info read) succeeds. The same probe on every poll marks a GPU that fell off
the bus (GpuIsLost), which also covers GPUs NVML gives no events for (some VMs).
Application-level Xids are ignored as NVIDIA does (13, 31, 43, 45, 68, 109).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from koordlet.gpu.nvml import NvmlSession

_log = logging.getLogger(__name__)

# Changes kept for streams that fall behind: a flap (unhealthy and back) between two reads of a
# stream is still delivered as two updates.
_HISTORY = 64
# Xids caused by applications, not by the GPU (NVIDIA k8s-device-plugin defaults, docs/node-interfaces.md §7.2).
APPLICATION_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68, 109})
DEFAULT_RECOVER_AFTER_S = 300.0


@dataclass(frozen=True, slots=True)
class GPUHealth:
    uuid: str
    healthy: bool
    # "" when healthy; otherwise why, e.g. "Xid79" (the Device CR condition reason, docs/koordinator.md §5.4).
    reason: str = ""
    message: str = ""


class HealthBoard:
    """Thread-safe health of each GPU, with change notification."""

    def __init__(self, uuids: Iterable[str]) -> None:
        self._cond = threading.Condition()
        self._health: dict[str, GPUHealth] = {uuid: GPUHealth(uuid, True) for uuid in uuids}
        self._generation = 0
        self._closed = False
        self._history: deque[tuple[int, dict[str, GPUHealth]]] = deque(maxlen=_HISTORY)

    @property
    def generation(self) -> int:
        with self._cond:
            return self._generation

    @property
    def closed(self) -> bool:
        with self._cond:
            return self._closed

    def snapshot(self) -> dict[str, GPUHealth]:
        with self._cond:
            return dict(self._health)

    def versioned_snapshot(self) -> tuple[int, dict[str, GPUHealth]]:
        """The generation and the health it stands for, read together."""
        with self._cond:
            return self._generation, dict(self._health)

    def snapshots_since(self, generation: int) -> list[tuple[int, dict[str, GPUHealth]]]:
        """Every state after `generation`, oldest first; only the latest when history is shorter."""
        with self._cond:
            if self._generation == generation:
                return []
            newer = [(g, dict(h)) for g, h in self._history if g > generation]
            if not newer or newer[0][0] != generation + 1:
                return [(self._generation, dict(self._health))]
            return newer

    def get(self, uuid: str) -> GPUHealth:
        with self._cond:
            return self._health[uuid]

    def set(self, uuid: str, healthy: bool, reason: str = "", message: str = "") -> bool:
        """Record a GPU's health; returns True when it changed (and waiters were woken)."""
        new = GPUHealth(uuid, healthy, "" if healthy else reason, "" if healthy else message)
        with self._cond:
            if uuid not in self._health:
                raise KeyError(f"unknown GPU {uuid}")
            if self._health[uuid].healthy == healthy and (healthy or self._health[uuid].reason == reason):
                return False
            self._health[uuid] = new
            self._generation += 1
            self._history.append((self._generation, dict(self._health)))
            self._cond.notify_all()
        if healthy:
            _log.warning("GPU %s is healthy again", uuid)
        else:
            _log.warning("GPU %s marked unhealthy: %s %s", uuid, reason, message)
        return True

    def wait_for_change(self, seen_generation: int, timeout_s: float | None) -> int:
        """Block until the generation passes `seen_generation`, the board closes, or the timeout."""
        with self._cond:
            self._cond.wait_for(lambda: self._generation != seen_generation or self._closed, timeout_s)
            return self._generation

    def close(self) -> None:
        """Wake every waiter for good (shutdown)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class XidHealthWatcher:
    """Turns NVML critical-error events into health changes on the board, and recovers GPUs."""

    def __init__(
        self,
        session: NvmlSession,
        board: HealthBoard,
        uuids: Iterable[str],
        ignored_xids: frozenset[int] = APPLICATION_XIDS,
        recover_after_s: float = DEFAULT_RECOVER_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._session = session
        self._nvml = session.nvml
        self._board = board
        self._ignored = ignored_xids
        self._recover_after_s = recover_after_s
        self._clock = clock
        self._last_error_at: dict[str, float] = {}
        self._event_set: Any = None
        self._uuids = tuple(uuids)
        # Event-less GPUs (NotSupported, e.g. some VMs) are still recovered and probed.
        self.watched: tuple[str, ...] = ()

    def start(self) -> None:
        """Create the NVML event set and register every GPU for critical-error events."""
        nvml = self._nvml
        self._event_set = nvml.nvmlEventSetCreate()
        mask = nvml.nvmlEventTypeXidCriticalError | nvml.nvmlEventTypeDoubleBitEccError
        watched: list[str] = []
        for uuid in self._uuids:
            try:
                nvml.nvmlDeviceRegisterEvents(self._session.handle(uuid), mask, self._event_set)
            except nvml.NVMLError as exc:
                _log.info("GPU %s: no NVML health events (%s); health checks by probe only", uuid, exc)
                continue
            watched.append(uuid)
        self.watched = tuple(watched)

    def stop(self) -> None:
        if self._event_set is not None:
            try:
                self._nvml.nvmlEventSetFree(self._event_set)
            except self._nvml.NVMLError as exc:
                _log.debug("nvmlEventSetFree failed: %s", exc)
            self._event_set = None

    def _uuid_of(self, handle: Any) -> str:
        return str(self._nvml.nvmlDeviceGetUUID(handle))

    def poll_once(self, timeout_ms: int) -> None:
        """Wait up to timeout_ms for one NVML event and apply it; then try recovering GPUs."""
        nvml = self._nvml
        if self._event_set is not None and self.watched:
            try:
                event = nvml.nvmlEventSetWait(self._event_set, timeout_ms)
            except nvml.NVMLError_Timeout:
                event = None
            except nvml.NVMLError_GpuIsLost as exc:
                for uuid in self.watched:
                    self._mark(uuid, "GPULost", str(exc))
                event = None
            if event is not None:
                self._apply(event)
        self._probe_lost()
        self._recover()

    def _probe_lost(self) -> None:
        """A GPU that fell off the bus raises GpuIsLost on any query; this catches it also where
        NVML has no events (VMs)."""
        for uuid in self._uuids:
            if uuid in self._last_error_at:
                continue
            try:
                self._nvml.nvmlDeviceGetMemoryInfo(self._session.handle(uuid))
            except self._nvml.NVMLError_GpuIsLost as exc:
                self._mark(uuid, "GPULost", str(exc))
            except (KeyError, self._nvml.NVMLError) as exc:
                _log.debug("GPU %s probe failed: %s", uuid, exc)

    def _mark(self, uuid: str, reason: str, message: str) -> None:
        self._last_error_at[uuid] = self._clock()
        self._board.set(uuid, False, reason, message)

    def _apply(self, event: Any) -> None:
        nvml = self._nvml
        xid = int(event.eventData)
        if event.eventType == nvml.nvmlEventTypeXidCriticalError and xid in self._ignored:
            _log.info("ignoring application Xid %d", xid)
            return
        reason = f"Xid{xid}" if event.eventType == nvml.nvmlEventTypeXidCriticalError else "DoubleBitEccError"
        try:
            uuid = self._uuid_of(event.device)
        except nvml.NVMLError as exc:
            # The event does not say which GPU in a form NVML can answer: all GPUs are suspect.
            _log.warning("NVML event %s for an unidentifiable GPU (%s): marking all", reason, exc)
            for known in self.watched:
                self._mark(known, reason, "critical error on an unidentified GPU")
            return
        if uuid in self._uuids:
            self._mark(uuid, reason, f"NVML critical error event {reason}")

    def _recover(self) -> None:
        now = self._clock()
        # Only what this watcher marked: a GPU marked unhealthy by someone else is theirs to clear.
        for uuid, last_error_at in list(self._last_error_at.items()):
            if now - last_error_at < self._recover_after_s:
                continue
            try:
                self._nvml.nvmlDeviceGetMemoryInfo(self._session.handle(uuid))
            except (KeyError, self._nvml.NVMLError) as exc:
                _log.debug("GPU %s still failing its probe: %s", uuid, exc)
                continue
            del self._last_error_at[uuid]
            self._board.set(uuid, True)

    def run(self, stop: threading.Event, poll_timeout_ms: int = 5000) -> None:
        """Daemon loop (NVIDIA polls every 5000 ms); errors are logged and the loop goes on."""
        while not stop.is_set():
            try:
                self.poll_once(poll_timeout_ms)
            except self._nvml.NVMLError as exc:
                _log.warning("GPU health poll failed: %s", exc)
                stop.wait(poll_timeout_ms / 1000)
            if not self.watched:
                stop.wait(poll_timeout_ms / 1000)
