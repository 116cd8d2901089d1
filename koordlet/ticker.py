"""One shape for koordlet's periodic loops (the collector runner, the QoS manager): a daemon thread that
calls ``tick(now)`` — run whatever is due, return when the next thing is due (monotonic seconds) — and
sleeps until then, until stopped. Stopping is bounded: a tick that does not return in time is reported
and left behind (the thread is a daemon)."""

from __future__ import annotations

import abc
import logging
import threading
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)


class TickerThread(abc.ABC):
    def __init__(self, name: str, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._name = name
        self._monotonic = monotonic
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @abc.abstractmethod
    def tick(self, monotonic_now: float) -> float:
        """Run what is due at ``monotonic_now``; return the monotonic time the next thing is due."""

    @abc.abstractmethod
    def _schedule_from(self, start: float) -> None:
        """Make everything first due at ``start`` (called once, on the thread, before the first tick)."""

    def _first_due(self) -> float:
        """Monotonic time of the first tick; runs on the thread and may wait on ``self._stop``."""
        return self._monotonic()

    def _loop(self) -> None:
        self._schedule_from(self._first_due())
        while not self._stop.is_set():
            next_due = self.tick(self._monotonic())
            self._stop.wait(max(next_due - self._monotonic(), 0.0))

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError(f"{self._name} already started")
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                logger.warning("%s thread did not stop within %.1f s", self._name, timeout_s)
            self._thread = None
