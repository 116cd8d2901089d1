"""One shape for koordlet's periodic loops: a daemon thread that calls ``tick(now)`` — run whatever is due,
return when the next thing is due (monotonic seconds) — and sleeps until then or until woken, until stopped.

:class:`TickerThread` is the base (the collector runner and the QoS manager schedule several things on it);
:class:`PeriodicThread` runs one function on an interval, for the parts with a single job (the states
informer's pod sync, the runtime hooks reconciler, network QoS, the NodeMetric and Device reporters, the
device plugin's kubelet watch).

Stopping is bounded: ``stop(timeout_s)`` sets the stop event, waits at most ``timeout_s`` for the thread,
logs when it did not end in time and says whether it did; a tick still running then is left behind (the
thread is a daemon). :func:`join_thread` is that bounded join, for the threads that are not loops.

Every thread koordlet starts has a name (ARCHITECTURE.md, "Threads, loops and pools", lists them; a test holds a
started koordlet to that list); :func:`start_observer` names a file watch's threads.
"""

from __future__ import annotations

import abc
import logging
import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from koordlet.kubeclient.timing import phase, spread

if TYPE_CHECKING:
    from watchdog.observers.api import BaseObserver

logger = logging.getLogger(__name__)


def start_observer(observer: BaseObserver, name: str) -> None:
    """Start a watchdog observer (a daemon) with its threads named: ``name`` (it hands the events to the handlers),
    ``<name>-emitter`` (one per watched dir) and ``<name>-inotify`` (the inotify reader, where watchdog has one per
    observer)."""
    observer.name = name
    observer.daemon = True
    observer.start()
    for emitter in observer.emitters:
        emitter.name = f"{name}-emitter"
    reader = getattr(observer, "_inotify_fd", None)  # watchdog >= 6 on Linux: the observer's own reader thread
    if isinstance(reader, threading.Thread):
        reader.name = f"{name}-inotify"


def join_thread(thread: threading.Thread | None, name: str, timeout_s: float) -> bool:
    """Wait at most ``timeout_s`` for ``thread`` to end; log when it did not. True when it ended (or is None)."""
    if thread is None or thread is threading.current_thread():
        return True
    thread.join(max(timeout_s, 0.0))
    if thread.is_alive():
        logger.warning("%s thread did not stop within %.1f s", name, timeout_s)
        return False
    return True


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """How a loop is doing, for the health checks (koordlet.health): whether its thread runs, how long ago it
    last finished a tick (or started), and what the tick running now runs and for how long."""

    running: bool  # started and not stopped
    alive: bool  # its thread is alive
    since_progress_s: float  # since the last tick ended (or the loop started)
    busy_s: float  # how long the tick running now has run; 0 while the loop sleeps
    doing: str  # what the running tick runs now ("" when the loop does not say, or sleeps)


class TickerThread(abc.ABC):
    def __init__(self, name: str, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._name = name
        self._monotonic = monotonic
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._woken = False  # the last sleep ended by wake(); read by tick() on the thread
        self._thread: threading.Thread | None = None
        self._progress_at = 0.0  # monotonic: the last tick ended (or the loop started)
        self._tick_started: float | None = None  # monotonic start of the tick running now
        self.doing = ""  # what the running tick runs now: a subclass names its item (a strategy, a collector)

    @abc.abstractmethod
    def tick(self, monotonic_now: float) -> float:
        """Run what is due at ``monotonic_now``; return the monotonic time the next thing is due."""

    @abc.abstractmethod
    def _schedule_from(self, start: float) -> None:
        """Make everything first due at ``start`` (called once, on the thread, before the first tick)."""

    def _first_due(self) -> float:
        """Monotonic time of the first tick; runs on the thread and may wait on ``self._stop``."""
        return self._monotonic()

    def schedule(self) -> float:
        """Schedule without a thread: the monotonic time of the first tick; then call :meth:`tick` when it is due
        and again at the time it returns (the fleet bench, bench/fleet.py, drives loops so on virtual time)."""
        due = self._first_due()
        self._schedule_from(due)
        return due

    @property
    def period_s(self) -> float:
        """The longest a healthy loop sleeps between two ticks (the health checks' bound follows it)."""
        return 1.0

    def heartbeat(self) -> Heartbeat:
        now = self._monotonic()
        thread, started = self._thread, self._tick_started
        return Heartbeat(running=thread is not None, alive=thread is not None and thread.is_alive(),
                         since_progress_s=now - self._progress_at,
                         busy_s=now - started if started is not None else 0.0,
                         doing=self.doing if started is not None else "")

    def _loop(self) -> None:
        self._schedule_from(self._first_due())
        while not self._stop.is_set():
            self._tick_started = self._monotonic()
            next_due = self.tick(self._tick_started)
            self._progress_at = self._monotonic()
            self._tick_started = None
            self._woken = self._wake.wait(max(next_due - self._monotonic(), 0.0))
            if self._woken:
                self._wake.clear()

    @property
    def running(self) -> bool:
        """Started and not stopped since."""
        return self._thread is not None

    def wake(self) -> None:
        """End the current sleep now: ``tick`` runs at once and finds ``self._woken`` set."""
        self._wake.set()

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError(f"{self._name} already started")
        self._stop.clear()
        self._wake.clear()
        self._woken = False
        self._progress_at = self._monotonic()
        self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> bool:
        """Stop the thread, waiting at most ``timeout_s``; True when it ended in time."""
        self._stop.set()
        self._wake.set()
        thread, self._thread = self._thread, None
        return join_thread(thread, self._name, timeout_s)


class PeriodicThread(TickerThread):
    """Calls ``fn`` every ``interval_s`` (a number, or a function read after every run), the first time
    ``first_delay_s`` after :meth:`start`, and soon after :meth:`wake`.

    - ``rng`` (jitter, for the actions that reach the API server: docs/design.md §5): the first run at a random
      point of the first interval (unless ``first_delay_s`` is given), every later interval ±10 %
      (koordlet/kubeclient/timing.py), so koordlets started together do not report together.

    - ``fixed_rate``: the interval runs from the start of a run (a pod poll every 10 s); otherwise from its
      end (a pass of work, then a pause).
    - ``min_gap_s``: a woken run starts no sooner than this after the previous run started; wakes in
      between are merged into one run.
    - ``fn`` raising is logged (or handed to ``on_error``) and the loop goes on.
    """

    def __init__(self, name: str, interval_s: float | Callable[[], float], fn: Callable[[], object], *,
                 first_delay_s: float | None = None, fixed_rate: bool = False, min_gap_s: float = 0.0,
                 on_error: Callable[[Exception], None] | None = None,
                 monotonic: Callable[[], float] = time.monotonic, rng: random.Random | None = None) -> None:
        super().__init__(name, monotonic)
        self._interval = interval_s if callable(interval_s) else (lambda: interval_s)
        self._fn = fn
        self._rng = rng
        if first_delay_s is None:
            first_delay_s = phase(self._interval(), rng) if rng is not None else 0.0
        self._first_delay_s = first_delay_s
        self._fixed_rate = fixed_rate
        self._min_gap_s = min_gap_s
        self._on_error = on_error
        self._next_due = 0.0
        self._last_start = -math.inf
        self._wake_pending = False
        self._follow_up_at: float | None = None
        self.runs = 0

    def wake(self, follow_up_s: float = 0.0) -> None:
        """Run now (subject to ``min_gap_s``) and, with ``follow_up_s``, once more that much later."""
        if follow_up_s > 0:
            self._follow_up_at = self._monotonic() + follow_up_s
        super().wake()

    def _first_due(self) -> float:
        return self._monotonic() + self._first_delay_s

    @property
    def period_s(self) -> float:
        return self._interval()

    def _schedule_from(self, start: float) -> None:
        self._next_due = start
        self._wake_pending = False

    def _due(self) -> float:
        due = self._next_due
        follow_up_at = self._follow_up_at
        if follow_up_at is not None:
            due = min(due, follow_up_at)
        if self._wake_pending:
            due = min(due, self._last_start + self._min_gap_s)
        return due

    def tick(self, monotonic_now: float) -> float:
        if self._woken:
            self._wake_pending = True
        if monotonic_now < self._due():
            return self._due()
        self._wake_pending = False
        follow_up_at = self._follow_up_at
        if follow_up_at is not None and follow_up_at <= monotonic_now:
            self._follow_up_at = None  # this run is the follow-up
        self._last_start = monotonic_now
        try:
            self._fn()
        except Exception as err:  # a daemon loop: log (or count) and go on (STYLE.md)
            if self._on_error is not None:
                self._on_error(err)
            else:
                logger.exception("%s: run failed", self._name)
        self.runs += 1
        interval = self._interval()
        if self._rng is not None:
            interval = spread(interval, self._rng)
        self._next_due = (monotonic_now if self._fixed_rate else self._monotonic()) + interval
        return self._due()
