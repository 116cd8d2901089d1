"""The clock koordlet's API client runs on, and the jitter of its periodic actions.

Every part that talks to the API server takes a :class:`Clock` (``monotonic`` for intervals, ``time`` for the wall
time written into objects) and a ``random.Random`` for its lots: the process's own by default, a fake clock and a
seeded generator in tests, a virtual clock in the fleet bench (bench/fleet.py).

Jitter (docs/design.md §5): a periodic API action starts at a random point of its first interval (:func:`phase`),
so nodes that start together do not act together, and every later interval is stretched or shrunk by up to ±10 %
(:func:`spread`), so they do not fall back into step; the mean interval stays the one asked for.
"""

from __future__ import annotations

import random
import time
from typing import Protocol

SPREAD = 0.1  # ±10 % of every interval


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (intervals, deadlines)."""

    def time(self) -> float:
        """Wall-clock seconds since the epoch (timestamps written into API objects)."""


class SystemClock:
    """The process's clocks."""

    @staticmethod
    def monotonic() -> float:
        return time.monotonic()

    @staticmethod
    def time() -> float:
        return time.time()


SYSTEM_CLOCK: Clock = SystemClock()


def phase(interval_s: float, rng: random.Random) -> float:
    """Where in its first interval a periodic action starts: uniform in [0, interval)."""
    return rng.uniform(0.0, max(interval_s, 0.0))


def spread(interval_s: float, rng: random.Random, fraction: float = SPREAD) -> float:
    """``interval_s`` stretched or shrunk by up to ``fraction`` (uniform, so the mean is ``interval_s``)."""
    return interval_s * rng.uniform(1.0 - fraction, 1.0 + fraction)
