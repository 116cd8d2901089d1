"""Exponential backoff with full jitter, for the retries of one loop (a watcher, a reporter).

The n-th retry in a row waits uniform(0, min(cap, initial × 2ⁿ)) ("full jitter": AWS Architecture Blog,
"Exponential Backoff And Jitter", 2015), so retries that failed together spread over the whole window instead of
returning together as client-go's [d, 2d) jitter still does. The initial step and the cap are client-go's
reflector defaults (0.8 s, 30 s; kubernetes/client-go tools/cache/reflector.go). The caller decides what success
resets it: a watcher resets it only when a watch has lived a while (:data:`koordlet.kubeclient.reflector.
HEALTHY_WATCH_S`), so watches cut every few seconds keep backing off instead of starting over.

A ``Retry-After`` the server sent is a floor on top (:meth:`Backoff.delay`), and the koordlet-wide budget
(:mod:`.budget`) enforces it for every other part too.
"""

from __future__ import annotations

import random

INITIAL_S = 0.8
CAP_S = 30.0


class Backoff:
    """Consecutive failures of one loop and the delay before its next try."""

    def __init__(self, initial_s: float = INITIAL_S, cap_s: float = CAP_S, rng: random.Random | None = None) -> None:
        if initial_s <= 0 or cap_s < initial_s:
            raise ValueError(f"backoff needs 0 < initial ({initial_s}) <= cap ({cap_s})")
        self.initial_s = initial_s
        self.cap_s = cap_s
        self._rng = rng or random.Random()
        self.failures = 0

    def window_s(self) -> float:
        """The upper end of the next delay: initial × 2^failures, at most the cap."""
        exponent = min(self.failures, 62)  # 2**62 × initial is far past any cap
        return min(self.cap_s, self.initial_s * (2.0 ** exponent))

    def delay(self, retry_after_s: float | None = None) -> float:
        """Count one more failure and draw the wait before the next try (never less than ``retry_after_s``)."""
        wait = self._rng.uniform(0.0, self.window_s())
        self.failures += 1
        return max(wait, retry_after_s or 0.0)

    def reset(self) -> None:
        self.failures = 0
