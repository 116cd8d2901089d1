"""Jitter of the periodic API actions: a random start in the first interval, then ±10 %, the mean kept."""

from __future__ import annotations

import random
import statistics

from koordlet.kubeclient.timing import phase, spread
from koordlet.ticker import PeriodicThread
from tests.koordlet.kubeclient.clock import FakeClock


def test_phase_is_anywhere_in_the_first_interval_and_spread_within_ten_percent() -> None:
    rng = random.Random(7)
    phases = [phase(60.0, rng) for _ in range(5000)]
    assert min(phases) >= 0.0 and max(phases) < 60.0
    assert min(phases) < 1.0 and max(phases) > 59.0  # the whole interval is used
    spreads = [spread(60.0, rng) for _ in range(5000)]
    assert min(spreads) >= 54.0 and max(spreads) <= 66.0
    assert abs(statistics.mean(spreads) - 60.0) < 0.3  # the interval asked for, on average


def test_a_jittered_periodic_loop_starts_in_its_first_interval_and_keeps_its_mean() -> None:
    clock = FakeClock()
    runs: list[float] = []
    loop = PeriodicThread("test", 60.0, lambda: runs.append(clock.now), monotonic=clock.monotonic,
                          rng=random.Random(3))
    start = clock.now
    due = loop.schedule()
    assert start <= due < start + 60.0
    for _ in range(500):
        clock.now = due
        due = loop.tick(due)
    gaps = [b - a for a, b in zip(runs, runs[1:], strict=False)]
    assert min(gaps) >= 54.0 and max(gaps) <= 66.0
    assert abs(statistics.mean(gaps) - 60.0) < 1.0


def test_loops_started_together_do_not_run_together() -> None:
    clock = FakeClock()
    firsts = [PeriodicThread("n", 60.0, lambda: None, monotonic=clock.monotonic, rng=random.Random(i)).schedule()
              for i in range(200)]
    # 200 nodes started at the same instant: their first reports fall all over the minute, not in one second
    per_second = [sum(1 for t in firsts if s <= t - clock.now < s + 1) for s in range(60)]
    assert max(per_second) <= 12


def test_an_unjittered_loop_is_unchanged() -> None:
    clock = FakeClock()
    loop = PeriodicThread("plain", 5.0, lambda: None, monotonic=clock.monotonic)
    assert loop.schedule() == clock.now
    assert loop.tick(clock.now) == clock.now + 5.0
