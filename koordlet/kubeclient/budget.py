"""The koordlet-wide API request budget: one per koordlet, every request it sends draws on it.

Two limits, both on the koordlet as a whole (its watchers, reporters, events, evictions and the ``/debug`` guard):

- **A token bucket** of ``-kube-api-qps`` tokens a second holding at most ``-kube-api-burst`` (Koordinator's
  defaults, 20 and 30: cmd/koordlet/options/options.go), as client-go's ``flowcontrol`` limiter: a request over
  it waits for its token, as client-go's does, when that is at most :data:`MAX_RATE_WAIT_S` away (else it is held
  back). In normal operation it never binds (a koordlet sends about one request a minute); it bounds a bug.
- **Pushback.** A 429 or 503 (and 502/504, or any 5xx with ``Retry-After``), or a server that cannot be reached,
  means the API server is overloaded or restarting; at 5,000 nodes every extra request then makes it worse. From
  that answer on, the koordlet sends **one request per pushback slot**, about every :data:`PUSHBACK_INTERVAL_S`
  (±15 %, so nodes that were pushed back together come back apart), never before the server's ``Retry-After``:
  two requests a minute at most, about what a koordlet sends in steady state (1.4 a minute: docs/benchmarks.md), so
  a koordlet under pushback asks no more of the server than it does when all is well, and finds out within half a
  minute that the server is answering again. The request sent in a slot is a probe: when it
  is answered, the koordlet waits :data:`PROBATION_S` more, and if nothing pushed back meanwhile (no 429/503, no
  watch broken off) it is back to normal. A watch broken off by the peer is a softer sign (load balancers cut
  idle connections): the next request goes at once as a probe, the others wait for the probation.

Who may send what: a **periodic** action (a NodeMetric report, an NRT resync, an Event, a review for
``/debug``) goes only when the budget is normal, else it skips its turn; an **essential** one (a watcher
re-establishing its watch, an eviction) may take a pushback slot. Apart from that short wait for a token, nothing
waits inside the budget: :meth:`Budget.admit` raises :class:`Throttled` with the time to come back, and the caller
skips its turn or comes back then. So a stopped koordlet never hangs on its budget, and the fleet bench drives the
same code on virtual time.
"""

from __future__ import annotations

import enum
import logging
import random
import threading
import time
from collections.abc import Callable

from kubernetes.client.exceptions import ApiException

from koordlet.kubeclient.timing import SYSTEM_CLOCK, Clock, spread

logger = logging.getLogger(__name__)

DEFAULT_QPS = 20.0  # -kube-api-qps (Koordinator cmd/koordlet/options/options.go)
DEFAULT_BURST = 30  # -kube-api-burst
PUSHBACK_INTERVAL_S = 30.0
PUSHBACK_SPREAD = 0.15
PROBATION_S = 12.0
MAX_RATE_WAIT_S = 1.0
_EPSILON = 1e-9  # of a token: a refill that float arithmetic leaves a hair short of one is one
PUSHBACK_STATUSES = frozenset({429, 502, 503, 504})


class State(enum.StrEnum):
    NORMAL = "normal"  # the token bucket alone
    PROBE = "probe"  # a watch was broken off: the next essential request goes at once
    PROBATION = "probation"  # a probe went out: the rest waits to see that nothing pushes back
    PUSHBACK = "pushback"  # the server pushed back: one essential request per slot


class Throttled(ApiException):
    """The koordlet's budget has no room for this request now; nothing was sent. A 429 of our own: callers that
    treat a 429 as "not now" need nothing more; :attr:`retry_in_s` says when to come back."""

    def __init__(self, retry_in_s: float, why: str) -> None:
        super().__init__(status=429, reason=f"throttled by koordlet's API budget ({why})")
        self.retry_in_s = max(retry_in_s, 0.0)
        self.why = why


def is_pushback(status: int, retry_after_s: float | None = None) -> bool:
    """An answer that says the server is overloaded or not ready."""
    return status in PUSHBACK_STATUSES or (status >= 500 and retry_after_s is not None)


class Budget:
    """One koordlet's budget (thread-safe)."""

    def __init__(self, qps: float = DEFAULT_QPS, burst: int = DEFAULT_BURST, clock: Clock = SYSTEM_CLOCK,
                 rng: random.Random | None = None, pushback_interval_s: float = PUSHBACK_INTERVAL_S,
                 probation_s: float = PROBATION_S, observe: Callable[[str], None] | None = None,
                 sleep: Callable[[float], None] | None = time.sleep) -> None:
        """``sleep`` waits for a token over the rate; None: nothing may wait (virtual time, the fleet bench), such a
        request is held back for the wait instead. ``observe`` is called with
        ``pushback`` when the server pushes back and ``throttled_periodic`` / ``throttled_essential`` when a request
        is held back (the koordlet's metrics count them)."""
        if qps <= 0 or burst < 1:
            raise ValueError(f"-kube-api-qps must be positive and -kube-api-burst at least 1 (got {qps}, {burst})")
        self.qps = qps
        self.burst = burst
        self._clock = clock
        self._rng = rng or random.Random()
        self._pushback_interval_s = pushback_interval_s
        self._probation_s = probation_s
        self._observe = observe or (lambda event: None)
        self._sleep = sleep
        self._lock = threading.Lock()
        now = clock.monotonic()
        self._tokens = float(burst)
        self._refilled_at = now
        self._state = State.NORMAL
        self._since = now  # PROBATION: when the probe went out
        self._slot = now  # PUSHBACK: when the next essential request may go

    @property
    def state(self) -> State:
        with self._lock:
            self._settle(self._clock.monotonic())
            return self._state

    # ----------------------------------------------------------------------------------------- sending

    def admit(self, essential: bool = False) -> None:
        """Take room for one request now (after a short wait for a token over the rate), or raise
        :class:`Throttled`."""
        wait = 0.0
        with self._lock:
            now = self._clock.monotonic()
            self._settle(now)
            state = self._state
            if state is State.NORMAL:
                self._refill(now)
                wait = (1.0 - self._tokens) / self.qps if self._tokens < 1.0 - _EPSILON else 0.0
                if wait > MAX_RATE_WAIT_S or (wait > 0 and self._sleep is None):
                    raise self._held(essential, wait, "rate")
                self._tokens -= 1.0  # reserved: below zero while requests wait their turn
            elif not essential:
                raise self._held(False, self._back_in(now), state.value)
            elif state is State.PROBE or (state is State.PUSHBACK and now >= self._slot):
                self._state, self._since = State.PROBATION, now
            else:
                raise self._held(True, self._back_in(now), state.value)
        if wait > 0 and self._sleep is not None:
            self._sleep(wait)

    # ---------------------------------------------------------------------------------------- answers

    def answered(self, status: int, retry_after_s: float | None = None) -> None:
        """What the server answered to a request (a watch: when it opened)."""
        if is_pushback(status, retry_after_s):
            self._push(retry_after_s, f"{status}")

    def unreachable(self) -> None:
        """A request found no server (refused, reset, timed out)."""
        self._push(None, "unreachable")

    def stream_broken(self) -> None:
        """A watch was broken off by the peer (not its normal end at its timeout)."""
        with self._lock:
            now = self._clock.monotonic()
            self._settle(now)
            if self._state is State.NORMAL:
                self._state = State.PROBE
                return
        self._push(None, "watch broken off")

    # ---------------------------------------------------------------------------------------- internals

    def _push(self, retry_after_s: float | None, why: str) -> None:
        with self._lock:
            now = self._clock.monotonic()
            if self._state is not State.PUSHBACK:
                logger.warning("API server pushed back (%s): one request per %.0f s until it answers again", why,
                               self._pushback_interval_s)
            self._state = State.PUSHBACK
            wait = spread(self._pushback_interval_s, self._rng, PUSHBACK_SPREAD)
            self._slot = now + max(wait, retry_after_s or 0.0)
        self._observe("pushback")

    def _settle(self, now: float) -> None:
        if self._state is State.PROBATION and now - self._since >= self._probation_s:
            logger.info("API server answering again: back to -kube-api-qps %.0f", self.qps)
            self._state = State.NORMAL
            self._refilled_at = now
            self._tokens = 1.0  # no burst right after a pushback: one request now, the rest at the rate

    def _refill(self, now: float) -> None:
        self._tokens = min(float(self.burst), self._tokens + (now - self._refilled_at) * self.qps)
        self._refilled_at = now

    def _back_in(self, now: float) -> float:
        if self._state is State.PUSHBACK:
            return max(self._slot - now, 0.0)
        if self._state is State.PROBATION:
            return max(self._since + self._probation_s - now, 0.0)
        return 0.0  # PROBE: the probe goes at once; a periodic action tries again at its next turn

    def _held(self, essential: bool, retry_in_s: float, why: str) -> Throttled:
        self._observe("throttled_essential" if essential else "throttled_periodic")
        return Throttled(retry_in_s, why)
